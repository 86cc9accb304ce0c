"""Typed, validated sampling parameters: one table drives parsing everywhere.

`SAMPLING_PARAMETERS` lists every per-request knob (name, type, default, allowed range). The Triton
models, the clients and the CLI flags are all built from it, and scripts/docs_reference.py generates
the parameter table of docs/reference/sampling-parameters.md from it, so a range is written down once.
`SamplingParams` validates itself on construction and raises `SamplingParamError` (a `ValueError`)
whose message names the field and the allowed range.
"""
from __future__ import annotations

import math
import numbers
import os
from dataclasses import dataclass, field, fields
from typing import Any, Sequence

from zerocheck.api.errors import InvalidRequest

UINT64_MAX = 2**64 - 1


def fresh_seed() -> int:
    """A fresh 64-bit seed for what arrives unseeded: fresh randomness, reproducible from then on."""
    return int.from_bytes(os.urandom(8), "little")


class SamplingParamError(InvalidRequest):
    """A request parameter is out of range or of the wrong type; the message is client-readable."""


@dataclass(frozen=True)
class ParamSpec:
    """One scalar sampling knob: its type, default and allowed interval."""

    name: str
    kind: type  # float or int
    default: Any
    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    doc: str = ""

    def interval(self) -> str:
        left = "(" if self.low_open else "["
        right = ")" if self.high_open else "]"
        high = "inf" if math.isinf(self.high) else f"{self.high:g}"
        return f"{left}{self.low:g}, {high}{right}"

    def check(self, value: Any) -> Any:
        """Return `value` converted to `kind`, or raise `SamplingParamError` naming the field."""
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise SamplingParamError(f"{self.name} must be a number, got {value!r}")
        value = float(value)
        if self.kind is int and not value.is_integer():
            raise SamplingParamError(f"{self.name} must be an integer, got {value!r}")
        if math.isnan(value) or math.isinf(value):
            raise SamplingParamError(f"{self.name} must be finite, got {value!r}")
        too_low = value <= self.low if self.low_open else value < self.low
        too_high = value >= self.high if self.high_open else value > self.high
        if too_low or too_high:
            raise SamplingParamError(f"{self.name} must be in {self.interval()}, got {value!r}")
        return self.kind(value)


SAMPLING_PARAMETERS: tuple[ParamSpec, ...] = (
    ParamSpec("temperature", float, 1.0, 0.0, math.inf, high_open=True,
              doc="softmax temperature; 0 means greedy (argmax)"),
    ParamSpec("top_k", int, 0, 0, 2**31 - 1, doc="keep the k most likely tokens; 0 disables"),
    ParamSpec("top_p", float, 1.0, 0.0, 1.0, low_open=True,
              doc="keep the smallest set of top tokens whose probability reaches top_p; 1 disables"),
    ParamSpec("min_p", float, 0.0, 0.0, 1.0, high_open=True,
              doc="drop tokens whose probability is below min_p times the top token's"),
    ParamSpec("repetition_penalty", float, 1.0, 0.0, math.inf, low_open=True, high_open=True,
              doc="CTRL penalty on tokens in the history: divide positive logits, multiply negative ones"),
    ParamSpec("presence_penalty", float, 0.0, -2.0, 2.0,
              doc="OpenAI presence penalty: subtract once from every token in the history"),
    ParamSpec("frequency_penalty", float, 0.0, -2.0, 2.0,
              doc="OpenAI frequency penalty: subtract once per occurrence in the history"),
)
PARAMETERS_BY_NAME = {spec.name: spec for spec in SAMPLING_PARAMETERS}
MAX_BAD_WORDS = 1024
MAX_BAD_WORD_TOKENS = 64
MAX_LOGIT_BIAS = 1024


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters of one request; validated on construction.

    `logit_bias` is (token id, bias) pairs added to the logits before penalties (OpenAI's
    `logit_bias`, TensorRT-LLM's `embedding_bias`). `bad_words` are token-id sequences: the last token of a sequence is banned when the sequence's
    prefix equals the tail of the history (a one-token sequence is always banned). `seed` makes the
    draw a deterministic function of (seed, step, logits), whatever the batch position.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    bad_words: tuple[tuple[int, ...], ...] = field(default=())
    logit_bias: tuple[tuple[int, float], ...] = field(default=())
    seed: int | None = None

    def __post_init__(self) -> None:
        for spec in SAMPLING_PARAMETERS:
            object.__setattr__(self, spec.name, spec.check(getattr(self, spec.name)))
        object.__setattr__(self, "bad_words", _check_bad_words(self.bad_words))
        object.__setattr__(self, "logit_bias", _check_logit_bias(self.logit_bias))
        if self.seed is not None:
            if (isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral)
                    or not 0 <= self.seed <= UINT64_MAX):
                raise SamplingParamError(f"seed must be an integer in [0, {UINT64_MAX}], got {self.seed!r}")
            object.__setattr__(self, "seed", int(self.seed))

    @property
    def is_greedy(self) -> bool:
        """T=0 or top_k=1: the draw is the argmax, with no noise."""
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "SamplingParams":
        """Build from a mapping; unknown keys are an error naming them."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SamplingParamError(f"unknown sampling parameter(s): {', '.join(unknown)}")
        return cls(**values)


def _check_bad_words(bad_words: Sequence[Sequence[int]]) -> tuple[tuple[int, ...], ...]:
    if len(bad_words) > MAX_BAD_WORDS:
        raise SamplingParamError(f"bad_words must hold at most {MAX_BAD_WORDS} sequences, got {len(bad_words)}")
    checked = []
    for word in bad_words:
        word = tuple(word)
        if not 1 <= len(word) <= MAX_BAD_WORD_TOKENS:
            raise SamplingParamError(
                f"each bad_words sequence must have 1 to {MAX_BAD_WORD_TOKENS} tokens, got {len(word)}")
        if any(isinstance(t, bool) or not isinstance(t, numbers.Integral) or t < 0 for t in word):
            raise SamplingParamError(f"bad_words token ids must be non-negative integers, got {word!r}")
        checked.append(tuple(int(t) for t in word))
    return tuple(checked)


def _check_logit_bias(logit_bias: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    if len(logit_bias) > MAX_LOGIT_BIAS:
        raise SamplingParamError(f"logit_bias must hold at most {MAX_LOGIT_BIAS} entries, got {len(logit_bias)}")
    checked = {}
    for token, bias in logit_bias:
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
            raise SamplingParamError(f"logit_bias token ids must be non-negative integers, got {token!r}")
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or not math.isfinite(bias):
            raise SamplingParamError(f"logit_bias values must be finite numbers, got {bias!r}")
        checked[int(token)] = checked.get(int(token), 0.0) + float(bias)
    return tuple(sorted(checked.items()))
