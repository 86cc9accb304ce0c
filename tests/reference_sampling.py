"""A float64 reference for the sampling distribution, written from the definition, not the library.

    probs = reference_probs(logits_row, params, history)   # np.ndarray float64 [V], sums to 1

Order of the chain (the contract of `zero_check_sample` and `checked_sample`):
1. penalties on history tokens: repetition (CTRL: positive logits / r, others * r), then
   frequency (- f * count) and presence (- p once);
2. bad words: the last token of a word is banned (-inf) when the word's prefix is the tail of the
   history (a one-token word is always banned);
3. special rows: all tokens masked -> argmax of the unpenalised logits; greedy (T=0 or top_k=1) ->
   argmax of the penalised logits, first index among ties; +inf present -> uniform over +inf tokens;
4. temperature; top-k keeps every token whose logit >= the k-th largest (ties kept, top_k >= V off);
5. top-p on the renormalised top-k mass: the cutoff is the first token in descending order whose
   cumulative probability reaches top_p; every token with probability >= the cutoff's is kept;
6. min-p keeps tokens with probability >= min_p * max probability; renormalise.
"""
from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np


def penalised_logits(logits_row, params, history: Sequence[int] | None = None) -> np.ndarray:
    """Steps 1-2: float64 [V] logits after penalties and bad-word bans (a new array)."""
    x = np.array(logits_row, dtype=np.float64).reshape(-1)
    history = list(history or ())
    has_penalties = (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
                     or params.frequency_penalty != 0.0)
    if has_penalties:
        for token, count in Counter(history).items():
            value = x[token]
            value = value / params.repetition_penalty if value > 0 else value * params.repetition_penalty
            x[token] = value - params.frequency_penalty * count - params.presence_penalty
    for token in banned_tokens(params.bad_words, history):
        if token < len(x):
            x[token] = -np.inf
    return x


def banned_tokens(bad_words: Sequence[Sequence[int]], history: Sequence[int]) -> set[int]:
    """Last tokens of the bad words whose prefix equals the tail of `history`."""
    history = list(history)
    banned = set()
    for word in bad_words:
        prefix = list(word[:-1])
        if not prefix or (len(history) >= len(prefix) and history[len(history) - len(prefix):] == prefix):
            banned.add(word[-1])
    return banned


def one_hot(size: int, index: int) -> np.ndarray:
    probs = np.zeros(size, dtype=np.float64)
    probs[index] = 1.0
    return probs


def reference_probs(logits_row, params, history: Sequence[int] | None = None) -> np.ndarray:
    """The distribution one row is drawn from. logits_row: [V] (any float array-like); params: a
    `SamplingParams`; history: token ids or None. Returns float64 [V] summing to 1.
    Raises ValueError if the logits contain NaN."""
    raw = np.array(logits_row, dtype=np.float64).reshape(-1)
    if np.isnan(raw).any():
        raise ValueError("logits contain NaN")
    vocab = len(raw)
    x = penalised_logits(raw, params, history)
    if np.all(x == -np.inf):
        return one_hot(vocab, int(np.argmax(raw)))
    if params.temperature == 0.0 or params.top_k == 1:
        return one_hot(vocab, int(np.argmax(x)))
    if np.any(x == np.inf):
        probs = (x == np.inf).astype(np.float64)
        return probs / probs.sum()

    y = (x - x.max()) / params.temperature
    keep = np.isfinite(y)
    if 0 < params.top_k < vocab:
        kth = np.sort(y)[::-1][params.top_k - 1]
        keep &= y >= kth
    probs = np.where(keep, np.exp(y), 0.0)
    probs /= probs.sum()

    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order])
        cut = min(int(np.searchsorted(cumulative, params.top_p, side="left")), vocab - 1)
        probs = np.where(probs >= probs[order[cut]], probs, 0.0)
    if params.min_p > 0.0:
        probs = np.where(probs >= params.min_p * probs.max(), probs, 0.0)
    return probs / probs.sum()


def top_p_margin(logits_row, params, history: Sequence[int] | None = None) -> float:
    """How far top_p is from the nearest cumulative-probability boundary of the top-k mass (a test
    design guard: a margin near 0 means float32 rounding could move the top-p cutoff)."""
    x = penalised_logits(logits_row, params, history)
    y = (x - x.max()) / params.temperature
    keep = np.isfinite(y)
    if 0 < params.top_k < len(y):
        keep &= y >= np.sort(y)[::-1][params.top_k - 1]
    probs = np.where(keep, np.exp(y), 0.0)
    cumulative = np.cumsum(np.sort(probs / probs.sum())[::-1])
    return float(np.min(np.abs(cumulative - params.top_p)))


def min_p_margin(logits_row, params, history: Sequence[int] | None = None) -> float:
    """Relative distance of the nearest probability ratio p / p_max to min_p (a test design guard)."""
    x = penalised_logits(logits_row, params, history)
    ratio = np.exp((x - x.max()) / params.temperature)
    return float(np.min(np.abs(ratio - params.min_p)) / params.min_p)


def compiled_zero_check_sample(logits, params, history=None, step=0):
    """`zero_check_sample` through the compiled CPU kernel (the server's CPU runner)."""
    from zerocheck.sampling import ZeroCheckSampler

    return ZeroCheckSampler(compiled=True).sample(logits, params, history, step).raise_errors()
