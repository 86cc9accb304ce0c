"""The python backend's `/dev/shm/triton_python_backend_shm_region_*` files: find a server's, remove stale ones."""
from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import psutil

SHM_DIR = Path("/dev/shm")
REGION_PREFIX = "triton_python_backend_shm_region_"


def server_processes(pid: int) -> list[psutil.Process]:
    """The stub (and any other) descendants of server `pid`; [] when it is gone."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def live_stub_regions(pid: int) -> set[str]:
    """Region names the stubs of server `pid` were started with (their argv names the region)."""
    regions = set()
    for child in server_processes(pid):
        try:
            regions.update(arg for arg in child.cmdline() if arg.startswith(REGION_PREFIX))
        except psutil.Error:
            continue
    return regions


def mapped_regions() -> set[str]:
    """Region names some live process still has mapped (from `/proc/*/maps`, where readable)."""
    mapped = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            start = line.find(REGION_PREFIX)
            if start >= 0:
                mapped.add(line[start:].split()[0])
    return mapped


def remove_regions(names: Iterable[str]) -> list[str]:
    """Unlink those of `names` still in /dev/shm that no live process maps; returns the names removed."""
    leftover = [name for name in names if (SHM_DIR / name).exists()]
    if not leftover:
        return []
    in_use = mapped_regions()
    removed = [name for name in leftover if name not in in_use]
    for name in removed:
        (SHM_DIR / name).unlink(missing_ok=True)
    return removed
