"""The zero-check sampler: one pass over the logits, no softmax over V, no sort.

Per batch (flags decided once, rows grouped by the work they need, never looped in Python):
1. penalties and bad-word bans are written in place at the history's (row, token) positions only,
   and restored before returning (the caller's logits are left as they came);
2. greedy rows (T=0 or top_k=1): argmax, no noise;
3. top-k rows: the exact top (k_max + 1) candidates by a group-max prefilter (no full sort), then
   temperature, top-p and min-p on that small sorted set, then an exponential race over it;
4. other rows: y = (x - max) / T and w = exp(y) in one pass each; min-p is the threshold
   y >= log(min_p); the draw is a two-stage exponential race (groups, then members of the winning
   group). With top-p that draw is a proposal (rejection sampling): it is kept when it lies in the
   nucleus (`ops.in_nucleus`: the mass above it is below top_p of the row's), which happens with
   probability >= top_p, and a kept proposal is then distributed exactly as the nucleus; otherwise the
   nucleus is found by an exact radix-select on probability mass (`dense_top_p_threshold`) and a
   second race, with noise independent of the first, draws from it. Either way P(token) is w_token
   over the nucleus's mass.
The race is argmax(log w - log E), E ~ Exp(1) from counter-based noise keyed by (seed, step, token).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from . import cpu_kernel, ops
from .batch import DENSE_ROW, GREEDY_ROW, TOP_K_ROW, BatchBuilder, SamplingBatch
from .params import SamplingParamError, SamplingParams
from .workspace import Workspace


@dataclass
class SampleOutput:
    """tokens: [B] int64 (-1 on error rows); errors: per row, a client-readable message or None."""

    tokens: torch.Tensor
    errors: list[str | None]

    def raise_errors(self) -> torch.Tensor:
        bad = [f"row {b}: {e}" for b, e in enumerate(self.errors) if e]
        if bad:
            raise SamplingParamError("; ".join(bad))
        return self.tokens


def as_float32(logits: torch.Tensor) -> tuple[torch.Tensor, bool]:
    """Return float32 contiguous logits and whether they are the caller's own tensor."""
    if logits.dim() != 2:
        raise SamplingParamError(f"logits must be [batch, vocab], got shape {tuple(logits.shape)}")
    if logits.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise SamplingParamError(f"logits must be float32, float16 or bfloat16, got {logits.dtype}")
    if logits.dtype == torch.float32 and logits.is_contiguous():
        return logits, True
    return logits.to(torch.float32).contiguous(), False


def resolve_posinf(x: torch.Tensor, tokens: torch.Tensor, row_max: torch.Tensor, batch: SamplingBatch) -> None:
    """Sampled rows whose max is +inf put all mass on their +inf tokens: draw uniformly among them,
    in place (greedy rows keep the first +inf). x: [B, V] penalised logits; tokens: [B] int64. Callers
    skip it when every row's max is finite (the common case)."""
    at_posinf = row_max == math.inf
    sampled = ~torch.tensor(batch.greedy, dtype=torch.bool, device=row_max.device)
    posinf = (at_posinf & sampled).nonzero().flatten()
    if len(posinf):
        tokens[posinf] = ops.draw_among_posinf(x[posinf], batch.keys[posinf])


def all_finite(values: torch.Tensor) -> bool:
    """Whether every value is finite; on the CPU by numpy: a small torch op's dispatch costs far more there than
    numpy's, most of all right after a decoder forward swept the caches."""
    if values.device.type == "cpu":
        return bool(np.isfinite(values.numpy()).all())
    return bool(torch.isfinite(values).all())


def mark_nan_under_edits(edits: ops.SparseEdits | None, row_max: torch.Tensor, finite: bool) -> bool:
    """Rows that held NaN where penalties or bans wrote (a ban must not hide a NaN) get a NaN row_max; returns
    whether every row's max is still finite."""
    if edits is None:
        return finite
    nan_rows = edits.nan_rows()
    row_max[nan_rows] = math.nan
    return finite and not len(nan_rows)


def finish(raw: torch.Tensor, tokens: torch.Tensor, row_max: torch.Tensor, finite: bool) -> SampleOutput:
    """NaN rows become per-row errors (token -1); rows with every token masked by penalties and bans
    fall back to the argmax of the unmasked logits `raw` [B, V]. row_max: [B], the max of each row
    after penalties and bans (NaN when the row held NaN); finite: whether every one of them is finite
    (then there is nothing to do)."""
    errors: list[str | None] = [None] * len(tokens)
    if finite:
        return SampleOutput(tokens, errors)
    masked = (row_max == -math.inf).nonzero().flatten()
    if len(masked):
        tokens[masked] = raw[masked].argmax(-1)
    nan_rows = torch.isnan(row_max).nonzero().flatten().tolist()
    for b in nan_rows:
        errors[b] = "logits contain NaN"
    if nan_rows:
        tokens[nan_rows] = -1
    return SampleOutput(tokens, errors)


