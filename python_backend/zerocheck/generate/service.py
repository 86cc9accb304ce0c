"""What the decoupled generation models do with one request, without Triton.

`GenerateService.prepare_batch` splits a request into its rows, validates and tokenizes each
(errors: `InvalidRequest`), `reserve` and `admission` bound concurrent sequences to the KV-cache
slots plus a bounded queue (beyond it: `Overloaded` at once), `serve` runs the rows' sequences
through the step scheduler and hands every response to `send` as output arrays of the request's
interface (its `interface` request parameter: text, or tokens for what the `tensorrt_llm` door forwards).
One service serves every door of the server: the other models forward their requests to `generate`
(`zerocheck.triton.forward`), so all sequences share its admission and its batched steps. It all runs on
the model's asyncio event loop (one thread); the `generate/1/model.py` adapter injects the BLS calls, the
sender and the cancellation check.
"""
from __future__ import annotations

import asyncio
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import AsyncIterator, Callable, Protocol

import numpy as np

from zerocheck.api.errors import InvalidRequest, Overloaded
from zerocheck.generate.responses import Prepared, response_arrays
from zerocheck.generate.sequence import Chunk, Generation, Sequence, choose_path
from zerocheck.grammar import GUIDE_TYPE_INPUT, GrammarCompiler
from zerocheck.sampling.params import MAX_LOGIT_BIAS
from zerocheck.api.request import TOKENS, GenerateRequest, Limits, check_context, parse_generate_request, \
    parse_token_request, request_interface, split_batch
from zerocheck.tokenizer import TextTokenizer
from zerocheck.tokenizer.chat import ChatTemplateError

class Scheduler(Protocol):
    """What runs the sequences: `StepScheduler` (zerocheck's decoder) or `zerocheck.trtllm.llm_api.LlmApiScheduler`.
    `run` generates them to their end, handing `emit` each streamed chunk and each good end (chunk None)."""

    async def run(self, sequences: list[Sequence], emit: Callable[[Sequence, Chunk | None], None]) -> None: ...


