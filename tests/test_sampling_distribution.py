"""Statistical tests: both sampling paths draw from the float64 reference distribution.

Each case draws N = 20,000 tokens per path from copies of one logits row, every row with its own
fixed seed, so the test is deterministic run to run. A chi-square goodness-of-fit test (expected
counts < 5 pooled into one bin) must give p > 1e-3; the empirical support must lie inside the
reference support, and equal it where every supported token has probability >= 1e-3.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from reference_sampling import compiled_zero_check_sample, min_p_margin, reference_probs, top_p_margin
from zerocheck.sampling import SamplingParams, checked_sample, zero_check_sample

DRAWS = 20_000
P_MIN = 1e-3  # p-value floor of the goodness-of-fit test
PATHS = {"zero_check": zero_check_sample, "zero_check_compiled": compiled_zero_check_sample,
         "checked": checked_sample}
ELEMENTS_PER_CALL = 8_000_000  # rows per call = this / V, capped by MAX_ROWS_PER_CALL
MAX_ROWS_PER_CALL = 2_000  # the dense top-p histogram holds 4096 float64 per row


def logits_row(vocab: int, seed: int, scale: float = 1.0) -> np.ndarray:
    """[V] float32 Gaussian logits N(0, scale^2) from a fixed numpy seed."""
    return np.random.default_rng(seed).normal(0.0, scale, vocab).astype(np.float32)


def spread_row(vocab: int, seed: int, width: float) -> np.ndarray:
    """[V] float32 logits uniform in [-width/2, width/2]: every token keeps a sizeable probability."""
    return np.random.default_rng(seed).uniform(-width / 2, width / 2, vocab).astype(np.float32)


def peaked_row(vocab: int, seed: int, head: int, spread: float = 2.5, tail_gap: float = 14.0) -> np.ndarray:
    """[V] float32: `head` tokens uniform in [-spread, 0] at random positions, the rest ~`tail_gap`
    lower, so top-k, top-p and min-p cut inside the head and the tail carries ~1e-4 of the mass."""
    rng = np.random.default_rng(seed)
    row = rng.normal(-tail_gap, 0.5, vocab)
    ids = rng.choice(vocab, head, replace=False)
    row[ids] = rng.uniform(-spread, 0.0, head)
    return row.astype(np.float32)


def penalised_row(vocab: int, seed: int) -> tuple[np.ndarray, list[int]]:
    """Logits uniform in [-0.6, 0.6] and a history with repeats of the highest (positive) logits,
    single hits on the lowest (negative) ones, and random tokens."""
    row = spread_row(vocab, seed, 1.2)
    order = np.argsort(-row)
    history = [int(order[0])] * 3 + [int(order[1])] * 2 + [int(order[2]), int(order[-1]), int(order[-2])]
    history += [int(t) for t in np.random.default_rng(seed + 1).choice(vocab, 12)]
    return row, history


def banned_head_row() -> np.ndarray:
    """A peaked V=1000 row whose two best tokens, 3 and 5, are banned by the case's bad words."""
    row = peaked_row(1000, 8, head=50)
    row[[3, 5]] = 0.5
    return row


