"""Inputs of the sampler models (`zero_check_sampler` and the checked chain), parsed in one place.

A request holds R rows (R >= 1, the leading dimension; the batched decode step of `generate` sends
every active sequence as one request). Besides its tensor ([R, V] logits or probabilities), every
sampler model takes the optional scalar inputs of `SAMPLING_PARAMETERS`, `random_seed` (UINT64),
`step` (INT32), all [R, 1]; `history` (INT32 [R, N]: prompt + generated ids, for penalties and bad
words), `bad_words` (INT32 [R, 2, N] in tensorrtllm_backend's word-list format: flattened ids, then
end offsets padded with -1) and `logit_bias_ids` / `logit_bias_values` ([R, N] INT32 / FP32).
Ragged id rows are padded at their end with -1.
A request is answered as a whole: a bad row fails its request, with a message naming the row.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np
import torch

from zerocheck.sampling import SAMPLING_PARAMETERS, SamplingParamError, SamplingParams
from zerocheck.api.errors import InvalidRequest
from zerocheck.serving.inputs import decode_word_list
from zerocheck.serving.triton import error_response

SCALARS = {spec.name: (spec.default, spec.kind) for spec in SAMPLING_PARAMETERS}
SCALARS.update(random_seed=(None, int), step=(0, int))
KNOBS = tuple(spec.name for spec in SAMPLING_PARAMETERS)
MAX_HISTORY = 1 << 16
MAX_STEP = 2**31 - 1
PAD = -1


@dataclass
class SamplerRow:
    """One row of a sampler batch."""

    params: SamplingParams
    history: list[int]
    step: int


def encode_word_lists(rows: Sequence[Sequence[Sequence[int]]]) -> np.ndarray:
    """Per row, token-id sequences -> INT32 [R, 2, N] (ids row, end-offsets row; both padded with -1)."""
    flats = [[t for word in words for t in word] for words in rows]
    width = max([len(flat) for flat in flats] + [len(words) for words in rows] + [1])
    array = np.full((len(rows), 2, width), PAD, dtype=np.int32)
    for r, (words, flat) in enumerate(zip(rows, flats)):
        array[r, 0, :len(flat)] = flat
        array[r, 1, :len(words)] = np.cumsum([len(word) for word in words])
    return array


def encode_word_list(words: Sequence[Sequence[int]]) -> np.ndarray:
    """Token-id sequences -> INT32 [1, 2, N] (one row of `encode_word_lists`)."""
    return encode_word_lists([words])


def check_token_ids(name: str, ids: np.ndarray, vocab_size: int | None) -> None:
    """Raise InvalidRequest unless every id of `ids` is in [0, vocab_size) (no bound when None)."""
    if vocab_size is not None and ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise InvalidRequest(f"{name} must hold token ids in [0, {vocab_size}), got "
                             f"{int(ids.min()) if int(ids.min()) < 0 else int(ids.max())}")


def unpadded(row: np.ndarray) -> np.ndarray:
    """A 1-D id row without the -1 padding at its end."""
    if not row.size or row[-1] != PAD:
        return row
    kept = np.flatnonzero(row != PAD)
    return row[:kept[-1] + 1] if kept.size else row[:0]


def id_rows(name: str, array: np.ndarray | None, rows: int, limit: int, vocab_size: int | None = None) -> list[np.ndarray]:
    """Integer [R, N] input (rows padded with -1) -> R id arrays, each checked against the vocabulary."""
    if array is None:
        return [np.zeros(0, np.int64)] * rows
    if array.ndim != 2 or array.shape[0] != rows or array.dtype.kind not in "iu":
        raise InvalidRequest(f"{name} must be an integer tensor of shape [{rows}, N], got {array.dtype} {list(array.shape)}")
    if array.shape[1] > limit:
        raise InvalidRequest(f"{name} must hold at most {limit} ids, got {array.shape[1]}")
    out = [unpadded(row) for row in array]
    for ids in out:
        check_token_ids(name, ids, vocab_size)
    return out


def row_scalars(present: dict[str, Any], rows: int) -> dict[str, list]:
    """The [R, 1] scalar inputs of SCALARS, one value per row (defaults where absent)."""
    values = {}
    for name, (default, kind) in SCALARS.items():
        tensor = present.get(name)
        if tensor is None:
            values[name] = [default] * rows
            continue
        array = tensor.as_numpy()
        if array.size != rows:
            raise InvalidRequest(f"{name} must hold one value per row ({rows}), got shape {list(array.shape)}")
        values[name] = [kind(v) for v in array.reshape(-1).tolist()]
    return values


def with_row(error: Exception, row: int, rows: int) -> Exception:
    """`error` naming its row when the request has several."""
    return error if rows == 1 else InvalidRequest(f"row {row}: {error}")


def parse_sampler_rows(present: dict[str, Any], rows: int, vocab_size: int | None = None) -> list[SamplerRow]:
    """The sampling inputs of one request of `rows` rows (`present`: input name -> pb_utils tensor);
    raises InvalidRequest naming the bad input (and row). Token ids (history, bad_words,
    logit_bias_ids) must lie in [0, vocab_size) when vocab_size is given."""
    values = row_scalars(present, rows)

    def optional(name: str) -> np.ndarray | None:
        tensor = present.get(name)
        return None if tensor is None else tensor.as_numpy()

    bad = optional("bad_words")
    if bad is not None:
        if bad.ndim != 3 or bad.shape[:2] != (rows, 2) or bad.dtype.kind not in "iu":
            raise InvalidRequest(f"bad_words must have shape [{rows}, 2, N], got {list(bad.shape)}")
        check_token_ids("bad_words", bad[:, 0][bad[:, 0] != PAD], vocab_size)
    histories = id_rows("history", optional("history"), rows, MAX_HISTORY, vocab_size)
    bias_ids, bias_values = optional("logit_bias_ids"), optional("logit_bias_values")
    ids_shape = [rows, 0] if bias_ids is None else list(bias_ids.shape)
    values_shape = [rows, 0] if bias_values is None else list(bias_values.shape)
    if ids_shape != values_shape:
        raise InvalidRequest(f"logit_bias_ids has {ids_shape[-1]} ids but logit_bias_values has {values_shape[-1]}"
                             if rows == 1 else f"logit_bias_ids {ids_shape} and logit_bias_values {values_shape} "
                             "must have the same shape")
    bias_ids = id_rows("logit_bias_ids", bias_ids, rows, 1024, vocab_size)
    bias_values = np.zeros((rows, 0), np.float32) if bias_values is None else bias_values
    out = []
    for r in range(rows):
        step = values["step"][r]
        try:
            if not 0 <= step <= MAX_STEP:
                raise InvalidRequest(f"step must be an integer in [0, {MAX_STEP}], got {step}")
            params = sampling_params(tuple(values[name][r] for name in KNOBS), values["random_seed"][r],
                                     decode_word_list("bad_words", bad[r]) if bad is not None else (),
                                     tuple(zip(bias_ids[r].tolist(), bias_values[r, :len(bias_ids[r])].tolist())))
        except InvalidRequest as error:
            raise with_row(error, r, rows) from None
        out.append(SamplerRow(params, histories[r].tolist(), step))
    return out


@lru_cache(maxsize=4096)
def sampling_params(knobs: tuple, seed: int | None, bad_words: tuple, logit_bias: tuple) -> SamplingParams:
    """SamplingParams validated once per distinct value: a sequence sends the same ones every step."""
    try:
        return SamplingParams(**dict(zip(KNOBS, knobs)), seed=seed, bad_words=bad_words, logit_bias=logit_bias)
    except SamplingParamError as error:
        raise InvalidRequest(str(error)) from None


def float_rows(present: dict[str, Any], name: str, vocab_size: int | None) -> torch.Tensor:
    """The [R, V] float tensor input `name` of one request as a torch view (DLPack, no copy)."""
    tensor = present.get(name)
    if tensor is None:
        raise InvalidRequest(f"{name} is required")
    rows = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    if rows.dim() != 2 or rows.shape[0] < 1 or rows.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise InvalidRequest(f"{name} must be a float tensor of shape [R, V], got {rows.dtype} {list(rows.shape)}")
    if vocab_size is not None and rows.shape[1] != vocab_size:
        raise InvalidRequest(f"{name} must have {vocab_size} values (the vocabulary size), got {rows.shape[1]}")
    return rows


@dataclass
class SamplerBatch:
    """The rows of the well-formed requests of one `execute` call, stacked; malformed requests
    already answered.

    tensors: input name -> [B, V] (B = rows of the well-formed requests); spans: per well-formed
    request, (request index, first row, end row); responses: one slot per request, filled with an
    error for the malformed ones and by `answer` for the rest.
    """

    rows: list[SamplerRow]
    tensors: dict[str, torch.Tensor]
    responses: list[Any]
    spans: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def params(self) -> list[SamplingParams]:
        return [row.params for row in self.rows]

    @property
    def history(self) -> list[list[int]]:
        return [row.history for row in self.rows]

    @property
    def steps(self) -> list[int]:
        return [row.step for row in self.rows]


Check = Callable[[dict[str, Any], dict[str, torch.Tensor]], None]


def gather_batch(pb_utils: Any, requests: Sequence[Any], names: Sequence[str], vocab_size: int | None,
                 check: Check | None = None) -> SamplerBatch:
    """Parse every request; stack the [R, V] inputs `names` of the well-formed ones. `check(present,
    values)` may refuse a request further (raise InvalidRequest); a refused request fails alone."""
    batch = SamplerBatch([], {}, [None] * len(requests))
    columns: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for i, request in enumerate(requests):
        try:
            present = {tensor.name(): tensor for tensor in request.inputs()}  # one call, not one per name
            values = {name: float_rows(present, name, vocab_size) for name in names}
            rows = {len(value) for value in values.values()}
            if len(rows) != 1:
                raise InvalidRequest(f"{', '.join(names)} must have the same number of rows")
            parsed = parse_sampler_rows(present, rows.pop(), vocab_size)
            if check is not None:
                check(present, values)
        except Exception as error:
            batch.responses[i] = error_response(pb_utils, error)
            continue
        batch.spans.append((i, len(batch.rows), len(batch.rows) + len(parsed)))
        batch.rows += parsed
        for name, value in values.items():
            columns[name].append(value)
    batch.tensors = {name: col[0] if len(col) == 1 else torch.cat(col) for name, col in columns.items() if col}
    return batch


def refuse_nan(*names: str, probabilities: bool = False) -> Check:
    """A `gather_batch` check: the inputs `names` must hold no NaN (probabilities: values in [0, 1])."""
    def check(present: dict[str, Any], values: dict[str, torch.Tensor]) -> None:
        for name in names:
            x = values[name]
            if bool(torch.isnan(x).any()):
                raise InvalidRequest(f"{name} contain NaN")
            if probabilities and bool(((x < 0) | (x > 1)).any()):
                raise InvalidRequest(f"{name} must be probabilities in [0, 1]")
    return check


def answer(pb_utils: Any, batch: SamplerBatch, outputs: dict[str, np.ndarray], errors: Sequence[str | None]) -> list[Any]:
    """Fill the responses of the well-formed requests: their rows of every output, or the error of
    their failed rows."""
    for i, begin, end in batch.spans:
        failed = [(r - begin, errors[r]) for r in range(begin, end) if errors[r]]
        if failed:
            message = failed[0][1] if end - begin == 1 else "; ".join(f"row {r}: {e}" for r, e in failed)
            batch.responses[i] = error_response(pb_utils, InvalidRequest(message))
        else:
            batch.responses[i] = pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.ascontiguousarray(array[begin:end])) for name, array in outputs.items()])
    return batch.responses


Compute = Callable[[SamplerBatch], tuple[dict[str, np.ndarray], Sequence[str | None]]]


def respond(pb_utils: Any, batch: SamplerBatch, compute: Compute) -> list[Any]:
    """Answer the well-formed requests with `compute(batch)` -> (outputs [B, ...], per-row errors).
    If the batched computation itself raises, each of them gets that error (never a traceback)."""
    if batch.rows:
        try:
            outputs, errors = compute(batch)
        except Exception as error:
            for i, _, _ in batch.spans:
                batch.responses[i] = error_response(pb_utils, error)
        else:
            answer(pb_utils, batch, outputs, errors)
    return batch.responses
