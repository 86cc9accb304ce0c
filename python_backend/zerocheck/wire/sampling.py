"""The sampling columns on the wire: the optional inputs every sampler model takes (`zero_check_sampler`,
the checked chain), which `decoder` also outputs for the checked chain, encoded and parsed here.

A request holds R rows (the leading dimension). Besides its [R, V] tensor, a sampler model takes the
knobs of `SAMPLING_PARAMETERS`, `random_seed` (UINT64) and `step` (INT32), all [R, 1]; `history`
(INT32 [R, N]: prompt + generated ids, for penalties and bad words), `bad_words` (INT32 [R, 2, N] in
tensorrtllm_backend's word-list format: flattened ids, then end offsets, both padded with -1) and
`logit_bias_ids` / `logit_bias_values` ([R, N] INT32 / FP32). Ragged id rows are padded at their end
with -1. Parsing raises InvalidRequest naming the input (and the row when there are several).
Imports neither torch nor Triton.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from zerocheck.api.errors import InvalidRequest
from zerocheck.api.request import decode_word_list
from zerocheck.sampling.params import MAX_LOGIT_BIAS, SAMPLING_PARAMETERS, SamplingParamError, SamplingParams

PAD = -1
MAX_HISTORY = 1 << 16
MAX_STEP = 2**31 - 1
KNOBS = tuple(spec.name for spec in SAMPLING_PARAMETERS)
NUMPY_OF = {"TYPE_FP32": np.float32, "TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64, "TYPE_BOOL": np.bool_,
            "TYPE_STRING": np.object_}  # Triton type -> numpy dtype, for every tensor of the wire
_TRITON_OF_KIND = {float: "TYPE_FP32", int: "TYPE_INT32"}


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of a model's config: Triton dtype, dims after the batch dimension, optional input,
    ragged rows (`allow_ragged_batch`)."""

    name: str
    dtype: str
    dims: tuple[int, ...] = (1,)
    optional: bool = False
    ragged: bool = False

    @property
    def numpy(self) -> type:
        return NUMPY_OF[self.dtype]

    def as_output(self) -> TensorSpec:
        """The same tensor declared as an output (outputs are never optional nor ragged)."""
        return TensorSpec(self.name, self.dtype, self.dims)


KNOB_INPUTS = tuple(TensorSpec(spec.name, _TRITON_OF_KIND[spec.kind], optional=True) for spec in SAMPLING_PARAMETERS)
SEED_INPUT = TensorSpec("random_seed", "TYPE_UINT64", optional=True)
STEP_INPUT = TensorSpec("step", "TYPE_INT32", optional=True)
HISTORY_INPUT = TensorSpec("history", "TYPE_INT32", (-1,), optional=True, ragged=True)
BAD_WORDS_INPUT = TensorSpec("bad_words", "TYPE_INT32", (2, -1), optional=True, ragged=True)
BIAS_INPUTS = (TensorSpec("logit_bias_ids", "TYPE_INT32", (-1,), optional=True, ragged=True),
               TensorSpec("logit_bias_values", "TYPE_FP32", (-1,), optional=True, ragged=True))
# the optional inputs of every sampler model, in config order
SAMPLER_INPUTS = (*KNOB_INPUTS, SEED_INPUT, STEP_INPUT, HISTORY_INPUT, BAD_WORDS_INPUT, *BIAS_INPUTS)


@dataclass
class SamplerRow:
    """One row of a sampler batch."""

    params: SamplingParams
    history: Sequence[int]
    step: int


def column(values: Sequence, dtype: type) -> np.ndarray:
    """One value per row -> [R, 1]."""
    return np.array(values, dtype=dtype).reshape(-1, 1)


def padded(rows: Sequence[Sequence[float]], dtype: type, fill: float = PAD) -> np.ndarray:
    """Ragged rows -> [R, max length] (at least 1 column), padded at the end with `fill`."""
    array = np.full((len(rows), max([len(row) for row in rows] + [1])), fill, dtype=dtype)
    for r, row in enumerate(rows):
        array[r, :len(row)] = row
    return array


def unpadded(row: np.ndarray) -> np.ndarray:
    """A 1-D id row without the -1 padding at its end."""
    if not row.size or row[-1] != PAD:
        return row
    kept = np.flatnonzero(row != PAD)
    return row[:kept[-1] + 1] if kept.size else row[:0]


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


def sampler_arrays(rows: Sequence[SamplerRow]) -> dict[str, np.ndarray]:
    """Every input of SAMPLER_INPUTS for `rows` (row r of each array is rows[r]): what `decoder` outputs
    for the checked chain; unseeded rows send seed 0."""
    params = [row.params for row in rows]
    arrays = {spec.name: column([getattr(p, spec.name) for p in params], spec.numpy) for spec in KNOB_INPUTS}
    arrays["random_seed"] = column([p.seed or 0 for p in params], np.uint64)
    arrays["step"] = column([row.step for row in rows], np.int32)
    arrays["history"] = padded([row.history for row in rows], np.int32)
    arrays["bad_words"] = encode_word_lists([p.bad_words for p in params])
    arrays["logit_bias_ids"] = padded([[t for t, _ in p.logit_bias] for p in params], np.int32)
    arrays["logit_bias_values"] = padded([[b for _, b in p.logit_bias] for p in params], np.float32, 0.0)
    return arrays


