"""A `Guide` (`zerocheck.api.guide`) as an llguidance grammar.

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

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

from zerocheck.api.guide import GUIDE_INPUT, Guide, GuideError

ANY_JSON_OBJECT = '{"type": "object"}'  # the `json` guide (OpenAI's json_object)
# compact separators (llguidance's default): the fewest tokens; whitespace between tokens is not allowed
JSON_OPTIONS = {"whitespace_flexible": False}
# the fallback for schemas the strict options refuse: unknown formats accepted, oneOf compiled as anyOf
LENIENT_JSON_OPTIONS = {**JSON_OPTIONS, "lenient": True, "coerce_one_of": True}
_UNIMPLEMENTED = re.compile(r"^Unimplemented keys: ")


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
    lenient = llguidance.LLMatcher.grammar_from_json_schema(schema, overrides=LENIENT_JSON_OPTIONS)
    failed, warnings = llguidance.LLMatcher.validate_grammar_with_warnings(lenient)
    unimplemented = [w for w in warnings if _UNIMPLEMENTED.match(w)]
    if failed or unimplemented:
        raise GuideError(f"{GUIDE_INPUT}: JSON schema not supported: "
                         f"{(warnings or [message])[0]}")
    return lenient
