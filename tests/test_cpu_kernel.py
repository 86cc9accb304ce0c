"""The compiled CPU kernel draws the tokens the eager torch path draws, row for row."""
from __future__ import annotations

import pytest
import torch

from zerocheck.sampling import SamplingParams, ZeroCheckSampler
from zerocheck.sampling import cpu_kernel
from zerocheck.sampling.cuda_graph import make_sampler

pytestmark = pytest.mark.skipif(not cpu_kernel.available(), reason="numba is not installed")

MIXED = [
    SamplingParams(temperature=0.0),
    SamplingParams(top_k=1, seed=1),
    SamplingParams(top_k=5, seed=2),
    SamplingParams(top_k=50, top_p=0.9, temperature=0.7, seed=3),
    SamplingParams(top_k=40, min_p=0.05, temperature=1.3, seed=4),
    SamplingParams(top_k=20, top_p=0.5, repetition_penalty=1.3, presence_penalty=0.5, seed=5),
    SamplingParams(top_k=30, bad_words=((7,), (3, 9)), seed=6),
    SamplingParams(top_p=0.8, seed=7),  # dense rows: every token exponentiated, the two-stage race
    SamplingParams(temperature=0.7, seed=8),
    SamplingParams(min_p=0.05, temperature=1.1, seed=9),
    SamplingParams(top_p=0.9, min_p=0.02, temperature=0.8, seed=10),
    SamplingParams(top_p=0.2, seed=11),  # most of its races' tokens fall outside the nucleus: the second race
]


@pytest.mark.parametrize("vocab", [1000, 32000, 50257])  # 1000, 50257: a partial last group
@pytest.mark.parametrize("scale", [1.0, 4.0])
def test_compiled_tokens_equal_eager_tokens(vocab: int, scale: float) -> None:
    generator = torch.Generator().manual_seed(vocab)
    logits = torch.randn(64, vocab, generator=generator) * scale
    params = [MIXED[b % len(MIXED)] for b in range(64)]
    history = [[b, 3, 3, 17] for b in range(64)]
    eager, compiled = ZeroCheckSampler(), ZeroCheckSampler(compiled=True)
    for step in range(3):
        expected = eager.sample(logits, params, history, step)
        got = compiled.sample(logits, params, history, step)
        assert got.tokens.tolist() == expected.tokens.tolist() and got.errors == expected.errors


def test_quantised_logits_with_ties_at_the_kth_value() -> None:
    """Logits rounded to 0.5 (as bf16 logits, many exact ties): ties at the k-th value keep every tied
    token; dense top-p rows cross their mass inside a bucket of equal values."""
    logits = torch.round(torch.randn(24, 5000, generator=torch.Generator().manual_seed(3)) * 4) / 2
    params = ([SamplingParams(top_k=k, top_p=0.95, seed=k) for k in range(1, 17)]
              + [SamplingParams(top_p=p, seed=s) for s, p in enumerate((0.3, 0.5, 0.7, 0.9, 0.95, 0.99, 0.999, 1.0))])
    expected = ZeroCheckSampler().sample(logits, params, None, 5).tokens
    assert ZeroCheckSampler(compiled=True).sample(logits, params, None, 5).tokens.tolist() == expected.tolist()


@pytest.mark.parametrize("tied", [40, 300, 1000])  # 300, 1000: more candidates than the kernel inserts one by one
def test_top_k_rows_with_many_tokens_tied_at_the_kth_value(tied: int) -> None:
    """Every token tied at the k-th value is a candidate: sorted by insertion up to INSERTED_CANDIDATES of them,
    by a stable argsort past that; the tokens equal the eager path's either way."""
    assert 40 < cpu_kernel.INSERTED_CANDIDATES < 300
    generator = torch.Generator().manual_seed(tied)
    logits = torch.randn(6, 1000, generator=generator) - 10.0
    for r in range(6):
        logits[r, torch.randperm(1000, generator=generator)[:tied]] = 1.5
        logits[r, r * 7] = 3.0  # one value above the ties
    params = [SamplingParams(top_k=k, top_p=p, seed=k) for k, p in ((2, 1.0), (5, 0.9), (20, 1.0), (1, 1.0), (3, 0.5), (50, 1.0))]
    for step in range(3):
        expected = ZeroCheckSampler().sample(logits, params, None, step).tokens
        assert ZeroCheckSampler(compiled=True).sample(logits, params, None, step).tokens.tolist() == expected.tolist()


