"""`ZeroCheckLogitsProcessor`: zerocheck's sampler inside TensorRT-LLM's LLM API (PyTorch backend).

    from tensorrt_llm import LLM, SamplingParams
    from zerocheck.sampling import SamplingParams as ZeroCheckParams
    from zerocheck.trtllm import ZeroCheckLogitsProcessor

    llm = LLM(model=..., disable_overlap_scheduler=True)
    draw = ZeroCheckLogitsProcessor(ZeroCheckParams(top_k=40, top_p=0.9, seed=7), min_tokens=4, end_ids=(2,))
    llm.generate(prompt, SamplingParams(temperature=0.0, logits_processor=draw))

Each call draws the request's next token with zerocheck's sampler (logit bias, penalties, bad words, temperature,
top-k / top-p / min-p, the exponential race keyed by (seed, step)) and writes a one-hot mask into the engine's
logits in place: 0 at the drawn token, -inf elsewhere (both exact in bf16 and fp16). The engine's greedy argmax
then emits that token, so a seeded request gets the tokens zerocheck's own decoder draws for the same prompt and
model.

How TensorRT-LLM calls it (read in NVIDIA/TensorRT-LLM, tensorrt_llm/_torch/pyexecutor/model_engine.py,
`PyTorchModelEngine.forward` -> `_execute_logit_post_processors`, commit 1a0dc5f7): after every forward, context
requests first, then generation requests, one call per request that has processors, with
- req_id: the request's id;
- logits: that request's row of the forward's logits viewed [1, 1, V] (the model's dtype, on its GPU), edited in
  place (a later refactor, `ForwardExecutor._apply_logits_processors`, views a request's beams as [beam, 1, V]);
- token_ids: `[request.get_tokens(0)]` (per beam in that refactor): the prompt, then every token generated so far;
- stream_ptr, client_id: None (work is queued on the current stream).
The engine checks `4 <= len(inspect.signature(processor).parameters) <= 5`. TensorRT-LLM's
`BatchedLogitsProcessor` reaches only the TensorRT-engine executor (`apply_batched_logits_processor` names a C++
post-processor; examples/llm-api/llm_logits_processor.py marks it "TensorRT-backend only"): the PyTorch backend
calls per-request processors only, so there is no batched form here.

Semantics, those of `zerocheck.decoder.sequences.SequenceState`: the prompt length is a request's token count at
its first call; step = tokens generated so far = len(token_ids[beam]) - prompt length, the noise counter; while
step < min_tokens the end ids are banned; penalties and bad words read prompt + generated. A call is a function
of (params, token_ids, logits) only, so a repeated call at one step (each chunk of a chunked prompt) draws the
same token.

The engine's own sampling must leave the mask alone: greedy (temperature=0), none of its penalties, bad words,
min_tokens or embedding bias (they are this processor's), and the overlap scheduler off: with it on the engine
calls processors before it appends the previous step's token (py_executor.py `_executor_loop_overlap` runs
`_forward_step` before `_update_requests`), so token_ids lag one token behind. A call whose token_ids disagree
with this processor's previous draw is logged, once per request (`mismatches` counts them).
"""
from __future__ import annotations

import importlib.util
import logging
import math
import threading
from dataclasses import dataclass, replace
from typing import Any, List, Optional, Sequence

import torch

from zerocheck.sampling.history import TokenHistory
from zerocheck.sampling.params import SamplingParamError, SamplingParams, fresh_seed

log = logging.getLogger("zerocheck.trtllm")


def _logits_processor_base() -> type:
    """TensorRT-LLM's `LogitsProcessor` when tensorrt_llm is installed and imports, else `object`; logged."""
    if importlib.util.find_spec("tensorrt_llm") is None:
        log.info("ZeroCheckLogitsProcessor is a plain class with LogitsProcessor's __call__ signature: "
                 "tensorrt_llm is not installed")
        return object
    try:
        from tensorrt_llm.sampling_params import LogitsProcessor
    except ImportError as error:
        log.warning("ZeroCheckLogitsProcessor is a plain class with LogitsProcessor's __call__ signature: "
                    "tensorrt_llm is installed but does not import (%s)", error)
        return object
    log.info("ZeroCheckLogitsProcessor subclasses tensorrt_llm.sampling_params.LogitsProcessor")
    return LogitsProcessor


