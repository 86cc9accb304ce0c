"""The checked reference chain: the default post-processing, one full pass per stage.

logit bias -> penalties (Hugging Face's gather/scatter repetition penalty, vLLM's dense token
counts for presence/frequency) -> bad-word mask -> temperature -> softmax over V -> full sort ->
top-k -> cumulative top-p on the renormalised top-k mass -> min-p -> renormalise -> multinomial.
It is the baseline every comparison runs against, and it draws from exactly the distribution the
zero-check sampler draws from (same tie rule: a filter keeps every token >= its threshold).
Each stage is a function of its own, so the Triton chain (`penalties` -> `softmax` ->
`top_k_top_p` -> `multinomial`) and `CheckedSampler` run the same code.
Seeded rows draw with their own `torch.Generator` seeded from (seed, step).
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from .batch import SamplingBatch, build_batch, row_steps
from .params import SamplingParamError, SamplingParams
from .zero_check import SampleOutput, as_float32


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
        if len(ids) and (presence[b] != 0 or frequency[b] != 0):
            counts[b].scatter_add_(0, torch.as_tensor(list(ids), device=x.device),
                                   torch.ones(len(ids), device=x.device))
    x -= frequency.unsqueeze(1) * counts + presence.unsqueeze(1) * (counts > 0)


def penalize(x: torch.Tensor, batch: SamplingBatch, params: Sequence[SamplingParams],
             history: Sequence[Sequence[int]] | None) -> None:
    """Stage 1: bias, penalties and bans, in place on x [B, V] float32. A row left with no finite
    logit falls back to its original argmax: it becomes 0 there and -inf elsewhere."""
    raw_top = x.argmax(-1)
    if batch.bias is not None:
        x.index_put_(batch.bias[:2], batch.bias[2], accumulate=True)
    if history is not None and any(p.has_penalties for p in params):
        def column(name: str) -> torch.Tensor:  # on the logits' device: CUDA rows index and scale with it
            return torch.tensor([getattr(p, name) for p in params], dtype=torch.float32, device=x.device)

        repetition_penalty(x, history, column("repetition_penalty"))
        presence_frequency_penalty(x, history, column("presence_penalty"), column("frequency_penalty"))
    if batch.banned is not None:
        x[batch.banned] = -math.inf
    masked = (x.amax(-1) == -math.inf).nonzero().flatten()
    if len(masked):
        x[masked] = -math.inf
        x[masked, raw_top[masked]] = 0.0


def tempered_probs(x: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """Stage 2: softmax(x / T) over V -> [B, V] float32. Greedy rows become one-hot at the argmax
    (first index among ties); rows holding +inf spread their mass evenly over the +inf tokens."""
    probs = torch.softmax(x / batch.temperature.unsqueeze(1), dim=-1)
    greedy = torch.tensor(batch.greedy, dtype=torch.bool, device=x.device)
    if bool(greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(1, x.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy.unsqueeze(1), one_hot, probs)
    posinf = x == math.inf
    rows = posinf.any(-1) & ~greedy
    if bool(rows.any()):
        even = posinf.float() / posinf.sum(-1, keepdim=True).clamp(min=1)
        probs = torch.where(rows.unsqueeze(1), even, probs)
    return probs


def sort_and_filter(probs: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 3: full sort, then top-k, top-p (on the renormalised top-k mass) and min-p masks.
    probs: [B, V] -> (filtered, renormalised probabilities sorted descending [B, V] float32,
    their token ids [B, V] int64)."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    vocab = probs.shape[1]
    k = torch.where(batch.top_k > 0, batch.top_k, vocab)
    kth = sorted_probs.gather(1, (k - 1).unsqueeze(1))
    kept = sorted_probs.masked_fill(sorted_probs < kth, 0.0)
    cum = (kept / kept.sum(-1, keepdim=True)).cumsum(-1)
    top_p = batch.top_p.unsqueeze(1)
    cut = torch.searchsorted(cum, top_p.to(cum.dtype)).clamp_(max=vocab - 1)
    kept = kept.masked_fill(kept < torch.where(top_p < 1.0, kept.gather(1, cut), 0.0), 0.0)
    kept = kept.masked_fill(kept < batch.min_p.unsqueeze(1) * kept[:, :1], 0.0)
    return kept / kept.sum(-1, keepdim=True), order


def generator_for(seed: int, step: int, device: torch.device) -> torch.Generator:
    """A generator seeded from (seed, step), so a seeded row draws the same on any batch position."""
    generator = torch.Generator(device=device)
    generator.manual_seed((seed * 1_000_003 + step) % (2**63))
    return generator


def draw_sorted(sorted_probs: torch.Tensor, order: torch.Tensor, params: Sequence[SamplingParams],
                steps: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Stage 4: multinomial over the sorted, filtered probabilities [B, V].
    Returns token ids [B] int64 and the log-probability of each drawn token [B] float32."""
    final = torch.nan_to_num(sorted_probs, nan=1.0)  # rows refused earlier (NaN) must not crash the draw
    positions = torch.empty(final.shape[0], dtype=torch.int64, device=final.device)
    unseeded = [b for b, p in enumerate(params) if p.seed is None]
    if unseeded:
        positions[unseeded] = torch.multinomial(final[unseeded], 1).squeeze(1)
    for b, p in enumerate(params):
        if p.seed is not None:
            positions[b] = torch.multinomial(final[b], 1, generator=generator_for(p.seed, steps[b], final.device))[0]
    chosen = positions.unsqueeze(1)
    return order.gather(1, chosen).squeeze(1), torch.log(final.gather(1, chosen).squeeze(1))


