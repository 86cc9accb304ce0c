"""`attention_kernel.decode_attention` (numba) against float32 attention over the same bf16 pool."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zerocheck.decoder import attention_kernel
from zerocheck.decoder.model import apply_rotary, rotary_cos_sin

pytestmark = pytest.mark.skipif(not attention_kernel.available(), reason="numba is not installed")

HEADS, KV_HEADS, HEAD_DIM, SLOTS, MAX_SEQ = 6, 2, 32, 12, 80
INV_FREQ = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))


def case(rows: int, seed: int, longest: int = 60):
    generator = torch.Generator().manual_seed(seed)
    pool = [torch.randn(SLOTS, KV_HEADS, MAX_SEQ, HEAD_DIM, generator=generator).to(torch.bfloat16) for _ in range(2)]
    slots = torch.randperm(SLOTS, generator=generator)[:rows]
    lengths = torch.randint(0, longest, (rows,), generator=generator)
    qkv = (3 * torch.randn(rows, (HEADS + 2 * KV_HEADS) * HEAD_DIM, generator=generator)).to(torch.bfloat16)
    return pool, slots, lengths, qkv


def run(kernel, pool, slots, lengths, qkv) -> torch.Tensor:
    cos, sin = (angle.reshape(len(lengths), HEAD_DIM).contiguous() for angle in rotary_cos_sin(lengths[:, None], INV_FREQ))
    out = torch.zeros(len(lengths), HEADS * HEAD_DIM, dtype=torch.bfloat16)
    bits = attention_kernel.as_bits
    kernel(bits(qkv), cos.numpy(), sin.numpy(), slots.numpy(), lengths.numpy(), bits(pool[0]), bits(pool[1]), bits(out),
           HEADS, KV_HEADS, *([np.float32(HEAD_DIM**-0.5)] if kernel is not attention_kernel.decode_attention else []))
    return out


@pytest.mark.parametrize("rows", [1, 5])
def test_decode_attention_is_float32_attention_over_the_pool(rows: int) -> None:
    """Each row's new key (rotated) and value land at its position in its slot, within bf16 rounding of the
    float32 rotation; its heads attend over its own positions only, within bf16 rounding of float32
    attention (queries grouped per KV head); nothing else in the pool changes."""
    pool, slots, lengths, qkv = case(rows, seed=rows)
    before = [cache.clone() for cache in pool]
    out = run(attention_kernel.decode_attention, pool, slots, lengths, qkv)
    cos, sin = rotary_cos_sin(lengths[:, None], INV_FREQ)
    q, k, v = qkv.float().split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
    q = apply_rotary(q.view(rows, HEADS, 1, HEAD_DIM), cos, sin)[:, :, 0]
    k = apply_rotary(k.view(rows, KV_HEADS, 1, HEAD_DIM), cos, sin)[:, :, 0]
    for b in range(rows):
        slot, position = int(slots[b]), int(lengths[b])
        stored_keys, stored_values = (cache[slot, :, position].float() for cache in pool)
        assert torch.allclose(stored_keys, k[b], rtol=2**-8, atol=1e-6)
        assert torch.equal(stored_values, v[b].view(KV_HEADS, HEAD_DIM).to(torch.bfloat16).float())
        keys, values = (cache[slot, :, : position + 1].float() for cache in pool)  # [Hkv, n, D]
        grouped = q[b].view(KV_HEADS, HEADS // KV_HEADS, HEAD_DIM)
        weights = torch.softmax(grouped @ keys.transpose(-1, -2) * HEAD_DIM**-0.5, dim=-1)
        expected = (weights @ values).reshape(HEADS * HEAD_DIM)
        assert torch.allclose(out[b].float(), expected, rtol=2**-8, atol=1e-3 * float(expected.abs().max()))
        for cache, old in zip(pool, before):
            old[slot, :, position] = cache[slot, :, position]
    for cache, old in zip(pool, before):
        assert torch.equal(cache, old)


def test_the_threaded_and_serial_loops_give_the_same_bits() -> None:
    """The work items are independent: spreading them over threads changes nothing."""
    pool, slots, lengths, qkv = case(8, seed=3, longest=MAX_SEQ - 1)
    other = [cache.clone() for cache in pool]
    serial = run(attention_kernel._attend_serial, pool, slots, lengths, qkv)
    threaded = run(attention_kernel._attend_parallel, other, slots, lengths, qkv)
    assert torch.equal(serial, threaded)
    assert all(torch.equal(a, b) for a, b in zip(pool, other))


def test_a_first_token_attends_to_itself() -> None:
    """At position 0 the only position is the new one: the output is the value (softmax of one score is 1)."""
    pool, slots, _, qkv = case(3, seed=4)
    lengths = torch.zeros(3, dtype=torch.int64)
    out = run(attention_kernel.decode_attention, pool, slots, lengths, qkv)
    values = qkv[:, (HEADS + KV_HEADS) * HEAD_DIM:].view(3, KV_HEADS, 1, HEAD_DIM)
    expected = values.expand(-1, -1, HEADS // KV_HEADS, -1).reshape(3, HEADS * HEAD_DIM)
    assert torch.equal(out, expected)


def test_bfloat16_rounding_is_to_nearest_even() -> None:
    """The kernel's float32 -> bfloat16 store is torch's (round to nearest, ties to even), halfway cases too."""
    generator = torch.Generator().manual_seed(5)
    wide = torch.randn(4096, generator=generator) * 10
    halfway = (wide.view(torch.int32) & ~0xFFFF | 0x8000).view(torch.float32)  # exactly between two bf16 values
    values = torch.cat([wide, halfway, torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 3.3895e38])])
    out = np.zeros(len(values), np.int16)
    attention_kernel._narrow(values.numpy(), np.empty(len(values), np.float32), out)
    assert torch.equal(torch.from_numpy(out).view(torch.bfloat16), values.to(torch.bfloat16))