def check_token_ids(name: str, ids: np.ndarray, vocab_size: int | None) -> None:
    """Raise InvalidRequest unless every id of `ids` is in [0, vocab_size) (no bound when None)."""
    if vocab_size is not None and ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab_size):
        raise InvalidRequest(f"{name} must hold token ids in [0, {vocab_size}), got "
                             f"{int(ids.min()) if int(ids.min()) < 0 else int(ids.max())}")


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


def scalar_column(arrays: Mapping[str, np.ndarray], name: str, rows: int, default, kind: type) -> list:
    """An [R, 1] scalar input, one value per row (`default` on every row when absent)."""
    array = arrays.get(name)
    if array is None:
        return [default] * rows
    if array.size != rows:
        raise InvalidRequest(f"{name} must hold one value per row ({rows}), got shape {list(array.shape)}")
    return [kind(v) for v in array.reshape(-1).tolist()]


def with_row(error: Exception, row: int, rows: int) -> Exception:
    """`error` naming its row when the request has several."""
    return error if rows == 1 else InvalidRequest(f"row {row}: {error}")


def parse_sampling(arrays: Mapping[str, np.ndarray], rows: int, vocab_size: int | None = None,
                   wanted: Sequence[bool] | None = None) -> list[SamplingParams | None]:
    """The sampling parameters of each row from the knobs, `random_seed`, `bad_words` and `logit_bias_*`
    of `arrays` (absent: defaults); only the rows `wanted` says (None elsewhere; default: all).
    Raises InvalidRequest naming the bad input (and row). Token ids must lie in [0, vocab_size)."""
    knobs = {spec.name: scalar_column(arrays, spec.name, rows, spec.default, spec.kind) for spec in SAMPLING_PARAMETERS}
    seeds = scalar_column(arrays, "random_seed", rows, None, int)
    bad = arrays.get("bad_words")
    if bad is not None:
        if bad.ndim != 3 or bad.shape[:2] != (rows, 2) or bad.dtype.kind not in "iu":
            raise InvalidRequest(f"bad_words must have shape [{rows}, 2, N], got {list(bad.shape)}")
        check_token_ids("bad_words", bad[:, 0][bad[:, 0] != PAD], vocab_size)
    bias_ids, bias_values = arrays.get("logit_bias_ids"), arrays.get("logit_bias_values")
    ids_shape = [rows, 0] if bias_ids is None else list(bias_ids.shape)
    values_shape = [rows, 0] if bias_values is None else list(bias_values.shape)
    if ids_shape != values_shape:
        raise InvalidRequest(f"logit_bias_ids has {ids_shape[-1]} ids but logit_bias_values has {values_shape[-1]}"
                             if rows == 1 else f"logit_bias_ids {ids_shape} and logit_bias_values {values_shape} "
                             "must have the same shape")
    bias_ids = id_rows("logit_bias_ids", bias_ids, rows, MAX_LOGIT_BIAS, vocab_size)
    bias_values = np.zeros((rows, 0), np.float32) if bias_values is None else bias_values
    out: list[SamplingParams | None] = []
    for r in range(rows):
        if wanted is not None and not wanted[r]:
            out.append(None)
            continue
        try:
            out.append(sampling_params(tuple(knobs[name][r] for name in KNOBS), seeds[r],
                                       decode_word_list("bad_words", bad[r]) if bad is not None else (),
                                       tuple(zip(bias_ids[r].tolist(), bias_values[r, :len(bias_ids[r])].tolist()))))
        except InvalidRequest as error:
            raise with_row(error, r, rows) from None
    return out


def parse_sampler_rows(arrays: Mapping[str, np.ndarray], rows: int, vocab_size: int | None = None) -> list[SamplerRow]:
    """The sampling inputs of one sampler-model request of `rows` rows (SAMPLER_INPUTS; absent: defaults)."""
    params = parse_sampling(arrays, rows, vocab_size)
    histories = id_rows("history", arrays.get("history"), rows, MAX_HISTORY, vocab_size)
    steps = scalar_column(arrays, "step", rows, 0, int)
    out = []
    for r, (row_params, history, step) in enumerate(zip(params, histories, steps)):
        if not 0 <= step <= MAX_STEP:
            raise with_row(InvalidRequest(f"step must be an integer in [0, {MAX_STEP}], got {step}"), r, rows)
        out.append(SamplerRow(row_params, history.tolist(), step))
    return out


@lru_cache(maxsize=4096)
def sampling_params(knobs: tuple, seed: int | None, bad_words: tuple, logit_bias: tuple) -> SamplingParams:
    """SamplingParams validated once per distinct value (many sequences share them)."""
    try:
        return SamplingParams(**dict(zip(KNOBS, knobs)), seed=seed, bad_words=bad_words, logit_bias=logit_bias)
    except SamplingParamError as error:
        raise InvalidRequest(str(error)) from None
