"""The decoder model's logic without Triton: the zero-check sampler fused after the forward, per-row errors."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from zerocheck.build import BuildOptions, build_artifacts
from zerocheck.decoder import StepRequest, load_decoder
from zerocheck.sampling import SamplingParams, ZeroCheckSampler
from zerocheck.sampling.cuda_graph import make_sampler
from zerocheck.serving.decoder_service import DecoderService, StepRows, parse_step_rows
from zerocheck.api.errors import InternalError, InvalidRequest, Overloaded
from zerocheck.serving.sampler_inputs import SamplerRow


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts")
    build_artifacts(BuildOptions(model="tiny", vocab_size=512, layers=1, hidden=32, heads=2, kv_heads=1, max_seq_len=32, onnx=False,
                                 tokenizer_corpus_files=5), out)
    return out


def service(artifacts: Path, max_slots: int = 8) -> DecoderService:
    engine = load_decoder(artifacts, backend="torch", max_slots=max_slots, dtype="fp32")
    return DecoderService(engine, make_sampler(engine.vocab_size, 8, "cpu"))


def row(params: SamplingParams, step: int = 0) -> SamplerRow:
    return SamplerRow(params, [], step)


def test_sampled_tokens_are_the_samplers_tokens_on_the_same_logits(artifacts: Path) -> None:
    fused, reference = service(artifacts), service(artifacts)
    params = [SamplingParams(temperature=0.0), SamplingParams(top_k=20, top_p=0.9, seed=3)]
    steps = [StepRequest("a", [1, 2, 3], True, False), StepRequest("b", [4, 5], True, False)]
    (answer,) = fused.run([StepRows(steps, [row(p) for p in params], want_logits=False)])
    logits = reference.engine.step(steps).logits
    expected = ZeroCheckSampler().sample(logits, params, [[], []], [0, 0]).tokens
    assert answer.outputs["output_id"].reshape(-1).tolist() == expected.tolist()
    assert "logits" not in answer.outputs and answer.errors == [None, None]
    assert fused.forward_s > 0 and fused.sample_s > 0


def test_logits_and_tokens_per_request_and_rows_fail_alone(artifacts: Path) -> None:
    svc = service(artifacts, max_slots=2)
    requests = [
        StepRows([StepRequest("ghost", [1], False, False), StepRequest("x", [7, 8], True, False)],
                 [row(SamplingParams(temperature=0.0))] * 2, want_logits=False),
        StepRows([StepRequest("y", [9], True, False)]),  # logits only (the checked chain samples elsewhere)
        StepRows([StepRequest("z", [3], True, False)], [row(SamplingParams(temperature=0.0))], want_logits=False),
    ]
    ghost, logits_only, full = svc.run(requests)
    assert isinstance(ghost.errors[0], InvalidRequest) and "holds no KV cache slot" in str(ghost.errors[0])
    assert ghost.errors[1] is None and ghost.outputs["output_id"].shape == (2, 1)
    assert logits_only.outputs["logits"].shape == (1, 512) and "output_id" not in logits_only.outputs
    assert isinstance(full.errors[0], Overloaded) and "KV cache pool full" in str(full.errors[0])


def test_nan_logits_fail_their_row(artifacts: Path) -> None:
    svc = service(artifacts)

    class NanRowSampler:
        def sample(self, logits, params, history, step):
            x = logits.clone()
            x[1] = float("nan")
            return ZeroCheckSampler().sample(x, params, history, step)

    svc.sampler = NanRowSampler()
    (answer,) = svc.run([StepRows([StepRequest(s, [1], True, False) for s in "ab"],
                                  [row(SamplingParams(temperature=0.0))] * 2, want_logits=False)])
    assert answer.errors[0] is None and isinstance(answer.errors[1], InternalError)
    assert "logits contain NaN" in str(answer.errors[1])


def test_step_rows_strip_the_padding() -> None:
    arrays = {"sequence_id": np.array([[b"a"], [b"b"]], dtype=object),
              "input_ids": np.array([[1, 2, 3], [4, -1, -1]], np.int32),
              "sequence_start": np.array([[True], [False]]), "sequence_end": np.array([[False], [True]])}
    assert parse_step_rows(arrays) == [StepRequest("a", [1, 2, 3], True, False), StepRequest("b", [4], False, True)]
    with pytest.raises(InvalidRequest, match=r"input_ids must be INT32 of shape \[2, N\]"):
        parse_step_rows({**arrays, "input_ids": np.zeros((3, 1), np.int32)})
