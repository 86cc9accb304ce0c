"""numba for the package's compiled CPU kernels (`zerocheck.sampling.cpu_kernel`,
`zerocheck.decoder.attention_kernel`, `zerocheck.decoder.layer_kernel`), with one threading layer for all of
them, chosen here at import.

OpenMP ("omp", numba's build against the system libgomp) when it loads: its threads split a parallel loop
over the cores, where numba's own "workqueue" layer gains little or nothing over the serial loop and at times
runs slower (benchmarks/sampler.py and benchmarks/decoder.py time the kernels). Its threads spin between calls
as long as GOMP_SPINCOUNT / OMP_WAIT_POLICY allow (`zerocheck serve` bounds both for every stub). Without
libgomp, workqueue, logged. `numba` is None when numba is not installed (the kernels' callers then run
their torch paths).

`exp_parts`: the float32 exp the kernels vectorise (inlined into their loops, under their fastmath flags).
`widen_bf16`, `round_bf16`, `store_bf16`: bfloat16 tensors reach the kernels as int16 views of their bits (a
bfloat16 is the top half of a float32's bits); these move rows between those bits and float32.
"""
from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("zerocheck")

try:
    import numba
except ImportError:
    numba = None

if numba is not None:
    try:
        from numba.np.ufunc import omppool  # noqa: F401  (loads only where libgomp is installed)

        numba.config.THREADING_LAYER = "omp"
    except (ImportError, OSError) as error:
        log.warning("numba's OpenMP threading layer is unavailable (%s): compiled kernels use workqueue", error)
        numba.config.THREADING_LAYER = "workqueue"


_F = np.float32
_LOG2E = _F(1.4426950408889634)
_LN2_HI = _F(0.693359375)  # ln 2 split so that k * _LN2_HI is exact for |k| < 2**12 (Cody-Waite)
_LN2_LO = _F(-2.12194440e-4)
EXP_FLOOR = _F(-87.0)  # float32's normal range ends at -87.3: callers take exp below it as 0 or clamp to it


def available() -> bool:
    return numba is not None


def exp_parts(z):
    """exp(z) = p * 2**k for float32 z >= EXP_FLOOR (and z < 88), as (p, the float32 bits of 2**k as int32):
    Cody-Waite reduction to r in [-ln2/2, ln2/2] and a degree-6 polynomial, within 2 ulp of float32's exp.
    Branch-free, so a loop calling it vectorises (a libm expf call per element would not)."""
    k = np.floor(z * _LOG2E + _F(0.5))
    r = (z - k * _LN2_HI) - k * _LN2_LO
    p = _F(1.0) + r + r * r * (_F(0.5) + r * (_F(1 / 6) + r * (_F(1 / 24) + r * (_F(1 / 120) + r * _F(1 / 720)))))
    return p, (np.int32(k) + np.int32(127)) << np.int32(23)


def widen_bf16(bits, out):
    """bfloat16 bits (int16) -> float32 into `out` (a float32 array; `out.view(uint32)` written)."""
    wide = out.view(np.uint32)
    for d in range(bits.shape[0]):
        wide[d] = np.uint32(np.uint16(bits[d])) << 16


def round_bf16(values):
    """float32 `values` rounded to bfloat16 (to nearest even) in place, kept as float32."""
    wide = values.view(np.uint32)
    for d in range(values.shape[0]):
        w = wide[d]
        wide[d] = (w + np.uint32(0x7FFF) + ((w >> 16) & np.uint32(1))) & np.uint32(0xFFFF0000)


def store_bf16(values, bits):
    """float32 `values` already rounded to bfloat16 (`round_bf16`) -> their bits (int16) into `bits`."""
    wide = values.view(np.uint32)
    for d in range(bits.shape[0]):
        bits[d] = np.int16(np.uint16(wide[d] >> 16))


def chunk_bounds(chunk, items, chunks):
    """[start, stop) of run `chunk` of `chunks` near-equal runs over `items` items: the runs a `prange` over
    chunks (one a thread) hands its iterations."""
    return chunk * items // chunks, (chunk + 1) * items // chunks


if numba is not None:
    chunk_bounds = numba.njit(inline="always", cache=True)(chunk_bounds)
    exp_parts = numba.njit(inline="always", cache=True)(exp_parts)
    widen_bf16 = numba.njit(inline="always", cache=True)(widen_bf16)
    round_bf16 = numba.njit(inline="always", cache=True)(round_bf16)
    store_bf16 = numba.njit(inline="always", cache=True)(store_bf16)
