"""Iteration-level (in-flight) batching of decode steps: `StepScheduler`.

All active sequences of one sampler path advance together: each iteration sends one batched step
(a row per sequence: the prompt for a sequence that just arrived, its last token for the others)
and applies the sampled tokens. A sequence joins at the first iteration after it arrives and
leaves when it ends, so the batch changes from step to step, as in TensorRT-LLM's in-flight
batching. While a step runs, the scheduler streams the text of the step before and finishes the
sequences that ended, so detokenizing and sending responses overlap the model's compute; it also asks then
whether each sequence's request was cancelled (a call to Triton per request), and a cancelled sequence ends
at the next iteration, its slot freed before the next step.

Chunked prefill: a step carries at most `prefill_tokens` prompt tokens. Long prompts, or many that
arrive together, are prefilled a chunk per step, first come first served, while the running
sequences go on decoding in the same steps: an arriving prompt delays the others' next token by one
bounded chunk, not by its whole prefill.

Multi-step decode: on the zero-check path, while at most `decode_steps_max_rows` sequences run, all of
them decoding (no prompt going in, none arrived), one call asks the decoder for `decode_steps` tokens of
each: the decoder draws each token with its fused sampler and feeds it back itself, so the round trip
between this loop and the decoder is paid once for several tokens. Their responses go out together (still
`stream_interval` tokens each). A call runs no further than the nearest max_tokens of its rows, so a
sequence's end never waits for another's later steps: otherwise a call's ends would leave together, and
closed-loop users' next prompts would arrive together and queue for prefill behind each other, raising their
time to first token. A sequence that arrives meanwhile waits for the call (a few steps) before its prefill.
The repository turns it on for a lone sequence only (`decode_steps_max_rows` 1): with more rows a batched
step already shares the round trip among them, so the gain is small (benchmarks/e2e.py measures it), and
every stream's tokens would then come in bursts of decode_steps (close together inside a burst, then a pause).

The batched step and the KV-slot release are injected async callables, so the scheduler runs (and
is tested) without Triton; in the server they are BLS calls (generate/1/model.py). Everything runs
on one asyncio event loop.
"""
from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Awaitable, Callable

from zerocheck.api.errors import Overloaded
from zerocheck.api.sampler_path import SamplerPath
from zerocheck.generate.sequence import Chunk, Sequence
from zerocheck.wire.step import StepCall, StepOutput

log = logging.getLogger("zerocheck")
DEFER_BACKOFF_S = 0.005  # pause of a path whose every row waits for a KV slot
# path, one call per row -> one outcome per row: the sampled token, or the exception that row failed with
StepBatch = Callable[[SamplerPath, list[StepCall]], Awaitable[list[StepOutput | Exception]]]
Release = Callable[[list[str]], Awaitable[None]]  # frees the KV slots of these sequence ids
Emit = Callable[[Sequence, Chunk | None], None]  # a streamed chunk; None: the sequence ended well


@dataclass
class _Entry:
    seq: Sequence
    emit: Emit
    ended: asyncio.Future


