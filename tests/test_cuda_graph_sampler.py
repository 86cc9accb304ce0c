"""CUDA-graph sampler: same tokens as the eager zero-check sampler, replays counted, same distribution.

GPU tests are marked `gpu` and skipped without CUDA; the runner choice (`make_sampler`) and the
bucket layout are checked on CPU too.
"""
from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from reference_sampling import reference_probs
from zerocheck.sampling import SamplingParamError, SamplingParams, ZeroCheckSampler

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(scope="module")
def cuda_graph():
    return pytest.importorskip("zerocheck.sampling.cuda_graph")


def mixed_params(batch: int, base_seed: int) -> list[SamplingParams]:
    """Graph-eligible rows: greedy, top-k, top-k with top-p / min-p / temperature, penalties, dense."""
    kinds = [SamplingParams(temperature=0.0), SamplingParams(top_k=40), SamplingParams(top_k=1),
             SamplingParams(top_k=20, top_p=0.8, temperature=0.7), SamplingParams(top_k=64, min_p=0.1),
             SamplingParams(top_k=10, repetition_penalty=1.3, presence_penalty=0.4, bad_words=((3,),)),
             SamplingParams(temperature=0.8, min_p=0.05)]  # a dense row: the graph's dense step
    return [replace(kinds[b % len(kinds)], seed=base_seed + b) for b in range(batch)]


# --- CPU ------------------------------------------------------------------------------------

def test_make_sampler_is_eager_on_cpu(cuda_graph) -> None:
    sampler = cuda_graph.make_sampler(32000, 8, "cpu")
    assert isinstance(sampler, ZeroCheckSampler)


def test_buckets_are_powers_of_two_then_the_max(cuda_graph) -> None:
    assert cuda_graph.buckets_up_to(12) == [1, 2, 4, 8, 12]
    assert cuda_graph.buckets_up_to(8) == [1, 2, 4, 8]
    assert cuda_graph.buckets_up_to(1) == [1]


def test_default_device_accepts_logits_on_cuda0(cuda_graph) -> None:
    """Every CUDA tensor reports an indexed device (cuda:0); a runner made for device "cuda" must
    still treat it as its own, or it never replays a graph."""
    assert cuda_graph.same_device(torch.device("cuda"), torch.device("cuda", 0))
    assert not cuda_graph.same_device(torch.device("cuda", 1), torch.device("cuda", 0))
    assert not cuda_graph.same_device(torch.device("cuda"), torch.device("cpu"))


# --- the runner's logic on CPU: the graph's body run eagerly on the same static buffers ------------------

def test_every_bucket_is_ready_at_load_and_tokens_equal_eager(cuda_graph) -> None:
    sampler = cuda_graph.CudaGraphSampler(1000, 12, device="cpu")
    assert sorted(sampler._bodies) == sampler.buckets == [1, 2, 4, 8, 12]
    eager = ZeroCheckSampler()
    gen = torch.Generator().manual_seed(0)
    for step, batch in enumerate([1, 3, 8, 12, 5]):
        logits = torch.randn(batch, 1000, generator=gen) * 3
        params = mixed_params(batch, 100 * step)
        history = [[3, 5, 5, 7 + b] for b in range(batch)]
        before = logits.clone()
        out = sampler.sample(logits, params, history, step)
        assert torch.equal(logits, before), "logits modified"
        assert out.errors == [None] * batch
        assert out.tokens.tolist() == eager.sample(logits, params, history, step).tokens.tolist(), (step, batch)
    assert (sampler.replays, sampler.eager_calls) == (5, 0)


@pytest.mark.parametrize("mix", ["dense", "mixed"])
def test_default_rows_replay_the_dense_step(cuda_graph, mix: str) -> None:
    """Rows with neither top-k nor top-p (the default T=1, temperature, min-p) are served by the graph's
    dense step, with the eager sampler's tokens, alone or beside top-k and greedy rows."""
    sampler = cuda_graph.CudaGraphSampler(1000, 8, device="cpu")
    dense = [SamplingParams(seed=1), SamplingParams(temperature=0.6, seed=2), SamplingParams(min_p=0.05, seed=3),
             SamplingParams(temperature=1.5, min_p=0.2, repetition_penalty=1.2, bad_words=((3,),), seed=4)]
    params = dense if mix == "dense" else dense + mixed_params(4, 50)
    history = [[3, 5, 9, b] for b in range(len(params))]
    gen = torch.Generator().manual_seed(3)
    eager = ZeroCheckSampler()
    for step in range(4):
        logits = torch.randn(len(params), 1000, generator=gen) * 3
        logits[0, 17] = math.inf if step == 3 else logits[0, 17]
        out = sampler.sample(logits, params, history, step)
        assert out.tokens.tolist() == eager.sample(logits, params, history, step).tokens.tolist(), step
    assert (sampler.replays, sampler.eager_calls) == (4, 0)
    assert int(out.tokens[0]) == 17  # +inf: all the mass


