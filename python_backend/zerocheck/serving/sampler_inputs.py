"""Inputs of the sampler models (`zero_check_sampler` and the checked chain), parsed in one place.

Every sampler model takes, besides its tensor ([1, V] logits or probabilities), the optional scalar
inputs of `SAMPLING_PARAMETERS`, `random_seed` (UINT64), `step` (INT32), `history` (INT32 [1, N]:
prompt + generated ids, for penalties and bad words), `bad_words` (INT32 [1, 2, N] in
tensorrtllm_backend's word-list format: flattened ids, then end offsets padded with -1) and
`logit_bias_ids` / `logit_bias_values` ([1, N] INT32 / FP32).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from zerocheck.sampling import SAMPLING_PARAMETERS, SamplingParamError, SamplingParams
from zerocheck.serving.inputs import InvalidRequest
from zerocheck.serving.triton import error_response, scalar_inputs

SCALARS = {spec.name: (spec.default, spec.kind) for spec in SAMPLING_PARAMETERS}
SCALARS.update(random_seed=(None, int), step=(0, int))
MAX_HISTORY = 1 << 16
MAX_STEP = 2**31 - 1


@dataclass
class SamplerRow:
    """One request of a sampler batch."""

    params: SamplingParams
    history: list[int]
    step: int


def encode_word_list(words: Sequence[Sequence[int]]) -> np.ndarray:
    """Token-id sequences -> INT32 [1, 2, N] (ids row, end-offsets row padded with -1)."""
    flat = [t for word in words for t in word]
    offsets = np.cumsum([len(word) for word in words]).tolist()
    width = max(len(flat), 1)
    array = np.full((1, 2, width), -1, dtype=np.int32)
    array[0, 0, :len(flat)] = flat
    array[0, 1, :len(offsets)] = offsets
    return array


def decode_word_list(array: np.ndarray) -> tuple[tuple[int, ...], ...]:
    """INT32 [1, 2, N] word list -> token-id sequences (inverse of `encode_word_list`)."""
    if array.ndim != 3 or array.shape[:2] != (1, 2):
        raise InvalidRequest(f"bad_words must have shape [1, 2, N], got {list(array.shape)}")
    ids, offsets = array[0, 0].tolist(), [o for o in array[0, 1].tolist() if o >= 0]
    words, begin = [], 0
    for end in offsets:
        if not begin < end <= len(ids):
            raise InvalidRequest(f"bad_words offsets must increase within [1, {len(ids)}], got {offsets}")
        words.append(tuple(ids[begin:end]))
        begin = end
    return tuple(words)


def check_token_ids(name: str, ids: np.ndarray, vocab_size: int | None) -> None:
    """Raise InvalidRequest unless every id of `ids` is in [0, vocab_size) (no bound when None)."""
    if vocab_size is not None and ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise InvalidRequest(f"{name} must hold token ids in [0, {vocab_size}), got "
                             f"{int(ids.min()) if int(ids.min()) < 0 else int(ids.max())}")


def _ids(name: str, array: np.ndarray | None, limit: int, vocab_size: int | None = None) -> list[int]:
    if array is None:
        return []
    if array.ndim != 2 or array.shape[0] != 1 or array.dtype.kind not in "iu":
        raise InvalidRequest(f"{name} must be an integer tensor of shape [1, N], got {array.dtype} {list(array.shape)}")
    if array.shape[1] > limit:
        raise InvalidRequest(f"{name} must hold at most {limit} ids, got {array.shape[1]}")
    check_token_ids(name, array, vocab_size)
    return array[0].tolist()


def parse_sampler_row(pb_utils: Any, request: Any, vocab_size: int | None = None) -> SamplerRow:
    """The sampling inputs of one request; raises InvalidRequest naming the bad input. Token ids
    (history, bad_words, logit_bias_ids) must lie in [0, vocab_size) when vocab_size is given."""
    values = scalar_inputs(pb_utils, request, SCALARS)
    if not 0 <= values["step"] <= MAX_STEP:
        raise InvalidRequest(f"step must be an integer in [0, {MAX_STEP}], got {values['step']}")

    def optional(name: str) -> np.ndarray | None:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        return None if tensor is None else tensor.as_numpy()

    bad = optional("bad_words")
    if bad is not None and bad.ndim == 3 and bad.shape[:2] == (1, 2):
        check_token_ids("bad_words", bad[0, 0][bad[0, 0] != -1], vocab_size)
    bias_ids = _ids("logit_bias_ids", optional("logit_bias_ids"), 1024, vocab_size)
    bias_values = optional("logit_bias_values")
    bias_values = [] if bias_values is None else bias_values.reshape(-1).tolist()
    if len(bias_ids) != len(bias_values):
        raise InvalidRequest(f"logit_bias_ids has {len(bias_ids)} ids but logit_bias_values has {len(bias_values)}")
    try:
        params = SamplingParams(
            **{name: values[name] for name in SCALARS if name not in ("random_seed", "step")},
            seed=values["random_seed"], bad_words=decode_word_list(bad) if bad is not None else (),
            logit_bias=tuple(zip(bias_ids, bias_values)))
    except SamplingParamError as error:
        raise InvalidRequest(str(error)) from None
    return SamplerRow(params, _ids("history", optional("history"), MAX_HISTORY, vocab_size), values["step"])


def logits_row(pb_utils: Any, request: Any, name: str, vocab_size: int | None) -> torch.Tensor:
    """The [1, V] float tensor input `name` of one request as a torch view (DLPack, no copy)."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        raise InvalidRequest(f"{name} is required")
    row = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    if row.dim() != 2 or row.shape[0] != 1 or row.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise InvalidRequest(f"{name} must be a float tensor of shape [1, V], got {row.dtype} {list(row.shape)}")
    if vocab_size is not None and row.shape[1] != vocab_size:
        raise InvalidRequest(f"{name} must have {vocab_size} values (the vocabulary size), got {row.shape[1]}")
    return row


