"""The step wire without Triton (zerocheck.wire.step): what `generate` sends is what the decoder parses,
row by row; a sequence registers its sampling once and later steps carry only ids; the sampler columns
the decoder exports to the checked chain parse back; per-row errors round-trip."""
from __future__ import annotations

import numpy as np
import pytest

from zerocheck.api.errors import InternalError, InvalidRequest, Overloaded
from zerocheck.api.request import decode_word_list
from zerocheck.api.sampler_path import SamplerPath
from zerocheck.sampling import SamplingParams
from zerocheck.wire.sampling import SamplerRow, encode_word_lists, parse_sampler_rows, sampler_arrays, unpadded
from zerocheck.wire.step import (Registration, StepCall, StepOutput, parse_step, release_arrays, row_error,
                                 row_error_text, step_arrays, step_results)

V = 600


def call(seq_id: str, tokens: list[int], registration: Registration | None = None) -> StepCall:
    return StepCall(seq_id, tokens, registration is not None, False, registration, SamplerPath.ZERO_CHECK, False)


CALLS = [
    call("a", [1, 2, 3, 4], Registration(SamplingParams(temperature=0.75, top_k=50, top_p=0.875, seed=11))),
    call("b", [9]),
    call("c", [5, 6], Registration(SamplingParams(seed=2**64 - 1, repetition_penalty=1.25, bad_words=((4, 5), (6,)),
                                                  logit_bias=((3, 1.5), (7, -2.0))), min_tokens=3, end_ids=(2, 0),
                                   prompt_length=9)),
]


def test_start_rows_parse_back_to_the_same_registration():
    arrays = step_arrays(CALLS)
    assert arrays["input_ids"].tolist() == [[1, 2, 3, 4], [9, -1, -1, -1], [5, 6, -1, -1]]
    rows = parse_step(arrays, V)
    assert [(r.seq_id, r.tokens, r.start) for r in rows] == [(c.seq_id, c.tokens, c.start) for c in CALLS]
    assert rows[0].registration == CALLS[0].registration
    assert rows[1].registration is None
    assert rows[2].registration == CALLS[2].registration


def test_decode_steps_carry_only_ids_and_flags():
    decode = step_arrays([call("a", [1]), call("b", [2])])
    assert set(decode) == {"sequence_id", "input_ids", "sequence_start", "sequence_end"}
    plain = step_arrays([call("a", [1, 2], Registration(SamplingParams(seed=1), prompt_length=2))])
    assert set(plain) == {"sequence_id", "input_ids", "sequence_start", "sequence_end", "random_seed"}
    assert {"min_tokens", "end_ids", "prompt_length", "bad_words", "temperature"} <= set(step_arrays(CALLS))


def test_word_lists_pad_each_row():
    rows = [((4, 5), (6,)), (), ((1, 2, 3),)]
    array = encode_word_lists(rows)
    assert array.shape == (3, 2, 3)
    assert [decode_word_list("bad_words", array[r]) for r in range(3)] == [tuple(map(tuple, r)) for r in rows]


def test_a_bad_registration_names_its_row():
    arrays = step_arrays(CALLS)
    arrays["logit_bias_ids"][2, 0] = 5000
    with pytest.raises(InvalidRequest, match=r"logit_bias_ids must hold token ids in \[0, 600\), got 5000"):
        parse_step(arrays, V)
    arrays = step_arrays(CALLS)
    arrays["top_p"][2, 0] = 2.0
    with pytest.raises(InvalidRequest, match=r"row 2: top_p must be in \(0, 1\]"):
        parse_step(arrays, V)
    arrays = step_arrays(CALLS)
    arrays["top_p"][1, 0] = 2.0  # a row that does not start: its registration inputs are not read
    assert parse_step(arrays, V)[1].registration is None


def test_exported_sampler_columns_parse_back():
    rows = [SamplerRow(CALLS[0].registration.params, [], 0), SamplerRow(CALLS[2].registration.params, [5, 6, 9], 4)]
    back = parse_sampler_rows(sampler_arrays(rows), 2, V)
    assert back == rows


@pytest.mark.parametrize("error", [InvalidRequest("sequence 'x' holds no KV cache slot"),
                                   Overloaded("KV cache pool full: 4/4 slots in use; retry later"),
                                   InternalError("internal error (InjectedFault); see the server log")])
def test_row_errors_round_trip_with_their_kind(error):
    back = row_error(row_error_text(error).encode())
    assert type(back) is type(error) and str(back) == str(error)
    assert row_error(b"") is None and row_error_text(None) == ""


def test_an_unexpected_row_error_is_named_by_its_type_only():
    text = row_error_text(KeyError("secret detail"))
    assert text == "INTERNAL: internal error (KeyError); see the server log"


def test_step_results_per_row():
    outputs = {"output_ids": np.array([[5, -1, -1], [0, -1, -1], [7, 8, 9]], np.int32),
               "error": np.array([[b""], [row_error_text(Overloaded("full")).encode()], [b""]], dtype=object)}
    results = step_results(SamplerPath.ZERO_CHECK, outputs, 3)
    assert results[0] == StepOutput(5) and results[2] == StepOutput(7, more=(8, 9))
    assert isinstance(results[1], Overloaded) and str(results[1]) == "full"


def test_decode_steps_go_only_when_a_row_asks_for_more_than_one():
    one = step_arrays([call("a", [1]), call("b", [2])])
    assert "decode_steps" not in one and [r.steps for r in parse_step(one, V)] == [1, 1]
    calls = [StepCall("a", [1], False, False, None, SamplerPath.ZERO_CHECK, False, steps=4), call("b", [2])]
    arrays = step_arrays(calls)
    assert [r.steps for r in parse_step(arrays, V)] == [4, 1]
    arrays["decode_steps"][1, 0] = 0
    with pytest.raises(InvalidRequest, match=r"row 1: decode_steps must be in \[1, 64\], got 0"):
        parse_step(arrays, V)


def test_end_ids_register_without_min_tokens():
    """A multi-step row stops at its end ids, so they are registered whenever a sequence has some."""
    arrays = step_arrays([call("a", [1, 2], Registration(SamplingParams(), end_ids=(2, 0)))])
    assert "min_tokens" not in arrays
    assert parse_step(arrays, V)[0].registration == Registration(SamplingParams(), 0, (2, 0), 0)


def test_release_rows_hold_no_tokens():
    arrays = release_arrays(["a", "b"])
    assert [unpadded(row).tolist() for row in arrays["input_ids"]] == [[], []]
    assert arrays["sequence_end"].reshape(-1).tolist() == [True, True]


def test_a_prompt_length_shorter_than_the_first_step_is_refused():
    arrays = step_arrays([call("a", [1, 2, 3], Registration(SamplingParams(), prompt_length=5))])
    arrays["prompt_length"][0, 0] = 2
    with pytest.raises(InvalidRequest, match="prompt_length must be 0 or at least the first step's 3 tokens, got 2"):
        parse_step(arrays, V)


def test_an_unseeded_row_beside_seeded_ones_gets_its_own_seed():
    arrays = step_arrays([call("a", [1], Registration(SamplingParams(seed=7))),
                          call("b", [2], Registration(SamplingParams())), call("c", [3], Registration(SamplingParams()))])
    seeds = arrays["random_seed"].reshape(-1).tolist()
    assert seeds[0] == 7 and len(set(seeds)) == 3
