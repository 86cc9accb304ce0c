"""The tensors of one BLS call to a step ensemble (`zero_check_step` / `checked_step`).

Every array has the leading batch dimension of size 1 that the ensembles' `max_batch_size`
implies. History is sent only when penalties or bad words need it (the loop decides), so a plain
decode step moves a handful of scalars and one token id.
"""
from __future__ import annotations

import numpy as np

from zerocheck.generate.loop import ZERO_CHECK, StepCall
from zerocheck.sampling import SAMPLING_PARAMETERS
from zerocheck.serving.sampler_inputs import encode_word_list

STEP_MODELS = {ZERO_CHECK: "zero_check_step", "checked": "checked_step"}
_NUMPY_OF = {float: np.float32, int: np.int32}


def step_arrays(call: StepCall) -> dict[str, np.ndarray]:
    """name -> numpy array for one step of one sequence."""
    p = call.sampling
    arrays = {
        "sequence_id": np.array([[call.seq_id.encode()]], dtype=object),
        "input_ids": np.array([call.tokens], dtype=np.int32),
        "sequence_start": np.array([[call.start]], dtype=bool),
        "sequence_end": np.array([[call.end]], dtype=bool),
        "step": np.array([[call.step]], dtype=np.int32),
    }
    for spec in SAMPLING_PARAMETERS:
        value = getattr(p, spec.name)
        if value != spec.default:
            arrays[spec.name] = np.array([[value]], dtype=_NUMPY_OF[spec.kind])
    if p.seed is not None:
        arrays["random_seed"] = np.array([[p.seed]], dtype=np.uint64)
    if call.history is not None:
        arrays["history"] = np.array([call.history], dtype=np.int32)
    if p.bad_words:
        arrays["bad_words"] = encode_word_list(p.bad_words)
    if p.logit_bias:
        arrays["logit_bias_ids"] = np.array([[t for t, _ in p.logit_bias]], dtype=np.int32)
        arrays["logit_bias_values"] = np.array([[b for _, b in p.logit_bias]], dtype=np.float32)
    return arrays


def step_outputs(call: StepCall) -> list[str]:
    return ["output_id", "output_log_prob"] if call.path != ZERO_CHECK else ["output_id"]
