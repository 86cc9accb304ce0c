"""What a request asks its answer to match: a `Guide` (type and text), parsed and checked here (size, depth,
JSON); `zerocheck.grammar` turns it into an llguidance grammar and compiles it.

Guide types are tensorrtllm_backend's `guided_decoding_guide_type` values (`json`: any JSON object,
`json_schema`, `regex`, `ebnf_grammar`) and two of vLLM's structured outputs (`lark`: a Lark grammar as
llguidance reads it, `choice`: a JSON array of strings, the answer being one of them).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from zerocheck.api.errors import InvalidRequest

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "lark", "choice")
GUIDE_TYPE_INPUT, GUIDE_INPUT = "guided_decoding_guide_type", "guided_decoding_guide"
MAX_GUIDE_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 64
MAX_CHOICES = 1024


class GuideError(InvalidRequest):
    """A guide the server cannot serve; the message names the input and what is wrong."""


@dataclass(frozen=True)
class Guide:
    """A checked guide: `kind` one of GUIDE_TYPES, `text` its source (the schema, regex, grammar or
    choices; for `json` empty)."""

    kind: str
    text: str = ""


def parse_guide(kind: str | bytes | None, text: str | bytes | None) -> Guide | None:
    """The guide of a request's `guided_decoding_guide_type` / `guided_decoding_guide` (None when neither is
    set); GuideError names the input for an unknown type, a missing or oversized guide, bad JSON."""
    kind, text = _decoded(GUIDE_TYPE_INPUT, kind), _decoded(GUIDE_INPUT, text)
    if not kind:
        if text:
            raise GuideError(f"{GUIDE_INPUT} needs {GUIDE_TYPE_INPUT} (one of {', '.join(GUIDE_TYPES)})")
        return None
    if kind not in GUIDE_TYPES:
        raise GuideError(f"{GUIDE_TYPE_INPUT} must be one of {', '.join(GUIDE_TYPES)}, got {kind!r}")
    if len(text.encode()) > MAX_GUIDE_BYTES:
        raise GuideError(f"{GUIDE_INPUT} must be at most {MAX_GUIDE_BYTES} bytes, got {len(text.encode())}")
    if kind == "json":
        return Guide("json", "")
    if not text.strip():
        raise GuideError(f"{GUIDE_INPUT} is required with {GUIDE_TYPE_INPUT} {kind!r}")
    if kind == "json_schema":
        schema = _json(text, "a JSON schema")
        if not isinstance(schema, (dict, bool)):
            raise GuideError(f"{GUIDE_INPUT}: a JSON schema must be an object, got {type(schema).__name__}")
        _check_depth(schema)
    if kind == "choice":
        choices = _json(text, "a JSON array of strings")
        if (not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES
                or not all(isinstance(c, str) and c for c in choices)):
            raise GuideError(f"{GUIDE_INPUT}: a choice guide must be a JSON array of 1 to {MAX_CHOICES} non-empty "
                             f"strings")
    return Guide(kind, text)


def _decoded(name: str, value: str | bytes | None) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as error:
            raise GuideError(f"{name} is not valid UTF-8 (byte {error.start})") from None
    return value


def _json(text: str, what: str):
    try:
        return json.loads(text)
    except RecursionError:
        raise GuideError(f"{GUIDE_INPUT} nests deeper than {MAX_SCHEMA_DEPTH} levels") from None
    except json.JSONDecodeError as error:
        raise GuideError(f"{GUIDE_INPUT} must be {what}: {error.msg} at character {error.pos}") from None


def _check_depth(value, depth: int = 0) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise GuideError(f"{GUIDE_INPUT} nests deeper than {MAX_SCHEMA_DEPTH} levels")
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    for child in children:
        _check_depth(child, depth + 1)
