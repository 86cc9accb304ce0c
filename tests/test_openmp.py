"""`zerocheck.triton.openmp.set_spin_count` and the decoder adapter that relies on it: its module imports leave
torch unloaded, so the spin count set in `initialize` reaches the libgomp that torch loads afterwards; the count
the decoder's `omp_spin_count` resolves to."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch  # noqa: F401  (loaded in this process: set_spin_count must refuse)

from zerocheck.paths import packaged_model_repository
from zerocheck.triton.config import TORCH_FORWARD_SPIN_COUNT, DecoderParameters
from zerocheck.triton.openmp import set_spin_count


def test_a_count_after_torch_is_loaded_is_refused_and_zero_changes_nothing(monkeypatch) -> None:
    monkeypatch.setenv("GOMP_SPINCOUNT", "10000")
    with pytest.raises(RuntimeError, match="before torch"):
        set_spin_count(100000)
    set_spin_count(0)
    assert os.environ["GOMP_SPINCOUNT"] == "10000"


def test_the_decoder_adapter_imports_without_torch_and_sets_the_count_before_it() -> None:
    code = f"""
import importlib.util, os, sys, types
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
sys.modules["triton_python_backend_utils"].TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1  # read at import
spec = importlib.util.spec_from_file_location("decoder_model", {str(packaged_model_repository() / "decoder/1/model.py")!r})
spec.loader.exec_module(importlib.util.module_from_spec(spec))
assert "torch" not in sys.modules and "numba" not in sys.modules, "the adapter's imports loaded torch or numba"
from zerocheck.triton.config import TORCH_FORWARD_SPIN_COUNT, DecoderParameters
from zerocheck.triton.openmp import set_spin_count
set_spin_count(100000)
import torch
print(os.environ["GOMP_SPINCOUNT"])
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "100000"


@pytest.mark.parametrize(("backend", "dtype", "configured", "count"), [
    ("auto", "auto", "auto", 0),  # openvino's forward: the server's spin
    ("openvino", "int8", "auto", 0),
    ("torch", "auto", "auto", TORCH_FORWARD_SPIN_COUNT),
    ("auto", "bf16", "auto", TORCH_FORWARD_SPIN_COUNT),
    ("auto", "auto", "2500", 2500),  # a count is taken as it is
])
def test_the_decoder_spin_count_follows_its_forward(backend: str, dtype: str, configured: str, count: int) -> None:
    assert decoder_parameters(backend=backend, dtype=dtype, omp_spin_count=configured).spin_count() == count


@pytest.mark.parametrize("configured", ["-1", "lots", ""])
def test_a_spin_count_neither_auto_nor_a_count_is_refused(configured: str) -> None:
    with pytest.raises(ValueError, match="omp_spin_count must be auto or a whole number"):
        decoder_parameters(omp_spin_count=configured)


def decoder_parameters(**changes: str) -> DecoderParameters:
    values = dict(backend="auto", dtype="auto", device="auto", int4_single_row=True, int8_lm_head_single_row=True,
                  prefix_cache_tokens=0, max_slots=4, max_seq_len=0, idle_timeout_s=60.0, num_threads=2,
                  omp_spin_count="auto", metrics_interval_s=0.25)
    return DecoderParameters(**(values | changes))
