"""KV cache pool and the batched cached step: parity with full recomputation, slots, errors."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from zerocheck.build import BuildOptions, build_artifacts
from zerocheck.decoder import (
    DecoderEngine,
    KVCachePool,
    PoolFullError,
    SequenceTooLongError,
    StepRequest,
    Transformer,
    load_decoder,
    load_transformer,
)
from zerocheck.decoder.errors import DecoderError


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts")
    options = BuildOptions(model="tiny", vocab_size=512, layers=2, hidden=64, heads=4, kv_heads=2, max_seq_len=32,
                           tokenizer_corpus_files=20)
    build_artifacts(options, out)
    return out


@pytest.fixture
def engine(artifacts: Path) -> DecoderEngine:
    return load_decoder(artifacts, backend="torch", max_slots=4, dtype="fp32")


@pytest.fixture(scope="module")
def model(artifacts: Path) -> Transformer:
    return load_transformer(artifacts / "hf_model")


def full_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """Last-position logits [V] recomputed without any cache."""
    config, t = model.config, len(ids)
    mask = torch.cat([torch.zeros(t, 1, dtype=torch.bool), torch.ones(t, t, dtype=torch.bool).tril()], dim=-1)[None]
    empty = torch.zeros(config.num_layers, 1, config.num_kv_heads, 1, config.head_dim)
    with torch.no_grad():
        return model(torch.tensor([ids]), torch.arange(t)[None], mask, torch.tensor([t - 1]), empty, empty)[0][0]


def test_mixed_prefill_and_decode_rows_match_recomputation(engine: DecoderEngine, model: Transformer) -> None:
    prompts = {"a": [1, 2, 3, 4, 5, 6, 7], "b": [9, 8], "c": [100, 200, 300, 400]}
    history = {seq: list(ids) for seq, ids in prompts.items()}
    engine.step([StepRequest("a", prompts["a"], start=True, end=False)])
    engine.step([StepRequest("b", prompts["b"], start=True, end=False)])
    # one step: a decodes 1 token, b appends 3 tokens, c prefills 4
    rows = [StepRequest("a", [11], False, False), StepRequest("b", [12, 13, 14], False, False),
            StepRequest("c", prompts["c"], True, False)]
    history["a"] += [11]
    history["b"] += [12, 13, 14]
    for _ in range(3):
        result = engine.step(rows)
        assert result.messages == [None, None, None]
        for row, logits in zip(rows, result.logits):
            torch.testing.assert_close(logits, full_logits(model, history[row.seq_id]), atol=1e-4, rtol=0)
        next_tokens = [int(logits.argmax()) for logits in result.logits]
        rows = [StepRequest(row.seq_id, [token], False, False) for row, token in zip(rows, next_tokens)]
        for row in rows:
            history[row.seq_id] += row.tokens
    assert {seq: engine.pool.state(seq).length for seq in history} == {seq: len(h) - 1 for seq, h in history.items()}


def test_end_releases_and_slots_are_reused(engine: DecoderEngine, model: Transformer) -> None:
    for round_ in range(6):  # more sequences than the 4 slots, one after another
        ids = [round_ + 1, 50, 60]
        result = engine.step([StepRequest(f"seq{round_}", ids, start=True, end=True)])
        assert result.messages == [None]
        torch.testing.assert_close(result.logits[0], full_logits(model, ids), atol=1e-4, rtol=0)
        assert engine.pool.in_use == 0


def test_pool_full(engine: DecoderEngine) -> None:
    engine.step([StepRequest(f"s{i}", [1, 2], True, False) for i in range(4)])
    result = engine.step([StepRequest("late", [1], True, False), StepRequest("s0", [3], False, False)])
    assert result.messages == ["KV cache pool full: 4/4 slots in use", None]
    engine.release("s0")
    engine.release("s0")  # not held any more: no error
    assert engine.step([StepRequest("late", [1], True, False)]).messages == [None]


def test_sequence_too_long(engine: DecoderEngine) -> None:
    result = engine.step([StepRequest("abc", list(range(33)), True, False), StepRequest("ok", [1], True, False)])
    assert result.messages == ["sequence 'abc' would reach 33 tokens, max_seq_len is 32", None]
    engine.step([StepRequest("x", list(range(31)), True, False)])
    assert engine.step([StepRequest("x", [1], False, False)]).messages == [None]
    assert engine.step([StepRequest("x", [1], False, False)]).messages == [
        "sequence 'x' would reach 33 tokens, max_seq_len is 32"
    ]
    assert issubclass(PoolFullError, DecoderError) and issubclass(SequenceTooLongError, DecoderError)


def test_bad_rows_do_not_disturb_good_rows(engine: DecoderEngine, model: Transformer) -> None:
    result = engine.step([
        StepRequest("ghost", [1], False, False),
        StepRequest("good", [4, 5, 6], True, False),
        StepRequest("empty", [], True, False),
        StepRequest("oov", [512], True, False),
        StepRequest("good", [7], False, False),
    ])
    assert result.messages[0].startswith("sequence 'ghost' holds no KV cache slot")
    assert result.messages[1:] == [None, "sequence 'empty': tokens is empty", "sequence 'oov': token id 512 outside [0, 512)",
                                 "sequence 'good' appears more than once in one step"]
    torch.testing.assert_close(result.logits[1], full_logits(model, [4, 5, 6]), atol=1e-4, rtol=0)
    assert engine.pool.in_use == 1
    assert engine.step([StepRequest("good", [4], True, False)]).messages == [
        "sequence 'good' is already started; release it before starting again"
    ]


def test_a_failed_forward_fails_only_its_rows(artifacts: Path, model: Transformer) -> None:
    """The fault knob fails every forward holding token 13: the batch falls back to one forward per
    row, so the good rows get their logits and the KV caches stay consistent."""
    engine = load_decoder(artifacts, backend="torch", max_slots=4, fail_token=13, dtype="fp32")
    engine.step([StepRequest("good", [4, 5], True, False), StepRequest("bad", [6, 7], True, False)])
    result = engine.step([StepRequest("good", [8], False, False), StepRequest("bad", [13], False, False),
                          StepRequest("new", [13, 2], True, False), StepRequest("fresh", [3, 4], True, False)])
    fault = "test fault: token 13 in a step's input"
    assert result.messages == [None, fault, fault, None]
    torch.testing.assert_close(result.logits[0], full_logits(model, [4, 5, 8]), atol=1e-4, rtol=0)
    torch.testing.assert_close(result.logits[3], full_logits(model, [3, 4]), atol=1e-4, rtol=0)
    assert engine.pool.state("new") is None and engine.pool.state("bad").length == 2  # nothing written
    result = engine.step([StepRequest("good", [9], False, False), StepRequest("bad", [1], False, True)])
    torch.testing.assert_close(result.logits[1], full_logits(model, [6, 7, 1]), atol=1e-4, rtol=0)
    assert engine.pool.state("bad") is None and result.messages == [None, None]


def test_release_only_rows(engine: DecoderEngine) -> None:
    engine.step([StepRequest("a", [1, 2], True, False)])
    result = engine.step([StepRequest("a", [], False, True), StepRequest("never", [], False, True)])
    assert result.messages == [None, None] and engine.pool.in_use == 0


def test_idle_reclaim() -> None:
    clock = FakeClock()
    pool = KVCachePool(num_layers=1, num_kv_heads=1, head_dim=2, max_slots=2, max_seq_len=8, idle_timeout_s=10.0, clock=clock)
    first, _ = pool.acquire("a"), pool.acquire("b")
    with pytest.raises(PoolFullError, match="2/2 slots"):
        pool.acquire("c")
    clock.now = 5.0
    pool.write(first, torch.ones(1, 1, 1, 2), torch.ones(1, 1, 1, 2))  # a stepped at t=5
    clock.now = 12.0
    assert pool.reclaim_idle() == ["b"]
    assert pool.acquire("c").slot == 1  # b's slot
    assert pool.reclaim_idle(now=15.0) == ["a"]


def test_engine_reclaims_idle_sequences_before_a_step(artifacts: Path) -> None:
    engine = load_decoder(artifacts, backend="torch", max_slots=1, idle_timeout_s=30.0, dtype="fp32")
    clock = FakeClock()
    engine.pool.clock = clock
    engine.step([StepRequest("stale", [1], True, False)])
    clock.now = 31.0
    assert engine.step([StepRequest("fresh", [1], True, False)]).messages == [None]
    assert engine.step([StepRequest("stale", [2], False, False)]).messages[0].startswith("sequence 'stale' holds no KV")


def test_nbytes_is_what_the_config_implies(engine: DecoderEngine) -> None:
    # 2 (K and V) * layers 2 * slots 4 * kv heads 2 * max_seq_len 32 * head_dim 16 * 4 bytes
    assert engine.pool.nbytes == 2 * 2 * 4 * 2 * 32 * 16 * 4
    assert engine.pool.keys[0].shape == (4, 2, 32, 16)
    assert "0.1 MiB" in engine.pool.describe()
