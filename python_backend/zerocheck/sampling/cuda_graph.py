"""CUDA-graph runner for the zero-check sampler: one captured graph per batch-size bucket.

Every bucket (1, 2, 4, ... up to `max_batch_size`) is captured when the runner is made (load time, not
mid-traffic: capture synchronises and empties the allocator's cache) over static buffers: logits
[bucket, V] float32 (float16 / bfloat16 logits are converted by the copy in) and per-row parameter
tensors. Each bucket holds three steps over the same buffers: the candidate step for greedy rows and
rows with 0 < top_k <= `max_top_k` (top-p and min-p then act on the candidates), and two dense steps for
rows without top-k (temperature and min-p over whole rows, the two-stage race), one of them with top-p
(the race's token kept when it lies in the nucleus, else a second race over the nucleus: its exact
threshold by the mass histogram, the crossing bucket ranked by a fixed-size top-k), replayed only when a
dense row has top_p < 1 (the default rows skip its histogram and ranking); a batch replays the ones its
rows need. Penalties and bans are sparse writes into the static logits buffer before replay. A row whose
k-th value is tied past the candidates (common with bf16 logits), or that needs the second top-p race and
whose crossing bucket holds more than TOP_P_MEMBERS tokens, is redrawn alone by the eager
`ZeroCheckSampler`, the other rows keep the graph's tokens; batches with a top-k above `max_top_k` or
more rows than the largest bucket run eager whole. On a CPU device the same steps run eagerly on the
same buffers, so the runner's logic is tested without a GPU.
The choice of runner is made once, by `make_sampler`, at load time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from . import ops
from .batch import DENSE_ROW, BatchBuilder, SamplingBatch, row_steps
from .params import SamplingParamError, SamplingParams
from .zero_check import SampleOutput, ZeroCheckSampler, all_finite, finish, mark_nan_under_edits, resolve_posinf

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# tokens of a top-p row's crossing mass bucket (1/128 of a logit wide) the dense step ranks; a row with more
# is redrawn eagerly
TOP_P_MEMBERS = 1024


def buckets_up_to(max_batch_size: int) -> list[int]:
    """Powers of two below max_batch_size, then max_batch_size itself."""
    sizes, size = [], 1
    while size < max_batch_size:
        sizes.append(size)
        size *= 2
    return sizes + [max_batch_size]


def candidate_step(x: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                   min_p: torch.Tensor, keys: torch.Tensor, greedy: torch.Tensor, width: int
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Static-shape zero-check step with no host sync (capturable).

    x: [R, V] float32; temperature/top_p/min_p: [R] float32; top_k: [R] int64 in [1, width - 1]
    (any value on greedy rows); keys: [R, 2] int64; greedy: [R] bool.
    Returns tokens [R] int64, row max [R] float32, and [R] bool rows whose k-th value is tied past
    the candidates (those need the eager sampler).
    """
    values, ids = ops.topk_candidates(x, width)
    drawn, _, tied = ops.draw_from_candidates(values, ids, torch.where(greedy, 1, top_k), temperature, top_p, min_p,
                                              keys)
    tokens = torch.where(greedy, x.argmax(-1), drawn)
    top, tied = values[:, 0], tied & ~greedy
    return tokens, top, tied


