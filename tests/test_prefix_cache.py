"""`PrefixCache` and the engine's reuse of cached prompt openings."""
from __future__ import annotations

import pytest
import torch

from zerocheck.decoder import StepRequest, load_decoder
from zerocheck.decoder.prefix_cache import PrefixCache


def kv(n: int, fill: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2, 1, n, 4), fill), torch.full((2, 1, n, 4), -fill)


def test_lookup_finds_the_longest_shared_opening_and_leaves_the_last_token() -> None:
    cache = PrefixCache(capacity_tokens=100, min_tokens=3)
    cache.store(list(range(10)), *kv(10, 1.0))
    cache.store([0, 1, 2, 3, 4, 50, 51], *kv(7, 2.0))
    entry, length = cache.lookup([0, 1, 2, 3, 4, 5, 6, 99])
    assert length == 7 and float(entry.keys[0, 0, 0, 0]) == 1.0
    entry, length = cache.lookup([0, 1, 2, 3, 4, 50, 51])  # the whole of a cached prompt: its last token is computed
    assert length == 6 and float(entry.keys[0, 0, 0, 0]) == 2.0
    assert cache.lookup([0, 1, 9, 9, 9]) == (None, 0)  # shares 2 < min_tokens
    assert cache.lookup([0, 1, 2]) == (None, 0)  # too short to leave a token after min_tokens
    assert cache.reused_tokens == 13


def test_least_recently_used_prompts_go_past_the_capacity() -> None:
    cache = PrefixCache(capacity_tokens=20, min_tokens=2)
    for first in (10, 20, 30):
        cache.store([first] * 8, *kv(8))
    assert len(cache) == 2 and cache.cached_tokens == 16  # the 10s went
    assert cache.lookup([10] * 9) == (None, 0)
    assert cache.lookup([20] * 9)[1] == 8  # now the most recent
    cache.store([40] * 8, *kv(8))  # the 30s go, not the 20s
    assert cache.lookup([30] * 9) == (None, 0) and cache.lookup([20] * 9)[1] == 8
    cache.store([50] * 30, *kv(30))  # longer than the whole cache: not kept
    assert cache.cached_tokens == 16 and cache.lookup([50] * 31) == (None, 0)


def test_stored_keys_and_values_are_copies() -> None:
    cache = PrefixCache(capacity_tokens=20, min_tokens=2)
    keys, values = kv(4, 1.0)
    cache.store([1, 2, 3, 4], keys, values)
    keys.fill_(7.0)
    entry, _ = cache.lookup([1, 2, 3, 4, 5])
    assert float(entry.keys.max()) == 1.0


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    from zerocheck.build import BuildOptions, build_artifacts

    root = tmp_path_factory.mktemp("prefix")
    build_artifacts(BuildOptions(model="tiny", vocab_size=512, layers=2, hidden=64, heads=4, kv_heads=2,
                                 max_seq_len=64, tokenizer_corpus_files=5), root)
    return root


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_prompt_opening_as_a_cached_one_decodes_as_without_the_cache(artifacts, dtype: str) -> None:
    """Prompt B shares 12 leading tokens with prompt A, served before it: B's first step computes only its
    last 6 tokens, and its logits over a few steps are those of an engine without a cache."""
    prompt_a, prompt_b = list(range(3, 20)), list(range(3, 15)) + [40, 41, 42, 43, 44, 45]
    runs = {}
    for tokens in (0, 256):
        engine = load_decoder(artifacts, backend="torch", max_slots=2, dtype=dtype, prefix_cache_tokens=tokens)
        engine.step([StepRequest("a", prompt_a, True, True)])  # prefill and release in one step
        logits, ids = [], []
        for i in range(4):
            step = engine.step([StepRequest("b", prompt_b if i == 0 else [ids[-1]], i == 0, False)])
            assert step.errors == [None]
            logits.append(step.logits[0])
            ids.append(int(step.logits[0].argmax()))
        runs[tokens] = (torch.stack(logits), ids, engine)
    reused = runs[256][2].prefix_cache
    assert reused.reused_tokens == 12 and len(reused) == 2
    assert runs[256][1] == runs[0][1]
    torch.testing.assert_close(runs[256][0], runs[0][0], rtol=0, atol=1e-4 if dtype == "fp32" else 0.05)
