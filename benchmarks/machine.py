"""What a benchmark's figures were measured on: the CPU (model, the vector extensions that pick kernels, cores)
and the checkout's commit. Imported by the benchmark scripts beside it."""
from __future__ import annotations

import platform
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cpu() -> dict[str, str]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.*)", info)
    flags = re.search(r"flags\s*:\s*(.*)", info)
    wanted = [f for f in (flags[1].split() if flags else []) if re.match(r"avx|amx|fma|f16c", f)]
    return {"model": model[1] if model else platform.processor(), "flags": " ".join(sorted(set(wanted))),
            "cores": str(len(re.findall(r"^processor", info, re.M)))}


def commit() -> str:
    done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    return done.stdout.strip() or "unknown"