def dense_step(x: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
               keys: torch.Tensor, members: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Static-shape dense draw with no host sync (capturable): temperature and min-p over whole rows, the
    two-stage race, and with `members` top-p (None: top_p is not read, the rows have none): the race's token is
    kept when it lies in the nucleus (`ops.in_nucleus`), and the other top-p rows take a second race over the
    nucleus (`ops.dense_top_p_threshold_static`, its crossing bucket ranked `members` deep): the eager
    sampler's dense path for rows without top-k, op for op, both races computed for every row. Returns tokens
    [R] int64, row max [R] float32 (rows that are not finite are resolved after) and [R] bool top-p rows that
    needed the second race and whose crossing bucket held more than `members` tokens (those need the eager
    sampler)."""
    top = x.amax(-1)
    shift = torch.where(torch.isfinite(top), top, 0.0)
    y = (x - shift.unsqueeze(1)).mul_((1.0 / temperature).unsqueeze(1))
    w = torch.exp(y)
    lower = torch.log(min_p)
    if members is not None:
        total = w.sum(-1, dtype=torch.float64)
        tau, overflow = ops.dense_top_p_threshold_static(y, w, top_p, members)
    w.masked_fill_(y < lower.unsqueeze(1), 0.0)
    drawn = ops.race_draw_dense(y, w, keys)
    if members is None:
        return drawn, top, torch.zeros_like(top, dtype=torch.bool)
    retry = (top_p < 1.0) & ~ops.in_nucleus(y, w, drawn, top_p, total)
    w.masked_fill_(y < torch.where(retry, tau, -math.inf).unsqueeze(1), 0.0)
    drawn = torch.where(retry, ops.race_draw_dense(y, w, keys, ops.TOP_P_RETRY_SALT), drawn)
    return drawn, top, overflow & retry


def same_device(runner: torch.device, tensor: torch.device) -> bool:
    """Whether a tensor on `tensor` is on the runner's device: a runner made for "cuda" (no index)
    takes "cuda:0" tensors (every CUDA tensor reports an index)."""
    return tensor.type == runner.type and (runner.index is None or tensor.index == runner.index)


@dataclass
class _Step:
    """A captured step: the outputs `replay` writes (a CUDA graph's replay, or on CPU the step run
    eagerly into the same outputs)."""

    outputs: tuple[torch.Tensor, ...]
    replay: Callable[[], None]


@dataclass
class _Body:
    """One bucket: static inputs, shared by its candidate step (greedy and top-k rows) and its dense steps
    step (rows without top-k or top-p)."""

    inputs: dict[str, torch.Tensor]
    candidate: _Step
    dense: _Step
    nucleus: _Step  # the dense step with top-p, replayed instead when a dense row has top_p < 1


class CudaGraphSampler:
    """Zero-check sampler replayed from CUDA graphs; same contract as `ZeroCheckSampler.sample`.
    replays: graph replays; eager_calls: batches run eager whole; eager_rows: tied rows redrawn eager."""

    def __init__(self, vocab_size: int, max_batch_size: int, device: str | torch.device = "cuda",
                 max_top_k: int = 64) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # its buffers' device, named exactly
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.width = min(max_top_k + 1, vocab_size)
        self.max_top_k = self.width - 1
        self.buckets = buckets_up_to(max_batch_size)
        self.replays = self.eager_calls = self.eager_rows = 0
        self._eager = ZeroCheckSampler()
        self._batches = BatchBuilder()
        self._bodies = {bucket: self._capture(bucket) for bucket in self.buckets}

    def _eligible(self, logits: torch.Tensor, params: Sequence[SamplingParams]) -> bool:
        return (same_device(self.device, logits.device) and logits.dim() == 2 and logits.shape[1] == self.vocab_size
                and logits.dtype in FLOAT_DTYPES and len(params) <= self.buckets[-1]
                and all(p.is_greedy or 0 <= p.top_k <= self.max_top_k for p in params))

    def _capture(self, bucket: int) -> _Body:
        f32 = dict(dtype=torch.float32, device=self.device)
        inputs = {
            "x": torch.zeros(bucket, self.vocab_size, **f32),
            "temperature": torch.ones(bucket, **f32),
            "top_k": torch.ones(bucket, dtype=torch.int64, device=self.device),
            "top_p": torch.ones(bucket, **f32),
            "min_p": torch.zeros(bucket, **f32),
            "keys": torch.zeros(bucket, 2, dtype=torch.int64, device=self.device),
            "greedy": torch.ones(bucket, dtype=torch.bool, device=self.device),
        }

        def candidate() -> tuple[torch.Tensor, ...]:
            return candidate_step(**inputs, width=self.width)

        def dense(members: int | None) -> Callable[[], tuple[torch.Tensor, ...]]:
            return lambda: dense_step(inputs["x"], inputs["temperature"], inputs["top_p"], inputs["min_p"],
                                      inputs["keys"], members)

        return _Body(inputs, self._capture_step(candidate), self._capture_step(dense(None)),
                     self._capture_step(dense(TOP_P_MEMBERS)))

    def _capture_step(self, step: Callable[[], tuple[torch.Tensor, ...]]) -> _Step:
        if self.device.type != "cuda":
            outputs = step()

            def run_eagerly() -> None:
                for out, value in zip(outputs, step()):
                    out.copy_(value)

            return _Step(outputs, run_eagerly)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels and the caching allocator outside the capture
                step()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = step()
        return _Step(outputs, graph.replay)

    def _load(self, body: _Body, logits: torch.Tensor, batch: SamplingBatch) -> None:
        rows = batch.size
        inputs = body.inputs
        inputs["x"][:rows].copy_(logits)  # float16 / bfloat16 converted here, no other copy
        inputs["temperature"][:rows].copy_(batch.temperature)
        inputs["top_k"][:rows].copy_(batch.top_k.clamp(min=1))
        inputs["top_p"][:rows].copy_(batch.top_p)
        inputs["min_p"][:rows].copy_(batch.min_p)
        inputs["keys"][:rows].copy_(batch.keys)
        inputs["greedy"][:rows].copy_(torch.tensor(batch.greedy, device=self.device))
        inputs["greedy"][rows:] = True

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               history: Sequence[Sequence[int]] | None = None, step: int | Sequence[int] = 0) -> SampleOutput:
        """logits: [B, V] on `device` (left unchanged); step: one or one per row. Returns per-row
        tokens and errors."""
        if logits.dim() == 2 and logits.shape[0] != len(params):
            raise SamplingParamError(f"logits have {logits.shape[0]} rows but {len(params)} params were given")
        if not self._eligible(logits, params):
            self.eager_calls += 1
            return self._eager.sample(logits, params, history, step)
        body = self._bodies[next(size for size in self.buckets if size >= len(params))]
        batch = self._batches.build(params, self.vocab_size, history, step, self.device)
        self._load(body, logits, batch)
        static_x = body.inputs["x"][:batch.size]
        edits = ops.apply_penalties_and_bans(static_x, batch)
        dense_rows = (batch.host.kind == DENSE_ROW).tolist()
        if not all(dense_rows):
            body.candidate.replay()
        dense_step = None
        if any(dense_rows):  # the histogram and rank of top-p only when a dense row asks for it
            dense_step = body.nucleus if batch.nucleus_rows else body.dense
            dense_step.replay()
        self.replays += 1
        tokens, row_max, tied = (out[:batch.size].clone() for out in body.candidate.outputs)
        if dense_step is not None:
            dense = torch.tensor(dense_rows, device=self.device)
            tokens = torch.where(dense, dense_step.outputs[0][:batch.size], tokens)
            row_max = torch.where(dense, dense_step.outputs[1][:batch.size], row_max)
            tied = torch.where(dense, dense_step.outputs[2][:batch.size], tied)
        finite = all_finite(row_max)
        if not finite:
            resolve_posinf(static_x, tokens, row_max, batch)
        if edits is not None:
            edits.restore(static_x)
        out = finish(static_x, tokens, row_max, mark_nan_under_edits(edits, row_max, finite))
        tied_rows = tied.nonzero().flatten().tolist()
        if tied_rows:
            self._redraw(out, tied_rows, logits, params, history, row_steps(step, len(params)))
        return out

    def _redraw(self, out: SampleOutput, rows: list[int], logits: torch.Tensor, params: Sequence[SamplingParams],
                history: Sequence[Sequence[int]] | None, steps: list[int]) -> None:
        """Draw the rows whose k-th value is tied past the candidates with the eager sampler (whole
        rows), in place of the graph's tokens; the other rows keep theirs."""
        self.eager_rows += len(rows)
        index = torch.tensor(rows, device=logits.device)
        redo = self._eager.sample(logits.index_select(0, index), [params[r] for r in rows],
                                  [history[r] for r in rows] if history is not None else None,
                                  [steps[r] for r in rows])
        out.tokens[index] = redo.tokens.to(out.tokens.device)
        for r, error in zip(rows, redo.errors):
            out.errors[r] = error


def make_sampler(vocab_size: int, max_batch_size: int, device: str | torch.device = "cpu",
                 max_top_k: int = 64) -> ZeroCheckSampler | CudaGraphSampler:
    """The runner for this process, chosen once: CUDA graphs on a CUDA device (every bucket captured
    now); on CPU the compiled kernel for every row when numba is installed (benchmarks/sampler.py),
    eager torch otherwise."""
    device = torch.device(device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device} asked for, but torch sees no CUDA device")
        return CudaGraphSampler(vocab_size, max_batch_size, device, max_top_k)
    sampler = ZeroCheckSampler(compiled=True)
    sampler.sample(torch.zeros(2, vocab_size), [SamplingParams(temperature=0.0), SamplingParams(top_k=2, seed=0)])
    return sampler  # the kernel is compiled now (or loaded from numba's cache), not at the first request