LogitsProcessorBase = _logits_processor_base()  # decided once, at import


class _Samplers:
    """One zerocheck sampler per (device, vocabulary) in this process, made on first use by `make_sampler` (CUDA
    graphs on a GPU, the compiled kernel on the CPU) and shared by every request's processor: a graph capture per
    request would cost more than the request's draws. The lock keeps one call at a time on a sampler's static
    buffers (the engine calls processors from one thread; the lock costs nothing then)."""

    def __init__(self) -> None:
        self._made: dict[tuple[torch.device, int], Any] = {}
        self.lock = threading.Lock()

    def get(self, device: torch.device, vocab_size: int) -> Any:
        key = (device, vocab_size)
        sampler = self._made.get(key)
        if sampler is None:
            from zerocheck.sampling.cuda_graph import make_sampler

            sampler = self._made[key] = make_sampler(vocab_size, 1, device)
            log.info("zero-check sampler for TensorRT-LLM requests on %s, V=%d: %s", device, vocab_size,
                     type(sampler).__name__)
        return sampler


SAMPLERS = _Samplers()


@dataclass
class _RequestState:
    """What a processor keeps of one request between calls."""

    prompt_length: int
    histories: list[TokenHistory] | None  # per beam, when penalties or bad words read them
    last_step: int = -1  # the step of this processor's last draw (beam 0) ...
    last_token: int = -1  # ... and the token it drew
    warned: bool = False


def logits_rows(logits: torch.Tensor) -> torch.Tensor:
    """The [beam, V] view of the engine's [beam, 1, V] logits ([beam, V] taken as it is): writes go through."""
    if logits.dim() == 3 and logits.shape[1] == 1:
        return logits.select(1, 0)
    if logits.dim() == 2:
        return logits
    raise SamplingParamError(f"logits must be [beam, 1, vocab] or [beam, vocab], got shape {tuple(logits.shape)}")


# -inf as the bits of each float dtype, read as a signed integer of the same width
_NEG_INF_BITS = {torch.float32: (torch.int32, -(1 << 23)), torch.float16: (torch.int16, -(1 << 10)),
                 torch.bfloat16: (torch.int16, -(1 << 7))}


def write_one_hot(rows: torch.Tensor, tokens: torch.Tensor, errors: Sequence[str | None]) -> None:
    """In place on rows [R, V] float32 / float16 / bfloat16: 0 at tokens[r] (int64 [R]), -inf elsewhere; a row
    with an error (its token is -1) is left as it came. On a GPU two kernels, no host sync; on the CPU through
    numpy on the rows' bits (one thread: torch's parallel fill of a row costs more in thread wake-ups than the
    write itself)."""
    keep = [r for r, error in enumerate(errors) if error is None]
    if rows.device.type == "cpu":
        int_dtype, neg_inf = _NEG_INF_BITS[rows.dtype]
        bits = rows.view(int_dtype).numpy()
        ids = tokens.tolist()
        for r in keep:
            bits[r].fill(neg_inf)
            bits[r, ids[r]] = 0  # all bits clear: +0.0
        return
    drawn = tokens.to(rows.device).view(-1, 1)
    if len(keep) == len(errors):
        rows.fill_(-math.inf)
        rows.scatter_(1, drawn, 0.0)
        return
    for r in keep:
        rows[r].fill_(-math.inf)
        rows[r].scatter_(0, drawn[r], 0.0)