def draw(sample: Callable, row: np.ndarray, params: Sequence[SamplingParams],
         history: Sequence[int] | None = None, step: int = 0) -> np.ndarray:
    """One token per entry of `params`, each drawn from its own copy of `row`. Returns [N] int64."""
    vocab = len(row)
    chunk = max(1, min(MAX_ROWS_PER_CALL, ELEMENTS_PER_CALL // vocab))
    base = torch.from_numpy(row).unsqueeze(0)
    tokens = []
    for start in range(0, len(params), chunk):
        part = params[start:start + chunk]
        hist = None if history is None else [list(history)] * len(part)
        tokens.append(sample(base.repeat(len(part), 1), list(part), hist, step).numpy())
    return np.concatenate(tokens)


def seeded(params: SamplingParams, count: int, base_seed: int) -> list[SamplingParams]:
    return [replace(params, seed=base_seed + i) for i in range(count)]


def assert_matches_reference(tokens: np.ndarray, probs: np.ndarray, label: str, exact_support: bool) -> float:
    """Chi-square goodness of fit of `tokens` against `probs` [V]; returns the p-value."""
    counts = np.bincount(tokens, minlength=len(probs)).astype(np.float64)
    support = probs > 0
    stray = np.nonzero(counts * ~support)[0]
    assert len(stray) == 0, f"{label}: drew tokens outside the reference support: {stray[:10].tolist()}"
    if exact_support:
        assert probs[support].min() >= P_MIN, f"{label}: test design: supported prob below {P_MIN}"
        missing = np.nonzero(support & (counts == 0))[0]
        assert len(missing) == 0, f"{label}: supported tokens never drawn: {missing[:10].tolist()}"
    expected = probs[support] * len(tokens)
    observed = counts[support]
    small = expected < 5
    if small.any():
        expected = np.append(expected[~small], expected[small].sum())
        observed = np.append(observed[~small], observed[small].sum())
    if len(expected) == 1:
        return 1.0
    expected *= observed.sum() / expected.sum()
    pvalue = float(chisquare(observed, expected).pvalue)
    assert pvalue > P_MIN, f"{label}: chi-square p = {pvalue:.2e} over {len(expected)} bins"
    return pvalue


def assert_thresholds_clear(row: np.ndarray, params: SamplingParams, history: Sequence[int] | None) -> None:
    """Test design guard: no token sits within float32 rounding of the top-p or min-p cutoff."""
    if params.top_p < 1.0 and not params.is_greedy:
        assert top_p_margin(row, params, history) > 1e-4, "top_p sits on a cumulative-probability boundary"
    if params.min_p > 0.0 and not params.is_greedy:
        assert min_p_margin(row, params, history) > 1e-4, "a token sits on the min_p threshold"


@dataclass(frozen=True)
class Case:
    name: str
    row: Callable[[], np.ndarray]
    params: SamplingParams
    history: Callable[[], list[int]] | None = None
    exact_support: bool = True


CASES = [
    Case("temperature_0.7_V300", lambda: spread_row(300, 1, 1.3), SamplingParams(temperature=0.7)),
    Case("top_k_40_V1000", lambda: peaked_row(1000, 2, head=60), SamplingParams(top_k=40)),
    Case("top_k_3_prefilter_V2000", lambda: peaked_row(2000, 3, head=12), SamplingParams(top_k=3, temperature=1.3)),
    Case("top_p_0.9_V300", lambda: peaked_row(300, 4, head=80), SamplingParams(top_p=0.9)),
    Case("top_p_0.9_dense_V5000", lambda: peaked_row(5000, 5, head=120), SamplingParams(top_p=0.9)),
    # top-p draws are proposals kept when inside the nucleus: at top_p 0.3 on a flat row most are rejected and
    # drawn again over the nucleus; with min-p and temperature both branches share the draws
    Case("top_p_0.3_mostly_redrawn_V2000", lambda: spread_row(2000, 10, 3.0), SamplingParams(top_p=0.3)),
    Case("top_p_0.6_min_p_T_V3000", lambda: peaked_row(3000, 11, head=200),
         SamplingParams(temperature=1.2, top_p=0.6, min_p=0.02)),
    Case("min_p_0.05_V300", lambda: peaked_row(300, 6, head=60, spread=4.5), SamplingParams(min_p=0.05)),
    Case("penalties_V100", lambda: penalised_row(100, 7)[0],
         SamplingParams(repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2),
         lambda: penalised_row(100, 7)[1]),
    Case("penalties_bad_words_top_k_V1000", banned_head_row,
         SamplingParams(top_k=30, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2,
                        bad_words=((17, 5), (3,))),
         lambda: [int(t) for t in np.argsort(-banned_head_row())[2:6]] * 2 + [17]),
    Case("top_k_top_p_min_p_T_V1000", lambda: peaked_row(1000, 9, head=120),
         SamplingParams(temperature=0.7, top_k=50, top_p=0.9, min_p=0.02)),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_distribution_matches_reference(case: Case, path: str) -> None:
    row = case.row()
    history = case.history() if case.history else None
    params = case.params
    assert_thresholds_clear(row, params, history)
    probs = reference_probs(row, params, history)
    base_seed = 1_000_003 * (CASES.index(case) + 1)
    tokens = draw(PATHS[path], row, seeded(params, DRAWS, base_seed), history)
    assert_matches_reference(tokens, probs, f"{case.name}/{path}", case.exact_support)


MIXED_V = 300
MIXED_ROWS = [  # one batch holds these rows interleaved, each with its own seeds
    SamplingParams(temperature=0.0),
    SamplingParams(top_k=20, temperature=0.8),
    SamplingParams(top_p=0.8),
    SamplingParams(min_p=0.5, temperature=1.2),
]


@pytest.mark.parametrize("path", PATHS)
def test_mixed_batch_rows_each_match_reference(path: str) -> None:
    row = spread_row(MIXED_V, 11, 1.2)
    history = None
    kinds = len(MIXED_ROWS)
    params = [replace(MIXED_ROWS[i % kinds], seed=50_000 + i) for i in range(DRAWS * kinds)]
    tokens = draw(PATHS[path], row, params, history)
    for k, kind in enumerate(MIXED_ROWS):
        assert_thresholds_clear(row, kind, history)
        probs = reference_probs(row, kind, history)
        assert_matches_reference(tokens[k::kinds], probs, f"mixed row {k} {kind}/{path}", exact_support=True)


@pytest.mark.parametrize("path", PATHS)
def test_greedy_is_argmax_first_among_ties(path: str) -> None:
    rng = np.random.default_rng(12)
    logits = torch.from_numpy(rng.integers(-3, 4, size=(64, 257)).astype(np.float32))  # many ties
    params = [SamplingParams(temperature=0.0) if b % 2 else SamplingParams(top_k=1, seed=b) for b in range(64)]
    tokens = PATHS[path](logits, params)
    expected = torch.tensor([int(np.argmax(r)) for r in logits.numpy()])  # numpy: first maximal index
    assert torch.equal(tokens, expected)


@pytest.mark.parametrize("path", PATHS)
def test_seeded_draws_reproducible_across_calls(path: str) -> None:
    logits = torch.from_numpy(np.stack([logits_row(500, 20 + b) for b in range(16)]))
    params = [SamplingParams(top_p=0.95, seed=b) if b % 2 else SamplingParams(top_k=30, seed=b) for b in range(16)]
    first = PATHS[path](logits, params, step=3)
    assert torch.equal(PATHS[path](logits, params, step=3), first)
    later = torch.stack([PATHS[path](logits, params, step=s) for s in range(4, 12)])
    assert bool((later != first).any()), "the step must change the draws"


TARGETS = [
    SamplingParams(temperature=0.9, seed=123),
    SamplingParams(top_k=7, seed=124),
    SamplingParams(top_p=0.7, seed=125),
    SamplingParams(min_p=0.1, seed=126),
    SamplingParams(top_k=40, top_p=0.9, temperature=0.6, seed=127),
    SamplingParams(repetition_penalty=1.5, presence_penalty=1.0, bad_words=((0,),), seed=128),
]
NEIGHBOURS = [
    SamplingParams(top_k=200),
    SamplingParams(temperature=0.0),
    SamplingParams(top_p=0.3, seed=9),
    SamplingParams(min_p=0.5),
    SamplingParams(top_k=3, frequency_penalty=1.0, seed=10),
    SamplingParams(bad_words=((1, 2), (5,))),
]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("vocab", [1000, 5000])
def test_seeded_row_independent_of_batch_position(path: str, vocab: int) -> None:
    """The same seeded row gives the same token alone, at any position, and beside any neighbours."""
    sample = PATHS[path]
    rng = np.random.default_rng(vocab)
    history = [int(t) for t in rng.choice(vocab, 30)]
    for t, target in enumerate(TARGETS):
        row = torch.from_numpy(logits_row(vocab, 30 + t, scale=2.0))
        for step in (0, 5):
            alone = int(sample(row.unsqueeze(0), [target], [history], step)[0])
            for position, count in [(0, 3), (2, 3), (5, 6), (1, 5), (9, 12)]:  # 12 rows: the vectorised row keys
                neighbours = [NEIGHBOURS[(position + i) % len(NEIGHBOURS)] for i in range(count)]
                params = neighbours[:position] + [target] + neighbours[position + 1:]
                others = torch.from_numpy(rng.normal(0, 3, (count, vocab)).astype(np.float32))
                others[position] = row
                tokens = sample(others, params, [history] * count, step)
                assert int(tokens[position]) == alone, (target, position, count, step)


@pytest.mark.parametrize("path", PATHS)
def test_unseeded_rows_get_fresh_randomness(path: str) -> None:
    logits = torch.zeros(64, 1000)
    params = [SamplingParams()] * 64
    assert not torch.equal(PATHS[path](logits, params), PATHS[path](logits, params))
