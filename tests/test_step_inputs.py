"""The batched step's wire format without Triton: what `generate` sends (step_inputs) is what the
sampler and decoder models parse (sampler_inputs), row by row; per-row errors round-trip."""
from __future__ import annotations

import numpy as np
import pytest

from zerocheck.generate.sequence import ZERO_CHECK, StepCall, StepOutput
from zerocheck.generate.step_inputs import release_arrays, step_arrays, step_results
from zerocheck.sampling import SamplingParams
from zerocheck.api.errors import InternalError, InvalidRequest, Overloaded
from zerocheck.serving.row_errors import row_error, row_error_text
from zerocheck.serving.inputs import decode_word_list
from zerocheck.serving.sampler_inputs import encode_word_lists, parse_sampler_rows, unpadded

V = 600


class FakeTensor:
    """The two methods of a pb_utils.Tensor the parsers use."""

    def __init__(self, name: str, array: np.ndarray) -> None:
        self._name, self._array = name, array

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array


def present(arrays: dict[str, np.ndarray]) -> dict[str, FakeTensor]:
    return {name: FakeTensor(name, array) for name, array in arrays.items()}


def call(seq_id: str, tokens: list[int], sampling: SamplingParams, history=None, step=0) -> StepCall:
    return StepCall(seq_id, tokens, step == 0, False, sampling, history, step, ZERO_CHECK, False)


CALLS = [
    call("a", [1, 2, 3, 4], SamplingParams(temperature=0.75, top_k=50, top_p=0.875, seed=11)),
    call("b", [9], SamplingParams(repetition_penalty=1.25, seed=12, bad_words=((4, 5), (6,))), history=[1, 2, 9], step=7),
    call("c", [8], SamplingParams(seed=2**64 - 1, logit_bias=((3, 1.5), (7, -2.0))), history=[8], step=3),
]


def test_step_rows_parse_back_to_the_same_params_history_and_steps():
    arrays = step_arrays(CALLS)
    assert arrays["input_ids"].tolist() == [[1, 2, 3, 4], [9, -1, -1, -1], [8, -1, -1, -1]]
    assert arrays["sequence_start"].reshape(-1).tolist() == [True, False, False]
    rows = parse_sampler_rows(present(arrays), 3, V)
    assert [r.params for r in rows] == [c.sampling for c in CALLS]
    assert [r.history for r in rows] == [[], [1, 2, 9], [8]]
    assert [r.step for r in rows] == [0, 7, 3]
    assert [unpadded(row).tolist() for row in arrays["input_ids"]] == [c.tokens for c in CALLS]


def test_optional_inputs_are_sent_only_when_a_row_needs_them():
    plain = step_arrays([call("a", [1], SamplingParams(seed=1)), call("b", [2], SamplingParams(seed=2))])
    assert set(plain) == {"sequence_id", "input_ids", "sequence_start", "sequence_end", "step", "random_seed"}
    assert "history" in step_arrays(CALLS) and "temperature" in step_arrays(CALLS)


def test_word_lists_pad_each_row():
    rows = [((4, 5), (6,)), (), ((1, 2, 3),)]
    array = encode_word_lists(rows)
    assert array.shape == (3, 2, 3)
    assert [decode_word_list("bad_words", array[r]) for r in range(3)] == [tuple(map(tuple, r)) for r in rows]


def test_a_bad_row_names_its_row():
    arrays = step_arrays(CALLS)
    arrays["history"][2, 0] = 5000
    with pytest.raises(InvalidRequest, match=r"history must hold token ids in \[0, 600\), got 5000"):
        parse_sampler_rows(present(arrays), 3, V)
    arrays = step_arrays(CALLS)
    arrays["top_p"][1, 0] = 2.0
    with pytest.raises(InvalidRequest, match=r"row 1: top_p must be in \(0, 1\]"):
        parse_sampler_rows(present(arrays), 3, V)


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
    outputs = {"output_id": np.array([[5], [0], [7]], np.int32),
               "error": np.array([[b""], [row_error_text(Overloaded("full")).encode()], [b""]], dtype=object)}
    results = step_results(ZERO_CHECK, outputs, 3)
    assert results[0] == StepOutput(5) and results[2] == StepOutput(7)
    assert isinstance(results[1], Overloaded) and str(results[1]) == "full"


def test_release_rows_hold_no_tokens():
    arrays = release_arrays(["a", "b"])
    assert [unpadded(row).tolist() for row in arrays["input_ids"]] == [[], []]
    assert arrays["sequence_end"].reshape(-1).tolist() == [True, True]
