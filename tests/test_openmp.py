"""`zerocheck.triton.openmp.set_spin_count` and the decoder adapter that relies on it: its module imports leave
torch unloaded, so the spin count set in `initialize` reaches the libgomp that torch loads afterwards."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch  # noqa: F401  (loaded in this process: set_spin_count must refuse)

from zerocheck.paths import packaged_model_repository
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
from zerocheck.triton.openmp import set_spin_count
set_spin_count(100000)
import torch
print(os.environ["GOMP_SPINCOUNT"])
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "100000"
