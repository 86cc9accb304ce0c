"""Per-batch sampling metadata, built once per call from B `SamplingParams`.

Like vLLM's `SamplingMetadata`: per-row parameters become tensors, and batch-wide flags
(`all_greedy`, `no_penalties`, ...) let the orchestrations skip whole stages instead of branching
per row. Penalty and bad-word positions are kept sparse: (row, token id) pairs, never a [B, V] tensor.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from .history import TokenHistory, counted
from .noise import row_keys
from .params import SamplingParamError, SamplingParams


GREEDY_ROW, TOP_K_ROW, DENSE_ROW = 0, 1, 2  # greedy (T = 0 or top_k 1); top-k; every token (no top-k)


@dataclass
class SparsePenalties:
    """History tokens of penalised rows: unique (row, token) pairs with their counts.

    rows, tokens: [N] int64; counts: [N] float32; repetition, presence, frequency: [N] float32 (per pair).
    """

    rows: torch.Tensor
    tokens: torch.Tensor
    counts: torch.Tensor
    repetition: torch.Tensor
    presence: torch.Tensor
    frequency: torch.Tensor

    def apply(self, values: torch.Tensor) -> torch.Tensor:
        """values: [N] float32 logits at (rows, tokens) -> penalised values (new tensor)."""
        rep = torch.where(values > 0, values / self.repetition, values * self.repetition)
        return rep - self.frequency * self.counts - self.presence


@dataclass(frozen=True)
class HostRows:
    """A batch's per-row values as host numpy arrays (a CPU batch's tensors share their memory), in the compiled
    CPU kernel's argument order: no tensor-to-array call per step."""

    kind: np.ndarray  # [B] int64: GREEDY_ROW, TOP_K_ROW or DENSE_ROW (the work a row needs)
    top_k: np.ndarray  # [B] int64
    temperature: np.ndarray  # [B] float32
    top_p: np.ndarray  # [B] float32
    min_p: np.ndarray  # [B] float32
    keys: np.ndarray  # [B, 2] int64


@dataclass
class SamplingBatch:
    """Tensors and flags describing one batch of B rows over a vocabulary of V tokens."""

    vocab_size: int
    temperature: torch.Tensor  # [B] float32; 1.0 on greedy rows (unused there)
    top_k: torch.Tensor  # [B] int64; 0 = off (top_k >= V also becomes 0)
    top_p: torch.Tensor  # [B] float32
    min_p: torch.Tensor  # [B] float32
    keys: torch.Tensor  # [B, 2] int64 noise keys from (seed, step)
    greedy: list[bool]
    top_k_list: list[int]
    host: HostRows  # the per-row values on the host, for the compiled CPU kernel
    nucleus_rows: int  # DENSE_ROW rows with top_p < 1
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None  # (rows [N], tokens [N]) int64, bias [N] f32
    penalties: SparsePenalties | None
    banned: tuple[torch.Tensor, torch.Tensor] | None  # (rows [N], tokens [N]) int64

    @property
    def size(self) -> int:
        return len(self.greedy)

    @property
    def all_greedy(self) -> bool:
        return all(self.greedy)


def row_steps(step: int | Sequence[int], rows: int) -> list[int]:
    """One decode step per row: a batch may mix sequences at different steps."""
    steps = [step] * rows if isinstance(step, int) else list(step)
    if len(steps) != rows:
        raise SamplingParamError(f"step has {len(steps)} values but params has {rows}")
    return steps


@dataclass(frozen=True)
class RowColumns:
    """What a batch takes from its params alone (not from the step or the history): built once for a run of
    calls with the same params (`BatchBuilder`)."""

    params: tuple[SamplingParams, ...]
    vocab_size: int
    device: torch.device
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    host: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # kind, top_k, temperature, top_p, min_p
    greedy: list[bool]
    top_k_list: list[int]
    nucleus_rows: int
    seeds: list[int | None]
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None
    penalised: list[int]  # rows with penalties
    banning: list[int]  # rows with bad words


