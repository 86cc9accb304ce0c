"""Iteration-level batching of decode steps across concurrent sequences.

Each sequence's generation loop runs on its own thread and calls `step(call)` once per token. The
batcher collects the steps of every active sequence (or what arrived within `linger_s` of the first)
and hands them to `dispatch` together, so the server issues them at the same instant and Triton's
dynamic batcher sees them as one batch, instead of a trickle of single requests. `dispatch` must
resolve every step's future, each as soon as its own result is there: a slow step (say, on the
checked path) never holds back the others.
"""
from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Sequence

from zerocheck.generate.loop import StepCall, StepOutput

Dispatch = Callable[[Sequence[tuple[StepCall, Future]]], None]


class StepBatcher:
    """`step(call)` blocks until the batch holding `call` has been dispatched; see the module doc.
    active(): how many sequences are generating now (the batch closes when all have stepped)."""

    def __init__(self, dispatch: Dispatch, active: Callable[[], int], linger_s: float = 0.002) -> None:
        self._dispatch, self._active, self.linger_s = dispatch, active, linger_s
        self._pending: queue.Queue[tuple[StepCall, Future]] = queue.Queue()
        self.batches = 0
        threading.Thread(target=self._run, name="step-batcher", daemon=True).start()

    def step(self, call: StepCall) -> StepOutput:
        future: Future = Future()
        self._pending.put((call, future))
        return future.result()

    def _collect(self) -> list[tuple[StepCall, Future]]:
        batch = [self._pending.get()]
        deadline = time.monotonic() + self.linger_s
        while len(batch) < self._active():
            remaining = deadline - time.monotonic()
            try:
                batch.append(self._pending.get(timeout=remaining) if remaining > 0 else self._pending.get_nowait())
            except queue.Empty:
                break
        return batch

    def _run(self) -> None:
        while True:
            batch = self._collect()
            self.batches += 1
            try:
                self._dispatch(batch)
            except BaseException as error:  # the dispatch itself failed: its unresolved steps fail
                for _, future in batch:
                    if not future.done():
                        future.set_exception(error)

