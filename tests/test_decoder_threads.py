"""The decoder's forward thread count follows the cores other processes leave it (zerocheck.decoder.threads)."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from zerocheck.decoder.threads import CpuSample, ThreadShare, others_busy, read_sample, usable_cpus, wanted_threads


def test_the_stat_lines_of_the_usable_cpus_give_the_busy_seconds(tmp_path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  999 0 0 0 0 0 0 0 0 0\ncpu0 100 20 30 4000 50 6 7 8 0 0\ncpu1 1 2 3 4 5 6 7 8 0 0\n"
                    "cpu2 1000 0 0 0 0 0 0 0 0 0\nintr 1 2 3\n")
    tick = os.sysconf("SC_CLK_TCK")
    sample = read_sample(frozenset({0, 1}), str(stat))
    assert sample is not None and sample.busy == pytest.approx((171 + 27) / tick)  # not cpu2's, not the total
    assert read_sample(frozenset({2}), str(stat)).busy == pytest.approx(1000 / tick)
    assert read_sample(frozenset({5}), str(stat)) is None
    assert read_sample(frozenset({0}), str(tmp_path / "missing")) is None
    assert usable_cpus() and read_sample() is not None or not os.path.exists("/proc/stat")


def test_others_are_the_machines_busy_seconds_less_this_processs_over_the_wall_seconds() -> None:
    before, after = CpuSample(busy=10.0, own=4.0, wall=100.0), CpuSample(busy=11.6, own=4.6, wall=100.5)
    assert others_busy(before, after) == pytest.approx(2.0)
    assert others_busy(after, after) == 0.0
    assert others_busy(before, CpuSample(busy=10.1, own=4.6, wall=100.5)) == 0.0  # ticks lag the process clock


@pytest.mark.parametrize("current, others, expected", [
    (2, 0.0, 2), (2, 0.45, 2), (2, 0.7, 2), (2, 0.8, 1), (2, 1.6, 1), (2, 3.0, 1),
    (1, 0.7, 1), (1, 0.55, 1), (1, 0.45, 2), (1, 0.0, 2)])
def test_threads_drop_past_three_quarters_of_a_core_and_rise_under_half(current: int, others: float,
                                                                       expected: int) -> None:
    assert wanted_threads(current, others, cores=2, max_threads=2) == expected


def test_more_cores_than_threads_leave_room_for_the_others() -> None:
    assert wanted_threads(4, 1.2, cores=8, max_threads=4) == 4
    assert wanted_threads(4, 4.8, cores=8, max_threads=4) == 3
    assert wanted_threads(4, 7.9, cores=8, max_threads=4) == 1


class _Machine:
    """A fake clock and /proc/stat: `run(seconds, others, forward)` advances them as a forward (or a wait) of
    that long while other processes keep `others` cores busy and this one 2."""

    def __init__(self) -> None:
        self.now, self.busy, self.own = 0.0, 0.0, 0.0

    def clock(self) -> float:
        return self.now

    def read(self) -> CpuSample:
        return CpuSample(busy=self.busy, own=self.own, wall=self.now)

    def run(self, share: ThreadShare, seconds: float, others: float, forward: bool = True) -> None:
        def advance() -> None:
            self.now += seconds
            own = 2.0 * seconds if forward else 0.0
            self.own += own
            self.busy += own + others * seconds
        if forward:
            with share.forward():
                advance()
        else:
            advance()


def test_a_share_drops_a_thread_while_a_core_is_busy_elsewhere_and_takes_it_back_after() -> None:
    machine, applied = _Machine(), []
    share = ThreadShare(2, applied.append, cores=2, read=machine.read, window_s=0.5, clock=machine.clock)
    for _ in range(30):
        machine.run(share, 0.05, others=0.3)
    assert share.threads == 2 and applied == []
    for _ in range(30):
        machine.run(share, 0.05, others=1.0)
    assert share.threads == 1 and applied == [1]
    for _ in range(30):
        machine.run(share, 0.05, others=0.2)
    assert share.threads == 2 and applied == [1, 2]


def test_a_window_mostly_spent_waiting_between_forwards_changes_nothing() -> None:
    """Other processes busy while the decoder waits (the checked chain's models between its steps) are not
    busy while it runs: a window with under 70 % of its time in forwards does not count."""
    machine, applied = _Machine(), []
    share = ThreadShare(2, applied.append, cores=2, read=machine.read, window_s=0.5, clock=machine.clock)
    for _ in range(40):
        machine.run(share, 0.02, others=0.2)
        machine.run(share, 0.05, others=1.5, forward=False)
    assert share.threads == 2 and applied == []


def test_without_proc_stat_the_threads_stay_as_loaded() -> None:
    applied = []
    share = ThreadShare(2, applied.append, cores=2, read=lambda: None)
    for _ in range(3):
        with share.forward():
            pass
    assert share.threads == 2 and applied == []


def test_a_stat_file_that_becomes_unreadable_stops_the_sampling() -> None:
    machine, reads = _Machine(), []

    def read() -> CpuSample | None:
        reads.append(machine.now)
        return machine.read() if len(reads) == 1 else None

    share = ThreadShare(2, lambda threads: None, cores=2, read=read, window_s=0.5, clock=machine.clock)
    for _ in range(40):
        machine.run(share, 0.05, others=1.0)
    assert len(reads) == 2 and share.threads == 2  # the load's read, one failed window, then none


@pytest.mark.skipif(read_sample() is None, reason="no /proc/stat")
def test_a_busy_process_beside_the_decoder_takes_a_thread_from_it() -> None:
    """The real /proc/stat: a busy-looping process beside 'forwards' that keep this process on one core makes the
    share drop to one thread (as if on two cores)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        applied = []
        share = ThreadShare(2, applied.append, cores=2, window_s=0.3)
        deadline = time.monotonic() + 3.0
        while not applied and time.monotonic() < deadline:
            with share.forward():
                end = time.monotonic() + 0.05
                while time.monotonic() < end:
                    pass
        assert applied == [1], "a busy core elsewhere did not take a thread"
    finally:
        hog.kill()
        hog.wait()
