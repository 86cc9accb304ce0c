"""Compiled (numba) decode attention over the KV cache pool: one call a layer for every row of a
one-token step, reading and writing the pool's bfloat16 slots in place.

For row b (its new token at position p = lengths[b], its sequence in pool slot s = slots[b]) and every
KV head h, `decode_attention`:
- rotates the new key (rotary angles of p, Hugging Face half-split layout) and stores it, with the new
  value, at keys[s, h, p] / values[s, h, p] (rounded to bfloat16, to nearest even);
- rotates the h-th group's query heads and attends over positions 0..p of slot s: scores, softmax and
  the weighted sum of values in float32 (the pool's bfloat16 widened exactly), the result rounded to
  bfloat16 into `out`.
Each row reads only its own positions (no padding to the longest row, no attention bias) and nothing
is copied out of the pool: torch's bf16 matmuls copy a strided window of the pool before they multiply
(they take contiguous operands only), and a batched step of ~20 small torch ops a layer costs more in
dispatch than the arithmetic at one row. The torch path (`PackedTransformer` without it) rounds
queries, scores and weights to bfloat16 on the way; here they stay float32, nearer the fp32 model.

bfloat16 tensors reach numba as int16 views (`as_bits`; `zerocheck.jit`'s bfloat16 helpers).
Work items are (row, KV head) pairs: spread over numba's threads (zerocheck.jit) in a heavy step, in
the calling thread in a light one (PARALLEL_WORK).
"""
from __future__ import annotations

import numpy as np
import torch

from zerocheck.jit import (EXP_FLOOR, available, exp_parts, numba, round_bf16, store_bf16,  # noqa: F401
                           widen_bf16)  # (available: the kernel runs)

# (row, KV head) items x positions attended, summed over the step, from which the items run on numba's
# threads: a heavy step (many rows over long pasts) gains from them, a light one does not and stays in the
# calling thread (benchmarks/decoder.py measures the step)
PARALLEL_WORK = 4096
_F = np.float32


def as_bits(tensor: torch.Tensor) -> np.ndarray:
    """A bfloat16 tensor's memory as an int16 numpy array (no copy)."""
    return tensor.view(torch.int16).numpy()


def _narrow(values, scratch, bits):
    """float32 `values` -> bfloat16 bits (round to nearest even) into `bits` (int16); `scratch`: float32."""
    scratch[:] = values
    round_bf16(scratch)
    store_bf16(scratch, bits)


def _rotate(x, cos, sin, out):
    """Rotary embedding of one head: out = x * cos + cat(-x2, x1) * sin (x1, x2 the halves of x)."""
    half = x.shape[0] // 2
    for d in range(half):
        out[d] = x[d] * cos[d] - x[d + half] * sin[d]
        out[d + half] = x[d + half] * cos[d + half] + x[d] * sin[d + half]


def _softmax(x, powers):
    """x <- softmax(x) in place; `powers`: int32 scratch as long as x (exp: `zerocheck.jit.exp_parts`)."""
    n = x.shape[0]
    top = x[0]
    for p in range(1, n):
        top = max(top, x[p])
    for p in range(n):
        x[p], powers[p] = exp_parts(max(x[p] - top, EXP_FLOOR))  # below the floor: exp(floor), ~1.6e-38
    scale = powers.view(np.float32)
    total = _F(0.0)
    for p in range(n):
        x[p] *= scale[p]
        total += x[p]
    inverse = _F(1.0) / total
    for p in range(n):
        x[p] *= inverse


def _attend_item(item, qkv, cos, sin, slots, lengths, keys, values, out, heads, kv_heads, scale):
    """Row item // kv_heads, KV head item % kv_heads: store its new key and value, attend its queries."""
    head_dim = keys.shape[3]
    groups = heads // kv_heads
    r, h = item // kv_heads, item % kv_heads
    slot, position = slots[r], lengths[r]
    n = position + 1
    raw = np.empty(head_dim, np.float32)
    rotated = np.empty(head_dim, np.float32)
    scratch = np.empty(head_dim, np.float32)
    # the new key (rotated) and value into the pool
    k_at = (heads + h) * head_dim
    widen_bf16(qkv[r, k_at:k_at + head_dim], raw)
    _rotate(raw, cos[r], sin[r], rotated)
    _narrow(rotated, scratch, keys[slot, h, position])
    v_at = (heads + kv_heads + h) * head_dim
    values[slot, h, position, :] = qkv[r, v_at:v_at + head_dim]
    # the group's queries, rotated and scaled
    queries = np.empty((groups, head_dim), np.float32)
    for g in range(groups):
        q_at = (h * groups + g) * head_dim
        widen_bf16(qkv[r, q_at:q_at + head_dim], raw)
        _rotate(raw, cos[r], sin[r], rotated)
        for d in range(head_dim):
            queries[g, d] = rotated[d] * scale
    # scores over positions 0..position, softmax, weighted sum of values
    scores = np.empty((groups, n), np.float32)
    key = np.empty(head_dim, np.float32)
    for p in range(n):
        widen_bf16(keys[slot, h, p], key)
        for g in range(groups):
            s = np.float32(0.0)
            for d in range(head_dim):
                s += queries[g, d] * key[d]
            scores[g, p] = s
    powers = np.empty(n, np.int32)
    for g in range(groups):
        _softmax(scores[g], powers)
    acc = np.zeros((groups, head_dim), np.float32)
    value = np.empty(head_dim, np.float32)
    for p in range(n):
        widen_bf16(values[slot, h, p], value)
        for g in range(groups):
            w = scores[g, p]
            for d in range(head_dim):
                acc[g, d] += w * value[d]
    for g in range(groups):
        q_at = (h * groups + g) * head_dim
        _narrow(acc[g], scratch, out[r, q_at:q_at + head_dim])