@dataclass
class SamplerBatch:
    """The well-formed requests of one `execute` call, stacked; malformed ones already answered.

    tensors: input name -> [B, V] (B = well-formed requests); responses: one slot per request,
    filled with an error for the malformed ones and by `answer` for the rest.
    """

    indices: list[int]
    rows: list[SamplerRow]
    tensors: dict[str, torch.Tensor]
    responses: list[Any]

    @property
    def params(self) -> list[SamplingParams]:
        return [row.params for row in self.rows]

    @property
    def history(self) -> list[list[int]]:
        return [row.history for row in self.rows]

    @property
    def steps(self) -> list[int]:
        return [row.step for row in self.rows]


def gather_batch(pb_utils: Any, requests: Sequence[Any], names: Sequence[str], vocab_size: int | None,
                 check: Callable[[Any, dict[str, torch.Tensor]], None] | None = None) -> SamplerBatch:
    """Parse every request; stack the [1, V] inputs `names` of the well-formed ones. `check(request,
    values)` may refuse a request further (raise InvalidRequest); a refused request fails alone."""
    batch = SamplerBatch([], [], {}, [None] * len(requests))
    columns: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for i, request in enumerate(requests):
        try:
            row = parse_sampler_row(pb_utils, request, vocab_size)
            values = {name: logits_row(pb_utils, request, name, vocab_size) for name in names}
            if check is not None:
                check(request, values)
        except Exception as error:
            batch.responses[i] = error_response(pb_utils, error)
            continue
        batch.indices.append(i)
        batch.rows.append(row)
        for name, value in values.items():
            columns[name].append(value)
    batch.tensors = {name: col[0] if len(col) == 1 else torch.cat(col) for name, col in columns.items() if col}
    return batch


def refuse_nan(*names: str, probabilities: bool = False) -> Callable[[Any, dict[str, torch.Tensor]], None]:
    """A `gather_batch` check: the inputs `names` must hold no NaN (probabilities: values in [0, 1])."""
    def check(request: Any, values: dict[str, torch.Tensor]) -> None:
        for name in names:
            x = values[name]
            if bool(torch.isnan(x).any()):
                raise InvalidRequest(f"{name} contain NaN")
            if probabilities and bool(((x < 0) | (x > 1)).any()):
                raise InvalidRequest(f"{name} must be probabilities in [0, 1]")
    return check


def answer(pb_utils: Any, batch: SamplerBatch, outputs: dict[str, np.ndarray], errors: Sequence[str | None]) -> list[Any]:
    """Fill the responses of the well-formed requests: row b of every output, or its error."""
    for b, i in enumerate(batch.indices):
        if errors[b]:
            batch.responses[i] = error_response(pb_utils, InvalidRequest(errors[b]))
        else:
            batch.responses[i] = pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.ascontiguousarray(array[b:b + 1])) for name, array in outputs.items()])
    return batch.responses


Compute = Callable[[SamplerBatch], tuple[dict[str, np.ndarray], Sequence[str | None]]]


def respond(pb_utils: Any, batch: SamplerBatch, compute: Compute) -> list[Any]:
    """Answer the well-formed requests with `compute(batch)` -> (outputs [B, ...], per-row errors).
    If the batched computation itself raises, each of them gets that error (never a traceback)."""
    if batch.rows:
        try:
            outputs, errors = compute(batch)
        except Exception as error:
            for i in batch.indices:
                batch.responses[i] = error_response(pb_utils, error)
        else:
            answer(pb_utils, batch, outputs, errors)
    return batch.responses
