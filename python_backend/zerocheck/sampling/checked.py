"""The checked reference chain: the default post-processing, one full pass per stage.

penalties (Hugging Face's gather/scatter repetition penalty, vLLM's dense token counts for
presence/frequency) -> bad-word mask -> temperature -> softmax over V -> full sort -> top-k ->
cumulative top-p on the renormalised top-k mass -> min-p -> renormalise -> multinomial.
It is the baseline every comparison runs against, and it draws from exactly the distribution the
zero-check sampler draws from (same tie rule: a filter keeps every token >= its threshold).
Seeded rows draw with their own `torch.Generator` seeded from (seed, step).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .batch import SamplingBatch, build_batch
from .params import SamplingParams
from .zero_check import SampleOutput, as_float32, finish, resolve_posinf


def repetition_penalty(x: torch.Tensor, history: Sequence[Sequence[int]], penalty: torch.Tensor) -> None:
    """CTRL penalty the Hugging Face way: gather the history's logits, rescale, scatter back.
    x: [B, V] float32, modified in place; penalty: [B] float32."""
    rows = [b for b in range(x.shape[0]) if penalty[b] != 1.0 and len(history[b])]
    if not rows:
        return
    width = max(len(history[b]) for b in rows)
    ids = torch.tensor([list(history[b]) + [history[b][0]] * (width - len(history[b])) for b in rows],
                       dtype=torch.int64, device=x.device)
    index = torch.tensor(rows, device=x.device)
    sub = x[index]
    score = sub.gather(1, ids)
    r = penalty[index].unsqueeze(1)
    sub.scatter_(1, ids, torch.where(score < 0, score * r, score / r))
    x[index] = sub


def presence_frequency_penalty(x: torch.Tensor, history: Sequence[Sequence[int]], presence: torch.Tensor,
                               frequency: torch.Tensor) -> None:
    """OpenAI penalties with dense [B, V] token counts (vLLM's bin counts). x modified in place."""
    counts = torch.zeros_like(x)
    for b, ids in enumerate(history):
        if len(ids):
            counts[b].scatter_add_(0, torch.as_tensor(list(ids), device=x.device),
                                   torch.ones(len(ids), device=x.device))
    x -= frequency.unsqueeze(1) * counts + presence.unsqueeze(1) * (counts > 0)


def filter_sorted_probs(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                        min_p: torch.Tensor) -> torch.Tensor:
    """probs: [R, V] sorted descending -> filtered, renormalised [R, V] (new tensor).
    top_k: [R] int64 (0 = off), top_p, min_p: [R] float32."""
    vocab = probs.shape[1]
    k = torch.where(top_k > 0, top_k, vocab)
    kth = probs.gather(1, (k - 1).unsqueeze(1))
    probs = probs.masked_fill(probs < kth, 0.0)
    renorm = probs / probs.sum(-1, keepdim=True)
    cum = renorm.cumsum(-1)
    cut = torch.searchsorted(cum, top_p.unsqueeze(1).to(cum.dtype)).clamp_(max=vocab - 1)
    pth = torch.where(top_p.unsqueeze(1) < 1.0, probs.gather(1, cut), 0.0)
    probs = probs.masked_fill(probs < pth, 0.0)
    probs = probs.masked_fill(probs < min_p.unsqueeze(1) * probs[:, :1], 0.0)
    return probs / probs.sum(-1, keepdim=True)


def generator_for(seed: int, step: int, device: torch.device) -> torch.Generator:
    """A generator seeded from (seed, step), so a seeded row draws the same on any batch position."""
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + step) % (2**63))
    return generator


class CheckedSampler:
    """The checked chain over a whole batch (see the module docstring)."""

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               history: Sequence[Sequence[int]] | None = None, step: int = 0) -> SampleOutput:
        """logits: [B, V] float32/float16/bfloat16 (left unchanged); returns per-row tokens and errors."""
        x = as_float32(logits)[0].clone()
        raw = x.clone()
        batch = build_batch(params, x.shape[1], history, step, x.device)
        if history is not None and any(p.has_penalties for p in params):
            repetition_penalty(x, history, torch.tensor([p.repetition_penalty for p in params]))
            presence_frequency_penalty(x, history, torch.tensor([p.presence_penalty for p in params]),
                                       torch.tensor([p.frequency_penalty for p in params]))
        if batch.banned is not None:
            x[batch.banned] = -math.inf
        row_max, tokens = x.max(-1)
        sampled = [b for b in range(batch.size) if not batch.greedy[b]]
        if sampled:
            self._sample_rows(x, batch, params, step, sampled, tokens)
        resolve_posinf(x, tokens, row_max, batch)
        return finish(raw, tokens, row_max)

    def _sample_rows(self, x: torch.Tensor, batch: SamplingBatch, params: Sequence[SamplingParams], step: int,
                     rows: list[int], tokens: torch.Tensor) -> None:
        index = torch.tensor(rows, device=x.device)
        scaled = x[index] / batch.temperature[index].unsqueeze(1)
        probs = torch.softmax(scaled, dim=-1)
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        final = filter_sorted_probs(sorted_probs, batch.top_k[index], batch.top_p[index], batch.min_p[index])
        final = torch.nan_to_num(final, nan=1.0)  # NaN/inf rows: any draw, `finish` replaces it
        positions = torch.empty(len(rows), dtype=torch.int64, device=x.device)
        unseeded = [i for i, b in enumerate(rows) if params[b].seed is None]
        if unseeded:
            positions[unseeded] = torch.multinomial(final[unseeded], 1).squeeze(1)
        for i, b in enumerate(rows):
            if params[b].seed is not None:
                positions[i] = torch.multinomial(final[i], 1, generator=generator_for(params[b].seed, step, x.device))[0]
        tokens[index] = order.gather(1, positions.unsqueeze(1)).squeeze(1)


_SAMPLER = CheckedSampler()


def checked_sample(logits: torch.Tensor, params: Sequence[SamplingParams],
                   history: Sequence[Sequence[int]] | None = None, step: int = 0) -> torch.Tensor:
    """Draw one token per row with the checked chain; same signature and contract as
    `zero_check_sample` (logits [B, V] not modified; returns LongTensor [B])."""
    return _SAMPLER.sample(logits, params, history, step).raise_errors()