def _attend_serial(qkv, cos, sin, slots, lengths, keys, values, out, heads, kv_heads, scale):
    for item in range(qkv.shape[0] * kv_heads):
        _attend_item(item, qkv, cos, sin, slots, lengths, keys, values, out, heads, kv_heads, scale)


def _attend_parallel(qkv, cos, sin, slots, lengths, keys, values, out, heads, kv_heads, scale):
    for item in numba.prange(qkv.shape[0] * kv_heads):
        _attend_item(item, qkv, cos, sin, slots, lengths, keys, values, out, heads, kv_heads, scale)


if numba is not None:
    _FAST = {"reassoc", "nsz", "contract", "arcp", "afn"}
    _narrow = numba.njit(inline="always", cache=True)(_narrow)
    _rotate = numba.njit(inline="always", cache=True, fastmath=_FAST)(_rotate)
    _softmax = numba.njit(inline="always", cache=True, fastmath={"reassoc", "nsz", "contract"})(_softmax)
    _attend_item = numba.njit(cache=True, fastmath=_FAST)(_attend_item)
    _attend_serial = numba.njit(cache=True)(_attend_serial)
    _attend_parallel = numba.njit(parallel=True, cache=True)(_attend_parallel)


def warm_up() -> None:
    """Compile (or load from numba's disk cache) both loops now, with the argument types a step passes:
    compiled at a first request, their compilation (with a cold cache) would stall that request."""
    heads, kv_heads, head_dim = 2, 1, 4
    for rows, length in ((1, 0), (2, PARALLEL_WORK)):  # serial, threaded
        pool = np.zeros((2, rows, kv_heads, length + 1, head_dim), np.int16)
        angles = np.zeros((rows, head_dim), np.float32)
        decode_attention(np.zeros((rows, (heads + 2 * kv_heads) * head_dim), np.int16), angles, angles,
                         np.arange(rows, dtype=np.int64), np.full(rows, length, dtype=np.int64), pool[0], pool[1],
                         np.zeros((rows, heads * head_dim), np.int16), heads, kv_heads)


def step_loop(lengths: np.ndarray, kv_heads: int):
    """The loop for a step of rows with these lengths (PARALLEL_WORK): `_attend_parallel` or `_attend_serial`,
    both called as `decode_attention` calls them, with the scale head_dim ** -0.5 as a float32 last."""
    work = kv_heads * int(lengths.sum() + len(lengths))
    return _attend_parallel if work >= PARALLEL_WORK and len(lengths) * kv_heads > 1 else _attend_serial


def decode_attention(qkv: np.ndarray, cos: np.ndarray, sin: np.ndarray, slots: np.ndarray, lengths: np.ndarray,
                     keys: np.ndarray, values: np.ndarray, out: np.ndarray, heads: int, kv_heads: int) -> None:
    """One layer's attention for a one-token step of B rows (see the module docstring); a caller that runs
    every layer of a step picks the loop once with `step_loop`.

    qkv: [B, (heads + 2 kv_heads) x D] bfloat16 bits (int16; queries, keys, values as projected, before
    rotation); cos, sin: [B, D] float32 angles of each row's position; slots, lengths: [B] int64 (the
    new token's position is lengths[b]); keys, values: one layer's [S, Hkv, max_seq_len, D] pool, bits;
    out: [B, heads x D] bits, written."""
    step_loop(lengths, kv_heads)(qkv, cos, sin, slots, lengths, keys, values, out, heads, kv_heads,
                                 np.float32(keys.shape[3] ** -0.5))
