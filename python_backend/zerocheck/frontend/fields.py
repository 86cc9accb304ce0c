"""Validators of JSON request fields shared by the OpenAI and Anthropic APIs: each refusal is a 400
naming the field."""
from __future__ import annotations

import json
import math
from typing import Any, Mapping

from zerocheck.frontend.errors import invalid


def json_body(raw: bytes) -> Any:
    """A request body parsed as JSON; a 400 for what is not JSON, nests too deep for the parser, or holds
    text that is not Unicode (a lone surrogate escape such as \\ud800 cannot become UTF-8 tokens)."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise invalid("the request body nests too deeply to parse") from None
    except (ValueError, UnicodeDecodeError) as error:
        raise invalid(f"the request body is not valid JSON: {error}") from None
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as error:
        raise invalid(f"the request body holds text that is not valid Unicode: {error.reason} "
                      f"({error.object[error.start:error.end]!a})") from None
    except RecursionError:
        raise invalid("the request body nests too deeply to parse") from None
    return body


def number(body: Mapping[str, Any], name: str, low: float, high: float, integer: bool = False,
           low_open: bool = False) -> float | int | None:
    """`body[name]` as a number in [low, high] ((low, high] with `low_open`); None when absent or null."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (integer and not float(value).is_integer()):
        raise invalid(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}", name)
    if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise invalid(f"{name} must be in {interval}, got {value!r}", name)
    return int(value) if integer else float(value)


def boolean(body: Mapping[str, Any], name: str) -> bool:
    """`body[name]` as true or false; False when absent or null."""
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"{name} must be true or false, got {value!r}", name)
    return value


def sampling_fields(body: Mapping[str, Any], max_temperature: float) -> dict[str, Any]:
    """The sampling fields both APIs take, validated, as `GenerateRequest.build` keywords (absent ones left
    out): temperature in [0, max_temperature], top_p, top_k, min_p, the penalties, seed (taken modulo 2**64),
    min_tokens, and ignore_eos (no end id)."""
    sampling = {"temperature": number(body, "temperature", 0, max_temperature),
                "top_p": number(body, "top_p", 0, 1, low_open=True),
                "presence_penalty": number(body, "presence_penalty", -2, 2),
                "frequency_penalty": number(body, "frequency_penalty", -2, 2),
                "top_k": number(body, "top_k", 0, 2**31 - 1, integer=True),
                "min_p": number(body, "min_p", 0, 1),
                "repetition_penalty": number(body, "repetition_penalty", 0, math.inf, low_open=True)}
    seed = number(body, "seed", -(2**63), 2**64 - 1, integer=True)
    return {**{name: value for name, value in sampling.items() if value is not None},
            "seed": None if seed is None else seed % 2**64,
            "min_tokens": number(body, "min_tokens", 0, 2**31 - 1, integer=True),
            "end_id": -1 if boolean(body, "ignore_eos") else None}


__all__ = ["boolean", "json_body", "number", "sampling_fields"]
