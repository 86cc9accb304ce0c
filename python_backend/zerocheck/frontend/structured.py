"""Structured output of the OpenAI API -> the generate model's guide (`guided_decoding_guide_type`,
`guided_decoding_guide`).

Sources, at most one per request:
- `response_format`: `{type: "text"}` (none), `{type: "json_object"}` (guide `json`: any JSON object),
  `{type: "json_schema", json_schema: {name, schema, strict, description}}` (guide `json_schema`; the
  schema is enforced whether or not `strict` is set);
- vLLM's `structured_outputs` (the openai SDK sends it with `extra_body`), exactly one of `json` (a schema,
  as an object or a string), `regex`, `choice` (a list of strings), `grammar` (GBNF / EBNF or Lark, guide
  `ebnf_grammar`: llguidance's converter reads both), `json_object` (true);
- vLLM's older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar`;
- `tools` whose `tool_choice` is not "none" (tools.py builds that grammar).
A guide with `min_tokens` > 0 or `ignore_eos` is refused: a finished grammar allows only the end token.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping

from zerocheck.frontend.errors import invalid

STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object")
LEGACY_KEYS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
               "guided_grammar": "grammar"}
GUIDED_FIELDS = ("response_format", "structured_outputs", *LEGACY_KEYS)


@dataclass(frozen=True)
class Constraint:
    """A guide and the request field that asked for it (`param` of the server's refusals of it)."""

    guide_type: str
    guide: str | None
    param: str


def response_format_constraint(body: Mapping[str, Any]) -> Constraint | None:
    """`response_format` -> Constraint (None for text or absent); 400 naming response_format."""
    response_format = body.get("response_format")
    if response_format is None:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Constraint("json", None, "response_format")
    if kind != "json_schema":
        raise invalid("response_format must be {type: \"text\"}, {type: \"json_object\"} or "
                      "{type: \"json_schema\", json_schema: {name, schema}}", "response_format")
    spec = response_format.get("json_schema")
    if not isinstance(spec, dict):
        raise invalid("response_format.json_schema is required: {name, schema, strict, description}",
                      "response_format")
    name, schema = spec.get("name"), spec.get("schema")
    if not isinstance(name, str) or not name:
        raise invalid("response_format.json_schema.name is required (a string)", "response_format")
    if not isinstance(schema, dict):
        raise invalid("response_format.json_schema.schema is required (a JSON schema object)", "response_format")
    if spec.get("strict") is not None and not isinstance(spec.get("strict"), bool):
        raise invalid("response_format.json_schema.strict must be true or false", "response_format")
    return Constraint("json_schema", json.dumps(schema, ensure_ascii=False), "response_format")


def structured_outputs_constraint(body: Mapping[str, Any]) -> Constraint | None:
    """vLLM's `structured_outputs` -> Constraint (None when absent); 400 naming structured_outputs."""
    spec = body.get("structured_outputs")
    if spec is None:
        return None
    given = sorted(key for key, value in spec.items() if value not in (None, False)) if isinstance(spec, dict) \
        else None
    if given is None or len(given) != 1 or given[0] not in STRUCTURED_KEYS:
        raise invalid(f"structured_outputs must hold exactly one of {', '.join(STRUCTURED_KEYS)}, got "
                      f"{', '.join(given) if given else repr(spec)}", "structured_outputs")
    key = given[0]
    return _constraint(key, spec[key], f"structured_outputs.{key}", "structured_outputs")


def legacy_constraints(body: Mapping[str, Any]) -> list[Constraint]:
    """vLLM's older `guided_json`, `guided_regex`, `guided_choice`, `guided_grammar` -> Constraints."""
    return [_constraint(key, body[name], name, name) for name, key in LEGACY_KEYS.items()
            if body.get(name) is not None]


def _constraint(key: str, value: Any, where: str, param: str) -> Constraint:
    if key == "json_object":
        if value is not True:
            raise invalid(f"{where} must be true", param)
        return Constraint("json", None, param)
    if key == "json":
        schema = value
        if isinstance(value, str):
            try:
                schema = json.loads(value)
            except (ValueError, RecursionError):
                raise invalid(f"{where} must be a JSON schema (an object, or a string holding one)", param) from None
        if not isinstance(schema, dict):
            raise invalid(f"{where} must be a JSON schema (an object, or a string holding one)", param)
        return Constraint("json_schema", json.dumps(schema, ensure_ascii=False), param)
    if key == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise invalid(f"{where} must be a non-empty list of non-empty strings", param)
        return Constraint("choice", json.dumps(value, ensure_ascii=False), param)
    if not isinstance(value, str) or not value.strip():
        raise invalid(f"{where} must be a non-empty string", param)
    return Constraint("regex" if key == "regex" else "ebnf_grammar", value, param)


def one_constraint(constraints: list[Constraint]) -> Constraint | None:
    """The request's one constraint; 400 naming the second source when there are several."""
    if len(constraints) > 1:
        first, second = constraints[0].param, constraints[1].param
        raise invalid(f"{first} and {second} both constrain the answer; send one of them", second)
    return constraints[0] if constraints else None


def check_guided_sampling(body: Mapping[str, Any], constraint: Constraint | None) -> None:
    """A constrained answer ends when its grammar does: refuse min_tokens > 0 and ignore_eos with it."""
    if constraint is None:
        return
    if body.get("min_tokens"):
        raise invalid(f"min_tokens cannot be used with {constraint.param}: a finished grammar allows only the end "
                      f"token", "min_tokens")
    if body.get("ignore_eos"):
        raise invalid(f"ignore_eos cannot be used with {constraint.param}: a finished grammar allows only the end "
                      f"token", "ignore_eos")


__all__ = ["Constraint", "GUIDED_FIELDS", "check_guided_sampling", "legacy_constraints", "one_constraint",
           "response_format_constraint", "structured_outputs_constraint"]