def row_columns(params: Sequence[SamplingParams], vocab_size: int, device: torch.device) -> RowColumns:
    """The params' per-row tensors and lists on `device` (logit bias ids checked against the vocabulary)."""
    greedy = [p.is_greedy for p in params]
    top_k = [p.top_k if 0 < p.top_k < vocab_size else 0 for p in params]
    kind = np.array([GREEDY_ROW if g else TOP_K_ROW if k else DENSE_ROW for g, k in zip(greedy, top_k)], np.int64)
    # numpy first (torch.tensor of a list is slower); on the CPU the tensors share the arrays' memory
    top_k_array = np.array(top_k, np.int64)
    temperature = np.array([p.temperature if not g else 1.0 for p, g in zip(params, greedy)], np.float32)
    top_p = np.array([p.top_p for p in params], np.float32)
    min_p = np.array([p.min_p for p in params], np.float32)
    return RowColumns(
        params=tuple(params), vocab_size=vocab_size, device=device,
        temperature=_on(torch.from_numpy(temperature), device), top_k=_on(torch.from_numpy(top_k_array), device),
        top_p=_on(torch.from_numpy(top_p), device), min_p=_on(torch.from_numpy(min_p), device),
        host=(kind, top_k_array, temperature, top_p, min_p),
        greedy=greedy, top_k_list=top_k, seeds=[p.seed for p in params],
        nucleus_rows=int(((kind == DENSE_ROW) & (top_p < 1.0)).sum()),
        bias=_logit_bias(params, vocab_size, device),
        penalised=[b for b, p in enumerate(params) if p.has_penalties],
        banning=[b for b, p in enumerate(params) if p.bad_words])


def batch_of(columns: RowColumns, history: Sequence[Sequence[int]] | None, step: int | Sequence[int]) -> SamplingBatch:
    """One call's batch: the columns, fresh noise keys for the step, and the history's penalties and bans."""
    params = columns.params
    if history is not None and len(history) != len(params):
        raise SamplingParamError(f"history has {len(history)} rows but params has {len(params)}")
    keys = row_keys(columns.seeds, row_steps(step, len(params)))
    device = columns.device
    return SamplingBatch(
        vocab_size=columns.vocab_size, temperature=columns.temperature, top_k=columns.top_k, top_p=columns.top_p,
        min_p=columns.min_p, keys=_on(torch.from_numpy(keys), device), host=HostRows(*columns.host, keys),
        greedy=columns.greedy, top_k_list=columns.top_k_list, nucleus_rows=columns.nucleus_rows, bias=columns.bias,
        penalties=_sparse_penalties(params, columns.penalised, history, columns.vocab_size, device)
        if columns.penalised else None,
        banned=_banned_tokens(params, columns.banning, history, columns.vocab_size, device) if columns.banning else None,
    )


