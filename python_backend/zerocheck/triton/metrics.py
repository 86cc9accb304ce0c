"""`DeferredMetrics`: the per-step metric calls of a model, handed to Triton in batches."""
from __future__ import annotations

import math
import time
from typing import Any, Callable


class DeferredMetrics:
    """Counter increments and gauge values kept in the process and handed to Triton together, at most
    every `interval_s`, or at once when a gauge changes: every pb_utils metric call is a round trip to
    the server process, too dear to pay per decode step. A model calls `flush` at the end of
    each execute; counters then lag by at most `interval_s` while it runs, and are exact at rest as
    long as its last execute changed a gauge (the decoder's last one frees a KV slot)."""

    def __init__(self, interval_s: float = 0.25, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self._counts: dict[int, list] = {}  # id(metric) -> [metric, amount not yet pushed]
        self._gauges: dict[int, list] = {}  # id(metric) -> [metric, value, value last pushed]
        self._pushed_at = -math.inf

    def increment(self, metric: Any, amount: float) -> None:
        self._counts.setdefault(id(metric), [metric, 0.0])[1] += amount

    def set(self, metric: Any, value: float) -> None:
        self._gauges.setdefault(id(metric), [metric, value, None])[1] = value

    def flush(self) -> None:
        now = self.clock()
        changed = any(entry[2] != entry[1] for entry in self._gauges.values())
        if not changed and now - self._pushed_at < self.interval_s:
            return
        for entry in self._counts.values():
            if entry[1]:
                entry[0].increment(entry[1])
                entry[1] = 0.0
        for entry in self._gauges.values():
            if entry[2] != entry[1]:
                entry[0].set(entry[1])
                entry[2] = entry[1]
        self._pushed_at = now