class ZeroCheckSampler:
    """Orchestration of the zero-check sampler (see the module docstring); its only state is a
    per-thread workspace of scratch tensors and the last call's per-row columns (`BatchBuilder`). With
    `compiled=True` (and numba installed), rows on CPU run in the compiled kernel of `cpu_kernel` instead of
    eager torch ops."""

    def __init__(self, compiled: bool = False) -> None:
        self._workspace = Workspace()
        self._batches = BatchBuilder()
        self.compiled = compiled and cpu_kernel.available()
        if self.compiled:
            cpu_kernel.warm_up()

    def sample(self, logits: torch.Tensor, params: Sequence[SamplingParams],
               history: Sequence[Sequence[int]] | None = None, step: int | Sequence[int] = 0) -> SampleOutput:
        """logits: [B, V] float32/float16/bfloat16 (left unchanged); step: one for all rows or one per
        row. Returns per-row tokens and errors."""
        x, shared = as_float32(logits)
        if x.shape[0] != len(params):
            raise SamplingParamError(f"logits have {x.shape[0]} rows but {len(params)} params were given")
        batch = self._batches.build(params, x.shape[1], history, step, x.device)
        edits = ops.apply_penalties_and_bans(x, batch)
        try:
            tokens, row_max, finite = self._draw(x, batch)
            if not finite:
                resolve_posinf(x, tokens, row_max, batch)
        finally:
            if edits is not None:
                edits.restore(x)
        return finish(x, tokens, row_max, mark_nan_under_edits(edits, row_max, finite))

    def _draw(self, x: torch.Tensor, batch: SamplingBatch) -> tuple[torch.Tensor, torch.Tensor, bool]:
        """(tokens, row_max, whether every row's max is finite)."""
        size = batch.size
        if self.compiled and x.device.type == "cpu":  # numpy in and out: a host tensor op's dispatch costs more
            tokens, row_max = np.empty(size, np.int64), np.empty(size, np.float32)
            # scratch reused: a fresh array, freed at the top of the heap, lets glibc trim the heap, and a trim after
            # another op's large frees stalls the call
            maxima = self._workspace.array("group_max", (size, -(-x.shape[1] // ops.GROUP)), np.float32)
            weights = self._workspace.array("weights", tuple(x.shape), np.float32)  # touched by top-p rows only
            finite = cpu_kernel.draw_rows(x, batch, tokens, row_max, maxima, weights)
            return torch.from_numpy(tokens), torch.from_numpy(row_max), finite
        tokens = torch.empty(size, dtype=torch.int64, device=x.device)
        row_max = torch.empty(size, dtype=torch.float32, device=x.device)
        kind = batch.host.kind
        greedy, top_k, dense = (np.flatnonzero(kind == k).tolist() for k in (GREEDY_ROW, TOP_K_ROW, DENSE_ROW))
        if greedy:
            rows = _rows(x, greedy)
            values, ids = rows.max(-1)
            _put(tokens, row_max, greedy, ids, values)
        if top_k:
            self._draw_top_k(x, batch, top_k, tokens, row_max)
        if dense:
            self._draw_dense(_rows(x, dense), batch, dense, tokens, row_max)
        return tokens, row_max, all_finite(row_max)

    def _draw_top_k(self, x: torch.Tensor, batch: SamplingBatch, rows: list[int],
                    tokens: torch.Tensor, row_max: torch.Tensor) -> None:
        idx = torch.tensor(rows, device=x.device)
        width = max(batch.top_k_list[b] for b in rows) + 1  # top_k < V: the candidates fit in a row
        self._draw_candidates(_rows(x, rows), batch, rows, batch.top_k[idx], width, tokens, row_max)

    def _draw_candidates(self, xs: torch.Tensor, batch: SamplingBatch, rows: list[int], k: torch.Tensor, width: int,
                         tokens: torch.Tensor, row_max: torch.Tensor) -> None:
        """Draw `rows` (logits xs [R, V]) among their `width` largest values with top-k `k` [R] (< width). A
        row whose k-th value repeats past its candidates keeps every token >= it (the checked chain's
        filter): it is drawn again with k = that count and the candidates widened to hold them all (as the
        compiled kernel does: the same race over the same ids)."""
        values, ids = ops.topk_candidates(xs, min(width, xs.shape[1]))
        if values.shape[1] < width:  # every token is kept: one -inf past them
            values = torch.cat([values, values.new_full((len(rows), 1), -math.inf)], 1)
            ids = torch.cat([ids, ids.new_zeros((len(rows), 1))], 1)
        idx = torch.tensor(rows, device=xs.device)
        drawn, kth, tied = ops.draw_from_candidates(values, ids, k, batch.temperature[idx], batch.top_p[idx],
                                                    batch.min_p[idx], batch.keys[idx])
        _put(tokens, row_max, rows, drawn, values[:, 0])
        if bool(tied.any()):
            at = tied.nonzero().flatten()
            wide = xs[at]
            counts = (wide >= kth[at].unsqueeze(1)).sum(-1)
            self._draw_candidates(wide, batch, [rows[i] for i in at.tolist()], counts, int(counts.max()) + 1,
                                  tokens, row_max)

    def _draw_dense(self, xs: torch.Tensor, batch: SamplingBatch, rows: list[int], tokens: torch.Tensor,
                    row_max: torch.Tensor) -> None:
        """xs: [R, V] whole rows without top-k."""
        idx = torch.tensor(rows, device=xs.device)
        top = xs.amax(-1)
        shift = top
        finite = torch.isfinite(top)
        if not bool(finite.all()):  # NaN / +inf / all -inf rows are resolved in `finish`; keep ops finite
            xs = xs.masked_fill(~finite.unsqueeze(1), 0.0)
            shift = torch.where(finite, top, 0.0)
        inv_t = 1.0 / batch.temperature[idx]
        y = torch.sub(xs, shift.unsqueeze(1), out=self._workspace.get("y", xs.shape, xs.dtype, xs.device))
        y.mul_(inv_t.unsqueeze(1))
        w = torch.exp(y, out=self._workspace.get("w", xs.shape, xs.dtype, xs.device))
        lower = torch.log(batch.min_p[idx])
        top_p = batch.top_p[idx]
        nucleus = bool((top_p < 1.0).any())
        total = w.sum(-1, dtype=torch.float64) if nucleus else None  # the top-p mass is taken before min-p
        if bool((lower > -math.inf).any()):
            w.masked_fill_(y < lower.unsqueeze(1), 0.0)
        keys = batch.keys[idx]
        drawn = ops.race_draw_dense(y, w, keys)
        if nucleus:  # top-p: the draw is a proposal, kept when it lies in the nucleus
            retry = ((top_p < 1.0) & ~ops.in_nucleus(y, w, drawn, top_p, total)).nonzero().flatten()
            if len(retry):
                drawn[retry] = self._draw_nucleus(y[retry], lower[retry], top_p[retry], keys[retry])
        _put(tokens, row_max, rows, drawn, top)

    def _draw_nucleus(self, y: torch.Tensor, lower: torch.Tensor, top_p: torch.Tensor, keys: torch.Tensor
                      ) -> torch.Tensor:
        """The second race of top-p rows whose proposal fell outside the nucleus: over the nucleus itself
        (`ops.dense_top_p_threshold`) and min-p, with noise independent of the proposal's. y: [R, V]."""
        w = torch.exp(y)
        lower = torch.maximum(lower, ops.dense_top_p_threshold(y, w, top_p, self._workspace))
        w.masked_fill_(y < lower.unsqueeze(1), 0.0)
        return ops.race_draw_dense(y, w, keys, ops.TOP_P_RETRY_SALT)


def _rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """The selected rows of x: a view when they are all rows, else a copy."""
    if len(rows) == x.shape[0]:
        return x
    return x.index_select(0, torch.tensor(rows, device=x.device))


def _put(tokens: torch.Tensor, row_max: torch.Tensor, rows: list[int], ids: torch.Tensor, top: torch.Tensor) -> None:
    if len(rows) == tokens.shape[0]:
        tokens.copy_(ids)
        row_max.copy_(top)
    else:
        index = torch.tensor(rows, device=tokens.device)
        tokens[index] = ids
        row_max[index] = top


_SAMPLER = ZeroCheckSampler()


def zero_check_sample(logits: torch.Tensor, params: Sequence[SamplingParams],
                      history: Sequence[Sequence[int]] | None = None, step: int = 0) -> torch.Tensor:
    """Draw one token per row with the zero-check sampler.

    logits: [B, V] float32/float16/bfloat16, not modified; params: B SamplingParams; history: B
    token-id lists (prompt + generated) for penalties and bad words; step: decode step (seeds noise).
    Returns LongTensor [B]. Raises SamplingParamError if a row's logits contain NaN (the server uses
    `ZeroCheckSampler.sample`, which reports such rows per request instead).
    """
    return _SAMPLER.sample(logits, params, history, step).raise_errors()
