"""What the decoupled `generate` model does with one request, without Triton.

`GenerateService.prepare` validates and tokenizes (errors: `InvalidRequest`), `admission` bounds
concurrent sequences to the KV-cache slots plus a bounded queue (beyond it: `Overloaded` at once),
`serve` runs the generation loop(s) and hands every response to `send` as output arrays. The
`generate/1/model.py` adapter injects the BLS step, the sender and the cancellation check.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from zerocheck.generate.loop import CHECKED, ZERO_CHECK, Chunk, Generation, GenerationLoop, choose_path
from zerocheck.serving.inputs import GenerateRequest, InvalidRequest, Limits, Overloaded, check_context, \
    parse_generate_request
from zerocheck.tokenizer import TextTokenizer

OUTPUTS = ("text_output", "output_ids", "zerocheck_bypass", "sampler", "prompt_tokens", "completion_tokens",
           "finish_reason", "cum_log_probs", "output_log_probs", "sequence_index", "arrival_time_ns",
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


def response_arrays(prepared: Prepared, text: str, ids: list[int], log_probs: list[float], index: int,
                    completion_tokens: int, finish_reason: str, generation: Generation | None) -> dict[str, np.ndarray]:
    """The output tensors of one response (batch dimension 1)."""
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
    if prepared.request.return_log_probs:
        arrays["output_log_probs"] = np.array([log_probs], dtype=np.float32).reshape(1, -1)
        arrays["cum_log_probs"] = np.array([[sum(generation.log_probs) if generation else sum(log_probs)]],
                                           dtype=np.float32)
    if prepared.request.return_perf_metrics and generation is not None:
        for name, value in (("arrival_time_ns", generation.arrival_ns), ("first_token_time_ns", generation.first_token_ns),
                            ("last_token_time_ns", generation.last_token_ns)):
            arrays[name] = np.array([[value]], dtype=np.int64)
    return arrays


class GenerateService:
    """Validation, admission control and the generation loop for the `generate` model."""

    def __init__(self, tokenizer: TextTokenizer, loop: GenerationLoop, limits: Limits, max_active: int,
                 max_queue: int, queue_timeout_s: float = 30.0) -> None:
        self.tokenizer = tokenizer
        self.loop = loop
        self.limits = limits
        self.max_active, self.max_queue, self.queue_timeout_s = max_active, max_queue, queue_timeout_s
        self._slots = threading.BoundedSemaphore(max_active)
        self._lock = threading.Lock()
        self._waiting = 0
        self.active = 0

    def prepare(self, arrays: dict[str, np.ndarray], parameters: dict) -> Prepared:
        request = parse_generate_request(arrays, parameters, self.limits)
        if request.end_id is not None and request.end_id >= self.tokenizer.vocab_size:
            raise InvalidRequest(f"end_id must be -1 or a token id in [0, {self.tokenizer.vocab_size}), "
                                 f"got {request.end_id}")
        prompt_ids = self.tokenizer.encode(request.prompt)
        if not prompt_ids:
            raise InvalidRequest("text_input must encode to at least one token")
        check_context(request, len(prompt_ids), self.limits)
        path, degraded = choose_path(request)
        return Prepared(request, prompt_ids, path, degraded)

    def reserve(self, sequences: int = 1) -> None:
        """Count a request as queued, or refuse it at once (Overloaded) when slots and queue are full:
        called as the request arrives, before it waits for a worker thread; `admission` follows."""
        if sequences > self.max_active:
            raise InvalidRequest(f"num_return_sequences must be <= {self.max_active} (the KV cache slots)")
        with self._lock:
            if self.active + self._waiting + sequences > self.max_active + self.max_queue:
                raise Overloaded(f"overloaded: {self.active}/{self.max_active} sequences active and "
                                 f"{self._waiting}/{self.max_queue} queued; retry later")
            self._waiting += sequences

    @contextmanager
    def admission(self, sequences: int = 1) -> Iterator[None]:
        """For a `reserve`d request: wait for `sequences` KV slots (Overloaded after queue_timeout_s)
        and hold them for the block."""
        taken = 0
        try:
            deadline = time.monotonic() + self.queue_timeout_s
            for _ in range(sequences):
                if not self._slots.acquire(timeout=max(0.0, deadline - time.monotonic())):
                    raise Overloaded(f"overloaded: no KV cache slot freed within {self.queue_timeout_s:g} s; retry later")
                taken += 1
        finally:
            with self._lock:
                self._waiting -= sequences
                self.active += taken
        try:
            yield
        finally:
            with self._lock:
                self.active -= taken
            for _ in range(taken):
                self._slots.release()

    def serve(self, prepared: Prepared, send: Callable[[dict[str, np.ndarray]], None],
              run_parallel: Callable[[list[Callable[[], None]]], None], context: object = None) -> list[Generation]:
        """Run every requested sequence; streamed chunks and final responses go to `send`.
        run_parallel runs the per-sequence jobs (threads in the server); `context` reaches every step."""
        request = prepared.request
        results: list[Generation | None] = [None] * request.num_return_sequences
        send_lock = threading.Lock()

        def locked_send(arrays: dict[str, np.ndarray]) -> None:
            with send_lock:
                send(arrays)

        def job(index: int) -> Callable[[], None]:
            def run() -> None:
                produced = [0]

                def emit(chunk: Chunk) -> None:
                    produced[0] += len(chunk.ids)
                    locked_send(response_arrays(prepared, chunk.text, chunk.ids, chunk.log_probs, index, produced[0],
                                                "", None))

                generation = self.loop.run(request, prepared.prompt_ids, prepared.path,
                                           emit if request.stream else None, seed_offset=index, context=context)
                results[index] = generation
                final_text = "" if request.stream else generation.text
                final_ids = [] if request.stream else generation.ids
                final_log_probs = [] if request.stream else generation.log_probs
                locked_send(response_arrays(prepared, final_text, final_ids, final_log_probs, index,
                                            generation.completion_tokens, generation.finish_reason, generation))
            return run

        run_parallel([job(i) for i in range(request.num_return_sequences)])
        return [r for r in results if r is not None]


__all__ = ["CHECKED", "OUTPUTS", "GenerateService", "Prepared", "ZERO_CHECK", "response_arrays"]
