"""A stand-in for the part of TensorRT-LLM's PyTorch backend that calls logits processors, so the processor is
tested, benchmarked and checked on a GPU where tensorrt_llm is not installed. Written from reading (not copying)
NVIDIA/TensorRT-LLM tensorrt_llm/_torch/pyexecutor/model_engine.py (`_execute_logit_post_processors`, commit
1a0dc5f7) and py_executor.py (`_executor_loop_overlap`, where `_forward_step` runs before `_update_requests`).

- `call_processors(requests, logits)`: one forward's calls: requests in scheduled order (context requests, then
  generation requests), one logits row each; the row viewed [1, 1, V]; the engine's signature check; each
  processor called with (request id, the view, [prompt + generated], None, None).
- `EngineLoop`: the loop around it. Each iteration schedules the arrived requests as context requests and the
  running ones as generation requests, runs the injected forward (one row per request, any float dtype), calls
  the processors, reads each row greedily (argmax: the engine's sampler at temperature 0) and appends the token
  to its request after the forward (the overlap scheduler off); `lag=True` appends it only after the next
  forward, as the overlap scheduler does.
- `DecoderForward`: the forward over zerocheck's own decoder engine (`zerocheck.decoder.load_decoder`).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

import torch

if TYPE_CHECKING:  # the decoder's imports only where it is used: the GPU check runs the loop without it
    from zerocheck.decoder.engine import DecoderEngine


def check_signature(processor: Callable) -> None:
    """The engine's check: a processor's call takes 4 or 5 parameters."""
    count = len(inspect.signature(processor).parameters)
    if not 4 <= count <= 5:
        raise TypeError(f"a logits processor's call must take 4 or 5 parameters (LogitsProcessor's), got {count}")


@dataclass
class EngineRequest:
    """One request as the engine holds it: prompt, generated tokens, its processors, when it stops."""

    req_id: int
    prompt: list[int]
    processors: list[Callable] = field(default_factory=list)
    max_tokens: int = 16
    end_ids: frozenset[int] = frozenset()
    generated: list[int] = field(default_factory=list)
    pending: int | None = None  # lag: drawn by the last forward, not yet appended
    done: bool = False

    def get_tokens(self) -> list[int]:
        """`request.get_tokens(0)`: the prompt, then the tokens appended so far."""
        return self.prompt + self.generated

    def last_token(self) -> int:
        """The token the next generation forward feeds (on the device in the engine, appended or not)."""
        return self.pending if self.pending is not None else self.generated[-1]

    def tokens(self) -> list[int]:
        """Every token drawn, the pending one included."""
        return self.generated + ([self.pending] if self.pending is not None else [])


def call_processors(requests: Sequence[EngineRequest], logits: torch.Tensor) -> None:
    """One forward's processor calls. logits: [R, V] (row r is requests[r]'s), edited in place by the processors."""
    for row, request in enumerate(requests):
        if not request.processors:
            continue
        view = logits[row].view(1, 1, -1)
        token_ids = [request.get_tokens()]
        for processor in request.processors:
            check_signature(processor)
            processor(request.req_id, view, token_ids, None, None)


class Forward(Protocol):
    def __call__(self, context: Sequence[EngineRequest], generation: Sequence[EngineRequest]) -> torch.Tensor:
        """[len(context) + len(generation), V] next-token logits, context rows first."""

    def release(self, request: EngineRequest) -> None:
        """Free what a finished request holds."""


class EngineLoop:
    """The engine's loop with greedy readout (see the module docstring); `forwards` counts iterations."""

    def __init__(self, forward: Forward, lag: bool = False) -> None:
        self.forward, self.lag = forward, lag
        self.forwards = 0

    def run(self, requests: Sequence[EngineRequest], arrivals: Sequence[int] | None = None) -> dict[int, list[int]]:
        """Generate until every request stops; request i is scheduled from iteration arrivals[i] (default 0).
        Returns req_id -> its tokens."""
        arrivals = list(arrivals) if arrivals is not None else [0] * len(requests)
        waiting = sorted(range(len(requests)), key=lambda i: arrivals[i])
        running: list[EngineRequest] = []
        iteration = 0
        while waiting or running:
            context = [requests[i] for i in waiting if arrivals[i] <= iteration]
            waiting = [i for i in waiting if arrivals[i] > iteration]
            scheduled = context + running
            if scheduled:
                self._iterate(context, running)
                for request in scheduled:
                    if request.done:
                        self.forward.release(request)
                running = [request for request in scheduled if not request.done]
            iteration += 1
        return {request.req_id: request.tokens() for request in requests}

    def _iterate(self, context: list[EngineRequest], generation: list[EngineRequest]) -> None:
        scheduled = context + generation
        logits = self.forward(context, generation)
        self.forwards += 1
        call_processors(scheduled, logits)
        if self.lag:  # the previous step's tokens reach the requests after this forward
            for request in generation:
                if request.pending is not None:
                    request.generated.append(request.pending)
                    request.pending = None
        for request, token in zip(scheduled, logits.argmax(-1).tolist()):
            if self.lag:
                request.pending = token
            else:
                request.generated.append(token)
            if token in request.end_ids or len(request.tokens()) >= request.max_tokens:
                request.done = True
                if request.pending is not None:
                    request.generated.append(request.pending)
                    request.pending = None


class DecoderForward:
    """`Forward` over zerocheck's decoder engine: context rows start their sequence with the prompt, generation
    rows feed their last token; logits come back in `dtype` (the model's dtype as the engine would hand it)."""

    def __init__(self, engine: DecoderEngine, dtype: torch.dtype = torch.float32) -> None:
        self.engine, self.dtype = engine, dtype

    def __call__(self, context: Sequence[EngineRequest], generation: Sequence[EngineRequest]) -> torch.Tensor:
        from zerocheck.decoder.engine import StepRequest

        steps = ([StepRequest(str(r.req_id), list(r.prompt), True, False) for r in context]
                 + [StepRequest(str(r.req_id), [r.last_token()], False, False) for r in generation])
        result = self.engine.step(steps)
        failed = [f"{step.seq_id}: {error}" for step, error in zip(steps, result.errors) if error is not None]
        if failed:
            raise RuntimeError(f"decoder step failed: {'; '.join(failed)}")
        return result.logits.to(self.dtype)

    def release(self, request: EngineRequest) -> None:
        from zerocheck.decoder.engine import StepRequest

        self.engine.step([StepRequest(str(request.req_id), [], False, True)])
