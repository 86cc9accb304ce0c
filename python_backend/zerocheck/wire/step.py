"""The step wire: the tensors of one batched decode step from `generate` to its step model (`decoder`
on the zero-check path, the `checked_step` ensemble on the checked one), and of a KV-slot release,
encoded (`step_arrays`, `release_arrays`, `step_results`: generate's side) and decoded
(`parse_step`, `row_error_text`: the decoder's side) here, with the tensor table the configs follow
(tests/test_model_repository.py fails when a config disagrees).

Row r of every tensor is the r-th sequence of the step; ragged id rows are padded at their end with -1.
- Every step: `sequence_id` BYTES, `input_ids` INT32 [R, N] (a prompt chunk until the prompt is in,
  then the last sampled token; none with `sequence_end` only frees the slot), `sequence_start` and
  `sequence_end` BOOL.
- A sequence registers how it samples with its first step (a `sequence_start` row): the knobs of
  SAMPLING_PARAMETERS, `random_seed`, `bad_words`, `logit_bias_ids` / `logit_bias_values` (the sampler
  models' columns), `min_tokens` with the `end_ids` it bans until then, and `prompt_length` (default:
  the start row's tokens, the whole prompt in one step), and a guide: `guided_decoding_guide_type` /
  `guided_decoding_guide` BYTES (`zerocheck.grammar`: the answer must match it). The decoder keeps them, and
  the history that
  penalties and bad words read, with the sequence's KV slot; on other rows these inputs are not read.
  Each is sent only when some starting row of the step sets it off its default (`end_ids` whenever a
  starting row has any: a multi-step row stops at them), so a decode step carries ids and flags alone.
- Multi-step: `decode_steps` INT32 (optional, default 1) asks the zero-check path for up to that many tokens
  of a row in one call: the decoder samples, feeds the token back and steps again in its own process,
  stopping the row early at one of its registered `end_ids`; `sequence_end` then applies after the row's
  last step. A request for `logits` (the checked chain samples elsewhere) takes only 1.
- Outputs: `output_id` INT32 (the zero-check sampler's token; -1 while the prompt is still going in),
  `output_ids` INT32 [R, K] (every token a row sampled in the call, in order, padded with -1),
  `error` BYTES ("" or "<CODE>: <message>": a row fails alone), `logits` FP32 [R, V] and, for the checked
  chain, every sampler input (SAMPLER_INPUTS) of each row as registered, with its history and step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from zerocheck.api.errors import ErrorCode, InvalidRequest, ServingError, coded_message, error_from_message
from zerocheck.api.sampler_path import SamplerPath
from zerocheck.api.guide import GUIDE_INPUT, GUIDE_TYPE_INPUT, Guide, parse_guide
from zerocheck.sampling.params import SamplingParams, fresh_seed
from zerocheck.wire.sampling import (BAD_WORDS_INPUT, BIAS_INPUTS, KNOB_INPUTS, PAD, SAMPLER_INPUTS, SEED_INPUT,
                                     TensorSpec, column, encode_word_lists, id_rows, padded, parse_sampling,
                                     scalar_column, unpadded, with_row)

STEP_INPUTS = (TensorSpec("sequence_id", "TYPE_STRING"), TensorSpec("input_ids", "TYPE_INT32", (-1,), ragged=True),
               TensorSpec("sequence_start", "TYPE_BOOL"), TensorSpec("sequence_end", "TYPE_BOOL"))
MIN_TOKENS_INPUT = TensorSpec("min_tokens", "TYPE_INT32", optional=True)
END_IDS_INPUT = TensorSpec("end_ids", "TYPE_INT32", (-1,), optional=True, ragged=True)
PROMPT_LENGTH_INPUT = TensorSpec("prompt_length", "TYPE_INT32", optional=True)
DECODE_STEPS_INPUT = TensorSpec("decode_steps", "TYPE_INT32", optional=True)
GUIDE_INPUTS = (TensorSpec(GUIDE_TYPE_INPUT, "TYPE_STRING", optional=True),
                TensorSpec(GUIDE_INPUT, "TYPE_STRING", optional=True))
REGISTRATION_INPUTS = (*KNOB_INPUTS, SEED_INPUT, BAD_WORDS_INPUT, *BIAS_INPUTS, MIN_TOKENS_INPUT, END_IDS_INPUT,
                       PROMPT_LENGTH_INPUT, *GUIDE_INPUTS)
DECODER_INPUTS = STEP_INPUTS + REGISTRATION_INPUTS + (DECODE_STEPS_INPUT,)  # also zero_check_step's inputs
CHECKED_STEP_INPUTS = STEP_INPUTS + REGISTRATION_INPUTS  # its chain samples one token a call
DECODER_OUTPUTS = (TensorSpec("logits", "TYPE_FP32", (-1,)), TensorSpec("output_id", "TYPE_INT32"),
                   TensorSpec("output_ids", "TYPE_INT32", (-1,)), TensorSpec("error", "TYPE_STRING"),
                   *(spec.as_output() for spec in SAMPLER_INPUTS))
MAX_END_IDS = 64
MAX_DECODE_STEPS = 64

# per path: the model one batched step calls, and its outputs (token, row error[, log-probability]). The
# zero-check path calls `decoder` itself (its sampler is fused after the forward; the one-step ensemble
# `zero_check_step` would only add a hop), the checked path the ensemble decoder -> check layer.
STEP_MODELS = {SamplerPath.ZERO_CHECK: "decoder", SamplerPath.CHECKED: "checked_step"}
STEP_OUTPUTS = {SamplerPath.ZERO_CHECK: ["output_ids", "error"],
                SamplerPath.CHECKED: ["output_id", "decoder_error", "output_log_prob", "top_ids", "top_log_probs"]}


@dataclass(frozen=True)
class Registration:
    """How a sequence samples, for its whole life: sent with its first step, kept by the decoder.
    min_tokens: `end_ids` are banned until this many tokens were sampled. prompt_length: prompt tokens
    (the first step may carry only a chunk of them); 0: the first step's tokens. guide: what the answer
    must match (every draw is masked to the tokens it allows)."""

    params: SamplingParams
    min_tokens: int = 0
    end_ids: tuple[int, ...] = ()
    prompt_length: int = 0
    guide: Guide | None = None


@dataclass(frozen=True)
class StepCall:
    """One sequence's row of a step, as `generate` sends it. tokens: the prompt (or its next chunk) until
    it is in, then the last token; registration: on the sequence's first step only; steps: tokens to
    sample in this call (zero-check path; `decode_steps`)."""

    seq_id: str
    tokens: list[int]
    start: bool
    end: bool
    registration: Registration | None
    path: SamplerPath
    want_log_prob: bool
    steps: int = 1


TopLogProbs = tuple[tuple[int, float], ...]  # the most likely tokens of one step: (token id, log-probability)


@dataclass(frozen=True)
class StepOutput:
    token: int
    log_prob: float | None = None
    top: TopLogProbs = ()  # the checked path's most likely alternatives, best first
    more: tuple[int, ...] = ()  # a multi-step row's tokens after `token`, in order


@dataclass
class StepRow:
    """One row of a step, as the decoder reads it."""

    seq_id: str
    tokens: list[int]
    start: bool
    end: bool
    registration: Registration | None = None  # on start rows
    steps: int = 1  # tokens to sample in this call (`decode_steps`)


# -- generate's side ---------------------------------------------------------------------------------

def step_arrays(calls: Sequence[StepCall]) -> dict[str, np.ndarray]:
    """name -> numpy array for one batched step; row r is calls[r]."""
    arrays = {"sequence_id": column([call.seq_id.encode() for call in calls], object),
              "input_ids": padded([call.tokens for call in calls], np.int32),
              "sequence_start": column([call.start for call in calls], bool),
              "sequence_end": column([call.end for call in calls], bool)}
    if any(call.steps != 1 for call in calls):
        arrays["decode_steps"] = column([call.steps for call in calls], np.int32)
    registrations = [call.registration for call in calls]
    if any(registrations):
        arrays.update(registration_arrays(registrations, [len(call.tokens) for call in calls]))
    return arrays


def registration_arrays(registrations: Sequence[Registration | None], sent: Sequence[int]) -> dict[str, np.ndarray]:
    """The registration inputs some row sets off its default (rows without one: defaults, not read).
    sent: each row's token count (a prompt_length equal to it need not be sent)."""
    blank = Registration(SamplingParams())
    rows = [registration or blank for registration in registrations]
    params = [row.params for row in rows]
    arrays = {}
    for spec in KNOB_INPUTS:
        values = [getattr(p, spec.name) for p in params]
        if any(value != getattr(blank.params, spec.name) for value in values):
            arrays[spec.name] = column(values, spec.numpy)
    if any(p.seed is not None for p in params):  # an unseeded row beside seeded ones gets a seed of its own
        arrays["random_seed"] = column([p.seed if p.seed is not None else fresh_seed() for p in params],
                                       np.uint64)
    if any(p.bad_words for p in params):
        arrays["bad_words"] = encode_word_lists([p.bad_words for p in params])
    if any(p.logit_bias for p in params):
        arrays["logit_bias_ids"] = padded([[t for t, _ in p.logit_bias] for p in params], np.int32)
        arrays["logit_bias_values"] = padded([[b for _, b in p.logit_bias] for p in params], np.float32, 0.0)
    if any(row.min_tokens for row in rows):
        arrays["min_tokens"] = column([row.min_tokens for row in rows], np.int32)
    if any(row.end_ids for row in rows):
        arrays["end_ids"] = padded([row.end_ids for row in rows], np.int32)
    if any(row.prompt_length not in (0, count) for row, count in zip(rows, sent)):
        arrays["prompt_length"] = column([row.prompt_length for row in rows], np.int32)
    if any(row.guide is not None for row in rows):
        arrays[GUIDE_TYPE_INPUT] = column([(row.guide.kind if row.guide else "").encode() for row in rows], object)
        arrays[GUIDE_INPUT] = column([(row.guide.text if row.guide else "").encode() for row in rows], object)
    return arrays