class StepScheduler:
    """One driver task per sampler path, alive while that path has sequences (see the module docstring)."""

    def __init__(self, step: StepBatch, release: Release, max_batch: int = 64, prefill_tokens: int = 0,
                 on_cancel_freed: Callable[[float], None] = lambda seconds: None, decode_steps: int = 1,
                 decode_steps_max_rows: int = 0) -> None:
        """prefill_tokens: prompt tokens per step (0: no limit, every prompt in one step).
        on_cancel_freed: called with the seconds from seeing a sequence's cancellation (at the start of
        an iteration) to its KV slot freed. decode_steps, decode_steps_max_rows: multi-step decode (see the
        module docstring; 1 or 0: off)."""
        if prefill_tokens < 0:
            raise ValueError(f"prefill_tokens must be >= 0, got {prefill_tokens}")
        if decode_steps < 1 or decode_steps_max_rows < 0:
            raise ValueError(f"decode_steps must be >= 1 and decode_steps_max_rows >= 0, got {decode_steps} and "
                             f"{decode_steps_max_rows}")
        self._step, self._release, self.max_batch = step, release, max_batch
        self.prefill_tokens = prefill_tokens
        self.decode_steps, self.decode_steps_max_rows = decode_steps, decode_steps_max_rows
        self.on_cancel_freed = on_cancel_freed
        self._arrived: dict[str, list[_Entry]] = {}
        self._drivers: dict[str, asyncio.Task] = {}
        self._background: set[asyncio.Task] = set()
        self.steps = 0  # batched steps sent (all paths)

    async def run(self, sequences: list[Sequence], emit: Emit) -> None:
        """Generate `sequences` to their end; `emit` gets each streamed chunk and each sequence's
        good end. A failed sequence ends with `seq.error` set and no end emitted."""
        loop = asyncio.get_running_loop()
        entries = [_Entry(seq, emit, loop.create_future()) for seq in sequences]
        for entry in entries:
            self._arrived.setdefault(entry.seq.path, []).append(entry)
            if entry.seq.path not in self._drivers:
                self._drivers[entry.seq.path] = asyncio.create_task(self._drive(entry.seq.path))
        await asyncio.gather(*(entry.ended for entry in entries))

    async def _drive(self, path: SamplerPath) -> None:
        active: list[_Entry] = []
        try:
            while True:
                active += self._arrived.pop(path, [])
                running = [entry for entry in active if not entry.seq.done]
                ended = [entry for entry in active if entry.seq.done]  # before this step, so none is in it
                self._release_slots(ended)  # its call goes out before the step's: the decoder frees them first
                stepping_entries, calls = self._plan(path, running)
                stepping = asyncio.ensure_future(self._step_all(path, calls)) if calls else None
                if stepping is not None:
                    await asyncio.sleep(0)  # the step task runs to its model call before the sends below
                for entry in active:  # while the step runs
                    deliver(entry.seq, entry.emit)
                self._resolve(ended)
                active = running
                for entry in active:  # while the step runs too; a cancelled sequence ends at the next iteration
                    if entry.seq.cancelled():
                        entry.seq.cancel()
                if stepping is None:
                    if not self._arrived.get(path):
                        return
                    continue
                progressed = False
                for entry, call, outcome in zip(stepping_entries, calls, await stepping):
                    if entry.seq.done:  # failed while the step ran (its response could not be sent)
                        continue
                    if isinstance(outcome, Overloaded) and call.start:
                        entry.seq.defer(outcome)  # no KV slot free yet: its prefill goes again next step
                    elif isinstance(outcome, Exception):
                        entry.seq.fail(outcome)
                    else:
                        entry.seq.accept(outcome)
                        progressed = True
                if not progressed and not self._arrived.get(path):
                    await asyncio.sleep(DEFER_BACKOFF_S)  # every row waits for a slot: do not spin
        except BaseException as error:  # a bug here must not leave requests waiting forever
            log.error("step scheduler failed", exc_info=error)
            for entry in active + self._arrived.pop(path, []):
                entry.seq.fail(error if isinstance(error, Exception) else RuntimeError("scheduler stopped"))
            self._end(active)
            raise
        finally:
            del self._drivers[path]

    def _plan(self, path: SamplerPath, running: list[_Entry]) -> tuple[list[_Entry], list[StepCall]]:
        """This step's rows: every decoding sequence, and prompt chunks within the prefill budget, in
        arrival order (a prefilling sequence past the budget sits this step out); several tokens a row
        when a multi-step call fits (module docstring)."""
        budget = self.prefill_tokens or None
        multi_step = (path is SamplerPath.ZERO_CHECK and len(running) <= self.decode_steps_max_rows
                      and not self._arrived.get(path) and not any(entry.seq.prefill_left for entry in running))
        # no longer than any row's max_tokens allows: a row's end never waits for the others' later steps
        steps = min([self.decode_steps, *(entry.seq.tokens_left for entry in running)]) if multi_step else 1
        entries, calls = [], []
        for entry in running:
            if entry.seq.prefill_left and budget is not None:
                if budget == 0:
                    continue
                calls.append(entry.seq.next_call(budget))
                budget -= len(calls[-1].tokens)
            else:
                calls.append(entry.seq.next_call(steps=steps))
            entries.append(entry)
        return entries, calls

    async def _step_all(self, path: SamplerPath, calls: list[StepCall]) -> list[StepOutput | Exception]:
        """Every call, in batches of at most max_batch rows sent together; a batch that fails as a
        whole fails each of its rows."""
        batches = [calls[i:i + self.max_batch] for i in range(0, len(calls), self.max_batch)]
        self.steps += len(batches)
        if len(batches) == 1:  # called here, not in a task of its own: the call starts without another turn
            try:
                return await self._step(path, calls)
            except Exception as error:
                return [error] * len(calls)
        results = await asyncio.gather(*(self._step(path, batch) for batch in batches), return_exceptions=True)
        return [outcome for batch, result in zip(batches, results)
                for outcome in (result if not isinstance(result, BaseException) else [result] * len(batch))]

    def _end(self, ended: list[_Entry]) -> None:
        """Free the KV slots the ended sequences may hold (in the background) and resolve them."""
        self._release_slots(ended)
        self._resolve(ended)

    def _release_slots(self, ended: list[_Entry]) -> None:
        """Free, in the background, the KV slots the ended sequences may still hold."""
        holding = [entry.seq for entry in ended if entry.seq.holds_slot]
        if holding:
            task = asyncio.ensure_future(self._release_quietly(holding))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    @staticmethod
    def _resolve(ended: list[_Entry]) -> None:
        for entry in ended:
            if not entry.ended.done():
                entry.ended.set_result(None)

    async def _release_quietly(self, sequences: list[Sequence]) -> None:
        try:
            await self._release([seq.seq_id for seq in sequences])
        except Exception as error:  # the decoder also reclaims idle slots itself
            log.warning("releasing KV slots of %d sequences failed: %s", len(sequences), error)
            return
        now = time.monotonic()
        for seq in sequences:
            if seq.cancelled_at:
                self.on_cancel_freed(now - seq.cancelled_at)


def deliver(seq: Sequence, emit: Emit) -> None:
    """Stream the chunks due (several after a multi-token output), and the end of a sequence that ended well;
    a send that fails fails the sequence. Also what `zerocheck.trtllm.llm_api.LlmApiScheduler` delivers with."""
    if seq.error is not None:
        return
    try:
        while (chunk := seq.take_chunk()) is not None:
            emit(seq, chunk)
        if seq.done and seq.error is None:
            emit(seq, None)
    except Exception as error:
        seq.fail(error)
