"""`layer_kernel` (numba) against `PackedTransformer`'s torch glue: residual add + RMSNorm, SiLU(gate) x up."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from zerocheck.decoder import layer_kernel
from zerocheck.decoder.attention_kernel import as_bits
from zerocheck.decoder.packed import _rms_norm

pytestmark = pytest.mark.skipif(not layer_kernel.available(), reason="numba is not installed")

EPS = 1e-5


def randn(*shape: int, scale: float = 1.0, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=generator)).to(torch.bfloat16)


@pytest.mark.parametrize("rows", [1, 7, layer_kernel.PARALLEL_ROWS, 3 * layer_kernel.PARALLEL_ROWS + 1])
def test_add_rms_norm_is_the_torch_glue(rows: int) -> None:
    """x + delta written back as torch's bf16 add; the norm as `_rms_norm` (float32 statistics, bf16 scaling):
    equal here, at most one bf16 step away anywhere (the float32 sum runs in another order); from
    PARALLEL_ROWS rows on the rows are split over numba's threads (every row written once, an odd count too)."""
    x, delta = randn(rows, 576, seed=1), randn(rows, 576, scale=4.0, seed=2)
    x[0, :8] = 0  # zeros and a large row mix
    weight = (torch.rand(576, generator=torch.Generator().manual_seed(3)) + 0.5).to(torch.bfloat16)
    expected_x = x + delta
    expected = _rms_norm(expected_x, weight, EPS)
    out = torch.empty_like(x)
    layer_kernel.add_rms_norm(as_bits(x), as_bits(delta), as_bits(weight), EPS, as_bits(out))
    assert torch.equal(x, expected_x)
    assert torch.equal(out, expected)


@pytest.mark.parametrize("rows", [3, layer_kernel.PARALLEL_ROWS + 1])
def test_rms_norm_of_a_zero_row_is_zero_and_of_others_the_torch_glue(rows: int) -> None:
    x = randn(rows, 64, scale=30.0, seed=4)
    x[1] = 0
    weight = randn(64, seed=5)
    out = torch.full_like(x, 7.0)
    layer_kernel.rms_norm(as_bits(x), as_bits(weight), EPS, as_bits(out))
    assert torch.equal(out, _rms_norm(x, weight, EPS))
    assert not out[1].any()


@pytest.mark.parametrize("rows", [5, 2 * layer_kernel.PARALLEL_ROWS + 1])
def test_silu_mul_is_the_torch_glue_over_the_whole_range(rows: int) -> None:
    """bf16(bf16(silu(gate)) * up), as `F.silu(gate) * up` on bf16 tensors: equal on ordinary values; at the
    extremes (|gate| past float32's exp range) within one bf16 step, and never NaN."""
    gate_up = randn(rows, 2 * 384, scale=4.0, seed=6)
    gate, up = gate_up.chunk(2, dim=-1)
    out = torch.empty(rows, 384, dtype=torch.bfloat16)
    layer_kernel.silu_mul(as_bits(gate_up), as_bits(out))
    assert torch.equal(out, F.silu(gate) * up)
    extremes = torch.tensor([[-1e4, -200.0, -88.0, -87.5, 0.0, 87.5, 200.0, 1e4] + [1.0] * 8], dtype=torch.bfloat16)
    extremes[0, 8:] = torch.tensor([1.0, 2.0, -3.0, 0.5, 1.0, 1.0, -1.0, 2.0])
    out = torch.empty(1, 8, dtype=torch.bfloat16)
    layer_kernel.silu_mul(as_bits(extremes), as_bits(out))
    gate, up = extremes.chunk(2, dim=-1)
    expected = F.silu(gate) * up
    assert not out.isnan().any()
    assert torch.allclose(out.float(), expected.float(), rtol=2**-7, atol=1e-30)