def step_results(path: SamplerPath, outputs: dict[str, np.ndarray], rows: int) -> list[StepOutput | Exception]:
    """Per row, the sampled token (and log-probability), or the error the decoder reported for it."""
    token_name, error_name = STEP_OUTPUTS[path][:2]
    tokens = outputs[token_name].reshape(rows, -1).tolist()  # [R, K]: a multi-step row's tokens, padded with -1
    errors = outputs[error_name].reshape(-1).tolist()
    log_probs = outputs["output_log_prob"].reshape(-1).tolist() if "output_log_prob" in outputs else [None] * rows
    tops = [tuple(zip(ids, lps)) for ids, lps in zip(outputs["top_ids"].reshape(rows, -1).tolist(),
                                                     outputs["top_log_probs"].reshape(rows, -1).tolist())] \
        if "top_ids" in outputs else [()] * rows
    return [row_error(error) or StepOutput(ids[0], log_prob, top, tuple(t for t in ids[1:] if t != PAD))
            for ids, error, log_prob, top in zip(tokens, errors, log_probs, tops)]


def release_arrays(seq_ids: Sequence[str]) -> dict[str, np.ndarray]:
    """A `decoder` request that only frees the KV slots of `seq_ids` (rows with no tokens, sequence_end)."""
    return {"sequence_id": column([seq_id.encode() for seq_id in seq_ids], object),
            "input_ids": np.full((len(seq_ids), 1), PAD, np.int32),
            "sequence_start": column([False] * len(seq_ids), bool),
            "sequence_end": column([True] * len(seq_ids), bool)}


