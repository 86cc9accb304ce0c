"""Compiled (numba) matrix-vector product with int8 weights: the lm_head of a one-row step (`PackedTransformer`
with `int8_lm_head_single_row`).

A one-row step's lm_head reads its whole weight for one row of output: SmolLM2-135M's is 49152 x 576, 56.6 MB in
bfloat16, a large part of what the step reads, and oneDNN's bf16 GEMM is bound by memory bandwidth there. Its
int8 copy is half the bytes: symmetric codes per output row (w = code x scale[n], scale = max |w_n| / 127), each
widened to float32 and multiplied with the row's float32 activations (bfloat16 widened exactly), summed in
float32, scaled once per output (benchmarks/decoder.py measures the step with it: "torch:bf16+int4+int8head").
The outputs are split into one run per numba thread (zerocheck.jit).
"""
from __future__ import annotations

import numpy as np
import torch

from zerocheck.jit import available, chunk_bounds, numba, widen_bf16  # noqa: F401  (available: the kernel runs)

_F = np.float32


def quantise_rows(weight: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """weight [N, K] -> (codes int8 [N, K], scales float32 [N]): symmetric per output row, codes in -127..127
    (a row of zeros gets scale 1 and zero codes)."""
    wide = weight.detach().to(torch.float32)
    scales = wide.abs().amax(1) / 127
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    codes = torch.round(wide / scales[:, None]).clamp_(-127, 127).to(torch.int8)
    return codes.numpy(), scales.numpy()


def _matvec(codes, scales, x_bits, out, chunks):
    """out[n] = scales[n] * sum_k codes[n, k] * x[k], x the bfloat16 bits x_bits widened; `chunks` runs of
    outputs spread over numba's threads."""
    rows, inputs = codes.shape
    x = np.empty(inputs, np.float32)
    widen_bf16(x_bits, x)
    for c in numba.prange(chunks):
        start, stop = chunk_bounds(c, rows, chunks)
        for n in range(start, stop):
            total = _F(0.0)
            for k in range(inputs):
                total += _F(codes[n, k]) * x[k]
            out[n] = total * scales[n]


if numba is not None:
    _matvec = numba.njit(parallel=True, cache=True, fastmath={"reassoc", "nsz", "contract"})(_matvec)


def matvec(codes: np.ndarray, scales: np.ndarray, x_bits: np.ndarray, out: np.ndarray) -> None:
    """codes: [N, K] int8; scales: [N] float32; x_bits: [K] bfloat16 bits (int16); out: [N] float32, written."""
    _matvec(codes, scales, x_bits, out, numba.get_num_threads())


def warm_up() -> None:
    """Compile (or load from numba's disk cache) the kernel with a step's argument types."""
    matvec(np.zeros((2, 4), np.int8), np.ones(2, np.float32), np.zeros(4, np.int16), np.empty(2, np.float32))
