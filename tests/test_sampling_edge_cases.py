"""Edge cases of both sampling paths: NaN, +-inf, masked rows, ties, vocab tails, dtypes, in-place
safety, bad-word prefixes, greedy with penalties. Deterministic: every sampled row is seeded."""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from reference_sampling import compiled_zero_check_sample, penalised_logits, reference_probs
from zerocheck.sampling import (CheckedSampler, SamplingParamError, SamplingParams, ZeroCheckSampler,
                                checked_sample, zero_check_sample)
from zerocheck.sampling import ops
from zerocheck.sampling.workspace import Workspace

PATHS = {"zero_check": zero_check_sample, "zero_check_compiled": compiled_zero_check_sample,
         "checked": checked_sample}
SAMPLERS = {"zero_check": ZeroCheckSampler, "zero_check_compiled": lambda: ZeroCheckSampler(compiled=True),
            "checked": CheckedSampler}
ROW_KINDS = {  # one of each orchestration branch of the zero-check sampler
    "greedy": SamplingParams(temperature=0.0),
    "top_k": SamplingParams(top_k=5, seed=1),
    "dense": SamplingParams(temperature=0.8, seed=2),
    "top_p": SamplingParams(top_p=0.9, seed=3),
    "min_p": SamplingParams(min_p=0.2, seed=4),
}


def seeded_copies(params: SamplingParams, count: int, base: int = 0) -> list[SamplingParams]:
    return [replace(params, seed=base + i) for i in range(count)]


def support_of(sample, row: torch.Tensor, params: SamplingParams, draws: int = 2000, history=None) -> set[int]:
    """The set of tokens drawn over `draws` seeded copies of `row` [V]."""
    hist = None if history is None else [list(history)] * draws
    tokens = sample(row.unsqueeze(0).repeat(draws, 1), seeded_copies(params, draws), hist)
    return set(tokens.tolist())


# --- NaN -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("path", SAMPLERS)
def test_nan_row_is_an_error_for_that_row_only(path: str, kind: str) -> None:
    rng = np.random.default_rng(0)
    logits = torch.from_numpy(rng.normal(0, 2, (4, 1000)).astype(np.float32))
    params = [SamplingParams(top_k=3, seed=10), ROW_KINDS[kind], SamplingParams(seed=11), SamplingParams(temperature=0)]
    clean = SAMPLERS[path]().sample(logits, params)
    assert clean.errors == [None] * 4
    logits[1, 17] = math.nan
    out = SAMPLERS[path]().sample(logits, params)
    assert out.errors[1] is not None and "NaN" in out.errors[1]
    assert int(out.tokens[1]) == -1
    assert [out.errors[b] for b in (0, 2, 3)] == [None] * 3
    assert out.tokens[[0, 2, 3]].tolist() == clean.tokens[[0, 2, 3]].tolist()


@pytest.mark.parametrize("path", PATHS)
def test_nan_row_raises_from_the_functions(path: str) -> None:
    logits = torch.zeros(3, 64)
    logits[2, 0] = math.nan
    with pytest.raises(SamplingParamError, match="row 2.*NaN"):
        PATHS[path](logits, [SamplingParams(seed=b) for b in range(3)])


@pytest.mark.parametrize("path", SAMPLERS)
def test_nan_hidden_under_a_banned_token_is_still_an_error(path: str) -> None:
    """A NaN row is refused even when the NaN sits on a token a bad word bans (or a penalty edits)."""
    logits = torch.zeros(2, 64)
    logits[0, 7] = math.nan
    params = [SamplingParams(bad_words=((7,),), seed=1), SamplingParams(seed=2)]
    out = SAMPLERS[path]().sample(logits, params)
    assert out.errors[0] is not None and int(out.tokens[0]) == -1
    assert out.errors[1] is None


# --- +inf / -inf -----------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("path", PATHS)
def test_single_posinf_token_always_wins(path: str, kind: str) -> None:
    row = torch.from_numpy(np.random.default_rng(1).normal(0, 3, 500).astype(np.float32))
    row[321] = math.inf
    assert support_of(PATHS[path], row, ROW_KINDS[kind], draws=200) == {321}


@pytest.mark.parametrize("kind", ["top_k", "dense", "top_p", "min_p"])
@pytest.mark.parametrize("path", PATHS)
def test_several_posinf_tokens_are_drawn_uniformly(path: str, kind: str) -> None:
    from scipy.stats import chisquare
    row = torch.zeros(300)
    ids = [3, 130, 299]
    row[ids] = math.inf
    draws = 3000
    tokens = PATHS[path](row.repeat(draws, 1), seeded_copies(ROW_KINDS[kind], draws)).numpy()
    assert set(tokens.tolist()) == set(ids)
    counts = [int((tokens == t).sum()) for t in ids]
    assert chisquare(counts).pvalue > 1e-3, counts


