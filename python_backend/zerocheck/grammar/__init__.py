"""Structured output: guides (JSON schema, regex, grammars) compiled with llguidance into per-token masks
that the samplers apply (`zerocheck.sampling`'s token bitmask)."""
from zerocheck.grammar.compiler import GrammarCompiler, GrammarMatcher, bitmask_words
from zerocheck.api.guide import GUIDE_INPUT, GUIDE_TYPE_INPUT, GUIDE_TYPES, Guide, GuideError, parse_guide

__all__ = ["GUIDE_INPUT", "GUIDE_TYPE_INPUT", "GUIDE_TYPES", "GrammarCompiler", "GrammarMatcher", "Guide",
           "GuideError", "bitmask_words", "parse_guide"]
