"""The long abuse sweep through the HTTP door (slow): bodies from 0 B to 64 MB to generate and infer
(Content-Length and chunked, JSON and junk), truncated and never-finishing bodies and headers, 1 MB of
headers, unknown routes and methods, gRPC messages up to 256 MB. After each request the server is
alive, ready and serving, and no body above the limit got anything but 413 (benchmarks/http_sweep.py)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import conftest

pytestmark = pytest.mark.slow


def test_nothing_kills_the_server_through_the_door(tritonserver_binary, tmp_path: Path) -> None:
    report = tmp_path / "sweep.json"
    done = subprocess.run([sys.executable, str(conftest.REPO_ROOT / "benchmarks" / "http_sweep.py"),
                           "--artifacts", str(conftest.test_artifacts_dir()), "--json", str(report)],
                          capture_output=True, text=True, timeout=1800)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = json.loads(report.read_text())
    assert len(rows) > 40 and all(row["alive"] for row in rows)
    status = {row["case"]: row["status"] for row in rows}
    assert status["generate JSON 64 MB"] == status["infer junk 8 MB"] == status["generate JSON 20 MB chunked"] == "413"
    assert status["body that never finishes"] == "408" and status["1 MB header"] == "400"
    assert status["gRPC text_input 256 MB"] == "INVALID_ARGUMENT"
