"""CUDA-graph runner for the zero-check sampler: one captured graph per batch-size bucket.

A graph is captured lazily for each bucket (1, 2, 4, ... up to `max_batch_size`) over static
buffers: logits [bucket, V] float32 and per-row parameter tensors. It covers the common serving
case, where every row is greedy or has 0 < top_k <= `max_top_k` (top-p and min-p then act on the
candidate set). Penalties and bans are sparse writes into the static logits buffer before replay.
Batches outside that case (dense top-p rows, ties past the top-k candidates, larger batches) run
the eager `ZeroCheckSampler`. The choice of runner is made once, by `make_sampler`, at load time.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from . import ops
from .batch import SamplingBatch, build_batch
from .params import SamplingParams
from .zero_check import SampleOutput, ZeroCheckSampler, as_float32, finish, resolve_posinf


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


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class CudaGraphSampler:
    """Zero-check sampler replayed from CUDA graphs; same contract as `ZeroCheckSampler.sample`."""

    def __init__(self, vocab_size: int, max_batch_size: int, device: str | torch.device = "cuda",
                 max_top_k: int = 64) -> None:
        self.vocab_size = vocab_size
        self.device = torch.device(device)
        self.width = min(max_top_k + 1, vocab_size)
        self.max_top_k = self.width - 1
        self.buckets = buckets_up_to(max_batch_size)
        self.replays = 0
        self.eager_calls = 0
        self._eager = ZeroCheckSampler()
        self._graphs: dict[int, _Graph] = {}

    def _eligible(self, logits: torch.Tensor, params: Sequence[SamplingParams]) -> bool:
        same_device = logits.device.type == self.device.type and (
            self.device.index is None or logits.device.index == self.device.index)
        return (same_device and logits.dim() == 2 and logits.shape[1] == self.vocab_size
                and len(params) <= self.buckets[-1]
                and all(p.is_greedy or 0 < p.top_k <= self.max_top_k for p in params))

    def _capture(self, bucket: int) -> _Graph:
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
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels and the caching allocator outside the capture
                candidate_step(**inputs, width=self.width)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = candidate_step(**inputs, width=self.width)
        return _Graph(graph, inputs, outputs)

    def _load(self, g: _Graph, x: torch.Tensor, batch: SamplingBatch) -> None:
        rows = batch.size
        inputs = g.inputs
        inputs["x"][:rows].copy_(x)
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
        if not self._eligible(logits, params):
            self.eager_calls += 1
            return self._eager.sample(logits, params, history, step)
        x, _ = as_float32(logits)
        bucket = next(size for size in self.buckets if size >= len(params))
        if bucket not in self._graphs:
            self._graphs[bucket] = self._capture(bucket)
        g = self._graphs[bucket]
        batch = build_batch(params, self.vocab_size, history, step, self.device)
        self._load(g, x, batch)
        static_x = g.inputs["x"][:batch.size]
        edits = ops.apply_penalties_and_bans(static_x, batch)
        g.graph.replay()
        self.replays += 1
        tokens, row_max, tied = (out[:batch.size].clone() for out in g.outputs)
        if bool(tied.any()):
            self.eager_calls += 1
            return self._eager.sample(logits, params, history, step)
        resolve_posinf(static_x, tokens, row_max, batch)
        if edits is not None:
            edits.restore(static_x)
        return finish(static_x, tokens, row_max)


def make_sampler(vocab_size: int, max_batch_size: int, device: str | torch.device = "cpu",
                 max_top_k: int = 64) -> ZeroCheckSampler | CudaGraphSampler:
    """The runner for this process, chosen once: CUDA graphs on a CUDA device; on CPU the compiled
    kernel for greedy and top-k rows when numba is installed (benchmarks/sampler.py: 2-3x faster than
    eager torch), eager torch otherwise."""
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.is_available():
        return CudaGraphSampler(vocab_size, max_batch_size, device, max_top_k)
    sampler = ZeroCheckSampler(compiled=True)
    sampler.sample(torch.zeros(2, vocab_size), [SamplingParams(temperature=0.0), SamplingParams(top_k=2, seed=0)])
    return sampler  # the kernel is compiled now (or loaded from numba's cache), not at the first request
