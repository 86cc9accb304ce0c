"""`ZeroCheckLogitsProcessor` driven as TensorRT-LLM's PyTorch backend drives a logits processor, without
tensorrt_llm: `zerocheck.trtllm.engine_loop` calls it (context requests then generation requests, a [1, 1, V] view
per request, token_ids = [prompt + generated], stream_ptr and client_id None) over zerocheck's own torch decoder of
a tiny model and reads each edited row out greedily, as the engine does at temperature 0."""
from __future__ import annotations

import inspect
import logging
import pickle
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

import conftest
from reference_sampling import reference_probs
from test_sampling_distribution import assert_matches_reference, assert_thresholds_clear, banned_head_row, peaked_row
from zerocheck.decoder import load_decoder
from zerocheck.decoder.service import DecoderService, StepRows
from zerocheck.sampling import SamplingParams, ZeroCheckSampler
from zerocheck.sampling.cuda_graph import make_sampler
from zerocheck.trtllm import ZeroCheckLogitsProcessor
from zerocheck.trtllm import processor as processor_module
from zerocheck.trtllm.engine_loop import DecoderForward, EngineLoop, EngineRequest, call_processors, check_signature
from zerocheck.wire.step import Registration, StepRow

# NVIDIA/TensorRT-LLM tensorrt_llm/sampling_params.py (commit 000a01de), class LogitsProcessor:
# `def __call__(self, req_id: int, logits: torch.Tensor, token_ids: List[List[int]], stream_ptr: Optional[int],
#  client_id: Optional[int]) -> None`
TRTLLM_CALL_PARAMETERS = ["self", "req_id", "logits", "token_ids", "stream_ptr", "client_id"]
LIMIT = 14
PROMPTS = {11: [1, 5, 7, 9], 12: [3, 3, 8], 13: [2, 40, 41, 42, 43, 44]}
PARAMS = {
    11: SamplingParams(temperature=0.9, seed=5),
    12: SamplingParams(top_k=20, top_p=0.9, temperature=0.8, repetition_penalty=1.3, presence_penalty=0.4,
                       frequency_penalty=0.2, bad_words=((7, 8), (9,)), seed=9),
    13: SamplingParams(min_p=0.05, logit_bias=((5, 2.0), (6, -1.5)), seed=2**63 + 17),
}


@pytest.fixture(scope="module")
def artifacts() -> Path:
    return conftest.test_artifacts_dir()


def engine_of(artifacts: Path):
    return load_decoder(artifacts, backend="torch", max_slots=8, dtype="fp32")


def service_tokens(svc: DecoderService, seq_id: str, prompt: list[int], registration: Registration) -> list[int]:
    """zerocheck's own generation loop: a start row, then each drawn token fed back, until an end id or LIMIT."""
    (answer,) = svc.run([StepRows([StepRow(seq_id, prompt, True, False, registration)], want_token=True,
                                  want_logits=False)])
    out = answer.outputs["output_id"].reshape(-1).tolist()
    while out[-1] not in registration.end_ids and len(out) < LIMIT:
        (answer,) = svc.run([StepRows([StepRow(seq_id, [out[-1]], False, False)], want_token=True, want_logits=False)])
        assert answer.errors == [None], answer.errors
        out += answer.outputs["output_id"].reshape(-1).tolist()
    svc.run([StepRows([StepRow(seq_id, [], False, True)], want_token=True, want_logits=False)])
    return out


def processor_tokens(loop: EngineLoop, req_id: int, prompt: list[int], params: SamplingParams, min_tokens: int = 0,
                     end_ids: tuple[int, ...] = ()) -> list[int]:
    request = EngineRequest(req_id, prompt, [ZeroCheckLogitsProcessor(params, min_tokens, end_ids)], LIMIT,
                            frozenset(end_ids))
    return loop.run([request])[req_id]


def test_call_signature_is_tensorrt_llms() -> None:
    assert list(inspect.signature(ZeroCheckLogitsProcessor.__call__).parameters) == TRTLLM_CALL_PARAMETERS
    processor = ZeroCheckLogitsProcessor(SamplingParams(seed=1))
    check_signature(processor)  # the engine's check: 4 <= parameters <= 5
    assert len(inspect.signature(processor).parameters) == 5


