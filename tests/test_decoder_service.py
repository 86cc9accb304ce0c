"""The decoder model's logic without Triton: the sequence table (sampling registered once, history kept
with the KV slot), the zero-check sampler fused after the forward, the checked chain's exports, per-row errors."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from zerocheck.api.errors import InternalError, InvalidRequest, Overloaded
from zerocheck.build import BuildOptions, build_artifacts
from zerocheck.decoder import StepRequest, load_decoder
from zerocheck.decoder.service import DecoderService, StepRows
from zerocheck.sampling import SamplingParams, ZeroCheckSampler
from zerocheck.sampling.cuda_graph import make_sampler
from zerocheck.wire.sampling import parse_sampler_rows
from zerocheck.wire.step import Registration, StepRow, parse_step

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts")
    build_artifacts(BuildOptions(model="tiny", vocab_size=512, layers=1, hidden=32, heads=2, kv_heads=1, max_seq_len=32,
                                 tokenizer_corpus_files=5), out)
    return out


def service(artifacts: Path, max_slots: int = 8) -> DecoderService:
    engine = load_decoder(artifacts, backend="torch", max_slots=max_slots, dtype="fp32")
    return DecoderService(engine, make_sampler(engine.vocab_size, 8, "cpu"))


def start(seq_id: str, tokens: list[int], params: SamplingParams = GREEDY, **registration) -> StepRow:
    return StepRow(seq_id, tokens, True, False, Registration(params, **registration))


def then(seq_id: str, tokens: list[int], end: bool = False) -> StepRow:
    return StepRow(seq_id, tokens, False, end)


def tokens(answer) -> list[int]:
    return answer.outputs["output_id"].reshape(-1).tolist()


def test_sampled_tokens_are_the_samplers_tokens_on_the_same_logits(artifacts: Path) -> None:
    fused, reference = service(artifacts), service(artifacts)
    params = [GREEDY, SamplingParams(top_k=20, top_p=0.9, seed=3)]
    rows = [start("a", [1, 2, 3], params[0]), start("b", [4, 5], params[1])]
    (answer,) = fused.run([StepRows(rows, want_token=True, want_logits=False)])
    logits = reference.engine.step([StepRequest(r.seq_id, r.tokens, True, False) for r in rows]).logits
    expected = ZeroCheckSampler().sample(logits, params, [[], []], [0, 0]).tokens
    assert tokens(answer) == expected.tolist()
    assert "logits" not in answer.outputs and answer.errors == [None, None]
    assert fused.forward_s > 0 and fused.sample_s > 0


def test_registered_sampling_and_history_serve_every_later_step(artifacts: Path) -> None:
    """Steps after the first carry one id; the draw is the sampler's with the full history (prompt +
    generated), the registered params and the step count, as if each step had sent them all."""
    params = SamplingParams(temperature=0.8, top_k=40, repetition_penalty=1.3, presence_penalty=0.5,
                            frequency_penalty=0.25, bad_words=((7, 8), (9,)), seed=5)
    svc, reference = service(artifacts), service(artifacts)
    prompt = [3, 7, 3, 11]
    (answer,) = svc.run([StepRows([start("s", prompt, params)], want_token=True)])
    history, drawn = list(prompt), tokens(answer)
    expected = ZeroCheckSampler().sample(reference.engine.step([StepRequest("s", prompt, True, False)]).logits,
                                         [params], [history], [0]).tokens.tolist()
    assert drawn == expected
    for step in range(1, 6):
        (answer,) = svc.run([StepRows([then("s", drawn)], want_token=True)])
        history += drawn
        logits = reference.engine.step([StepRequest("s", drawn, False, False)]).logits
        expected = ZeroCheckSampler().sample(logits, [params], [history], [step]).tokens.tolist()
        drawn = tokens(answer)
        assert drawn == expected, step
    assert list(svc.table.get("s").history) == history


def test_min_tokens_bans_the_end_ids_until_then(artifacts: Path) -> None:
    svc = service(artifacts)
    probe = service(artifacts)
    (first,) = probe.run([StepRows([start("p", [1, 2])], want_token=True)])
    end = tokens(first)[0]  # the greedy token: made an end id, it must not come before min_tokens
    (answer,) = svc.run([StepRows([start("s", [1, 2], min_tokens=1, end_ids=(end,))], want_token=True)])
    assert tokens(answer) != [end]
    state = svc.table.get("s")
    assert (end,) in state.sampling.bad_words
    svc.run([StepRows([then("s", tokens(answer))], want_token=True)])
    assert state.step == 1 and state.sampling is state.params  # min_tokens reached: end ids allowed again


def test_prompt_chunks_sample_nothing_until_the_prompt_is_in(artifacts: Path) -> None:
    svc = service(artifacts)
    (first,) = svc.run([StepRows([start("s", [1, 2, 3], prompt_length=5)], want_token=True)])
    assert tokens(first) == [-1] and first.errors == [None]
    (last,) = svc.run([StepRows([then("s", [4, 5])], want_token=True)])
    assert tokens(last)[0] >= 0 and svc.table.get("s").step == 0


def test_the_entry_goes_with_the_kv_slot(artifacts: Path) -> None:
    svc = service(artifacts, max_slots=2)
    svc.run([StepRows([start("a", [1]), start("b", [2]), start("c", [3])], want_token=True)])  # c: pool full
    assert len(svc.table) == 2 and svc.table.get("c") is None
    svc.run([StepRows([then("a", [4], end=True)], want_token=True)])  # the last step frees slot and entry
    assert svc.table.get("a") is None
    svc.run([StepRows([StepRow("b", [], False, True)])])  # release only
    assert len(svc.table) == 0 and svc.engine.pool.in_use == 0
    svc.run([StepRows([start("d", [1])], want_token=True)])
    svc.engine.pool.reclaim_idle(now=float("inf"))
    assert len(svc.table) == 0
    (answer,) = svc.run([StepRows([StepRow("e", [1], True, True, Registration(GREEDY))], want_token=True)])
    assert answer.errors == [None] and len(svc.table) == 0  # one-step sequence: started and ended at once


def test_logits_and_tokens_per_request_and_rows_fail_alone(artifacts: Path) -> None:
    svc = service(artifacts, max_slots=2)
    requests = [
        StepRows([then("ghost", [1]), start("x", [7, 8])], want_token=True, want_logits=False),
        StepRows([start("y", [9])]),  # logits only (the checked chain samples elsewhere)
        StepRows([start("z", [3])], want_token=True, want_logits=False),
    ]
    ghost, logits_only, full = svc.run(requests)
    assert isinstance(ghost.errors[0], InvalidRequest) and "holds no KV cache slot" in str(ghost.errors[0])
    assert ghost.errors[1] is None and ghost.outputs["output_id"].shape == (2, 1)
    assert logits_only.outputs["logits"].shape == (1, 512) and "output_id" not in logits_only.outputs
    assert isinstance(full.errors[0], Overloaded) and "KV cache pool full" in str(full.errors[0])


def test_the_checked_chain_reads_the_registered_rows(artifacts: Path) -> None:
    params = SamplingParams(temperature=0.75, top_p=0.875, repetition_penalty=1.25, bad_words=((4,),), seed=9,
                            logit_bias=((5, 1.0),))  # values exact in float32, the wire's type
    svc = service(artifacts)
    names = ("temperature", "top_p", "random_seed", "step", "history", "bad_words", "logit_bias_ids",
             "logit_bias_values", "repetition_penalty")
    svc.run([StepRows([start("s", [1, 2], params), start("t", [3])], exports=names)])
    (answer,) = svc.run([StepRows([then("s", [6]), then("t", [8])], exports=names)])
    rows = parse_sampler_rows(answer.outputs, 2, 512)
    assert rows[0].params == params
    assert replace(rows[1].params, seed=None) == GREEDY and rows[1].params.seed is not None  # unseeded: a fresh seed
    assert [r.history for r in rows] == [[1, 2, 6], []] and [r.step for r in rows] == [1, 1]


def test_nan_logits_fail_their_row(artifacts: Path) -> None:
    svc = service(artifacts)

    class NanRowSampler:
        def sample(self, logits, params, history, step):
            x = logits.clone()
            x[1] = float("nan")
            return ZeroCheckSampler().sample(x, params, history, step)

    svc.sampler = NanRowSampler()
    (answer,) = svc.run([StepRows([start(s, [1]) for s in "ab"], want_token=True, want_logits=False)])
    assert answer.errors[0] is None and isinstance(answer.errors[1], InternalError)
    assert "logits contain NaN" in str(answer.errors[1])


def test_step_rows_strip_the_padding() -> None:
    arrays = {"sequence_id": np.array([[b"a"], [b"b"]], dtype=object),
              "input_ids": np.array([[1, 2, 3], [4, -1, -1]], np.int32),
              "sequence_start": np.array([[True], [False]]), "sequence_end": np.array([[False], [True]])}
    assert parse_step(arrays) == [StepRow("a", [1, 2, 3], True, False, Registration(SamplingParams())),
                                  StepRow("b", [4], False, True)]
    with pytest.raises(InvalidRequest, match=r"input_ids must be INT32 of shape \[2, N\]"):
        parse_step({**arrays, "input_ids": np.zeros((3, 1), np.int32)})


def many(seq_id: str, token: int, steps: int, end: bool = False) -> StepRow:
    return StepRow(seq_id, [token], False, end, steps=steps)


def drawn_ids(answer) -> list[list[int]]:
    return [[t for t in row if t >= 0] for row in answer.outputs["output_ids"].tolist()]


PENALISED = SamplingParams(temperature=0.9, top_k=30, top_p=0.95, repetition_penalty=1.2, bad_words=((7,),), seed=41)


def test_a_multi_step_call_draws_what_one_step_calls_draw(artifacts: Path) -> None:
    """decode_steps: the decoder feeds each drawn token back itself; seeded sequences (penalties and bad words
    reading the history, a greedy row beside them) get the tokens of one-step calls, row by row."""
    single, multi = service(artifacts), service(artifacts)
    rows = [start("a", [1, 2, 3], PENALISED), start("b", [4, 5], GREEDY), start("c", [6], replace(PENALISED, seed=9))]
    first = [tokens(svc.run([StepRows(rows, want_token=True, want_logits=False)])[0]) for svc in (single, multi)]
    assert first[0] == first[1]
    expected = {seq_id: [token] for seq_id, token in zip("abc", first[0])}
    for _ in range(10):  # 11 tokens a row, as the multi-step calls below draw
        (answer,) = single.run([StepRows([then(s, expected[s][-1:]) for s in "abc"], want_token=True,
                                         want_logits=False)])
        for s, token in zip("abc", tokens(answer)):
            expected[s].append(token)
    got = {seq_id: [token] for seq_id, token in zip("abc", first[1])}
    for steps in ((4, 2, 3), (5, 3, 4), (1, 5, 3)):  # rows asking for different counts in one call
        (answer,) = multi.run([StepRows([many(s, got[s][-1], n) for s, n in zip("abc", steps)], want_token=True,
                                        want_logits=False)])
        assert answer.errors == [None] * 3
        for s, n, ids in zip("abc", steps, drawn_ids(answer)):
            assert len(ids) == n
            got[s] += ids
        assert answer.outputs["output_id"].reshape(-1).tolist() == [ids[0] for ids in drawn_ids(answer)]
    assert got == expected
    assert list(multi.table.get("a").history) == list(single.table.get("a").history)


def test_a_multi_step_row_stops_at_an_end_id_and_frees_a_slot_its_request_ended(artifacts: Path) -> None:
    svc, probe = service(artifacts), service(artifacts)
    (answer,) = probe.run([StepRows([start("p", [1, 2])], want_token=True, want_logits=False)])
    following = [tokens(answer)[0]]
    (answer,) = probe.run([StepRows([many("p", following[0], 3)], want_token=True, want_logits=False)])
    following += drawn_ids(answer)[0]  # greedy: what comes after the prompt
    end_id = following[2]
    for end in (False, True):
        seq = f"s{end}"
        svc.run([StepRows([start(seq, [1, 2], end_ids=(end_id,))], want_token=True, want_logits=False)])
        (answer,) = svc.run([StepRows([many(seq, following[0], 6, end=end)], want_token=True, want_logits=False)])
        assert drawn_ids(answer) == [following[1:3]]  # the end id is the row's last token
        assert (svc.engine.pool.state(seq) is None) == end


def test_sequence_end_applies_after_a_multi_step_rows_last_step(artifacts: Path) -> None:
    svc = service(artifacts)
    (answer,) = svc.run([StepRows([start("s", [1, 2, 3], PENALISED)], want_token=True, want_logits=False)])
    (answer,) = svc.run([StepRows([many("s", tokens(answer)[0], 4, end=True)], want_token=True, want_logits=False)])
    assert len(drawn_ids(answer)[0]) == 4 and answer.errors == [None]
    assert svc.engine.pool.state("s") is None and svc.table.get("s") is None


def test_multi_step_is_for_the_fused_sampler_only() -> None:
    rows = [many("s", 1, 2)]
    with pytest.raises(InvalidRequest, match="decode_steps > 1 needs the fused sampler"):
        StepRows(rows, want_token=True, want_logits=True)
    with pytest.raises(InvalidRequest, match="decode_steps > 1 needs the fused sampler"):
        StepRows(rows, want_token=True, want_logits=False, exports=("temperature",))
    StepRows(rows, want_token=True, want_logits=False)
