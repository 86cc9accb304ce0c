"""Compiled CPU kernel (numba) for the candidate rows of the zero-check sampler: greedy and top-k.

One pass per row over the logits finds the top (k + 1) candidates: blocks of values are compared
with the current (k+1)-th one in a vectorised loop, and only a larger value is inserted into the
small sorted list. Then, on those candidates, the same steps as
`ops.draw_from_candidates` in the same precision: temperature, top-p on the float64 cumulative mass,
min-p, and the exponential race with the same counter-based noise, so a row gets the token the
eager torch path gives (up to the last-ulp rounding of exp/log). Rows run in parallel from
PARALLEL_ROWS of them on.

Compiled by `warm_up` when a compiled sampler is made (cached on disk when the package directory is
writable); `available()` says
whether numba is importable. The choice of kernel or eager torch is made once, by `make_sampler`.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .batch import SamplingBatch, build_batch
from .params import SamplingParams

BLOCK = 64
# from this many rows on, spreading them over threads beats the ~0.1 ms it takes to wake them
# (measured on 2 cores at V = 32000 and 128256)
PARALLEL_ROWS = 12
_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B
_INV_2_32 = 1.0 / 4294967296.0

try:
    import numba

    # numba's OpenMP layer spins its threads after each call, taking the CPU from the decoder that runs
    # next; the workqueue layer's threads sleep (as onnxruntime's do: allow_spinning 0)
    numba.config.THREADING_LAYER = "workqueue"
except ImportError:  # the eager torch path serves without it
    numba = None


def available() -> bool:
    return numba is not None


def _mix32(z):
    z = (((z >> 16) ^ z) * _MUL) & _M32
    z = (((z >> 16) ^ z) * _MUL) & _M32
    return (z >> 16) ^ z


def _log_noise(key0, key1, counter):
    """log(E), E = -log(u) ~ Exp(1): `noise.exponential_noise` for one (row key, counter)."""
    z = _mix32(_mix32(key0 ^ (counter & _M32)) ^ key1)
    z = _mix32(z ^ (counter >> 32))
    u = (np.float64(z) + 0.5) * _INV_2_32
    return math.log(-math.log(u))


def _insert(vals, ids, v, i):
    """Insert (v, i) into the descending vals (after equal values), dropping the last."""
    j = len(vals) - 1
    while j > 0 and vals[j - 1] < v:
        vals[j] = vals[j - 1]
        ids[j] = ids[j - 1]
        j -= 1
    vals[j] = v
    ids[j] = i


def _top_candidates(row, vals, ids):
    """Fill vals/ids with the len(vals) largest values of row (descending; -inf, id -1 when the row has
    fewer finite ones) and their ids; returns whether the row holds NaN. A vectorised loop counts, in
    each block of BLOCK values, those above the current last candidate (fixed trip count and integer
    sums: the loop compiles to SIMD compares); only a block holding one is scanned again to insert it,
    which soon is rare. The tail past the last whole block is checked value by value."""
    vals[:] = -np.inf
    ids[:] = -1
    low = vals[-1]  # float32, as the row: the block test stays a float32 compare
    nan = 0
    vocab = row.shape[0]
    whole = vocab - vocab % BLOCK
    for start in range(0, whole, BLOCK):
        above = 0
        for i in range(BLOCK):
            v = row[start + i]
            nan += v != v
            above += v > low
        if above:
            for i in range(start, start + BLOCK):
                if row[i] > low:
                    _insert(vals, ids, row[i], i)
                    low = vals[-1]
    for i in range(whole, vocab):
        v = row[i]
        nan += v != v
        if v > low:
            _insert(vals, ids, v, i)
            low = vals[-1]
    return nan > 0


def _draw_row(j, x, rows, greedy, top_k, temperature, top_p, min_p_log, keys, tokens, row_max):
    """Row r = rows[j]: tokens[r], row_max[r]."""
    r = rows[j]
    k = top_k[j]
    width = 1 if greedy[j] else k + 1  # greedy: the first largest value (ties keep the lowest id)
    vals = np.empty(width, np.float32)
    ids = np.empty(width, np.int64)
    if _top_candidates(x[r], vals, ids):
        tokens[r], row_max[r] = -1, np.nan
        return
    if greedy[j]:
        tokens[r], row_max[r] = max(ids[0], 0), vals[0]
        return
    row_max[r] = vals[0]
    kth = vals[k - 1]
    keep = k
    if vals[k] == kth and math.isfinite(kth):
        # the k-th value is tied past the candidates (common with bf16 logits): widen them until a smaller
        # value shows, so that every token >= the k-th value is kept, as the checked chain's filter does
        vocab = x.shape[1]
        while width < vocab and vals[width - 1] == kth:
            width = min(2 * width, vocab)
            vals = np.empty(width, np.float32)
            ids = np.empty(width, np.int64)
            _top_candidates(x[r], vals, ids)
        while keep < width and vals[keep] == kth:
            keep += 1
    t = temperature[j]
    y = np.empty(keep, np.float32)
    total = 0.0
    cum = np.empty(keep, np.float64)
    for i in range(keep):
        y[i] = (vals[i] - vals[0]) / t
        if math.isfinite(vals[i]):
            total += math.exp(np.float64(y[i]))
        cum[i] = total
    low = min_p_log[j]
    if top_p[j] < 1.0:
        target = np.float64(top_p[j]) * total
        cut = 0
        while cut < keep - 1 and cum[cut] < target:
            cut += 1
        low = max(low, y[cut])
    best, arg = -np.inf, ids[0]
    for i in range(keep):
        if math.isfinite(vals[i]) and y[i] >= low:
            score = np.float64(y[i]) - _log_noise(keys[j, 0], keys[j, 1], ids[i])
            if score > best:
                best, arg = score, ids[i]
    tokens[r] = arg


def _draw_rows_serial(x, rows, greedy, top_k, temperature, top_p, min_p_log, keys, tokens, row_max):
    """`_draw_row` for every j, in this thread."""
    for j in range(rows.shape[0]):
        _draw_row(j, x, rows, greedy, top_k, temperature, top_p, min_p_log, keys, tokens, row_max)


def _draw_rows(x, rows, greedy, top_k, temperature, top_p, min_p_log, keys, tokens, row_max):
    """`_draw_row` for every j, rows spread over numba's threads."""
    for j in numba.prange(rows.shape[0]):
        _draw_row(j, x, rows, greedy, top_k, temperature, top_p, min_p_log, keys, tokens, row_max)