class GenerateService:
    """Validation, admission control and generation for the `generate` model."""

    def __init__(self, tokenizer: TextTokenizer, scheduler: Scheduler | None, limits: Limits, max_active: int,
                 max_queue: int, queue_timeout_s: float = 30.0,
                 on_queue_wait: Callable[[float], None] = lambda seconds: None,
                 grammars: GrammarCompiler | None = None,
                 refuse_unserved: Callable[[Prepared], None] = lambda row: None) -> None:
        """max_active: sequences generating at once (the decoder's KV-cache slots); max_queue: sequences
        waiting for one; on_queue_wait: called with each admitted request's wait in the queue; grammars: compiles
        the requests' guides before they are admitted (None: a guide is refused); refuse_unserved: raises
        InvalidRequest for a validated row the scheduler's engine does not serve."""
        self.tokenizer = tokenizer
        self.refuse_unserved = refuse_unserved
        self.grammars = grammars
        self.scheduler = scheduler
        self.on_queue_wait = on_queue_wait
        self.limits = limits
        self.max_active, self.max_queue, self.queue_timeout_s = max_active, max_queue, queue_timeout_s
        self._slots = asyncio.Semaphore(max_active)
        self._waiting = 0
        self.active = 0

    def prepare_batch(self, arrays: dict[str, np.ndarray], parameters: dict) -> list[Prepared]:
        """Every row of a request ([N, ...] inputs: N rows), validated and tokenized."""
        return [replace(self.prepare(row, parameters), batch_index=index)
                for index, row in enumerate(split_batch(arrays, self.limits))]

    def prepare(self, arrays: dict[str, np.ndarray], parameters: dict) -> Prepared:
        """One row (batch size 1), of the interface its `interface` request parameter names."""
        interface = request_interface(parameters)
        parse = parse_token_request if interface == TOKENS else parse_generate_request
        request = parse(arrays, parameters, self.limits)
        vocab = self.tokenizer.vocab_size
        if request.end_id is not None and request.end_id >= vocab:
            raise InvalidRequest(f"end_id must be -1 or a token id in [0, {vocab}), got {request.end_id}")
        if request.guide is not None:
            self._check_guided(request)
        if any(not 0 <= token < vocab for token, _ in request.bias_ids):
            raise InvalidRequest(f"logit_bias_ids must be token ids in [0, {vocab})")
        if request.dense_bias:
            request = replace(request, bias_ids=self._dense_bias(request.dense_bias), dense_bias=())
        if request.prompt_ids is not None:
            if any(not 0 <= token < vocab for token in request.prompt_ids):
                raise InvalidRequest(f"input_ids must be token ids in [0, {vocab})")
            prompt_ids = list(request.prompt_ids)
        else:
            prompt_ids = self.tokenizer.encode(self._prompt_text(request))
        if not prompt_ids:
            raise InvalidRequest("text_input must encode to at least one token")
        check_context(request, len(prompt_ids), self.limits)
        if request.max_tokens is None:  # as many as fit, up to the server's limit
            room = self.limits.max_context - len(prompt_ids)
            request = replace(request, max_tokens=min(self.limits.max_output_tokens, room))
        path, degraded = choose_path(request)
        prepared = Prepared(request, prompt_ids, path, degraded, interface=interface)
        self.refuse_unserved(prepared)
        return prepared

    def _check_guided(self, request: GenerateRequest) -> None:
        """The one rule of a guide: a finished guide allows only the model's end ids, so the guide decides where
        the answer ends (no min_tokens) and an end_id must be one of those ids (not -1, never stop)."""
        if request.min_tokens:
            raise InvalidRequest(f"min_tokens cannot be combined with {GUIDE_TYPE_INPUT}: the guide decides where "
                                 f"the answer ends")
        if request.end_id is not None and request.end_id not in self.tokenizer.end_ids:
            never = " (never stop at an end token)" if request.end_id < 0 else ""
            raise InvalidRequest(f"end_id {request.end_id}{never} cannot be combined with {GUIDE_TYPE_INPUT}: a "
                                 f"finished guide allows only the model's end ids {list(self.tokenizer.end_ids)}")

    def _dense_bias(self, bias: tuple[float, ...]) -> tuple[tuple[int, float], ...]:
        """tensorrt_llm's embedding_bias (a value per vocabulary entry) as (token id, bias) pairs."""
        if len(bias) != self.tokenizer.vocab_size:
            raise InvalidRequest(f"embedding_bias must hold {self.tokenizer.vocab_size} values (the vocabulary), "
                                 f"got {len(bias)}")
        pairs = tuple((token, value) for token, value in enumerate(bias) if value)
        if len(pairs) > MAX_LOGIT_BIAS:
            raise InvalidRequest(f"embedding_bias may bias at most {MAX_LOGIT_BIAS} tokens, got {len(pairs)}")
        return pairs

    def _prompt_text(self, request: GenerateRequest) -> str:
        """The prompt, or the conversation rendered with the model's chat template."""
        if not request.is_chat:
            return request.prompt
        if self.tokenizer.chat_template is None:
            raise InvalidRequest("messages: the served model has no chat template; send text_input instead")
        try:
            return self.tokenizer.apply_chat_template(request.messages)
        except ChatTemplateError as error:
            raise InvalidRequest(f"messages: the model's chat template refused them: {error}") from None

    async def check_guides(self, rows: list[Prepared]) -> None:
        """Compile the rows' guides (cached; the loop goes on meanwhile): GuideError for one that cannot be
        served (unsupported, over the compile time limit). Called before admission, so a refused guide never
        holds a KV slot."""
        for row in rows:
            if row.request.guide is not None:
                if self.grammars is None:
                    raise InvalidRequest(f"{GUIDE_TYPE_INPUT}: this server does not serve guides")
                await self.grammars.check_async(row.request.guide)

    def release_reservation(self, sequences: int) -> None:
        """Undo `reserve` for a request refused before its admission."""
        self._waiting -= sequences

    def reserve(self, sequences: int = 1) -> None:
        """Count a request as queued, or refuse it at once (Overloaded) when slots and queue are full:
        called as the request arrives; `admission` follows."""
        if sequences > self.max_active:
            raise InvalidRequest(f"num_return_sequences must be <= {self.max_active} (the KV cache slots)")
        if self.active + self._waiting + sequences > self.max_active + self.max_queue:
            raise Overloaded(f"overloaded: {self.active}/{self.max_active} sequences active and "
                             f"{self._waiting}/{self.max_queue} queued; retry later")
        self._waiting += sequences

    @asynccontextmanager
    async def admission(self, sequences: int = 1) -> AsyncIterator[None]:
        """For a `reserve`d request: wait for `sequences` KV slots (Overloaded after queue_timeout_s)
        and hold them for the block."""
        taken = 0
        queued_at = time.monotonic()
        try:
            deadline = queued_at + self.queue_timeout_s
            for _ in range(sequences):
                if not await _acquire(self._slots, max(0.0, deadline - time.monotonic())):
                    raise Overloaded(f"overloaded: no KV cache slot freed within {self.queue_timeout_s:g} s; "
                                     "retry later")
                taken += 1
        finally:
            self._waiting -= sequences
            self.active += taken
        self.on_queue_wait(time.monotonic() - queued_at)
        try:
            yield
        finally:
            self.active -= taken
            for _ in range(taken):
                self._slots.release()

    async def serve(self, rows: list[Prepared], send: Callable[[dict[str, np.ndarray], bool], None],
                    cancelled: Callable[[], bool] = lambda: False) -> list[Generation]:
        """Generate every requested sequence of every row; streamed chunks and each sequence's final
        response go to `send` (with whether it is that sequence's final one). Raises the error of the first
        sequence that failed, once all have ended."""
        sequences = {id(seq): (row, seq) for row in rows for seq in
                     (Sequence(self.tokenizer, row.request, row.prompt_ids, row.path, self.limits.max_context, index,
                               cancelled, self.queue_timeout_s) for index in range(row.request.num_return_sequences))}

        def emit(seq: Sequence, chunk: Chunk | None) -> None:
            row = sequences[id(seq)][0]
            if chunk is not None:
                send(response_arrays(row, seq, chunk, final=False), False)
                return
            generation = seq.generation()
            whole = Chunk("", [], []) if row.request.stream else \
                Chunk(generation.text, generation.ids, generation.log_probs, generation.top_log_probs)
            send(response_arrays(row, seq, whole, final=True), True)

        ordered = [seq for _, seq in sequences.values()]
        await self.scheduler.run(ordered, emit)
        failed = next((seq.error for seq in ordered if seq.error is not None), None)
        if failed is not None:
            raise failed
        return [seq.generation() for seq in ordered]


__all__ = ["GenerateService", "Prepared"]


async def _acquire(slots: asyncio.Semaphore, timeout_s: float) -> bool:
    """`slots.acquire()` within timeout_s: whether it got a slot. Not `asyncio.wait_for`: before Python 3.12 it
    keeps the slot and drops the caller's cancellation when both arrive in one loop turn (a client leaving as a
    slot frees: its request then ran on for nobody); here the cancellation is raised and the slot given back."""
    acquire = asyncio.ensure_future(slots.acquire())
    try:
        await asyncio.wait({acquire}, timeout=timeout_s)
    except asyncio.CancelledError:
        if acquire.done() and not acquire.cancelled():
            slots.release()
        acquire.cancel()  # nothing when it is done
        raise
    if acquire.done() and not acquire.cancelled():
        return True
    acquire.cancel()  # the timeout: a cancelled acquire takes no slot
    return False
