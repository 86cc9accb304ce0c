"""How many threads the decoder's CPU forward uses, chosen again as the rest of the machine's load changes.

The decoder's OpenMP threads spin between parallel regions (the decoder's `omp_spin_count`): on cores it has
to itself that shortens a batched step, as no sleeping thread has to be woken. But when another process holds
one of the cores, a team of spinning threads waits a scheduler time slice at every barrier for its descheduled
member, and a forward holds ~150 of them, so a step beside a busy process (such as a load generator's timing
process) takes far longer. A shorter spin, or none, helps there but slows the one-row step when the cores
are free. A team of one has no barrier to wait at.

`ThreadShare` wraps each forward. Every `window_s` seconds (at a forward's start) it samples the CPU time of
the CPUs this process may run on (/proc/stat; its affinity: a container's cpuset) and this process's; over a
window in which the decoder spent at least BUSY_SHARE of the time in forwards (so what the others used, they
used while it ran: not while it waited, say for the checked chain's models between its steps), it gives the
forwards the cores the other processes left: `max_threads` while they keep less than half a core busy beyond
the ones in use, one thread fewer for each further core (dropping once they reach 0.75, rising again under
0.5: the band keeps it from flapping). It sets torch's intra-op threads
and numba's (the compiled kernels'), and logs each change. Where /proc/stat cannot be read (not Linux), the
count stays as loaded, logged once.
"""
from __future__ import annotations

import logging
import math
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from zerocheck.jit import numba

log = logging.getLogger("zerocheck")

WINDOW_S = 0.5  # the shortest span between two samples
BUSY_SHARE = 0.7  # the share of a window spent in forwards for it to count
DROP_AT, RISE_UNDER = 0.75, 0.5  # cores kept busy by other processes, above the ones a thread count leaves


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds at one moment: the machine's busy time over every core, this process's own, and the wall
    clock."""

    busy: float
    own: float
    wall: float


def usable_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity: a container's cpuset, `taskset`), else all."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def read_sample(cpus: frozenset[int] | None = None, stat_path: str = "/proc/stat") -> CpuSample | None:
    """The busy CPU time of `cpus` (default: `usable_cpus()`) from /proc/stat's per-CPU lines (user nice system
    idle iowait irq softirq steal, in clock ticks: all but idle and iowait; other CPUs of the host, another
    container's, do not count) and this process's from `time.process_time`; None where the file cannot be read
    or names none of them."""
    cpus = usable_cpus() if cpus is None else cpus
    try:
        with open(stat_path, "rb") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    ticks, found = 0, False
    for line in lines:
        fields = line.split()
        if len(fields) < 9 or not fields[0].startswith(b"cpu") or not fields[0][3:].isdigit():
            continue
        if int(fields[0][3:]) in cpus:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(value) for value in fields[1:9])
            ticks += user + nice + system + irq + softirq + steal
            found = True
    if not found:
        return None
    return CpuSample(busy=ticks / os.sysconf("SC_CLK_TCK"), own=time.process_time(), wall=time.monotonic())


def others_busy(before: CpuSample, after: CpuSample) -> float:
    """Cores kept busy by other processes between two samples: the machine's busy CPU seconds less this
    process's, over the wall seconds between them (0 or more)."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def wanted_threads(current: int, others: float, cores: int, max_threads: int) -> int:
    """The thread count for `others` cores busy elsewhere: fewer once they reach DROP_AT past a whole core,
    more again once under RISE_UNDER (see the module docstring); between, `current`."""
    drop = min(max_threads, cores - math.floor(others + 1 - DROP_AT))
    rise = min(max_threads, cores - math.floor(others + 1 - RISE_UNDER))
    if drop < current:
        return max(1, drop)
    if rise > current:
        return max(1, rise)
    return current


class ThreadShare:
    """`with share.forward(): ...` around each forward; `apply(n)` sets the forwards' thread count."""

    def __init__(self, max_threads: int, apply: Callable[[int], None], cores: int | None = None,
                 read: Callable[[], CpuSample | None] = read_sample, window_s: float = WINDOW_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """cores: how many CPUs `read` counts (default: `usable_cpus()`'s, which `read_sample` counts)."""
        self.max_threads = self.threads = max_threads
        self.cores = cores or len(usable_cpus())
        self._apply, self._read, self._window_s, self._clock = apply, read, window_s, clock
        self._last = read()
        self._forward_s = 0.0  # spent in forwards since the last sample
        if self._last is None:
            log.warning("decoder: /proc/stat is unreadable: its %d threads stay as loaded whatever else runs",
                        max_threads)

    @contextmanager
    def forward(self) -> Iterator[None]:
        start = self._clock()
        if self._last is not None and start - self._last.wall >= self._window_s:
            self._close_window()
        try:
            yield
        finally:
            self._forward_s += self._clock() - start

    def _close_window(self) -> None:
        sample = self._read()
        if sample is None:  # no longer readable: stop sampling (each forward would try again)
            log.warning("decoder: /proc/stat became unreadable: its %d threads stay as they are", self.threads)
            self._last = None
            return
        last, self._last = self._last, sample
        busy, self._forward_s = self._forward_s, 0.0
        if busy < BUSY_SHARE * (sample.wall - last.wall):
            return
        others = others_busy(last, sample)
        threads = wanted_threads(self.threads, others, self.cores, self.max_threads)
        if threads != self.threads:
            log.warning("decoder: other processes keep %.2f of %d cores busy: forward threads %d -> %d",
                        others, self.cores, self.threads, threads)
            self._apply(threads)
            self.threads = threads


def set_forward_threads(threads: int) -> None:
    """torch's intra-op threads and numba's (when installed) for the forwards that follow."""
    torch.set_num_threads(threads)
    if numba is not None:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
