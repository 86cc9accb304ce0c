"""benchmarks/soak.py for one minute (slow): mixed gRPC / HTTP / OpenAI load on the real model at twice
the KV slots, 20 % of streams given up mid-way; the script's own checks must pass (no admitted request
fails, slots all free, RSS within +10 %, cancelled slots freed fast). `python benchmarks/soak.py` runs
the 10-minute version whose numbers the README gives."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import conftest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_one_minute_soak_passes_its_checks(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "soak.py"), "--minutes", "1", "--out", str(out),
                           "--artifacts", str(conftest.real_artifacts_dir())],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["outcomes"].get("ok", 0) > 0 and result["outcomes"].get("cancelled", 0) > 0, result
