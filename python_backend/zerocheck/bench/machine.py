"""The CPU a benchmark ran on: its model, the vector extensions that pick kernels, and its core count."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path


def cpu() -> dict[str, str]:
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    model = re.search(r"model name\s*:\s*(.*)", info)
    flags = re.search(r"flags\s*:\s*(.*)", info)
    wanted = [f for f in (flags[1].split() if flags else []) if re.match(r"avx|amx|fma|f16c", f)]
    return {"model": model[1] if model else platform.processor(), "flags": " ".join(sorted(set(wanted))),
            "cores": str(len(re.findall(r"^processor", info, re.M)) or os.cpu_count())}


__all__ = ["cpu"]
