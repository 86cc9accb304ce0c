"""The generation loop: prefill, then one decode step per token, until a stop condition.

A plain class driven by injected callables, so it runs (and is tested) without Triton:
`step(StepCall) -> StepOutput` runs decoder + sampler for one sequence (in the server: one BLS call
to the `zero_check_step` or `checked_step` ensemble, batched with other sequences' steps by Triton's
dynamic batcher), `release(seq_id)` frees the sequence's KV-cache slot, `emit(Chunk)` sends a
streamed piece. Detokenization is incremental (multi-byte characters never split).
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from zerocheck.sampling import SamplingParams
from zerocheck.serving.inputs import GenerateRequest
from zerocheck.tokenizer import IncrementalDetokenizer, TextTokenizer

ZERO_CHECK = "zero_check"
CHECKED = "checked"


@dataclass(frozen=True)
class StepCall:
    """One decode step of one sequence. tokens: the prompt on the first step, else the last token.
    history: prompt + generated ids when penalties or bad words need them, else None."""

    seq_id: str
    tokens: list[int]
    start: bool
    end: bool
    sampling: SamplingParams
    history: list[int] | None
    step: int
    path: str  # ZERO_CHECK or CHECKED
    want_log_prob: bool
    context: object = None  # the caller's per-request handle, passed through to `step`


class StepCancelled(Exception):
    """Raised by a step that found its request cancelled: the loop ends with finish_reason cancelled."""


@dataclass(frozen=True)
class StepOutput:
    token: int
    log_prob: float | None = None


@dataclass
class Chunk:
    """A streamed piece: new text and ids since the last chunk."""

    text: str
    ids: list[int]
    log_probs: list[float]


@dataclass
class Generation:
    """The finished result of one sequence."""

    text: str
    ids: list[int]
    prompt_tokens: int
    finish_reason: str  # length | stop | eos | cancelled
    log_probs: list[float] = field(default_factory=list)
    arrival_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.ids)


def choose_path(request: GenerateRequest) -> tuple[str, str | None]:
    """The sampler path and, when the zero-check path was asked for but cannot serve the request,
    why it degraded. Log-probabilities need the normalised distribution, which only the checked
    chain computes."""
    if not request.zerocheck:
        return CHECKED, None
    if request.return_log_probs:
        return CHECKED, "return_log_probs"
    return ZERO_CHECK, None


def ends_with(ids: Sequence[int], suffix: Sequence[int]) -> bool:
    return len(suffix) > 0 and len(ids) >= len(suffix) and list(ids[len(ids) - len(suffix):]) == list(suffix)


class GenerationLoop:
    """Runs one sequence to completion; see the module docstring for the injected callables."""

    def __init__(self, tokenizer: TextTokenizer, step: Callable[[StepCall], StepOutput],
                 release: Callable[[str], None], max_context: int) -> None:
        self.tokenizer = tokenizer
        self._step = step
        self._release = release
        self.max_context = max_context

    def sampling_for(self, request: GenerateRequest) -> SamplingParams:
        """Request sampling params with bad words and embedding-bias words turned into token ids."""
        bad = tuple(tuple(ids) for ids in self.tokenizer.token_ids_of(list(request.bad_words)) if ids)
        bias = tuple((ids[0], weight) for (word, weight), ids in
                     zip(request.bias_words, self.tokenizer.token_ids_of([w for w, _ in request.bias_words])) if ids)
        return replace(request.sampling, bad_words=request.sampling.bad_words + bad, logit_bias=bias)

    def run(self, request: GenerateRequest, prompt_ids: list[int], path: str,
            emit: Callable[[Chunk], None] | None = None, cancelled: Callable[[], bool] = lambda: False,
            seed_offset: int = 0, context: object = None) -> Generation:
        """Generate until a stop condition. Cancellation is seen before each step, by `cancelled()` or
        by the step raising StepCancelled (a server checks it in the same hop as the step)."""
        arrival = time.time_ns()
        sampling = self.sampling_for(request)
        if seed_offset:
            sampling = replace(sampling, seed=(sampling.seed + seed_offset) % 2**64)
        end_id = request.end_id if request.end_id is not None else self.tokenizer.eos_id
        stop_ids = [ids for ids in self.tokenizer.token_ids_of(list(request.stop_words)) if ids]
        max_tokens = min(request.max_tokens, self.max_context - len(prompt_ids))
        needs_history = sampling.has_penalties or bool(sampling.bad_words)
        detok = IncrementalDetokenizer(self.tokenizer)
        seq_id = uuid.uuid4().hex
        ids: list[int] = []
        log_probs: list[float] = []
        pending = Chunk("", [], [])
        finish, first_ns, released = "length", 0, False
        try:
            for step in range(max_tokens):
                if cancelled():
                    finish = "cancelled"
                    break
                params = sampling
                if end_id >= 0 and step < request.min_tokens:
                    params = replace(sampling, bad_words=sampling.bad_words + ((end_id,),))
                last = step == max_tokens - 1
                try:
                    out = self._step(StepCall(
                        seq_id=seq_id, tokens=prompt_ids if step == 0 else ids[-1:], start=step == 0, end=last,
                        sampling=params, history=prompt_ids + ids if needs_history else None, step=step, path=path,
                        want_log_prob=request.return_log_probs, context=context))
                except StepCancelled:
                    finish = "cancelled"
                    break
                released = last
                first_ns = first_ns or time.time_ns()
                if out.token == end_id:
                    finish = "eos"
                    break
                ids.append(out.token)
                if out.log_prob is not None:
                    log_probs.append(out.log_prob)
                pending.text += detok.push([out.token])
                pending.ids.append(out.token)
                pending.log_probs += [out.log_prob] if out.log_prob is not None else []
                if any(ends_with(ids, stop) for stop in stop_ids):
                    finish = "stop"
                    break
                if emit is not None and len(pending.ids) >= request.stream_interval:
                    emit(pending)
                    pending = Chunk("", [], [])
        finally:
            if not released:
                self._release(seq_id)
        pending.text += detok.flush()
        if emit is not None and (pending.ids or pending.text):
            emit(pending)
        text = self.tokenizer.decode(ids)
        if not request.exclude_input_in_output and not request.stream:
            text = request.prompt + text
        return Generation(text=text, ids=ids, prompt_tokens=len(prompt_ids), finish_reason=finish,
                          log_probs=log_probs, arrival_ns=arrival, first_token_ns=first_ns,
                          last_token_ns=time.time_ns())