@pytest.mark.parametrize("path", PATHS)
def test_greedy_row_with_several_posinf_tokens_is_the_first(path: str) -> None:
    """Greedy is argmax, first index among ties, and deterministic even unseeded."""
    logits = torch.zeros(8, 50)
    logits[:, [9, 4, 30]] = math.inf
    tokens = PATHS[path](logits, [SamplingParams(temperature=0.0)] * 4 + [SamplingParams(top_k=1)] * 4)
    assert tokens.tolist() == [4] * 8


@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("path", PATHS)
def test_neginf_tokens_are_never_drawn(path: str, kind: str) -> None:
    row = torch.full((700,), -math.inf)
    finite = [0, 127, 128, 255, 699]  # group edges and the tail
    row[finite] = torch.tensor([0.5, 1.0, 0.0, 0.7, 0.9])
    support = support_of(PATHS[path], row, ROW_KINDS[kind], draws=1000)
    expected = {int(t) for t in np.nonzero(reference_probs(row.numpy(), ROW_KINDS[kind]))[0]}
    assert support == expected
    assert support <= set(finite)


@pytest.mark.parametrize("path", PATHS)
def test_top_k_larger_than_the_finite_tokens(path: str) -> None:
    row = torch.full((5000,), -math.inf)
    row[[10, 2000, 4999]] = torch.tensor([1.0, 1.5, 0.5])
    assert support_of(PATHS[path], row, SamplingParams(top_k=20), draws=600) == {10, 2000, 4999}


# --- rows masked by bad words ----------------------------------------------------------------

@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("path", SAMPLERS)
def test_all_candidates_banned_falls_back_to_unmasked_argmax(path: str, kind: str) -> None:
    logits = torch.full((2, 300), -math.inf)
    logits[0, [4, 200, 299]] = torch.tensor([1.0, 3.0, 2.0])  # every finite token is banned
    logits[1] = torch.linspace(0, 1, 300)
    params = [replace(ROW_KINDS[kind], bad_words=((4,), (200,), (299,))), SamplingParams(temperature=0)]
    out = SAMPLERS[path]().sample(logits, params)
    assert out.errors == [None, None]
    assert out.tokens.tolist() == [200, 299]


@pytest.mark.parametrize("path", PATHS)
def test_all_neginf_row_gives_argmax(path: str) -> None:
    logits = torch.full((len(ROW_KINDS), 129), -math.inf)
    tokens = PATHS[path](logits, list(ROW_KINDS.values()))
    assert tokens.tolist() == [0] * len(ROW_KINDS)


# --- ties, top_k >= V, top_p = 1, vocab tails ------------------------------------------------

