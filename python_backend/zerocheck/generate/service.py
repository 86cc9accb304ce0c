"""What the decoupled `generate` model does with one request, without Triton.

`GenerateService.prepare` validates and tokenizes (errors: `InvalidRequest`), `reserve` and
`admission` bound concurrent sequences to the KV-cache slots plus a bounded queue (beyond it:
`Overloaded` at once), `serve` runs the request's sequences through the step scheduler and hands
every response to `send` as output arrays. It all runs on the model's asyncio event loop (one
thread); the `generate/1/model.py` adapter injects the BLS calls, the sender and the cancellation
check.
"""
from __future__ import annotations

import asyncio
import math
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import AsyncIterator, Callable

import numpy as np

from zerocheck.generate.scheduler import StepScheduler
from zerocheck.generate.sequence import CHECKED, ZERO_CHECK, Chunk, Generation, Sequence, choose_path
from zerocheck.api.errors import InvalidRequest, Overloaded
from zerocheck.serving.inputs import GenerateRequest, Limits, check_context, \
    parse_generate_request
from zerocheck.tokenizer import TextTokenizer
from zerocheck.tokenizer.chat import ChatTemplateError

OUTPUTS = ("text_output", "output_ids", "zerocheck_bypass", "sampler", "prompt_tokens", "completion_tokens",
           "finish_reason", "cum_log_probs", "output_log_probs", "output_top_ids", "output_top_log_probs",
           "sequence_index", "arrival_time_ns",
           "first_token_time_ns", "last_token_time_ns")


@dataclass(frozen=True)
class Prepared:
    """A validated, tokenized request and the sampler path it will take."""

    request: GenerateRequest
    prompt_ids: list[int]
    path: str
    degraded: str | None  # why a zero-check request runs on the checked path

    @property
    def bypass(self) -> bool:
        """True when the check layer is skipped (the zero-check sampler ran)."""
        return self.path == ZERO_CHECK


def response_arrays(prepared: Prepared, piece: Chunk, index: int, completion_tokens: int, finish_reason: str,
                    generation: Generation | None) -> dict[str, np.ndarray]:
    """The output tensors of one response (batch dimension 1): `piece` is the text, ids and log-probabilities
    it carries (a streamed chunk, or the whole generation)."""
    text, ids, log_probs = piece.text, piece.ids, piece.log_probs
    arrays = {
        "text_output": np.array([[text.encode()]], dtype=object),
        "output_ids": np.array([ids], dtype=np.int32).reshape(1, -1),
        "zerocheck_bypass": np.array([[prepared.bypass]], dtype=bool),
        "sampler": np.array([[prepared.path.encode()]], dtype=object),
        "prompt_tokens": np.array([[len(prepared.prompt_ids)]], dtype=np.int32),
        "completion_tokens": np.array([[completion_tokens]], dtype=np.int32),
        "finish_reason": np.array([[finish_reason.encode()]], dtype=object),
        "sequence_index": np.array([[index]], dtype=np.int32),
    }
    if prepared.request.return_log_probs or prepared.request.top_log_probs:
        arrays["output_log_probs"] = np.array([log_probs], dtype=np.float32).reshape(1, -1)
        arrays["cum_log_probs"] = np.array([[sum(generation.log_probs) if generation else sum(log_probs)]],
                                           dtype=np.float32)
    if prepared.request.top_log_probs:  # [1, tokens, k]: ids and log-probabilities of the k most likely, best first
        k = prepared.request.top_log_probs
        rows = [list(top) + [(-1, -math.inf)] * (k - len(top)) for top in piece.top_log_probs]
        arrays["output_top_ids"] = np.array([[[t for t, _ in row] for row in rows]], dtype=np.int32).reshape(1, -1, k)
        arrays["output_top_log_probs"] = np.array([[[lp for _, lp in row] for row in rows]],
                                                  dtype=np.float32).reshape(1, -1, k)
    if prepared.request.return_perf_metrics and generation is not None:
        for name, value in (("arrival_time_ns", generation.arrival_ns), ("first_token_time_ns", generation.first_token_ns),
                            ("last_token_time_ns", generation.last_token_ns)):
            arrays[name] = np.array([[value]], dtype=np.int64)
    return arrays


class GenerateService:
    """Validation, admission control and generation for the `generate` model."""

    def __init__(self, tokenizer: TextTokenizer, scheduler: StepScheduler | None, limits: Limits, max_active: int,
                 max_queue: int, queue_timeout_s: float = 30.0) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.limits = limits
        self.max_active, self.max_queue, self.queue_timeout_s = max_active, max_queue, queue_timeout_s
        self._slots = asyncio.Semaphore(max_active)
        self._waiting = 0
        self.active = 0

    def prepare(self, arrays: dict[str, np.ndarray], parameters: dict) -> Prepared:
        request = parse_generate_request(arrays, parameters, self.limits)
        vocab = self.tokenizer.vocab_size
        if request.end_id is not None and request.end_id >= vocab:
            raise InvalidRequest(f"end_id must be -1 or a token id in [0, {vocab}), got {request.end_id}")
        if any(not 0 <= token < vocab for token, _ in request.bias_ids):
            raise InvalidRequest(f"logit_bias_ids must be token ids in [0, {vocab})")
        prompt_ids = self.tokenizer.encode(self._prompt_text(request))
        if not prompt_ids:
            raise InvalidRequest("text_input must encode to at least one token")
        check_context(request, len(prompt_ids), self.limits)
        if request.max_tokens is None:  # as many as fit, up to the server's limit
            room = self.limits.max_context - len(prompt_ids)
            request = replace(request, max_tokens=min(self.limits.max_output_tokens, room))
        path, degraded = choose_path(request)
        return Prepared(request, prompt_ids, path, degraded)

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
        try:
            deadline = time.monotonic() + self.queue_timeout_s
            for _ in range(sequences):
                try:
                    await asyncio.wait_for(self._slots.acquire(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    raise Overloaded(f"overloaded: no KV cache slot freed within {self.queue_timeout_s:g} s; "
                                     "retry later") from None
                taken += 1
        finally:
            self._waiting -= sequences
            self.active += taken
        try:
            yield
        finally:
            self.active -= taken
            for _ in range(taken):
                self._slots.release()

    async def serve(self, prepared: Prepared, send: Callable[[dict[str, np.ndarray]], None],
                    cancelled: Callable[[], bool] = lambda: False) -> list[Generation]:
        """Generate every requested sequence; streamed chunks and each sequence's final response go to
        `send`. Raises the error of the first sequence that failed, once all have ended."""
        request = prepared.request
        sequences = [Sequence(self.tokenizer, request, prepared.prompt_ids, prepared.path, self.limits.max_context,
                              index, cancelled) for index in range(request.num_return_sequences)]

        def emit(seq: Sequence, chunk: Chunk | None) -> None:
            if chunk is not None:
                send(response_arrays(prepared, chunk, seq.index, len(seq.ids), "", None))
                return
            generation = seq.generation()
            whole = Chunk("", [], []) if request.stream else \
                Chunk(generation.text, generation.ids, generation.log_probs, generation.top_log_probs)
            send(response_arrays(prepared, whole, seq.index, generation.completion_tokens, generation.finish_reason,
                                 generation))

        await self.scheduler.run(sequences, emit)
        failed = next((seq.error for seq in sequences if seq.error is not None), None)
        if failed is not None:
            raise failed
        return [seq.generation() for seq in sequences]


__all__ = ["CHECKED", "OUTPUTS", "GenerateService", "Prepared", "ZERO_CHECK", "response_arrays"]