def test_base_class_is_decided_at_import() -> None:
    if processor_module.importlib.util.find_spec("tensorrt_llm") is None:
        assert processor_module.LogitsProcessorBase is object
    else:  # pragma: no cover - only where tensorrt_llm is installed
        assert processor_module.LogitsProcessorBase.__name__ == "LogitsProcessor"


def test_seeded_requests_get_zerochecks_own_tokens(artifacts: Path) -> None:
    """Per request (alone, so both sides run the same forwards): the fake engine with the processor and greedy
    readout emits exactly the tokens of zerocheck's DecoderService for the same prompt and params, with penalties,
    bad words, logit bias, min-p, top-k/top-p, and min_tokens with end ids."""
    svc = DecoderService(engine_of(artifacts), make_sampler(600, 8, "cpu"))
    loop = EngineLoop(DecoderForward(engine_of(artifacts)))
    for req_id, prompt in PROMPTS.items():
        expected = service_tokens(svc, f"s{req_id}", prompt, Registration(PARAMS[req_id]))
        assert processor_tokens(loop, req_id, prompt, PARAMS[req_id]) == expected, req_id
    free = service_tokens(svc, "free", PROMPTS[11], Registration(PARAMS[11]))
    end = free[1]  # drawn at step 1 when nothing bans it
    registration = Registration(PARAMS[11], min_tokens=4, end_ids=(end, 599))
    expected = service_tokens(svc, "min", PROMPTS[11], registration)
    assert end not in expected[:4] and len(expected) >= 4
    assert processor_tokens(loop, 21, PROMPTS[11], PARAMS[11], 4, (end, 599)) == expected
    early_stop = service_tokens(svc, "stop", PROMPTS[11], Registration(PARAMS[11], end_ids=(end,)))
    assert early_stop == free[:2]
    assert processor_tokens(loop, 22, PROMPTS[11], PARAMS[11], 0, (end,)) == early_stop


class RecordingForward(DecoderForward):
    """Keeps each forward's rows (before the processors edit them) with the requests they belong to."""

    def __init__(self, engine) -> None:
        super().__init__(engine)
        self.calls: list[tuple[list[tuple[int, list[int]]], torch.Tensor]] = []

    def __call__(self, context, generation):
        logits = super().__call__(context, generation)
        self.calls.append(([(r.req_id, r.get_tokens()) for r in [*context, *generation]], logits.clone()))
        return logits


def test_batched_context_and_generation_rows_each_get_their_own_draw(artifacts: Path) -> None:
    """Requests arriving while others generate (context and generation rows in one forward): every row's
    emitted token is zerocheck's sampler's draw on that row's logits with its request's params, history and step."""
    forward = RecordingForward(engine_of(artifacts))
    loop = EngineLoop(forward)
    requests = [EngineRequest(req_id, PROMPTS[req_id], [ZeroCheckLogitsProcessor(PARAMS[req_id])], LIMIT)
                for req_id in PROMPTS]
    tokens = loop.run(requests, arrivals=[0, 2, 3])
    sampler = ZeroCheckSampler(compiled=True)
    checked = 0
    for rows, logits in forward.calls:
        assert len({req_id for req_id, _ in rows}) == len(rows)
        for r, (req_id, ids) in enumerate(rows):
            prompt = PROMPTS[req_id]
            step = len(ids) - len(prompt)
            drawn = sampler.sample(logits[r:r + 1], [PARAMS[req_id]], [ids], [step]).tokens.item()
            assert tokens[req_id][step] == drawn, (req_id, step)
            checked += 1
    assert checked == sum(len(t) for t in tokens.values()) and loop.forwards == len(forward.calls)
    assert any(len(rows) == 3 for rows, _ in forward.calls)  # one forward held a context row and generation rows


