"""DeferredMetrics: per-step metric calls reach Triton batched, and exactly once at rest."""
from __future__ import annotations

from zerocheck.triton.metrics import DeferredMetrics


class FakeMetric:
    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def increment(self, amount: float) -> None:
        self.calls.append(("increment", amount))

    def set(self, value: float) -> None:
        self.calls.append(("set", value))


def test_counters_are_pushed_summed_once_per_interval_and_gauge_changes_at_once() -> None:
    now = [0.0]
    metrics = DeferredMetrics(interval_s=0.25, clock=lambda: now[0])
    seconds, slots = FakeMetric(), FakeMetric()
    metrics.set(slots, 1)
    metrics.increment(seconds, 0.5)
    metrics.flush()  # the first flush pushes
    assert seconds.calls == [("increment", 0.5)] and slots.calls == [("set", 1)]
    for step in range(10):  # steps within the interval, the gauge unchanged: nothing pushed
        now[0] += 0.01
        metrics.increment(seconds, 0.25)
        metrics.set(slots, 1)
        metrics.flush()
    assert len(seconds.calls) == 1 and len(slots.calls) == 1
    now[0] += 0.01
    metrics.set(slots, 0)  # a slot freed: everything goes out now
    metrics.flush()
    assert seconds.calls[1] == ("increment", 2.5) and slots.calls[1] == ("set", 0)
    now[0] += 1.0
    metrics.flush()  # nothing new: no call
    assert len(seconds.calls) == 2 and len(slots.calls) == 2
