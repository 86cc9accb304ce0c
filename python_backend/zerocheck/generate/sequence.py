"""One sequence's generation, as a state machine the step scheduler drives.

`Sequence.next_call()` says which decode step the sequence needs next (prefill with the prompt, or
the next chunk of it when the scheduler limits a step's prompt tokens, then the last sampled token);
`accept(StepOutput)` applies a sampled token: append, stop at end_id / a stop word / max_tokens, or
stream (the token sampled after a prompt chunk that is not the last is dropped). Detokenization is incremental (multi-byte characters
never split) and done when a chunk is taken, off the path between two steps.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence as Seq

from zerocheck.api.errors import Overloaded
from zerocheck.api.sampler_path import DEGRADE_LOG_PROBS, SamplerPath
from zerocheck.sampling import SamplingParams
from zerocheck.sampling.params import fresh_seed
from zerocheck.api.request import GenerateRequest
from zerocheck.tokenizer import IncrementalDetokenizer, TextTokenizer
from zerocheck.wire.step import Registration, StepCall, StepOutput, TopLogProbs



@dataclass
class Chunk:
    """A streamed piece: new text and ids since the last chunk (and their log-probabilities when asked)."""

    text: str
    ids: list[int]
    log_probs: list[float]
    top_log_probs: list[TopLogProbs] = field(default_factory=list)


@dataclass
class Generation:
    """The finished result of one sequence."""

    text: str
    ids: list[int]
    prompt_tokens: int
    finish_reason: str  # length | stop | eos | cancelled
    log_probs: list[float] = field(default_factory=list)
    top_log_probs: list[TopLogProbs] = field(default_factory=list)
    arrival_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0

    @property
    def completion_tokens(self) -> int:
        return len(self.ids)


def choose_path(request: GenerateRequest) -> tuple[SamplerPath, str | None]:
    """The sampler path and, when the zero-check path was asked for but cannot serve the request,
    why it degraded. Log-probabilities need the normalised distribution, which only the checked
    chain computes."""
    if not request.zerocheck:
        return SamplerPath.CHECKED, None
    if request.return_log_probs or request.top_log_probs:
        return SamplerPath.CHECKED, DEGRADE_LOG_PROBS
    return SamplerPath.ZERO_CHECK, None


def ends_with(ids: Seq[int], suffix: Seq[int]) -> bool:
    return len(suffix) > 0 and len(ids) >= len(suffix) and list(ids[len(ids) - len(suffix):]) == list(suffix)


def end_ids_of(tokenizer: TextTokenizer, request: GenerateRequest) -> tuple[int, ...]:
    """The ids that end the sequence: the request's `end_id` (-1: none), else the model's (EOS, its
    generation config's eos ids and the chat template's end-of-turn token)."""
    if request.end_id is None:
        return tokenizer.end_ids
    return () if request.end_id < 0 else (request.end_id,)


def sampling_for(tokenizer: TextTokenizer, request: GenerateRequest, index: int = 0) -> SamplingParams:
    """Request sampling params with bad words and embedding-bias words turned into token ids (next to the
    request's logit_bias_ids). Sequence
    `index` of a request draws with seed + index; an unseeded request gets a fresh random seed, so
    every sequence has its own noise stream whatever its batch position."""
    bad = tuple(tuple(ids) for ids in tokenizer.token_ids_of(list(request.bad_words)) if ids)
    bias = tuple((ids[0], weight) for (word, weight), ids in
                 zip(request.bias_words, tokenizer.token_ids_of([w for w, _ in request.bias_words])) if ids)
    bias += request.bias_ids
    seed = request.sampling.seed if request.sampling.seed is not None else fresh_seed()
    return replace(request.sampling, bad_words=request.sampling.bad_words + bad, logit_bias=bias,
                   seed=(seed + index) % 2**64)


class Sequence:
    """The state of one sequence between decode steps (see the module docstring)."""

    def __init__(self, tokenizer: TextTokenizer, request: GenerateRequest, prompt_ids: list[int], path: SamplerPath,
                 max_context: int, index: int = 0, cancelled: Callable[[], bool] = lambda: False,
                 max_wait_s: float = 30.0) -> None:
        self.tokenizer, self.request, self.prompt_ids, self.path, self.index = tokenizer, request, prompt_ids, path, index
        self.cancelled = cancelled
        self.seq_id = uuid.uuid4().hex
        self.sampling = sampling_for(tokenizer, request, index)
        self.end_ids = end_ids_of(tokenizer, request)
        self.stop_ids = [ids for ids in tokenizer.token_ids_of(list(request.stop_words)) if ids] + \
            [list(ids) for ids in request.stop_ids if ids]
        self.max_tokens = min(request.max_tokens, max_context - len(prompt_ids))
        self.ids: list[int] = []
        self.log_probs: list[float] = []
        # set when done: length | stop | eos | cancelled | error
        self.finish: str | None = None if self.max_tokens > 0 else "length"
        self.error: Exception | None = None
        self.started = False  # a step was sent: the decoder may hold a KV slot for it
        self.prefilled = 0  # prompt tokens the decoder has cached
        self._chunk = 0  # prompt tokens in the step sent, when it is a prompt chunk
        self.deferred_since = 0.0  # time.monotonic() of the first prefill refused for want of a slot
        self.cancelled_at = 0.0  # time.monotonic() when its cancellation was seen
        self.max_wait_s = max_wait_s
        self.released = False  # a step with end=True came back: the decoder freed the slot itself
        self.arrival_ns, self.first_scheduled_ns, self.first_token_ns, self.last_token_ns = time.time_ns(), 0, 0, 0
        self._detok = IncrementalDetokenizer(tokenizer)
        self._unsent = 0  # ids accepted but not yet in a chunk
        self._unsent_log_probs: list[float] = []
        self.top_log_probs: list[TopLogProbs] = []
        self._unsent_top: list[TopLogProbs] = []
        self._sent_end = False
        self._generation: Generation | None = None

    @property
    def done(self) -> bool:
        return self.finish is not None

    @property
    def holds_slot(self) -> bool:
        """Whether the decoder may still hold a KV cache slot for this sequence (release it when done)."""
        return self.started and not self.released

    @property
    def tokens_left(self) -> int:
        """Tokens still to generate before max_tokens (an end id or a stop may come sooner)."""
        return self.max_tokens - len(self.ids)

    @property
    def prefill_left(self) -> int:
        """Prompt tokens not yet sent to the decoder."""
        return len(self.prompt_ids) - self.prefilled

    def next_call(self, max_prompt_tokens: int | None = None, steps: int = 1) -> StepCall:
        """The next step; while prefilling, at most `max_prompt_tokens` of the prompt (None: all of it); once the
        prompt is in, up to `steps` tokens in the call (a multi-step call, never past max_tokens)."""
        step = len(self.ids)
        start = self.prefilled == 0
        self.started = True
        self.first_scheduled_ns = self.first_scheduled_ns or time.time_ns()
        if self.prefill_left:
            self._chunk = self.prefill_left if max_prompt_tokens is None else min(max_prompt_tokens, self.prefill_left)
            tokens = self.prompt_ids[self.prefilled:self.prefilled + self._chunk]
        else:
            self._chunk, tokens = 0, self.ids[-1:]
        steps = 1 if self.prefill_left else max(1, min(steps, self.tokens_left))
        self._sent_end = step + steps == self.max_tokens and self._chunk == self.prefill_left
        registration = Registration(self.sampling, self.request.min_tokens, self.end_ids, len(self.prompt_ids),
                                    self.request.guide) if start else None
        return StepCall(seq_id=self.seq_id, tokens=tokens, start=start, end=self._sent_end, registration=registration,
                        path=self.path, want_log_prob=self.request.return_log_probs or self.request.top_log_probs > 0,
                        steps=steps)

    def accept(self, out: StepOutput) -> None:
        """Apply the sampled token(s) of the step `next_call` asked for (a multi-step call's in order, up to
        the one that ends the sequence)."""
        chunk, self._chunk = self._chunk, 0
        self.prefilled += chunk
        if chunk and self.prefill_left:  # a prompt chunk, not the last: nothing to sample yet
            return
        self.released = self._sent_end
        self.last_token_ns = time.time_ns()
        self.first_token_ns = self.first_token_ns or self.last_token_ns
        self._append(out.token, out.log_prob, out.top)
        for token in out.more:
            if self.done:
                break
            self._append(token, None, ())

    def _append(self, token: int, log_prob: float | None, top: TopLogProbs) -> None:
        if token in self.end_ids:
            self.finish = "eos"
            return
        self.ids.append(token)
        self._unsent += 1
        if log_prob is not None:
            self.log_probs.append(log_prob)
            self._unsent_log_probs.append(log_prob)
        if self.request.top_log_probs:
            top = top[:self.request.top_log_probs]
            self.top_log_probs.append(top)
            self._unsent_top.append(top)
        if any(ends_with(self.ids, stop) for stop in self.stop_ids):
            self.finish = "stop"
        elif len(self.ids) >= self.max_tokens:
            self.finish = "length"

    def defer(self, refusal: Exception) -> None:
        """The decoder had no KV slot for this sequence's prefill (every slot is taken, or one that
        ended is still being freed): it holds none, and the prefill goes again at the next step. After
        `max_wait_s` of that, the sequence fails with the refusal."""
        self.started, self.prefilled, self._chunk = False, 0, 0
        now = time.monotonic()
        self.deferred_since = self.deferred_since or now
        if now - self.deferred_since > self.max_wait_s:
            self.fail(Overloaded(f"overloaded: no KV cache slot freed within {self.max_wait_s:g} s ({refusal})"))

    def cancel(self) -> None:
        self.finish = "cancelled"
        self.cancelled_at = time.monotonic()

    def fail(self, error: Exception) -> None:
        """The step failed for this sequence: it ends, and its request gets `error`."""
        self.finish, self.error = "error", error

    def take_chunk(self) -> Chunk | None:
        """For a streamed request, the next piece due: `stream_interval` new ids (a multi-step call's tokens
        make several pieces), or what is left once done; None when none is due."""
        interval = self.request.stream_interval
        if not self.request.stream or (not self.done and self._unsent < interval):
            return None
        count = min(self._unsent, interval)
        first = len(self.ids) - self._unsent
        ids = self.ids[first:first + count]
        text = self._detok.push(ids) + (self._detok.flush() if self.done and count == self._unsent else "")
        chunk = Chunk(text, ids, self._unsent_log_probs[:count], self._unsent_top[:count])
        self._unsent -= count
        self._unsent_log_probs, self._unsent_top = self._unsent_log_probs[count:], self._unsent_top[count:]
        return chunk if chunk.ids or chunk.text else None

    def generation(self) -> Generation:
        """The result, once done (decoded once: the final response and the metrics share it)."""
        if self._generation is None:
            text = self.tokenizer.decode(self.ids)
            if not (self.request.exclude_input_in_output or self.request.stream or self.request.is_chat):
                text = self.request.prompt + text
            self._generation = Generation(text=text, ids=self.ids, prompt_tokens=len(self.prompt_ids),
                                          finish_reason=self.finish or "length", log_probs=self.log_probs,
                                          top_log_probs=self.top_log_probs, arrival_ns=self.arrival_ns, first_token_ns=self.first_token_ns,
                                          last_token_ns=self.last_token_ns)
        return self._generation