def row_error(text: str | bytes) -> ServingError | None:
    """The exception a row's `error` output stands for (inverse of `row_error_text`); None for ""."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return error_from_message(text, ErrorCode.INTERNAL) if text else None


# -- the decoder's side ------------------------------------------------------------------------------

def parse_step(arrays: Mapping[str, np.ndarray], vocab_size: int | None = None) -> list[StepRow]:
    """The rows of one step request (`arrays`: input name -> numpy array), with the registration of
    each start row; raises InvalidRequest naming the bad input (and row)."""
    seq_ids = arrays["sequence_id"].reshape(-1)
    rows = len(seq_ids)
    ids = arrays["input_ids"]
    if ids.ndim != 2 or ids.shape[0] != rows or ids.dtype.kind not in "iu":
        raise InvalidRequest(f"input_ids must be INT32 of shape [{rows}, N], got {ids.dtype} {list(ids.shape)}")
    starts, ends = arrays["sequence_start"].reshape(-1).tolist(), arrays["sequence_end"].reshape(-1).tolist()
    counts = scalar_column(arrays, "decode_steps", rows, 1, int)
    for r, count in enumerate(counts):
        if not 1 <= count <= MAX_DECODE_STEPS:
            raise with_row(InvalidRequest(f"decode_steps must be in [1, {MAX_DECODE_STEPS}], got {count}"), r, rows)
    steps = [StepRow(seq_id.decode() if isinstance(seq_id, bytes) else str(seq_id), unpadded(row).tolist(),
                     bool(start), bool(end), steps=count)
             for seq_id, row, start, end, count in zip(seq_ids, ids, starts, ends, counts)]
    if any(starts):
        for r, (step, registration) in enumerate(zip(steps, parse_registrations(arrays, starts, vocab_size))):
            step.registration = registration
            if registration is not None and 0 < registration.prompt_length < len(step.tokens):
                raise with_row(InvalidRequest(f"prompt_length must be 0 or at least the first step's "
                                              f"{len(step.tokens)} tokens, got {registration.prompt_length}"), r, rows)
    return steps


def parse_registrations(arrays: Mapping[str, np.ndarray], starts: Sequence[bool],
                        vocab_size: int | None) -> list[Registration | None]:
    """The registration of every start row (None on the others)."""
    rows = len(starts)
    params = parse_sampling(arrays, rows, vocab_size, wanted=starts)
    min_tokens = scalar_column(arrays, "min_tokens", rows, 0, int)
    end_ids = id_rows("end_ids", arrays.get("end_ids"), rows, MAX_END_IDS, vocab_size)
    prompt_length = scalar_column(arrays, "prompt_length", rows, 0, int)
    kinds, guides = (scalar_column(arrays, name, rows, None, lambda value: value)
                     for name in (GUIDE_TYPE_INPUT, GUIDE_INPUT))
    out: list[Registration | None] = []
    for r, start in enumerate(starts):
        if not start:
            out.append(None)
            continue
        for name, value in (("min_tokens", min_tokens[r]), ("prompt_length", prompt_length[r])):
            if value < 0:
                raise with_row(InvalidRequest(f"{name} must be >= 0, got {value}"), r, rows)
        try:
            guide = parse_guide(kinds[r], guides[r])
        except InvalidRequest as error:
            raise with_row(error, r, rows) from None
        out.append(Registration(params[r], min_tokens[r], tuple(end_ids[r].tolist()), prompt_length[r], guide))
    return out


def row_error_text(error: BaseException | None) -> str:
    """The `error` output of one row: "" when it succeeded."""
    return "" if error is None else coded_message(error)


def row_errors(errors: Sequence[BaseException | None]) -> np.ndarray:
    """The `error` output of a step: BYTES [R, 1]."""
    return np.array([[row_error_text(error).encode()] for error in errors], dtype=object)
