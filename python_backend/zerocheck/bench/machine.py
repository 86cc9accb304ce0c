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


def cpu_kind(flags: str) -> str:
    """The kind of x86-64 CPU that picks the decoder's kernels, from `cpu()["flags"]`: avx512-bf16 (it multiplies
    bfloat16: AVX512-BF16 or AMX), avx512 (AVX-512 without bf16), or avx2."""
    found = set(flags.split())
    if found & {"avx512_bf16", "amx_bf16"}:
        return "avx512-bf16"
    return "avx512" if "avx512f" in found else "avx2"


__all__ = ["cpu", "cpu_kind"]
