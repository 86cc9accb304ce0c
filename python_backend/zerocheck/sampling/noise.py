"""Counter-based exponential noise for the exponential race (Gumbel-max) draw.

Noise is a pure function of (row key, counter): a seeded request gets the same noise for the same
token id at the same step on any batch position, on CPU and GPU alike, and the functions are plain
tensor ops, so they can be captured in a CUDA graph. A row key is two 32-bit words derived from
(seed, step) on the host; unseeded rows get fresh random words per call.

The hash is the 32-bit "lowbias"-style finalizer applied twice, computed in int64 with multipliers
below 2**31 so no product overflows.
"""
from __future__ import annotations

import random

import torch

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B
_GOLDEN = 0x9E3779B1
_fresh = random.Random()  # seeded from os.urandom at import


def _mix32(z: torch.Tensor) -> torch.Tensor:
    """Bijective 32-bit avalanche hash on int64 tensors holding values in [0, 2**32)."""
    z = ((z >> 16) ^ z) * _MUL & _M32
    z = ((z >> 16) ^ z) * _MUL & _M32
    return (z >> 16) ^ z


def _mix32_int(z: int) -> int:
    z = ((z >> 16) ^ z) * _MUL & _M32
    z = ((z >> 16) ^ z) * _MUL & _M32
    return (z >> 16) ^ z


def row_key(seed: int | None, step: int) -> tuple[int, int]:
    """Two 32-bit words that identify the noise stream of one row at one decode step."""
    if seed is None:
        return _fresh.getrandbits(32), _fresh.getrandbits(32)
    lo, hi = seed & _M32, (seed >> 32) & _M32
    s = _mix32_int((step & _M32) ^ _GOLDEN)
    a = _mix32_int(lo ^ _mix32_int(hi ^ s))
    b = _mix32_int(a ^ _mix32_int((step >> 32) ^ 0x5BD1E995 ^ hi))
    return a, b


def exponential_noise(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """E ~ Exp(1), one per counter.

    keys: [R, 2] int64 row keys; counters: [R, N] int64 (token ids, or salted group ids).
    Returns [R, N] float64, strictly positive and finite.
    """
    z = _mix32(_mix32(keys[:, :1] ^ (counters & _M32)) ^ keys[:, 1:])
    z = _mix32(z ^ (counters >> 32))
    u = (z.to(torch.float64) + 0.5) * (1.0 / 4294967296.0)  # (0, 1)
    return -torch.log(u)


def race_scores(log_weights: torch.Tensor, keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """Exponential race scores: argmax(log w - log E) draws index i with probability w_i / sum(w).

    log_weights: [R, N] float (-inf excludes an entry); returns [R, N] float64.
    """
    return log_weights.to(torch.float64) - torch.log(exponential_noise(keys, counters))
