"""What a benchmark's figures were measured on: the CPU (model, the vector extensions that pick kernels, cores)
and the checkout's commit. Imported by the benchmark scripts beside it."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from zerocheck.bench.machine import cpu  # noqa: F401  (the benchmarks import it from here)

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "unknown"


def write_result(out: Path, name: str, fields: dict) -> Path:
    """`out/name`: the benchmark's `fields` after its command, the CPU and the commit (what every figure
    carries), as indented JSON; says where it went."""
    result = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "cpu": cpu(), "commit": commit(), **fields}
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out / name}")
    return out / name