@pytest.mark.parametrize("vocab", [1000, 40000])  # 40000: past the group pre-filter's width
def test_top_p_rows_without_top_k_replay_the_dense_step(cuda_graph, vocab: int) -> None:
    """Top-p rows without top-k (with temperature, min-p, penalties; beside top-k and greedy rows) are drawn
    by the graph's dense step, whose static threshold gives the eager sampler's tokens, step after step."""
    sampler = cuda_graph.CudaGraphSampler(vocab, 8, device="cpu")
    params = [SamplingParams(top_p=0.9, seed=1), SamplingParams(top_p=0.5, temperature=0.7, seed=2),
              SamplingParams(top_p=0.95, min_p=0.02, seed=3),
              SamplingParams(top_p=0.8, repetition_penalty=1.3, bad_words=((3,),), seed=4),
              SamplingParams(top_k=5, seed=5), SamplingParams(temperature=0.0)]
    history = [[3, 5, 9, b] for b in range(len(params))]
    gen = torch.Generator().manual_seed(4)
    eager = ZeroCheckSampler()
    for step in range(5):
        logits = torch.randn(len(params), vocab, generator=gen) * (1 + step)
        out = sampler.sample(logits, params, history, step)
        assert out.tokens.tolist() == eager.sample(logits, params, history, step).tokens.tolist(), step
    assert (sampler.replays, sampler.eager_calls, sampler.eager_rows) == (5, 0, 0)


def test_static_top_p_threshold_is_the_exact_one(cuda_graph) -> None:
    """`ops.dense_top_p_threshold_static` = `ops.dense_top_p_threshold` (the eager, compacting one) on rows
    of every shape: spread, peaked, tied, all in one bucket (flagged when past `members`), top_p 1."""
    from zerocheck.sampling import ops
    from zerocheck.sampling.workspace import Workspace

    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3000, generator=gen) * torch.tensor([[1.0], [4.0], [10.0], [0.5], [1.0], [2.0]])
    x[3] = 0.25  # every token in one bucket: 3000 members
    x[4, :40] = 3.0  # a tie at the top
    top_p = torch.tensor([0.9, 0.5, 0.99, 0.7, 0.6, 1.0])
    y = x - x.amax(-1, keepdim=True)
    w = torch.exp(y)
    expected = ops.dense_top_p_threshold(y, w, top_p, Workspace())
    tau, overflow = ops.dense_top_p_threshold_static(y, w, top_p, 1024)
    assert overflow.tolist() == [False, False, False, True, False, False]
    assert torch.equal(tau[~overflow], expected[~overflow])
    tau, overflow = ops.dense_top_p_threshold_static(y, w, top_p, 3000)
    assert not overflow.any() and torch.equal(tau, expected)


def test_a_top_p_row_past_the_ranked_members_is_redrawn_eager(cuda_graph) -> None:
    sampler = cuda_graph.CudaGraphSampler(3000, 4, device="cpu")
    logits = torch.randn(2, 3000)
    # 3000 distinct logits 0.005 apart in all: one bucket holds the whole row, past TOP_P_MEMBERS, and the race's
    # token lies outside the nucleus (its top ~5 %: seed 1's does not), so the row needs the second race
    logits[0] = torch.linspace(1.0, 1.005, 3000)
    params = [SamplingParams(top_p=0.05, seed=1), SamplingParams(top_p=0.5, seed=2)]
    out = sampler.sample(logits, params)
    assert (sampler.replays, sampler.eager_calls, sampler.eager_rows) == (1, 0, 1)
    assert out.tokens.tolist() == ZeroCheckSampler().sample(logits, params).tokens.tolist()


def test_a_nan_under_a_banned_token_fails_its_row(cuda_graph) -> None:
    sampler = cuda_graph.CudaGraphSampler(1000, 4, device="cpu")
    logits = torch.randn(2, 1000)
    logits[1, 3] = math.nan
    params = [SamplingParams(top_k=5, seed=1), SamplingParams(top_k=5, seed=2, bad_words=((3,),))]
    out = sampler.sample(logits, params)
    assert sampler.replays == 1
    assert out.errors == ZeroCheckSampler().sample(logits, params).errors == [None, "logits contain NaN"]


def test_logits_rows_must_match_params(cuda_graph) -> None:
    sampler = cuda_graph.CudaGraphSampler(1000, 4, device="cpu")
    for rows in (1, 3):
        with pytest.raises(SamplingParamError, match=f"logits have {rows} rows but 2 params were given"):
            sampler.sample(torch.randn(rows, 1000), [SamplingParams(top_k=5)] * 2)


def test_only_the_tied_rows_are_redrawn_eager(cuda_graph) -> None:
    sampler = cuda_graph.CudaGraphSampler(1000, 4, device="cpu")
    logits = torch.randn(3, 1000)
    logits[0, :10] = 50.0  # the 3rd value is tied past the candidates
    params = [SamplingParams(top_k=3, seed=b) for b in range(3)]
    out = sampler.sample(logits, params)
    assert (sampler.replays, sampler.eager_calls, sampler.eager_rows) == (1, 0, 1)
    assert out.tokens.tolist() == ZeroCheckSampler().sample(logits, params).tokens.tolist()
    assert int(out.tokens[0]) < 10


