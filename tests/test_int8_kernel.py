"""`int8_kernel`: per-row int8 codes of a weight and the compiled matrix-vector product on them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from zerocheck.decoder import int8_kernel
from zerocheck.decoder.attention_kernel import as_bits

pytestmark = pytest.mark.skipif(not int8_kernel.available(), reason="numba is not installed")


def test_codes_reproduce_each_row_within_half_its_step() -> None:
    weight = torch.randn(7, 96, generator=torch.Generator().manual_seed(0)) * torch.arange(1, 8)[:, None]
    weight[3] = 0  # a row of zeros: scale 1, codes 0
    codes, scales = int8_kernel.quantise_rows(weight)
    assert codes.dtype == np.int8 and scales.dtype == np.float32 and codes.shape == (7, 96) and scales.shape == (7,)
    assert np.abs(codes.astype(np.int32)).max() == 127 and (codes != -128).all()
    assert scales[3] == 1 and not codes[3].any()
    back = codes.astype(np.float32) * scales[:, None]
    assert np.all(np.abs(back - weight.numpy()) <= scales[:, None] / 2 * (1 + 1e-6))


@pytest.mark.parametrize("rows", [1, 5, 1000])
def test_matvec_is_the_float64_product_of_the_codes_within_float32_rounding(rows: int) -> None:
    """Every output (an odd count: the threads' runs split it unevenly), against float64 on the same codes and the
    bfloat16 input widened exactly."""
    generator = torch.Generator().manual_seed(rows)
    codes, scales = int8_kernel.quantise_rows(torch.randn(rows, 576, generator=generator))
    x = torch.randn(576, generator=generator).to(torch.bfloat16)
    out = np.full(rows, np.nan, np.float32)
    int8_kernel.matvec(codes, scales, as_bits(x), out)
    expected = (codes.astype(np.float64) @ x.double().numpy()) * scales
    bound = 1e-5 * (np.abs(codes.astype(np.float64)) @ np.abs(x.double().numpy())) * scales + 1e-30
    assert np.all(np.abs(out - expected) <= bound)
