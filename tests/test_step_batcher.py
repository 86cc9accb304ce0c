"""StepBatcher gathers the steps of concurrent sequences into one dispatch (no Triton)."""
from __future__ import annotations

import threading
import time

import pytest

from zerocheck.generate.loop import StepCall, StepOutput
from zerocheck.generate.step_batcher import StepBatcher
from zerocheck.sampling import SamplingParams


def resolve(future, compute) -> None:
    try:
        future.set_result(compute())
    except BaseException as error:
        future.set_exception(error)


def call(i: int) -> StepCall:
    return StepCall(seq_id=f"s{i}", tokens=[i], start=False, end=False, sampling=SamplingParams(), history=None,
                    step=0, path="zero_check", want_log_prob=False)


def test_steps_of_all_active_sequences_go_out_together():
    sizes = []

    def dispatch(batch):
        sizes.append(len(batch))
        for c, future in batch:
            resolve(future, lambda c=c: StepOutput(c.tokens[0] * 10))

    batcher = StepBatcher(dispatch, active=lambda: 8, linger_s=1.0)
    results = [None] * 8
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, batcher.step(call(i)))) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sizes == [8]  # one dispatch, not eight
    assert [r.token for r in results] == [i * 10 for i in range(8)]


def test_a_lone_sequence_is_not_delayed():
    batcher = StepBatcher(lambda batch: [f.set_result(StepOutput(1)) for _, f in batch], active=lambda: 1, linger_s=5.0)
    start = time.perf_counter()
    assert batcher.step(call(0)).token == 1
    assert time.perf_counter() - start < 1.0


def test_linger_bounds_the_wait_for_missing_steps():
    batcher = StepBatcher(lambda batch: [f.set_result(StepOutput(len(batch))) for _, f in batch], active=lambda: 4,
                          linger_s=0.05)
    start = time.perf_counter()
    assert batcher.step(call(0)).token == 1  # the other three never came
    assert time.perf_counter() - start < 1.0


def fail_on_one(c: StepCall) -> StepOutput:
    if c.tokens[0] == 1:
        raise ValueError("bad row")
    return StepOutput(0)


def test_errors_reach_only_their_own_step():
    def dispatch(batch):
        for c, future in batch:
            resolve(future, lambda c=c: fail_on_one(c))

    batcher = StepBatcher(dispatch, active=lambda: 1)
    assert batcher.step(call(0)).token == 0
    with pytest.raises(ValueError, match="bad row"):
        batcher.step(call(1))


def test_a_failing_dispatch_fails_its_steps():
    def dispatch(batch):
        raise RuntimeError("server gone")

    with pytest.raises(RuntimeError, match="server gone"):
        StepBatcher(dispatch, active=lambda: 1).step(call(0))
