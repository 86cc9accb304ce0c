"""What a request asks its answer to match: a `Guide` (type and text), validated and turned into an
llguidance grammar here, before any model sees it.

Guide types are tensorrtllm_backend's `guided_decoding_guide_type` values (`json`: any JSON object,
`json_schema`, `regex`, `ebnf_grammar`) and two of vLLM's structured outputs (`lark`: a Lark grammar as
llguidance reads it, `choice`: a JSON array of strings, the answer being one of them).

JSON Schema features, per `json_schema_grammar`:
- enforced: everything llguidance compiles exactly (types, properties, required, additionalProperties,
  items / prefixItems, enum / const, anyOf / allOf, $ref / $defs, string length and pattern, number and
  array bounds, the formats llguidance knows: date-time, date, time, email, uuid, ...);
- not enforced, accepted: a `format` llguidance does not know (JSON Schema calls format an annotation:
  the answer is any string);
- approximated: `oneOf` whose branches may overlap is compiled as `anyOf` (an answer matching two
  branches passes);
- refused with INVALID_ARGUMENT naming the keys: keywords llguidance cannot enforce (`not`,
  `uniqueItems`, `if` / `then` / `else`, `dependentSchemas`, ...): a constraint silently dropped could let
  a wrong document through.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from zerocheck.api.errors import InvalidRequest

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar", "lark", "choice")
GUIDE_TYPE_INPUT, GUIDE_INPUT = "guided_decoding_guide_type", "guided_decoding_guide"
ANY_JSON_OBJECT = '{"type": "object"}'  # the `json` guide (OpenAI's json_object)
MAX_GUIDE_BYTES = 64 * 1024
MAX_SCHEMA_DEPTH = 64
MAX_CHOICES = 1024
# compact separators (llguidance's default): the fewest tokens; whitespace between tokens is not allowed
JSON_OPTIONS = {"whitespace_flexible": False}
_UNKNOWN_FORMAT = re.compile(r"^Unknown format: ")
_UNIMPLEMENTED = re.compile(r"^Unimplemented keys: ")


class GuideError(InvalidRequest):
    """A guide the server cannot serve; the message names the input and what is wrong."""


@dataclass(frozen=True)
class Guide:
    """A validated guide: `kind` one of GUIDE_TYPES, `text` its source (the schema, regex, grammar or
    choices; for `json` empty)."""

    kind: str
    text: str = ""

    def grammar(self) -> str:
        """The llguidance grammar (a JSON string) of this guide: GuideError when it cannot be served."""
        return grammar_of(self)


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


def grammar_of(guide: Guide) -> str:
    """The llguidance grammar of `guide` (not yet checked against a tokenizer: `GrammarCompiler` does)."""
    if guide.kind == "json":
        return json_schema_grammar(ANY_JSON_OBJECT)
    if guide.kind == "json_schema":
        return json_schema_grammar(guide.text)
    if guide.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(guide.text)
    if guide.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(guide.text)
    if guide.kind == "ebnf_grammar":
        try:
            return llguidance.LLMatcher.grammar_from_lark(any_to_lark(guide.text))
        except Exception as error:  # the converter raises its own parse errors
            raise GuideError(f"{GUIDE_INPUT}: not a GBNF / EBNF grammar: {error}") from None
    lark = "start: " + " | ".join(json.dumps(choice) for choice in json.loads(guide.text))
    return llguidance.LLMatcher.grammar_from_lark(lark)


def json_schema_grammar(schema: str) -> str:
    """The grammar of a JSON schema under the feature policy of the module docstring."""
    strict = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_OPTIONS)
    failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(strict)
    if not failed:
        return strict
    message = messages[0] if messages else "the schema does not compile"
    if _UNIMPLEMENTED.match(message):
        raise GuideError(f"{GUIDE_INPUT}: JSON schema keyword(s) not supported (they cannot be enforced): "
                         f"{_UNIMPLEMENTED.sub('', message)}")
    lenient = llguidance.LLMatcher.grammar_from_json_schema(
        schema, overrides={**JSON_OPTIONS, "lenient": True, "coerce_one_of": True})
    failed, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(lenient)
    unimplemented = [w for w in warnings if _UNIMPLEMENTED.match(w)]
    if failed or unimplemented:
        raise GuideError(f"{GUIDE_INPUT}: JSON schema not supported: "
                         f"{(warnings or unimplemented or [message])[0]}")
    return lenient


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