def _on(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host tensor on device (no call when that is the host: each costs microseconds after a decoder step)."""
    return tensor if device.type == "cpu" else tensor.to(device)


def build_batch(params: Sequence[SamplingParams], vocab_size: int, history: Sequence[Sequence[int]] | None,
                step: int | Sequence[int], device: torch.device | str = "cpu") -> SamplingBatch:
    """Validate shapes and turn per-request params into batch tensors on `device`."""
    return batch_of(row_columns(params, vocab_size, torch.device(device)), history, step)


class BatchBuilder:
    """`build_batch` that keeps the last call's `RowColumns`: a decode loop passes the same (frozen)
    SamplingParams objects step after step, so while every row's params object is the last call's, only
    the noise keys, penalties and bans are built (the per-row columns are not rebuilt every step). Safe across
    threads: the kept columns are replaced whole."""

    def __init__(self) -> None:
        self._columns: RowColumns | None = None

    def build(self, params: Sequence[SamplingParams], vocab_size: int, history: Sequence[Sequence[int]] | None,
              step: int | Sequence[int], device: torch.device) -> SamplingBatch:
        columns = self._columns
        if (columns is None or columns.vocab_size != vocab_size or columns.device != device
                or len(columns.params) != len(params) or not all(map(operator.is_, columns.params, params))):
            columns = self._columns = row_columns(params, vocab_size, device)
        return batch_of(columns, history, step)


def _outside(row: int, vocab_size: int, what: str) -> SamplingParamError:
    return SamplingParamError(f"{what} of row {row} holds token ids outside [0, {vocab_size})")


def _check_ids(row: int, ids: Sequence[int], vocab_size: int, what: str) -> None:
    if ids and (min(ids) < 0 or max(ids) >= vocab_size):
        raise _outside(row, vocab_size, what)


def _sparse_penalties(params: Sequence[SamplingParams], penalised: list[int], history: Sequence[Sequence[int]] | None,
                      vocab_size: int, device: torch.device | str) -> SparsePenalties | None:
    """Penalised rows' (row, token) pairs from their histories' counts: with a TokenHistory (kept up to date as
    it grows: no re-count, no sort of the whole history) one array concatenation for all rows. The pairs stay in
    numpy, not Python objects (`torch.tensor` of Python lists converts element by element, slower than numpy's
    arrays)."""
    rows = [b for b in penalised if len(history[b])] if history is not None else []
    if not rows:
        return None
    per_row = [counted(history[b]) for b in rows]
    sizes = np.array([len(ids) for ids, _ in per_row])
    tokens = np.concatenate([ids for ids, _ in per_row])
    counts = np.concatenate([row_counts for _, row_counts in per_row])
    pair_rows = np.repeat(np.array(rows, dtype=np.int64), sizes)
    unchecked = np.repeat([not isinstance(history[b], TokenHistory) for b in rows], sizes)  # a TokenHistory
    bad = unchecked & ((tokens < 0) | (tokens >= vocab_size))                        # holds checked ids
    if bad.any():
        raise _outside(int(pair_rows[bad.argmax()]), vocab_size, "history")

    def per_pair(name: str) -> torch.Tensor:
        table = np.array([getattr(p, name) for p in params], dtype=np.float32)
        return torch.from_numpy(table[pair_rows]).to(device)

    return SparsePenalties(
        rows=torch.from_numpy(pair_rows).to(device), tokens=torch.from_numpy(tokens).to(device),
        counts=torch.from_numpy(counts).to(device), repetition=per_pair("repetition_penalty"),
        presence=per_pair("presence_penalty"), frequency=per_pair("frequency_penalty"))


def _logit_bias(params: Sequence[SamplingParams], vocab_size: int, device: torch.device | str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    entries = [(b, token, bias) for b, p in enumerate(params) for token, bias in p.logit_bias]
    if not entries:
        return None
    for b, token, _ in entries:
        _check_ids(b, [token], vocab_size, "logit_bias")
    rows, tokens, values = zip(*entries)
    return (torch.tensor(rows, dtype=torch.int64, device=device), torch.tensor(tokens, dtype=torch.int64, device=device),
            torch.tensor(values, dtype=torch.float32, device=device))


def banned_token_ids(bad_words: Sequence[Sequence[int]], history: Sequence[int]) -> set[int]:
    """Tokens banned at this step: last token of each bad word whose prefix ends the history."""
    banned = set()
    for word in bad_words:
        prefix = word[:-1]
        if not prefix or (len(history) >= len(prefix) and tuple(history[len(history) - len(prefix):]) == prefix):
            banned.add(word[-1])
    return banned


def _banned_tokens(params: Sequence[SamplingParams], banning: list[int], history: Sequence[Sequence[int]] | None,
                   vocab_size: int, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor] | None:
    rows, tokens = [], []
    for b in banning:
        ids = sorted(t for t in banned_token_ids(params[b].bad_words, history[b] if history is not None else ())
                     if t < vocab_size)
        rows += [b] * len(ids)
        tokens += ids
    if not rows:
        return None
    return (torch.tensor(rows, dtype=torch.int64, device=device),
            torch.tensor(tokens, dtype=torch.int64, device=device))

