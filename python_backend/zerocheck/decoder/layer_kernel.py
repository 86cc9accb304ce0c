"""Compiled (numba) glue between a layer's GEMMs: the residual add with the next RMSNorm, and SiLU(gate) x up,
each one call for every row of a step, on bfloat16 bits (int16 views, `attention_kernel.as_bits`).

At one row a layer's norms, residual adds and activation are ~25 small torch ops, each dearer to dispatch
than its arithmetic, so together they weigh on a one-row step beside its GEMMs and lm_head.
The numerics are the module's (`PackedTransformer`'s torch path), rounding to bfloat16 (to nearest even) at
the same points:
- `add_rms_norm`: x <- bf16(x + delta); out <- bf16(w * bf16(x * rsqrt(mean(x^2) + eps))), the mean in float32;
- `rms_norm`: the same without the add (a step's first layer);
- `silu_mul`: out <- bf16(bf16(silu(gate)) * up) for gate_up = [gate | up].
Sums run in another order than torch's and exp is `zerocheck.jit.exp_parts` (within 2 ulp), so a value can
land one bfloat16 step away from torch's, rarely (tests/test_layer_kernel.py).
From PARALLEL_ROWS rows on, a call splits its rows into one run per numba thread (zerocheck.jit): a batched
step's glue then runs on every core, where fewer rows are not worth the hand-off to the threads
(benchmarks/decoder.py measures the step).
"""
from __future__ import annotations

import numpy as np

from zerocheck.jit import (EXP_FLOOR, available, chunk_bounds, exp_parts, numba, round_bf16, store_bf16,  # noqa: F401
                           widen_bf16)  # (available: the kernels run)

_F = np.float32
PARALLEL_ROWS = 8


def _normalise(x, weight, eps, scratch, widened, out):
    """out <- bf16(weight * bf16(x * rsqrt(mean(x^2) + eps))) for one row x (float32, bf16 values);
    scratch, widened: float32 rows."""
    total = _F(0.0)
    for d in range(x.shape[0]):
        total += x[d] * x[d]
    inverse = _F(1.0) / np.sqrt(total / _F(x.shape[0]) + eps)
    for d in range(x.shape[0]):
        scratch[d] = x[d] * inverse
    round_bf16(scratch)
    widen_bf16(weight, widened)
    for d in range(x.shape[0]):
        scratch[d] *= widened[d]
    round_bf16(scratch)
    store_bf16(scratch, out)


def _add_rms_norm(x, delta, weight, eps, out, add, first, last):
    """Rows first..last - 1: x <- x + delta when `add` (else x is only read); out <- the norm of x."""
    hidden = x.shape[1]
    row = np.empty(hidden, np.float32)
    other = np.empty(hidden, np.float32)
    scratch = np.empty(hidden, np.float32)
    for n in range(first, last):
        widen_bf16(x[n], row)
        if add:
            widen_bf16(delta[n], other)
            for d in range(hidden):
                row[d] += other[d]
            round_bf16(row)
            store_bf16(row, x[n])
        _normalise(row, weight, eps, scratch, other, out[n])


def _silu_mul(gate_up, out, first, last):
    """Rows first..last - 1 of out <- bf16(bf16(silu(gate)) * up)."""
    width = out.shape[1]
    gate = np.empty(width, np.float32)
    up = np.empty(width, np.float32)
    mantissas = np.empty(width, np.float32)
    powers = np.empty(width, np.int32)
    scale = powers.view(np.float32)
    for n in range(first, last):
        widen_bf16(gate_up[n, :width], gate)
        widen_bf16(gate_up[n, width:], up)
        for d in range(width):
            mantissas[d], powers[d] = exp_parts(min(max(-gate[d], EXP_FLOOR), -EXP_FLOOR))
        for d in range(width):
            gate[d] = gate[d] / (_F(1.0) + mantissas[d] * scale[d])
        round_bf16(gate)
        for d in range(width):
            gate[d] *= up[d]
        round_bf16(gate)
        store_bf16(gate, out[n])


if numba is not None:
    _FAST = {"reassoc", "nsz", "contract", "arcp", "afn"}
    _normalise = numba.njit(inline="always", cache=True, fastmath=_FAST)(_normalise)
    _add_rms_norm = numba.njit(cache=True, fastmath=_FAST)(_add_rms_norm)
    _silu_mul = numba.njit(cache=True, fastmath={"reassoc", "nsz", "contract"})(_silu_mul)


def _add_rms_norm_parallel(x, delta, weight, eps, out, add, chunks):
    """`_add_rms_norm` over all rows, in `chunks` runs of rows spread over numba's threads."""
    for c in numba.prange(chunks):
        start, stop = chunk_bounds(c, x.shape[0], chunks)
        _add_rms_norm(x, delta, weight, eps, out, add, start, stop)


def _silu_mul_parallel(gate_up, out, chunks):
    """`_silu_mul` over all rows, in `chunks` runs of rows spread over numba's threads."""
    for c in numba.prange(chunks):
        start, stop = chunk_bounds(c, out.shape[0], chunks)
        _silu_mul(gate_up, out, start, stop)


if numba is not None:
    _add_rms_norm_parallel = numba.njit(parallel=True, cache=True)(_add_rms_norm_parallel)
    _silu_mul_parallel = numba.njit(parallel=True, cache=True)(_silu_mul_parallel)


def _norm(x: np.ndarray, delta: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray, add: bool) -> None:
    if x.shape[0] >= PARALLEL_ROWS:
        _add_rms_norm_parallel(x, delta, weight, np.float32(eps), out, add, numba.get_num_threads())
    else:
        _add_rms_norm(x, delta, weight, np.float32(eps), out, add, 0, x.shape[0])


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """x: [N, H] bits; weight: [H] bits; out: [N, H] bits, written."""
    _norm(x, x, weight, eps, out, False)


def add_rms_norm(x: np.ndarray, delta: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
    """x: [N, H] bits, x + delta written back; delta: [N, H] bits; weight: [H] bits; out: [N, H] bits, written."""
    _norm(x, delta, weight, eps, out, True)


def silu_mul(gate_up: np.ndarray, out: np.ndarray) -> None:
    """gate_up: [N, 2 I] bits ([gate | up]); out: [N, I] bits, written."""
    if out.shape[0] >= PARALLEL_ROWS:
        _silu_mul_parallel(gate_up, out, numba.get_num_threads())
    else:
        _silu_mul(gate_up, out, 0, out.shape[0])


def warm_up() -> None:
    """Compile (or load from numba's disk cache) the kernels, serial and threaded, with a step's argument types."""
    for rows in (1, PARALLEL_ROWS):
        bits = np.zeros((rows, 4), np.int16)
        rms_norm(bits, bits[0], 1e-5, bits.copy())
        add_rms_norm(bits.copy(), bits, bits[0], 1e-5, bits.copy())
        silu_mul(bits, np.zeros((rows, 2), np.int16))
