"""The tensors of one batched BLS step call (`decoder` on the zero-check path, `checked_step` on the
checked one), and of a KV-slot release to `decoder`.

Row r of every array is the r-th sequence of the step. Ragged id rows (the prompt of a sequence that
just arrived beside one token of the others, histories, logit-bias ids) are padded at the end with
-1. Optional inputs are sent only when some row needs them (a sampling knob off its default,
history for penalties or bad words), so a plain decode step moves a handful of scalars per row.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from zerocheck.generate.sequence import CHECKED, ZERO_CHECK, StepCall, StepOutput
from zerocheck.sampling import SAMPLING_PARAMETERS
from zerocheck.serving.row_errors import row_error
from zerocheck.serving.sampler_inputs import PAD, encode_word_lists

# per path: the model one batched step calls, and its outputs (token, row error[, log-probability]). The
# zero-check path calls `decoder` itself (its sampler is fused after the forward; the one-step ensemble
# `zero_check_step` would only add a hop), the checked path the ensemble decoder -> check layer.
STEP_MODELS = {ZERO_CHECK: "decoder", CHECKED: "checked_step"}
STEP_OUTPUTS = {ZERO_CHECK: ["output_id", "error"],
                CHECKED: ["output_id", "decoder_error", "output_log_prob", "top_ids", "top_log_probs"]}
_NUMPY_OF = {float: np.float32, int: np.int32}


def padded(rows: Sequence[Sequence[float]], dtype: type, fill: float = PAD) -> np.ndarray:
    """Ragged rows -> [R, max length] (at least 1 column), padded at the end with `fill`."""
    array = np.full((len(rows), max([len(row) for row in rows] + [1])), fill, dtype=dtype)
    for r, row in enumerate(rows):
        array[r, :len(row)] = row
    return array


def column(values: Sequence, dtype: type) -> np.ndarray:
    """One value per row -> [R, 1]."""
    return np.array(values, dtype=dtype).reshape(-1, 1)


def step_arrays(calls: Sequence[StepCall]) -> dict[str, np.ndarray]:
    """name -> numpy array for one batched step; row r is calls[r]."""
    params = [call.sampling for call in calls]
    arrays = {
        "sequence_id": column([call.seq_id.encode() for call in calls], object),
        "input_ids": padded([call.tokens for call in calls], np.int32),
        "sequence_start": column([call.start for call in calls], bool),
        "sequence_end": column([call.end for call in calls], bool),
        "step": column([call.step for call in calls], np.int32),
    }
    for spec in SAMPLING_PARAMETERS:
        values = [getattr(p, spec.name) for p in params]
        if any(value != spec.default for value in values):
            arrays[spec.name] = column(values, _NUMPY_OF[spec.kind])
    if any(p.seed is not None for p in params):
        arrays["random_seed"] = column([p.seed for p in params], np.uint64)
    if any(call.history is not None for call in calls):
        arrays["history"] = padded([call.history or [] for call in calls], np.int32)
    if any(p.bad_words for p in params):
        arrays["bad_words"] = encode_word_lists([p.bad_words for p in params])
    if any(p.logit_bias for p in params):
        arrays["logit_bias_ids"] = padded([[t for t, _ in p.logit_bias] for p in params], np.int32)
        arrays["logit_bias_values"] = padded([[b for _, b in p.logit_bias] for p in params], np.float32, 0.0)
    return arrays


def step_results(path: str, outputs: dict[str, np.ndarray], rows: int) -> list[StepOutput | Exception]:
    """Per row, the sampled token (and log-probability), or the error the decoder reported for it."""
    token_name, error_name = STEP_OUTPUTS[path][:2]
    tokens = outputs[token_name].reshape(-1).tolist()
    errors = outputs[error_name].reshape(-1).tolist()
    log_probs = outputs["output_log_prob"].reshape(-1).tolist() if "output_log_prob" in outputs else [None] * rows
    tops = [tuple(zip(ids, lps)) for ids, lps in zip(outputs["top_ids"].reshape(rows, -1).tolist(),
                                                     outputs["top_log_probs"].reshape(rows, -1).tolist())] \
        if "top_ids" in outputs else [()] * rows
    return [row_error(error) or StepOutput(token, log_prob, top)
            for token, error, log_prob, top in zip(tokens, errors, log_probs, tops)]


def release_arrays(seq_ids: Sequence[str]) -> dict[str, np.ndarray]:
    """A `decoder` request that only frees the KV slots of `seq_ids` (rows with no tokens, sequence_end)."""
    return {"sequence_id": column([seq_id.encode() for seq_id in seq_ids], object),
            "input_ids": np.full((len(seq_ids), 1), PAD, np.int32),
            "sequence_start": column([False] * len(seq_ids), bool),
            "sequence_end": column([True] * len(seq_ids), bool)}
