"""What a benchmark's figures were measured on: the CPU (model, the vector extensions that pick kernels, cores)
and the checkout's commit. Imported by the benchmark scripts beside it."""
from __future__ import annotations

import subprocess
from pathlib import Path

from zerocheck.bench.machine import cpu  # noqa: F401  (the benchmarks import it from here)

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "unknown"