@pytest.mark.parametrize("vocab", [300, 5000])
@pytest.mark.parametrize("path", PATHS)
def test_ties_at_the_top_k_threshold_are_all_kept(path: str, vocab: int) -> None:
    """5 equal top logits with top_k=3: all 5 are candidates, in both paths, on the small-V
    (torch.topk) and the large-V (group prefilter) candidate search."""
    row = torch.from_numpy(np.random.default_rng(2).uniform(-5, 0, vocab).astype(np.float32))
    tied = [1, 150, vocab // 2, vocab - 130, vocab - 1]
    row[tied] = 2.0
    support = support_of(PATHS[path], row, SamplingParams(top_k=3), draws=1000)
    assert support == set(tied)


@pytest.mark.parametrize("path", PATHS)
def test_ties_below_distinct_top_values(path: str) -> None:
    """logits 10, 9, then four 8s: top_k=3 keeps 10, 9 and every 8 (T large so all are drawn)."""
    row = torch.full((1000,), -20.0)
    row[[500, 7, 3, 900, 999, 128]] = torch.tensor([10.0, 9.0, 8.0, 8.0, 8.0, 8.0])
    support = support_of(PATHS[path], row, SamplingParams(top_k=3, temperature=5.0), draws=2000)
    assert support == {500, 7, 3, 900, 999, 128}


@pytest.mark.parametrize("path", PATHS)
def test_top_k_at_least_vocab_is_off(path: str) -> None:
    rng = np.random.default_rng(3)
    logits = torch.from_numpy(rng.normal(0, 2, (32, 300)).astype(np.float32))
    base = [SamplingParams(seed=100 + b, top_p=0.95 if b % 2 else 1.0) for b in range(32)]
    off = PATHS[path](logits, base)
    for top_k in (300, 301, 10**6):
        assert torch.equal(PATHS[path](logits, [replace(p, top_k=top_k) for p in base]), off)


@pytest.mark.parametrize("path", PATHS)
def test_top_p_one_is_off(path: str) -> None:
    rng = np.random.default_rng(4)
    logits = torch.from_numpy(rng.normal(0, 2, (32, 1000)).astype(np.float32))
    base = [SamplingParams(seed=200 + b, top_k=10 * (b % 3)) for b in range(32)]
    assert torch.equal(PATHS[path](logits, [replace(p, top_p=1.0) for p in base]), PATHS[path](logits, base))


@pytest.mark.parametrize("vocab", [1, 2, 127, 129, 255, 1000])
@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("path", PATHS)
def test_vocab_tail_tokens_are_reachable(path: str, kind: str, vocab: int) -> None:
    """V not a multiple of 128: the last group's tail is drawn, and nothing past V."""
    row = torch.full((vocab,), -math.inf)
    row[-1] = 1.0
    if vocab > 1:
        row[-2] = 0.8
    params = ROW_KINDS[kind]
    support = support_of(PATHS[path], row, params, draws=400)
    expected = {int(t) for t in np.nonzero(reference_probs(row.numpy(), params))[0]}
    assert support == expected


# --- dtypes ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("path", PATHS)
def test_half_inputs_give_the_float32_tokens(path: str, dtype: torch.dtype) -> None:
    """Logits on a 1/8 grid in [-8, 8] are exact in float16 and bfloat16."""
    rng = np.random.default_rng(5)
    logits = torch.from_numpy((rng.integers(-64, 65, (40, 1000)) / 8).astype(np.float32))
    params = [list(ROW_KINDS.values())[b % len(ROW_KINDS)] for b in range(40)]
    params = [p if p.is_greedy else replace(p, seed=300 + b) for b, p in enumerate(params)]
    half = logits.to(dtype)
    assert torch.equal(half.float(), logits)
    expected = PATHS[path](logits, params)
    assert torch.equal(PATHS[path](half, params), expected)
    assert torch.equal(half.float(), logits), "the half-precision input was modified"


# --- logits left unchanged -------------------------------------------------------------------

@pytest.mark.parametrize("kind", ROW_KINDS)
@pytest.mark.parametrize("path", PATHS)
def test_logits_unchanged_with_penalties_and_bad_words(path: str, kind: str) -> None:
    rng = np.random.default_rng(6)
    logits = torch.from_numpy(rng.normal(0, 2, (3, 1000)).astype(np.float32))
    logits[2, 5] = math.inf
    logits[1, 6] = -math.inf
    before = logits.clone()
    history = [[1, 2, 2, 3, 999], [5, 6, 6, 7], [5, 5, 0]]
    params = [replace(ROW_KINDS[kind], repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.3,
                      bad_words=((2, 9), (3, 4), (11,), (5,)))] * 3
    PATHS[path](logits, params, history)
    assert torch.equal(logits, before)
    transposed = before.t().contiguous().t()  # same values, non-contiguous
    PATHS[path](transposed, params, history)
    assert torch.equal(transposed, before)


@pytest.mark.parametrize("path", SAMPLERS)
def test_logits_unchanged_when_a_row_is_refused(path: str) -> None:
    logits = torch.randn(2, 300, generator=torch.Generator().manual_seed(7))
    logits[1, 3] = math.nan
    before = logits.clone()
    params = [SamplingParams(repetition_penalty=2.0, bad_words=((1,),), seed=1)] * 2
    SAMPLERS[path]().sample(logits, params, [[1, 2, 3], [3, 4]])
    assert torch.equal(logits.nan_to_num(), before.nan_to_num()) and bool(logits[1, 3].isnan())


# --- bad words -------------------------------------------------------------------------------

BAD = ((5, 6, 7), (8, 7), (9,))


@pytest.mark.parametrize("history,banned", [
    ([1, 5, 6], {7, 9}),  # full prefix (5, 6) ends the history
    ([5, 6, 1], {9}),  # prefix present, but not at the tail
    ([6], {9}),  # only part of the prefix
    ([], {9}),  # history shorter than every prefix
    ([5, 6, 8], {7, 9}),  # the other word's prefix (8,)
    ([8, 5], {9}),
])
@pytest.mark.parametrize("path", PATHS)
def test_bad_word_prefix_matching(path: str, history: list[int], banned: set[int]) -> None:
    row = torch.full((50,), -math.inf)
    row[[7, 9]] = torch.tensor([5.0, 6.0])  # 9 > 7 > everything else
    row[20] = 1.0
    params = SamplingParams(bad_words=BAD, temperature=0.0)
    greedy = int(PATHS[path](row.unsqueeze(0), [params], [history])[0])
    expected = 20 if banned >= {7, 9} else 7
    assert greedy == expected
    support = support_of(PATHS[path], row, replace(params, temperature=1.0, top_k=3), draws=300, history=history)
    assert not support & banned
    assert support == {int(t) for t in np.nonzero(reference_probs(row.numpy(), replace(params, temperature=1.0, top_k=3), history))[0]}


@pytest.mark.parametrize("path", PATHS)
def test_bad_words_without_history(path: str) -> None:
    row = torch.zeros(1, 10)
    row[0, 3] = 9.0
    row[0, 4] = 8.0
    params = [SamplingParams(bad_words=((1, 3), (4,)), temperature=0.0)]
    assert PATHS[path](row, params, None).tolist() == [3]  # (1, 3) needs a history; (4,) is banned


# --- greedy with penalties -------------------------------------------------------------------

@pytest.mark.parametrize("path", PATHS)
def test_greedy_with_penalties_is_argmax_of_penalised_logits(path: str) -> None:
    rng = np.random.default_rng(8)
    logits = rng.normal(0, 1, (64, 200)).astype(np.float32)
    histories, params = [], []
    for b in range(64):
        top = np.argsort(-logits[b])[:3]
        histories.append([int(top[0])] * (1 + b % 3) + [int(top[1])] + [int(t) for t in rng.choice(200, 5)])
        params.append(SamplingParams(temperature=0.0 if b % 2 else 1.0, top_k=0 if b % 2 else 1,
                                     repetition_penalty=1.0 + 0.2 * (b % 4), presence_penalty=0.3 * (b % 3),
                                     frequency_penalty=0.2 * (b % 5) - 0.4, bad_words=((int(top[2]),),)))
    expected = [int(np.argmax(penalised_logits(logits[b], params[b], histories[b]))) for b in range(64)]
    assert expected != [int(np.argmax(r)) for r in logits], "the penalties must change some argmax"
    assert PATHS[path](torch.from_numpy(logits), params, histories).tolist() == expected


def test_a_penalised_plain_history_with_an_id_outside_the_vocabulary_names_its_row() -> None:
    from zerocheck.sampling.batch import build_batch
    from zerocheck.sampling.history import TokenHistory

    params = [SamplingParams(), SamplingParams(presence_penalty=0.5), SamplingParams(repetition_penalty=1.2)]
    with pytest.raises(SamplingParamError, match=r"history of row 2 holds token ids outside \[0, 100\)"):
        build_batch(params, 100, [[1, 2], [3, 3, 4], [5, 100]], 0)
    with pytest.raises(SamplingParamError, match=r"history of row 1 holds token ids outside \[0, 100\)"):
        build_batch(params, 100, [[1, 2], [-1], [5]], 0)
    batch = build_batch(params, 100, [[1, 2], TokenHistory([3, 3, 4]), [5, 5, 7]], 0)
    pairs = sorted(zip(batch.penalties.rows.tolist(), batch.penalties.tokens.tolist(), batch.penalties.counts.tolist(),
                       batch.penalties.presence.tolist(), batch.penalties.repetition.tolist()))
    assert pairs == [(1, 3, 2.0, 0.5, 1.0), (1, 4, 1.0, 0.5, 1.0), (2, 5, 2.0, 0.0, 1.2000000476837158),
                     (2, 7, 1.0, 0.0, 1.2000000476837158)]


def test_the_batch_builder_keeps_the_columns_of_the_same_params_objects_only() -> None:
    """Per-row columns are reused while every row passes the last call's params object; keys, penalties and
    bans are the call's own; another object (even with equal values), vocabulary or row count rebuilds them."""
    from zerocheck.sampling.batch import BatchBuilder, build_batch

    cpu = torch.device("cpu")
    params = [SamplingParams(top_k=5, seed=1), SamplingParams(presence_penalty=0.5, bad_words=((4, 9),), seed=2)]
    builder = BatchBuilder()
    first = builder.build(params, 100, [[1, 4], [3, 5]], 0, cpu)
    again = builder.build(list(params), 100, [[1, 4], [3, 3, 4]], 1, cpu)
    assert again.top_k is first.top_k and again.temperature is first.temperature
    fresh = build_batch(params, 100, [[1, 4], [3, 3, 4]], 1)
    for name in ("temperature", "top_k", "top_p", "min_p", "keys"):
        assert torch.equal(getattr(again, name), getattr(fresh, name)), name
    assert again.host.kind.tolist() == fresh.host.kind.tolist() == [1, 2]
    assert again.host.keys is not first.host.keys and torch.equal(torch.from_numpy(again.host.keys), again.keys)
    assert not torch.equal(again.keys, first.keys)  # the step's keys
    assert again.penalties.counts.tolist() == fresh.penalties.counts.tolist() == [2.0, 1.0]
    assert again.banned[1].tolist() == fresh.banned[1].tolist() == [9]
    assert first.banned is None  # [3, 5] does not end with the prefix 4
    equal_values = [SamplingParams(top_k=5, seed=1), params[1]]
    assert builder.build(equal_values, 100, None, 0, cpu).top_k is not first.top_k
    assert builder.build(equal_values, 100, None, 0, cpu).top_k_list == [5, 0]
    assert builder.build(equal_values, 4, None, 0, cpu).top_k_list == [0, 0]  # top_k >= V: off
    assert builder.build(equal_values[:1], 4, None, 0, cpu).size == 1


def test_the_workspace_reuses_one_buffer_per_name_and_grows_it() -> None:
    """Scratch tensors and host arrays: a name's buffer serves every smaller shape and is replaced by a larger one."""
    import numpy as np

    workspace = Workspace()
    first = workspace.array("a", (4, 10), np.float32)
    smaller = workspace.array("a", (3, 5), np.float32)
    assert smaller.shape == (3, 5) and np.shares_memory(first, smaller)
    assert not np.shares_memory(first, workspace.array("b", (4, 10), np.float32))
    larger = workspace.array("a", (5, 10), np.float32)
    assert larger.shape == (5, 10) and not np.shares_memory(first, larger)
    assert np.shares_memory(larger, workspace.array("a", (2, 2), np.float32))
    tensor = workspace.get("t", (4, 10), torch.float32, torch.device("cpu"))
    assert workspace.get("t", (2, 3), torch.float32, torch.device("cpu")).data_ptr() == tensor.data_ptr()


def test_a_drawn_token_is_in_the_nucleus_exactly_when_the_threshold_keeps_it() -> None:
    """`ops.in_nucleus` (the accept test of a top-p row's race) holds for a token exactly when y >= the exact
    top-p threshold (`ops.dense_top_p_threshold`: the smallest top set reaching top_p of the mass, ties kept),
    tried for every token of rows with ties, and unchanged when min-p zeroed weights below the token."""
    vocab, top_p = 400, torch.tensor([0.3, 0.5, 0.9, 0.99])
    x = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3)) * 2
    x[1, :40] = x[1].max()  # 40 tokens tied at the top
    x[2, 100:130] = x[2].median()  # 30 tied in the middle
    y = x - x.amax(-1, keepdim=True)
    w = torch.exp(y)
    tau = ops.dense_top_p_threshold(y, w, top_p, Workspace())
    rows = torch.arange(4).repeat_interleave(vocab)
    drawn = torch.arange(vocab).repeat(4)
    ys, ws = y[rows], w[rows]
    held = ops.in_nucleus(ys, ws, drawn, top_p[rows], w.sum(-1, dtype=torch.float64)[rows])
    assert torch.equal(held, y.flatten() >= tau[rows])
    floor = ys.gather(1, drawn.unsqueeze(1))  # min-p cut just at the drawn token: every token above it passes
    masked = ws.masked_fill(ys < floor, 0.0)
    assert torch.equal(ops.in_nucleus(ys, masked, drawn, top_p[rows], w.sum(-1, dtype=torch.float64)[rows]), held)


def test_a_token_history_keeps_its_distinct_ids_and_counts_as_it_grows() -> None:
    """`TokenHistory.counted()`: the distinct ids in first-seen order and their counts, equal to a recount after
    single ids, runs of ids and growth past its first arrays; a plain list is counted alike."""
    from collections import Counter

    from zerocheck.sampling.history import TokenHistory, counted

    rng = np.random.default_rng(4)
    history, seen = TokenHistory([5, 5, 9]), [5, 5, 9]
    for step in range(300):
        new = [int(t) for t in rng.integers(0, 400, 1 if step % 3 else 7)]
        history.extend(new)
        seen += new
    ids, counts = history.counted()
    expected = Counter(seen)
    assert ids.tolist() == list(expected) and counts.tolist() == [float(c) for c in expected.values()]
    assert len(ids) > 64 and list(history) == seen and history[-3:] == seen[-3:]
    plain_ids, plain_counts = counted(seen)
    assert plain_ids.tolist() == ids.tolist() and plain_counts.tolist() == counts.tolist()