def test_mask_is_one_hot_in_place_and_a_repeated_call_draws_the_same() -> None:
    """The row keeps one finite value, 0 at the drawn token, in fp32, fp16 and bf16; a second call at the same
    step (a chunked prompt's next chunk) draws the same token."""
    base = torch.from_numpy(peaked_row(1000, 3, head=60))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        processor = ZeroCheckLogitsProcessor(SamplingParams(top_k=40, seed=4))
        drawn = []
        for _ in range(2):
            logits = base.to(dtype).view(1, 1, -1).clone()
            processor(7, logits, [[1, 2, 3]], None, None)
            finite = torch.isfinite(logits.float()).nonzero()
            assert finite.shape[0] == 1 and logits[0, 0, finite[0, 2]].item() == 0.0
            drawn.append(int(logits.argmax()))
        assert drawn[0] == drawn[1]


def test_processor_pickles_midway_and_continues_its_draws() -> None:
    """The LLM API sends SamplingParams (and the processor in it) to its worker process."""
    row = torch.from_numpy(peaked_row(1000, 5, head=100))
    params = SamplingParams(top_p=0.9, repetition_penalty=1.2, seed=3)

    def step(processor, ids):
        logits = row.clone().view(1, 1, -1)
        processor(1, logits, [ids], None, None)
        return int(logits.argmax())

    first, copy = ZeroCheckLogitsProcessor(params), None
    ids = [4, 5, 6]
    for k in range(6):
        if k == 3:
            copy = pickle.loads(pickle.dumps(first))
        token = step(first, ids)
        if copy is not None:
            assert step(copy, ids) == token
        ids = ids + [token]


def test_unseeded_request_gets_one_seed_for_its_life() -> None:
    processor = ZeroCheckLogitsProcessor(SamplingParams(top_k=50))
    assert processor.params.seed is not None and processor.early is processor.params


def test_overlap_schedulers_lagging_token_ids_are_reported(artifacts: Path, caplog) -> None:
    """With the overlap scheduler on, token_ids lag one token behind the engine: the processor cannot draw
    zerocheck's tokens, and says so."""
    loop = EngineLoop(DecoderForward(engine_of(artifacts)), lag=True)
    processors = [ZeroCheckLogitsProcessor(replace(PARAMS[11], seed=s)) for s in range(4)]
    with caplog.at_level(logging.WARNING, logger="zerocheck.trtllm"):
        loop.run([EngineRequest(40 + i, PROMPTS[11], [p], LIMIT) for i, p in enumerate(processors)])
    assert sum(p.mismatches for p in processors) > 0
    assert "disable_overlap_scheduler=True" in caplog.text


DRAWS = 4000
CASES = [  # (name, row, params, history, logits dtype)
    ("top_p_0.9_dense_V300", lambda: peaked_row(300, 4, head=80), SamplingParams(top_p=0.9), [], torch.float32),
    ("top_k_40_bf16_V1000", lambda: peaked_row(1000, 2, head=60), SamplingParams(top_k=40), [], torch.bfloat16),
    ("min_p_T_bf16_V300", lambda: peaked_row(300, 6, head=60, spread=4.5),
     SamplingParams(min_p=0.05, temperature=1.3), [], torch.bfloat16),
    ("penalties_bad_words_top_k_V1000", banned_head_row,
     SamplingParams(top_k=30, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.2,
                    bad_words=((17, 5), (3,))),
     [int(t) for t in np.argsort(-banned_head_row())[2:6]] * 2 + [17], torch.float32),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_draws_through_the_processor_match_the_reference_distribution(case) -> None:
    """DRAWS requests, each with its own seed and processor, one row each in one forward's logits (the history is
    each request's prompt, step 0): the greedy readout of the edited rows is chi-square-close to the float64
    reference of the row as the engine hands it (bf16 rows: the reference of the rounded values)."""
    name, make_row, params, history, dtype = case
    logits = torch.from_numpy(make_row()).to(dtype)
    row = logits.float().numpy()
    assert_thresholds_clear(row, params, history)
    requests = [EngineRequest(i, list(history), [ZeroCheckLogitsProcessor(replace(params, seed=7_000_003 + i))])
                for i in range(DRAWS)]
    batch = logits.unsqueeze(0).repeat(DRAWS, 1)
    call_processors(requests, batch)
    tokens = batch.argmax(-1).numpy()
    assert (torch.isfinite(batch.float()).sum(-1) == 1).all()
    assert_matches_reference(tokens, reference_probs(row, params, history), name, exact_support=False)