if numba is not None:
    _mix32 = numba.njit(inline="always", cache=True)(_mix32)
    _log_noise = numba.njit(inline="always", cache=True)(_log_noise)
    _insert = numba.njit(cache=True)(_insert)
    _top_candidates = numba.njit(cache=True)(_top_candidates)
    _draw_row = numba.njit(cache=True)(_draw_row)
    _draw_rows_serial = numba.njit(cache=True)(_draw_rows_serial)
    _draw_rows = numba.njit(parallel=True, cache=True)(_draw_rows)


def warm_up() -> None:
    """Compile (or load from the disk cache) both row loops now, through `draw_candidate_rows` so the
    argument types are the ones a step passes: the first steps then pay no compilation (seconds)."""
    for rows in (1, PARALLEL_ROWS):
        batch = build_batch([SamplingParams(top_k=1)] * rows, 4 * BLOCK, None, 0)
        draw_candidate_rows(torch.zeros(rows, 4 * BLOCK), batch, list(range(rows)),
                            torch.empty(rows, dtype=torch.int64), torch.empty(rows))


def draw_candidate_rows(x: torch.Tensor, batch: SamplingBatch, rows: list[int], tokens: torch.Tensor,
                        row_max: torch.Tensor) -> None:
    """Draw the greedy and top-k `rows` of x [B, V] float32 (contiguous, CPU, penalties applied)
    into tokens [B] int64 and row_max [B] float32, in place. A top-k row whose k-th value is tied past
    its candidates widens them in the kernel (every token >= the k-th value is kept)."""
    every = len(rows) == batch.size  # the common case: no per-row gathers
    index = torch.tensor(rows, dtype=torch.int64)
    pick = (lambda t: t) if every else (lambda t: t[index])
    greedy = np.array([batch.greedy[r] for r in rows])
    top_k = np.array([batch.top_k_list[r] if not batch.greedy[r] else 1 for r in rows], dtype=np.int64)
    draw = _draw_rows if len(rows) >= PARALLEL_ROWS else _draw_rows_serial
    draw(x.numpy(), index.numpy(), greedy, top_k, pick(batch.temperature).numpy(), pick(batch.top_p).numpy(),
         torch.log(pick(batch.min_p)).numpy(), pick(batch.keys).numpy(), tokens.numpy(), row_max.numpy())
