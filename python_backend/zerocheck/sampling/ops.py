"""Pure sampling ops over logits tensors, shared by the zero-check and checked orchestrations.

Conventions: `x` is [R, V] float32 logits; `y = (x - rowmax) / T` is the max-shifted, tempered
logit, so exp(y) <= 1 is an unnormalised probability and log-probability ratios need no softmax.
Every threshold keeps ties: a token survives a filter when its value is >= the threshold value, the
same rule in both paths (Hugging Face's top-k rule).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .batch import SamplingBatch
from .noise import exponential_noise, race_scores
from .workspace import Workspace

GROUP = 128  # tokens per group: the unit of the two-stage race and of the top-k prefilter
HIST_BUCKETS = 4096  # value buckets of the sort-free top-p search
HIST_RANGE = 32.0  # buckets cover y in [-HIST_RANGE, 0]; lower values share the last bucket
GROUP_SALT = 1 << 32  # counters of group-level noise, disjoint from token ids
TOP_P_RETRY_SALT = 2 << 32  # added to a top-p row's second race's counters: noise independent of the first race


@dataclass
class SparseEdits:
    """Positions of `x` overwritten in place, stage by stage: (rows [N], tokens [N], values before)."""

    parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]

    def restore(self, x: torch.Tensor) -> None:
        """Undo the stages last to first (positions are unique within a stage, not across)."""
        for rows, tokens, original in reversed(self.parts):
            x.index_put_((rows, tokens), original)

    def nan_rows(self) -> torch.Tensor:
        """Rows that held NaN at an overwritten position (a ban must not hide a NaN)."""
        return torch.unique(torch.cat([r[torch.isnan(o)] for r, _, o in self.parts]))


def apply_penalties_and_bans(x: torch.Tensor, batch: SamplingBatch) -> SparseEdits | None:
    """Add logit biases, apply repetition/presence/frequency penalties, then bad-word bans, in place
    and only at the (row, token) positions they name. x: [B, V] float32, modified in place; returns
    what restores it.
    """
    parts = []
    if batch.bias is not None:
        rows, tokens, bias = batch.bias
        original = x[rows, tokens]
        parts.append((rows, tokens, original))
        x.index_put_((rows, tokens), original + bias)
    if batch.penalties is not None:
        pen = batch.penalties
        original = x[pen.rows, pen.tokens]
        parts.append((pen.rows, pen.tokens, original))
        x.index_put_((pen.rows, pen.tokens), pen.apply(original))
    if batch.banned is not None:
        rows, tokens = batch.banned
        parts.append((rows, tokens, x[rows, tokens]))
        x.index_put_((rows, tokens), torch.tensor(-math.inf, dtype=x.dtype, device=x.device))
    return SparseEdits(parts) if parts else None


def _per_group(x: torch.Tensor, group: int, reduce: str, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [R, V] -> [R, ceil(V / group)]: `reduce` ("amax" or "sum") of each run of `group` tokens, written into
    `out` (that shape, x's dtype) when given: no allocation per call."""
    rows, vocab = x.shape
    full = vocab // group
    if out is None:
        out = torch.empty(rows, -(-vocab // group), dtype=x.dtype, device=x.device)
    if full:
        getattr(torch, reduce)(x[:, :full * group].view(rows, full, group), -1, out=out[:, :full])
    if vocab % group:
        getattr(torch, reduce)(x[:, full * group:], -1, keepdim=True, out=out[:, full:])
    return out


def group_max(x: torch.Tensor, group: int = GROUP, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [R, V] -> [R, ceil(V / group)] max of each run of `group` tokens (NaN propagates); into `out` when
    given (`_per_group`)."""
    return _per_group(x, group, "amax", out)


def group_sum(x: torch.Tensor, group: int = GROUP) -> torch.Tensor:
    """x: [R, V] -> [R, ceil(V / group)] sum of each run of `group` tokens."""
    return _per_group(x, group, "sum")


def topk_candidates(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact k largest values of each row, sorted descending, without a full sort.

    x: [R, V] float32; returns values [R, k] float32 and token ids [R, k] int64.
    The k groups with the largest maxima contain every value above the k-th group maximum and at
    least k values >= it, so a top-k over their members has exactly the row's top-k values (only the
    ids among exact ties may differ, which the tie-inclusive thresholds make irrelevant).
    """
    rows, vocab = x.shape
    if k * GROUP * 4 > vocab:
        return torch.topk(x, k, dim=-1, sorted=True)
    maxima = group_max(x)
    groups = torch.topk(maxima, k, dim=-1, sorted=False).indices  # [R, k]
    ids = (groups.unsqueeze(-1) * GROUP + torch.arange(GROUP, device=x.device)).reshape(rows, -1)
    valid = ids < vocab
    members = x.gather(1, ids.clamp_(max=vocab - 1)).masked_fill_(~valid, -math.inf)
    values, pos = torch.topk(members, k, dim=-1, sorted=True)
    return values, ids.gather(1, pos)


def top_p_cutoff_sorted(y_sorted: torch.Tensor, keep: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Top-p threshold on a small candidate set sorted descending.

    y_sorted: [R, K] float32 shifted logits; keep: [R, K] bool (already kept); top_p: [R].
    Returns [R] float32: the value of the token at which the cumulative kept mass first reaches
    top_p of the kept mass (-inf where top_p == 1).
    """
    w = torch.where(keep, torch.exp(y_sorted.double()), 0.0)
    cum = w.cumsum(-1)
    target = top_p.double().unsqueeze(-1) * cum[:, -1:]
    cut = torch.searchsorted(cum, target).clamp_(max=y_sorted.shape[1] - 1)
    tau = y_sorted.gather(1, cut).squeeze(1)
    return torch.where(top_p >= 1.0, -math.inf, tau)


def _crossing_bucket(y: torch.Tensor, w: torch.Tensor, top_p: torch.Tensor, scaled: torch.Tensor, bucket: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Steps 1 and 2 of `dense_top_p_threshold` (static shapes, no host sync). scaled, bucket: [R, V] float32 and
    int64 scratch. Returns each token's bucket [R, V], the bucket where top_p of the row's mass is crossed
    [R, 1], the mass of the buckets above it [R] and the target mass [R, 1] (float64)."""
    torch.mul(y, -HIST_BUCKETS / HIST_RANGE, out=scaled)
    bucket.copy_(scaled.clamp_(0, HIST_BUCKETS - 1))
    mass = torch.zeros(y.shape[0], HIST_BUCKETS, dtype=torch.float32, device=y.device).scatter_add_(1, bucket, w)
    cum = mass.double().cumsum(-1)
    target = top_p.double().unsqueeze(-1) * cum[:, -1:]
    boundary = torch.searchsorted(cum, target).clamp_(max=HIST_BUCKETS - 1)
    before = torch.where(boundary > 0, cum.gather(1, (boundary - 1).clamp_(min=0)), 0.0).squeeze(1)
    return bucket, boundary, before, target


def dense_top_p_threshold_static(y: torch.Tensor, w: torch.Tensor, top_p: torch.Tensor, members: int
                                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """`dense_top_p_threshold` with static shapes and no host sync (a CUDA graph can hold it): the crossing
    bucket's members are ranked by a top-`members` of the row's values in that bucket instead of being
    compacted with `nonzero`. Returns tau [R] float32 and overflow [R] bool: rows whose crossing bucket holds
    more than `members` tokens, whose tau may be wrong (the caller draws them otherwise)."""
    members = min(members, y.shape[1])
    bucket, boundary, before, target = _crossing_bucket(y, w, top_p, torch.empty_like(y),
                                                        torch.empty(y.shape, dtype=torch.int64, device=y.device))
    inside = bucket == boundary
    count = inside.sum(-1)
    ranked = torch.topk(torch.where(inside, y, -math.inf), members, dim=-1).values  # [R, members], descending
    # as `dense_top_p_threshold`: the exact crossing member; past the last member (rounding), the last one
    running = before.unsqueeze(1) + torch.exp(ranked.double()).cumsum(-1)
    position = torch.arange(members, device=y.device)
    crossed = (running >= target) & (position < count.unsqueeze(1))
    first = torch.where(crossed, position, members).amin(-1)
    cut = torch.where(first == members, (count - 1).clamp(0, members - 1), first)
    tau = ranked.gather(1, cut.unsqueeze(1)).squeeze(1)
    return torch.where(count > 0, tau, -math.inf), count > members


def dense_top_p_threshold(y: torch.Tensor, w: torch.Tensor, top_p: torch.Tensor, workspace: Workspace) -> torch.Tensor:
    """Exact, sort-free top-p threshold over whole rows (a radix-select on probability mass).

    y: [R, V] float32 shifted logits (<= 0); w: [R, V] float32 = exp(y), 0 where already excluded;
    top_p: [R] in (0, 1). Returns [R] float32 threshold tau: keeping y >= tau gives the smallest
    top set whose mass reaches top_p * sum(w) (ties kept).

    1. Histogram the mass over HIST_BUCKETS equal-width buckets of y (one scatter_add pass).
    2. The cumulative bucket mass locates the bucket where top_p * sum(w) is crossed.
    3. Only that bucket's members are ranked: compacted with `nonzero` (a handful per row), sorted
       by value within their row, and the exact crossing token among them gives tau.
    Bucket masses are float32 sums, as precise as the checked chain's float32 softmax and cumsum.
    """
    rows, vocab = y.shape
    bucket, boundary, before, target = _crossing_bucket(
        y, w, top_p, workspace.get("scaled", y.shape, y.dtype, y.device),
        workspace.get("bucket", y.shape, torch.int64, y.device))
    inside = torch.eq(bucket, boundary, out=workspace.get("inside", y.shape, torch.bool, y.device))
    member_row, member_col = inside.nonzero(as_tuple=True)  # row-major: grouped by row
    values = y[member_row, member_col]
    by_value = torch.sort(values, descending=True, stable=True).indices
    order = by_value[torch.sort(member_row[by_value], stable=True).indices]  # by row, then value desc
    member_row, values = member_row[order], values[order]
    # zero-weight members rank after the crossing token, so they never become the cut
    weight = torch.exp(values.double())
    running = weight.cumsum(0)
    starts = torch.searchsorted(member_row, torch.arange(rows, device=y.device))
    offset = running[(starts - 1).clamp(min=0)].masked_fill(starts == 0, 0.0) if len(running) else before.new_zeros(rows)
    position = torch.arange(len(values), device=y.device)
    crossed = before[member_row] + running - offset[member_row] >= target.squeeze(1)[member_row]
    none = len(values)
    cut = torch.full((rows,), none, dtype=torch.int64, device=y.device)
    cut.scatter_reduce_(0, member_row[crossed], position[crossed], "amin")
    # Rounding can leave the crossing just past the last member: then the last member is the cut.
    last = torch.full((rows,), -1, dtype=torch.int64, device=y.device).scatter_reduce_(0, member_row, position, "amax")
    cut = torch.where(cut == none, last, cut)
    values = torch.cat([values, values.new_full((1,), -math.inf)])  # rows without members keep everything
    return values[torch.where(cut < 0, none, cut)]


def race_draw_candidates(y: torch.Tensor, keep: torch.Tensor, ids: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Exponential race over a candidate set. y: [R, K] float32 log-weights, keep: [R, K] bool,
    ids: [R, K] int64 token ids (the noise counters), keys: [R, 2]. Returns token ids [R] int64."""
    scores = race_scores(y.masked_fill(~keep, -math.inf), keys, ids)
    return ids.gather(1, scores.argmax(-1, keepdim=True)).squeeze(1)


def draw_from_candidates(values: torch.Tensor, ids: torch.Tensor, k: torch.Tensor, temperature: torch.Tensor,
                         top_p: torch.Tensor, min_p: torch.Tensor, keys: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k, temperature, top-p and min-p on the sorted candidates, then the race; no host sync.

    values/ids: [R, W] from `topk_candidates` (W > every k); k: [R] int64 in [1, W - 1];
    temperature/top_p/min_p: [R] float32; keys: [R, 2]. Returns drawn token ids [R] int64, the k-th
    value [R] and [R] bool rows whose k-th value repeats past the candidates (ties there reach
    outside them: those rows need whole-row treatment).
    """
    width = values.shape[1]
    kth = values.gather(1, (k - 1).unsqueeze(1)).squeeze(1)
    after = values.gather(1, k.unsqueeze(1)).squeeze(1)
    tied = (after == kth) & torch.isfinite(kth)
    y = (values - values[:, :1]) / temperature.unsqueeze(1)
    keep = (torch.arange(width, device=values.device) < k.unsqueeze(1)) & torch.isfinite(values)
    tau = top_p_cutoff_sorted(y, keep, top_p)
    keep &= y >= torch.maximum(tau, torch.log(min_p)).unsqueeze(1)
    return race_draw_candidates(y, keep, ids, keys), kth, tied


def race_draw_dense(y: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, salt: int = 0) -> torch.Tensor:
    """Two-stage exponential race over whole rows, with noise for ~V/GROUP + GROUP entries per row.

    y: [R, V] float32 log-weights; w: [R, V] float32 = exp(y), 0 where excluded; keys: [R, 2]; salt: added to
    every noise counter (TOP_P_RETRY_SALT: a race independent of the one without). Stage 1 races the groups
    with weights sum(w) per group; stage 2 races the members of the winning group with weights w.
    P(token) = P(group) * P(token | group) = w_token / sum(w). Returns token ids [R] int64.
    """
    rows, vocab = y.shape
    mass = group_sum(w)  # [R, G]
    groups = torch.arange(mass.shape[1], device=y.device).expand(rows, -1) + (GROUP_SALT + salt)
    winner = race_scores(torch.log(mass), keys, groups).argmax(-1, keepdim=True)  # [R, 1]
    ids = winner * GROUP + torch.arange(GROUP, device=y.device)
    valid = ids < vocab
    ids = ids.clamp_(max=vocab - 1)
    member_w = w.gather(1, ids)
    log_w = torch.where(valid & (member_w > 0), y.gather(1, ids), -math.inf)
    return ids.gather(1, race_scores(log_w, keys, ids + salt).argmax(-1, keepdim=True)).squeeze(1)


def in_nucleus(y: torch.Tensor, w: torch.Tensor, drawn: torch.Tensor, top_p: torch.Tensor, total: torch.Tensor
               ) -> torch.Tensor:
    """Whether each drawn token lies in its row's top-p nucleus: the mass of the tokens above it (y > its y) is
    below top_p of the row's mass. The nucleus (the smallest top set whose mass reaches top_p of the row's,
    ties kept: `dense_top_p_threshold`'s) is exactly the tokens for which that holds.

    y: [R, V] float32; w: [R, V] float32 = exp(y), where min-p may have zeroed tokens below a drawn one (every
    token above it passes min-p); drawn: [R] int64; top_p: [R]; total: [R] float64, the row's mass before
    min-p. Returns [R] bool; no host sync."""
    level = y.gather(1, drawn.unsqueeze(1))
    above = torch.where(y > level, w, 0.0).sum(-1, dtype=torch.float64)
    return above < top_p.double() * total


def draw_among_posinf(x: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """Rows holding +inf logits put all mass on those tokens: draw uniformly among them.
    x: [R, V]; keys: [R, 2]; returns [R] int64."""
    ids = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
    noise = exponential_noise(keys, ids)
    return torch.where(x == math.inf, -torch.log(noise), -math.inf).argmax(-1)
