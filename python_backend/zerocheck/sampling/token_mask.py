"""The token mask of structured output: a stage before every sampler (zero-check kernel, checked chain,
CUDA-graph runner), so a token the guide does not allow does not exist for that row.

A mask is llguidance's bitmask: int32 [B, W] (W = ceil(V / 32)), bit t % 32 of word t // 32 set when token
t is allowed, and `rows` [B] bool, the rows that have one. `apply_token_mask` writes -inf in place at every
disallowed token of those rows, before logit bias, penalties, temperature, top-k, top-p and min-p (as vLLM
and TensorRT-LLM apply theirs): the samplers then draw from the constrained distribution, and the logits a
decoder exports to the checked chain are the constrained ones. On the CPU a compiled loop (a bit test per
token, a whole word of 32 tokens skipped when all are allowed; rows spread over numba's threads), elsewhere
torch ops on the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from zerocheck.jit import numba

_BITS = torch.arange(32, dtype=torch.int32)


@dataclass(frozen=True)
class TokenMask:
    """bits: int32 [B, W] (see the module docstring); rows: bool [B], the rows it applies to."""

    bits: np.ndarray
    rows: np.ndarray

    def allows(self, row: int, token: int) -> bool:
        """Whether `token` may be drawn in `row` (any token on a row without a mask)."""
        return not self.rows[row] or bool((self.bits[row, token >> 5] >> (token & 31)) & 1)


def _mask_row(row, words):
    """-inf at the tokens of `row` whose bit in `words` is clear (a word of all ones: nothing to do)."""
    vocab = row.shape[0]
    for w in range(words.shape[0]):
        word = words[w]
        if word == -1:
            continue
        start = w * 32
        for i in range(min(32, vocab - start)):
            if not (word >> i) & 1:
                row[start + i] = -np.inf


def _mask_rows(x, bits, rows):
    for r in numba.prange(x.shape[0]):
        if rows[r]:
            _mask_row(x[r], bits[r])


if numba is not None:
    _mask_row = numba.njit(inline="always", cache=True)(_mask_row)
    _mask_rows = numba.njit(parallel=True, cache=True)(_mask_rows)


def apply_token_mask(x: torch.Tensor, mask: TokenMask) -> None:
    """Write -inf at the disallowed tokens of the masked rows of x [B, V], in place."""
    if x.shape[0] != mask.bits.shape[0] or mask.bits.shape[1] * 32 < x.shape[1]:
        raise ValueError(f"a token mask of shape {list(mask.bits.shape)} does not fit logits {list(x.shape)}")
    if numba is not None and x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous():
        _mask_rows(x.numpy(), mask.bits, mask.rows)
        return
    rows = torch.from_numpy(np.flatnonzero(mask.rows)).to(x.device)
    bits = torch.from_numpy(mask.bits).to(x.device)[rows]
    allowed = ((bits.unsqueeze(-1) >> _BITS.to(x.device)) & 1).flatten(1)[:, :x.shape[1]].bool()
    x[rows] = x[rows].masked_fill(~allowed, -float("inf"))