def test_the_cpu_runner_is_the_compiled_kernel() -> None:
    assert make_sampler(1000, 8, "cpu").compiled


@pytest.mark.parametrize("case", ["plain", "nan_in_tail", "all_neg_inf", "tied_max", "pos_inf"])
def test_single_rows_take_the_serial_kernel_and_match_eager(case: str) -> None:
    """One row at a time (the kernel without threads); V = 1000 leaves a tail past the whole blocks."""
    eager, compiled = ZeroCheckSampler(), ZeroCheckSampler(compiled=True)
    for b, params in enumerate(MIXED):
        logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(b))
        if case == "nan_in_tail":
            logits[0, 997] = float("nan")
        elif case == "all_neg_inf":
            logits[:] = -float("inf")
        elif case == "tied_max":
            logits[0, [5, 600, 990]] = 10.0
        elif case == "pos_inf":
            logits[0, [40, 995]] = float("inf")
        expected = eager.sample(logits, [params], [[3, 17]], 2)
        got = compiled.sample(logits, [params], [[3, 17]], 2)
        assert got.tokens.tolist() == expected.tokens.tolist() and got.errors == expected.errors, params


def test_group_max_into_a_scratch_tensor_equals_the_allocating_one() -> None:
    from zerocheck.sampling.ops import GROUP, group_max

    for vocab in (3 * GROUP, 3 * GROUP + 5):  # the second: a partial last group
        x = torch.randn(4, vocab, generator=torch.Generator().manual_seed(vocab))
        x[1, 7] = float("nan")
        x[2, -1] = float("inf")
        out = torch.full((4, 4), -1.0)[:, : -(-vocab // GROUP)]
        assert group_max(x, out=out) is out
        assert torch.equal(out.isnan(), group_max(x).isnan())
        assert torch.equal(out.nan_to_num(), group_max(x).nan_to_num())


@pytest.mark.parametrize("vocab", [3 * 128, 3 * 128 + 5])  # the second: a partial last group
def test_the_kernels_group_maxima_are_torchs(vocab: int) -> None:
    """`cpu_kernel._group_maxima` (a max over int32 keys) gives `ops.group_max`'s values, the first group holding
    the row's largest value (-0.0 and +0.0 alike) and whether the row holds NaN."""
    import numpy as np

    from zerocheck.sampling.ops import group_max

    inf, nan = float("inf"), float("nan")
    rows = torch.randn(6, vocab, generator=torch.Generator().manual_seed(vocab)) * 3
    rows[1, 5], rows[1, -1] = inf, inf  # +inf in the first and the last group
    rows[2] = -inf
    rows[2, 200], rows[2, 150], rows[2, -1] = -1e-30, -0.0, 0.0  # the largest: -0.0 in group 1, +0.0 in the last
    rows[3, 300] = nan  # NaN in group 2 only
    rows[4] = -rows[4].abs() - 1.0  # every value negative: the keys' negative half
    rows[5, 130] = rows[5].max() + 1.0
    expected_best = [int(group_max(rows[r:r + 1])[0].argmax()) for r in (0, 4, 5)]
    for r, best in zip((0, 1, 2, 4, 5), expected_best[:1] + [0, 1] + expected_best[1:]):
        gm = np.empty(-(-vocab // 128), np.float32)
        assert cpu_kernel._group_maxima(rows[r].numpy(), gm) == (best, False), r
        assert torch.equal(torch.from_numpy(gm), group_max(rows[r:r + 1])[0]), r
    gm = np.empty(-(-vocab // 128), np.float32)
    assert cpu_kernel._group_maxima(rows[3].numpy(), gm)[1]
    assert np.isnan(gm).tolist() == [g == 2 for g in range(gm.shape[0])]
    assert torch.equal(torch.from_numpy(gm).nan_to_num(), group_max(rows[3:4])[0].nan_to_num())
    greedy = ZeroCheckSampler(compiled=True).sample(rows[2:3], [SamplingParams(temperature=0.0)])
    assert greedy.tokens.tolist() == [150]  # the first token at the largest value, as torch's argmax


@pytest.mark.parametrize("lower", [-6.0, -2.5, 0.0])
def test_masses_from_the_kept_weights_are_the_recomputed_ones(lower: float) -> None:
    """A top-p row's second pass sums the weights its first pass kept (`_stored_masses`): the masses of a pass
    that computes exp again (`_group_masses` above lower), with the weights kept equal to exp(y)."""
    import numpy as np

    vocab = 3 * 128 + 5
    row = (torch.randn(vocab, generator=torch.Generator().manual_seed(5)) * 2).numpy()
    groups = -(-vocab // 128)
    gm = np.empty(groups, np.float32)
    top = gm[cpu_kernel._group_maxima(row, gm)[0]]
    inv_t, none, every = np.float32(1 / 0.8), np.empty(0, np.float32), np.empty(0, np.bool_)
    weights, first = np.full(vocab, np.nan, np.float32), np.empty(groups, np.float32)
    cpu_kernel._group_masses(row, gm, top, inv_t, np.float32(-np.inf), first, none, every, weights)
    np.testing.assert_allclose(weights, np.exp((row.astype(np.float64) - top) * inv_t), rtol=1e-5)  # y in float32
    kept, recomputed = np.empty(groups, np.float32), np.empty(groups, np.float32)
    cpu_kernel._stored_masses(row, gm, top, inv_t, np.float32(lower), weights, kept)
    cpu_kernel._group_masses(row, gm, top, inv_t, np.float32(lower), recomputed, none, every, none)
    np.testing.assert_allclose(kept, recomputed, rtol=1e-5)
    assert (kept > 0).sum() == ((gm - top) * inv_t >= lower).sum() > 0


@pytest.mark.parametrize("level", [-9.0, -3.0, 0.0])
def test_the_nucleus_masses_are_the_rows_mass_and_the_mass_above_a_level(level: float) -> None:
    """`_nucleus_masses`: the row's mass and the mass strictly above a level (the level itself held by tokens),
    as float64 sums of exp(y), with a partial last group."""
    import numpy as np

    vocab = 5 * 128 + 7
    row = (torch.randn(vocab, generator=torch.Generator().manual_seed(9)) * 3).numpy()
    gm = np.empty(-(-vocab // 128), np.float32)
    top = gm[cpu_kernel._group_maxima(row, gm)[0]]
    inv_t = np.float32(1 / 0.7)
    y = (row - top) * inv_t
    at = np.float32(y[np.argmin(np.abs(y - level))])  # a token's own y: the tokens at it are not above it
    total, above = cpu_kernel._nucleus_masses(row, gm, top, inv_t, at)
    w = np.exp(y.astype(np.float64))
    np.testing.assert_allclose([total, above], [w.sum(), w[y > at].sum()], rtol=1e-6)


def test_one_compiled_sampler_serves_batches_of_other_sizes_and_vocabularies() -> None:
    """The group maxima's scratch tensor is reused across calls: smaller batches and other vocabularies
    get views of it, and still draw the eager path's tokens."""
    eager, compiled = ZeroCheckSampler(), ZeroCheckSampler(compiled=True)
    for rows, vocab in ((64, 50257), (3, 1000), (17, 32000), (64, 50257)):
        logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(rows)) * 2.0
        params = [MIXED[b % len(MIXED)] for b in range(rows)]
        assert compiled.sample(logits, params).tokens.tolist() == eager.sample(logits, params).tokens.tolist()


def exhaustive_contending_groups(gmax, top, inv_t, vocab, key0, key1):
    """`cpu_kernel._contending_groups` by its definition: both score bounds of every group, in float64."""
    import math

    import numpy as np

    from zerocheck.jit import EXP_FLOOR
    from zerocheck.sampling.noise import exponential_noise
    from zerocheck.sampling.ops import GROUP, GROUP_SALT

    groups = len(gmax)
    noise = exponential_noise(torch.tensor([[key0, key1]]), torch.arange(groups)[None] + GROUP_SALT)[0].numpy()
    lowest, least_highest = np.full(groups, np.inf), np.inf
    for g in range(groups):
        y = (gmax[g] - top) * inv_t
        if y > EXP_FLOOR:
            w = math.exp(float(y))
            least_highest = min(least_highest, noise[g] / (w * (1.0 - cpu_kernel.MASS_BOUND)))
            lowest[g] = noise[g] / (min(GROUP, vocab - g * GROUP) * w * (1.0 + cpu_kernel.MASS_BOUND))
    return lowest <= least_highest


if cpu_kernel.available():
    @cpu_kernel.numba.njit
    def contending_groups_into(gmax, top, inv_t, vocab, key0, key1, out):
        """The kernel's set, copied inside compiled code: a cached kernel function that returns an array to
        Python can fail to box it (numba: "NRT_adapt_ndarray_to_python, 'descr' is NULL"); the kernel
        itself never returns one to Python."""
        out[:] = cpu_kernel._contending_groups(gmax, top, inv_t, vocab, key0, key1)


@pytest.mark.parametrize("temperature", [0.05, 0.7, 1.0, 3.0])
def test_the_prefiltered_contending_groups_are_the_exhaustive_ones(temperature: float) -> None:
    """The kernel computes exact scores only for groups its float32 prefilter keeps: the set must be the one
    every group's exact bounds give, on flat and peaked rows, a partial last group and masked groups."""
    import numpy as np

    from zerocheck.sampling.ops import group_max

    generator = torch.Generator().manual_seed(int(temperature * 100))
    vocab = 50257
    for trial in range(40):
        row = torch.randn(vocab, generator=generator) * (3.0 if trial % 2 else 0.5)
        if trial % 4 == 3:
            ranks = torch.randperm(vocab, generator=generator).to(torch.float32) + 1
            row = -1.1 * torch.log(ranks)
        if trial % 5 == 4:
            row[: vocab // 2] = -float("inf")  # masked groups (bans, min-p): no weight
        gmax = group_max(row[None])[0].numpy()
        top = np.float32(gmax.max())
        inv_t = np.float32(1.0 / temperature)
        key0, key1 = (int(v) for v in torch.randint(0, 2**32, (2,), generator=generator))
        got = np.empty(len(gmax), np.bool_)
        contending_groups_into(gmax, top, inv_t, vocab, key0, key1, got)
        assert got.tolist() == exhaustive_contending_groups(gmax, top, inv_t, vocab, key0, key1).tolist()


@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.3])
def test_temperature_rows_on_peaked_logits_draw_the_eager_tokens(temperature: float) -> None:
    """LM-like rows (a few strong tokens over a wide tail) at temperature alone: the rows whose prefiltered
    contending groups are fewest; the compiled kernel draws the eager path's token in every row."""
    generator = torch.Generator().manual_seed(int(temperature * 10))
    logits = torch.randn(64, 49152, generator=generator) * 2.0
    logits[:, :5] += torch.tensor([12.0, 10.0, 9.0, 8.0, 6.0])
    params = [SamplingParams(temperature=temperature, seed=b) for b in range(64)]
    expected = ZeroCheckSampler().sample(logits, params).tokens
    assert ZeroCheckSampler(compiled=True).sample(logits, params).tokens.tolist() == expected.tolist()
