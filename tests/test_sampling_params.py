"""SamplingParams validation: every bad value is refused with a message naming the field and range."""
from __future__ import annotations

import math

import pytest

from zerocheck.sampling import SamplingParamError, SamplingParams

BAD_VALUES = [  # (field, value, text the message must contain besides the field name)
    ("temperature", -0.1, "[0, inf)"), ("temperature", math.nan, "finite"), ("temperature", math.inf, "finite"),
    ("temperature", "0.7", "number"), ("temperature", True, "number"), ("temperature", None, "number"),
    ("top_k", -1, "[0, "), ("top_k", 1.5, "integer"), ("top_k", 2**31, "[0, "), ("top_k", math.nan, ""),
    ("top_p", 0.0, "(0, 1]"), ("top_p", 1.5, "(0, 1]"), ("top_p", -0.1, "(0, 1]"), ("top_p", math.nan, "finite"),
    ("top_p", math.inf, ""),
    ("min_p", -0.1, "[0, 1)"), ("min_p", 1.0, "[0, 1)"), ("min_p", math.nan, "finite"),
    ("repetition_penalty", 0.0, "(0, inf)"), ("repetition_penalty", -1.0, "(0, inf)"),
    ("repetition_penalty", math.inf, ""), ("repetition_penalty", math.nan, ""),
    ("presence_penalty", -2.1, "[-2, 2]"), ("presence_penalty", 2.1, "[-2, 2]"), ("presence_penalty", math.nan, ""),
    ("frequency_penalty", -2.1, "[-2, 2]"), ("frequency_penalty", 2.1, "[-2, 2]"), ("frequency_penalty", -math.inf, ""),
    ("bad_words", ((),), "1 to"), ("bad_words", ((-1,),), "non-negative"), ("bad_words", (("a",),), "non-negative"),
    ("bad_words", ((1.5,),), "non-negative"), ("bad_words", ((True,),), "non-negative"),
    ("bad_words", tuple((i,) for i in range(1025)), "at most"), ("bad_words", (tuple(range(65)),), "1 to"),
    ("seed", -1, "[0, "), ("seed", 2**64, "[0, "), ("seed", 1.5, "integer"), ("seed", True, "integer"),
    ("seed", "7", "integer"),
]


@pytest.mark.parametrize("field,value,text", BAD_VALUES, ids=[f"{f}={v!r}"[:40] for f, v, _ in BAD_VALUES])
def test_bad_value_is_refused_naming_the_field(field: str, value, text: str) -> None:
    with pytest.raises(SamplingParamError) as error:
        SamplingParams(**{field: value})
    assert field in str(error.value)
    assert text in str(error.value)
    assert isinstance(error.value, ValueError)


def test_message_format() -> None:
    with pytest.raises(SamplingParamError, match=r"^top_p must be in \(0, 1\], got 1\.5$"):
        SamplingParams(top_p=1.5)


GOOD_VALUES = [
    ("temperature", 0.0), ("temperature", 1e6), ("top_k", 0), ("top_k", 1), ("top_k", 2**31 - 1),
    ("top_p", 1.0), ("top_p", 1e-9), ("min_p", 0.0), ("min_p", 0.999), ("repetition_penalty", 1e-3),
    ("presence_penalty", -2.0), ("presence_penalty", 2.0), ("frequency_penalty", -2.0), ("frequency_penalty", 2),
    ("bad_words", ((0,), tuple(range(64)))), ("seed", 0), ("seed", 2**64 - 1), ("seed", None),
]


@pytest.mark.parametrize("field,value", GOOD_VALUES, ids=[f"{f}={v!r}"[:40] for f, v in GOOD_VALUES])
def test_boundary_values_are_accepted(field: str, value) -> None:
    params = SamplingParams(**{field: value})
    assert getattr(params, field) == value


def test_values_are_normalised() -> None:
    params = SamplingParams(temperature=1, top_k=5.0, bad_words=[[1, 2], [3]], seed=7)
    assert isinstance(params.temperature, float) and isinstance(params.top_k, int) and params.top_k == 5
    assert params.bad_words == ((1, 2), (3,))
    hash(params)  # frozen and hashable after normalisation


@pytest.mark.parametrize("params,greedy", [
    (SamplingParams(), False), (SamplingParams(temperature=0.0), True), (SamplingParams(top_k=1), True),
    (SamplingParams(top_k=2, temperature=0.0), True), (SamplingParams(top_p=1e-9), False),
])
def test_is_greedy(params: SamplingParams, greedy: bool) -> None:
    assert params.is_greedy is greedy


def test_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(SamplingParamError, match="unknown sampling parameter.*top_q"):
        SamplingParams.from_dict({"top_q": 0.5, "top_k": 3})
    assert SamplingParams.from_dict({"top_k": 3}) == SamplingParams(top_k=3)