class ZeroCheckLogitsProcessor(LogitsProcessorBase):
    """A request's zero-check sampling as a TensorRT-LLM logits processor (see the module docstring).

    params: the request's zerocheck `SamplingParams` (an unseeded request gets a fresh seed here, once: its noise
    stream for its whole life, as zerocheck's decoder registers it); min_tokens: end_ids are banned while fewer
    tokens were generated; end_ids: the request's end token ids. One processor per request is the intended use;
    state is kept per req_id, so a shared one stays correct. Picklable (the LLM API sends SamplingParams to its
    worker process): the sampler lives in the process (`SAMPLERS`), not in the processor."""

    def __init__(self, params: SamplingParams, min_tokens: int = 0, end_ids: Sequence[int] = ()) -> None:
        if not isinstance(params, SamplingParams):
            raise SamplingParamError(f"params must be a zerocheck.sampling.SamplingParams, got {type(params).__name__}")
        if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
            raise SamplingParamError(f"min_tokens must be an integer >= 0, got {min_tokens!r}")
        end_ids = tuple(end_ids)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in end_ids):
            raise SamplingParamError(f"end_ids must be non-negative integers, got {end_ids!r}")
        self.params = params if params.seed is not None else replace(params, seed=fresh_seed())
        self.early = (replace(self.params, bad_words=self.params.bad_words + tuple((t,) for t in end_ids))
                      if min_tokens and end_ids else self.params)
        self.min_tokens = min_tokens
        self.end_ids = frozenset(end_ids)
        self.keeps_history = self.params.has_penalties or bool(self.params.bad_words)
        self.mismatches = 0
        self._requests: dict[int, _RequestState] = {}

    def __call__(self, req_id: int, logits: torch.Tensor, token_ids: List[List[int]], stream_ptr: Optional[int],
                 client_id: Optional[int]) -> None:
        """Draw each beam's next token and write its one-hot mask into `logits` ([beam, 1, V] float32 / float16 /
        bfloat16, in place). token_ids: per beam, prompt + generated. stream_ptr and client_id are not read (the
        PyTorch backend passes None; work goes on the current stream). Host syncs: the sampler's, and one reading
        the drawn token back for the mismatch check."""
        rows = logits_rows(logits)
        if len(token_ids) != rows.shape[0]:
            raise SamplingParamError(f"request {req_id}: {rows.shape[0]} logits rows but {len(token_ids)} token_ids")
        state = self._requests.get(req_id)
        if state is None:
            state = self._requests[req_id] = _RequestState(
                len(token_ids[0]), [TokenHistory(ids) for ids in token_ids] if self.keeps_history else None)
        steps = [len(ids) - state.prompt_length for ids in token_ids]
        if min(steps) < 0:
            raise SamplingParamError(f"request {req_id}: token_ids hold {min(map(len, token_ids))} ids, fewer than "
                                     f"its prompt's {state.prompt_length}")
        self._check_taken(req_id, state, token_ids[0], steps[0])
        params = [self.early if step < self.min_tokens else self.params for step in steps]
        history = self._histories(state, token_ids)
        with SAMPLERS.lock:
            out = SAMPLERS.get(rows.device, rows.shape[1]).sample(rows, params, history, steps)
        write_one_hot(rows, out.tokens, out.errors)
        for error in out.errors:
            if error:
                log.error("request %s, step %d: %s; its logits are left as they came", req_id, steps[0], error)
        state.last_step, state.last_token = steps[0], int(out.tokens[0])

    def _check_taken(self, req_id: int, state: _RequestState, ids: List[int], step: int) -> None:
        """Whether the engine emitted this processor's previous draw (see the module docstring); logged once."""
        if state.last_step != step - 1 or state.last_token < 0:
            return
        emitted = ids[state.prompt_length + step - 1]
        if emitted == state.last_token:
            return
        self.mismatches += 1
        if not state.warned:
            state.warned = True
            log.warning("request %s: the engine emitted token %d at step %d where this processor drew %d: sample "
                        "greedily (temperature=0), with the engine's penalties, bad words, min_tokens and embedding "
                        "bias off, and disable_overlap_scheduler=True; the draws go on from the engine's token_ids",
                        req_id, emitted, step - 1, state.last_token)

    def _histories(self, state: _RequestState, token_ids: List[List[int]]) -> list[TokenHistory] | None:
        """Per beam, prompt + generated as a `TokenHistory` grown by the new ids (rebuilt when a beam's ids are not
        its continuation); None when neither penalties nor bad words read it."""
        if state.histories is None:
            return None
        for b, ids in enumerate(token_ids):
            history = state.histories[b]
            kept = len(history)
            if len(ids) < kept or (kept and ids[kept - 1] != history[kept - 1]):
                state.histories[b] = TokenHistory(ids)
            elif len(ids) > kept:
                history.extend(ids[kept:])
        return state.histories