def top_alternatives(sorted_probs: torch.Tensor, order: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k most likely tokens of each row of the sorted, filtered distribution [B, V]: ids [B, k] int32
    and log-probabilities [B, k] float32, best first (-1 and -inf past the vocabulary)."""
    probs = torch.nan_to_num(sorted_probs[:, :k].float(), nan=0.0)
    ids = order[:, :k].to(torch.int32)
    if probs.shape[1] < k:  # a vocabulary smaller than k
        pad = k - probs.shape[1]
        probs = torch.nn.functional.pad(probs, (0, pad))
        ids = torch.nn.functional.pad(ids, (0, pad), value=-1)
    return ids, torch.log(probs)


class CheckedSampler:
    """The checked chain over a whole batch (see the module docstring)."""

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               history: Sequence[Sequence[int]] | None = None, step: int | Sequence[int] = 0) -> SampleOutput:
        """logits: [B, V] float32/float16/bfloat16 (left unchanged); step: one for all rows or one per
        row. Returns per-row tokens and errors."""
        return self.sample_with_log_probs(logits, params, history, step)[0]

    def sample_with_log_probs(self, logits: torch.Tensor, params: Sequence[SamplingParams],
                              history: Sequence[Sequence[int]] | None = None,
                              step: int | Sequence[int] = 0) -> tuple[SampleOutput, torch.Tensor]:
        """As `sample`, plus the log-probability [B] of each drawn token under the final distribution."""
        x = as_float32(logits)[0].clone()
        if x.shape[0] != len(params):
            raise SamplingParamError(f"logits have {x.shape[0]} rows but {len(params)} params were given")
        batch = build_batch(params, x.shape[1], history, step, x.device)
        nan_rows = torch.isnan(x).any(-1)
        x = x.masked_fill(nan_rows.unsqueeze(1), 0.0)
        penalize(x, batch, params, history)
        sorted_probs, order = sort_and_filter(tempered_probs(x, batch), batch)
        tokens, log_probs = draw_sorted(sorted_probs, order, params, row_steps(step, batch.size))
        errors: list[str | None] = [None] * batch.size
        for b in nan_rows.nonzero().flatten().tolist():
            errors[b] = "logits contain NaN"
            tokens[b] = -1
        return SampleOutput(tokens, errors), log_probs


_SAMPLER = CheckedSampler()


def checked_sample(logits: torch.Tensor, params: Sequence[SamplingParams],
                   history: Sequence[Sequence[int]] | None = None, step: int | Sequence[int] = 0) -> torch.Tensor:
    """Draw one token per row with the checked chain; same signature and contract as
    `zero_check_sample` (logits [B, V] not modified; returns LongTensor [B])."""
    return _SAMPLER.sample(logits, params, history, step).raise_errors()
