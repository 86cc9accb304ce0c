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
from typing import Sequence

import numpy as np
import torch

_M32 = 0xFFFFFFFF
_MUL = 0x45D9F3B
_GOLDEN = 0x9E3779B1
_fresh = random.Random()  # seeded from os.urandom at import


def _mix32(z):
    """Bijective 32-bit avalanche hash on int64 tensors or arrays holding values in [0, 2**32)."""
    z = ((z >> 16) ^ z) * _MUL & _M32
    z = ((z >> 16) ^ z) * _MUL & _M32
    return (z >> 16) ^ z


def _key_words(lo, hi, step):
    """The two key words of a row from its seed's 32-bit halves and its step: Python ints or int64
    arrays alike (the same operators)."""
    s = _mix32((step & _M32) ^ _GOLDEN)
    a = _mix32(lo ^ _mix32(hi ^ s))
    return a, _mix32(a ^ _mix32((step >> 32) ^ 0x5BD1E995 ^ hi))


SMALL_BATCH = 8  # up to this many seeded rows, Python ints beat numpy's per-call cost


def _fresh_words(rows: int) -> np.ndarray:
    """[rows, 2] int64: fresh random 32-bit words, drawn as one big integer."""
    raw = _fresh.getrandbits(64 * rows).to_bytes(8 * rows, "little")
    return np.frombuffer(raw, dtype=np.uint32).astype(np.int64).reshape(rows, 2)


def row_keys(seeds: Sequence[int | None], steps: Sequence[int]) -> np.ndarray:
    """[R, 2] int64: two 32-bit words per row that identify its noise stream at its decode step,
    computed for all seeded rows at once; unseeded rows get fresh random words."""
    keys = _fresh_words(len(seeds))
    seeded = [i for i, seed in enumerate(seeds) if seed is not None]
    if len(seeded) <= SMALL_BATCH:
        for i in seeded:
            keys[i] = _key_words(seeds[i] & _M32, seeds[i] >> 32, int(steps[i]))
        return keys
    values = np.array([seeds[i] for i in seeded], dtype=np.uint64)
    lo, hi = (values & np.uint64(_M32)).astype(np.int64), (values >> np.uint64(32)).astype(np.int64)
    keys[seeded] = np.stack(_key_words(lo, hi, np.asarray(steps, dtype=np.int64).reshape(-1)[seeded]), axis=1)
    return keys


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