def test_bf16_logits_are_replayed(cuda_graph) -> None:
    sampler = cuda_graph.CudaGraphSampler(1000, 8, device="cpu")
    logits = (torch.randn(8, 1000) * 3).to(torch.bfloat16)
    params = mixed_params(8, 7)
    out = sampler.sample(logits, params)
    assert sampler.replays == 1 and sampler.eager_calls == 0
    assert out.tokens.tolist() == ZeroCheckSampler().sample(logits, params).tokens.tolist()


def test_cuda_without_a_gpu_is_refused(cuda_graph) -> None:
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="torch sees no CUDA device"):
        cuda_graph.make_sampler(1000, 4, "cuda")


# --- GPU ------------------------------------------------------------------------------------

@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("batch", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("vocab", [1000, 32000])
def test_graph_tokens_equal_eager_tokens(cuda_graph, batch: int, vocab: int) -> None:
    sampler = cuda_graph.CudaGraphSampler(vocab, 16)
    eager = ZeroCheckSampler()
    gen = torch.Generator(device="cuda").manual_seed(batch)
    for step in range(3):
        logits = torch.randn(batch, vocab, device="cuda", generator=gen) * 3
        params = mixed_params(batch, 1000 * batch)
        history = [[3, 5, 5, 7 + b] for b in range(batch)]
        before = logits.clone()
        graph_out = sampler.sample(logits, params, history, step)
        eager_out = eager.sample(logits, params, history, step)
        assert torch.equal(logits, before), "logits modified"
        assert graph_out.errors == eager_out.errors == [None] * batch
        assert torch.equal(graph_out.tokens.cpu(), eager_out.tokens.cpu()), (batch, vocab, step)
    assert sampler.replays == 3 and sampler.eager_calls == 0
    assert sampler.buckets == [1, 2, 4, 8, 16]


@pytest.mark.gpu
@needs_cuda
def test_replays_count_and_ineligible_batches_run_eager(cuda_graph) -> None:
    sampler = cuda_graph.make_sampler(4096, 8, "cuda")
    assert isinstance(sampler, cuda_graph.CudaGraphSampler)
    logits = torch.randn(3, 4096, device="cuda")
    sampler.sample(logits, [SamplingParams(top_k=5, seed=1)] * 3)
    sampler.sample(logits, [SamplingParams(temperature=0.0)] * 3)
    assert (sampler.replays, sampler.eager_calls) == (2, 0)
    dense = [SamplingParams(top_p=0.9, seed=2)] * 3  # dense top-p: the graph's dense step
    out = sampler.sample(logits, dense)
    assert (sampler.replays, sampler.eager_calls) == (3, 0)
    assert torch.equal(out.tokens, ZeroCheckSampler().sample(logits, dense).tokens)
    out = sampler.sample(logits, [SamplingParams(top_k=100, seed=2)] * 3)  # top-k past max_top_k: eager
    assert sampler.eager_calls == 1
    tied = logits.clone()
    tied[:, :10] = 50.0  # ties past the top-k candidates: replay, then eager
    out = sampler.sample(tied, [SamplingParams(top_k=3, seed=3)] * 3)
    assert (sampler.eager_calls, sampler.eager_rows) == (1, 3) and set(out.tokens.tolist()) <= set(range(10))


@pytest.mark.gpu
@needs_cuda
def test_graph_nan_and_posinf_rows(cuda_graph) -> None:
    sampler = cuda_graph.CudaGraphSampler(1000, 4)
    logits = torch.randn(4, 1000, device="cuda")
    logits[1, 5] = math.nan
    logits[2, 700] = math.inf
    params = [SamplingParams(top_k=5, seed=b) for b in range(4)]
    out = sampler.sample(logits, params)
    eager = ZeroCheckSampler().sample(logits, params)
    assert out.errors[1] is not None and out.errors[0] is None and out.errors[2] is None
    assert int(out.tokens[2]) == 700
    assert out.tokens.tolist() == eager.tokens.tolist()


@pytest.mark.gpu
@needs_cuda
def test_graph_distribution_matches_reference(cuda_graph) -> None:
    from scipy.stats import chisquare
    vocab, draws, batch = 300, 20_000, 250
    rng = np.random.default_rng(0)
    row = rng.normal(-14, 0.5, vocab).astype(np.float32)
    row[rng.choice(vocab, 60, replace=False)] = rng.uniform(-2.5, 0, 60)
    params = SamplingParams(top_k=40, top_p=0.9, temperature=0.8)
    probs = reference_probs(row, params)
    sampler = cuda_graph.CudaGraphSampler(vocab, batch)
    logits = torch.from_numpy(row).to("cuda").unsqueeze(0).repeat(batch, 1)
    tokens = np.concatenate([
        sampler.sample(logits, [replace(params, seed=start + b) for b in range(batch)]).tokens.cpu().numpy()
        for start in range(0, draws, batch)])
    assert sampler.replays == draws // batch
    counts = np.bincount(tokens, minlength=vocab)
    support = probs > 0
    assert counts[~support].sum() == 0
    assert (counts[support] > 0).all() and probs[support].min() >= 1e-3
    assert chisquare(counts[support], probs[support] * draws).pvalue > 1e-3
