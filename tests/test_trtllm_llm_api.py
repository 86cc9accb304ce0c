"""The trtllm flavor's `tensorrt_llm` model (zerocheck.trtllm.llm_api, model_repository_trtllm/) without TensorRT-LLM:
the version check, tensorrtllm_backend's token inputs turned into zerocheck's sampling and the LLM API's
SamplingParams arguments, whole requests served over a stand-in for `LLM.generate_async` (streaming, stop words,
end ids, max_tokens, cancellation, engine failures), the flavor's config against the default door's, the Docker
flavor, and the model's load refusing cleanly where tensorrt_llm is not installed."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import conftest
from test_model_repository import config as default_config, tensors
from zerocheck.api.errors import InvalidRequest
from zerocheck.api.request import Limits
from zerocheck.generate.sequence import Sequence
from zerocheck.generate.service import GenerateService
from zerocheck.tokenizer import load_tokenizer
from zerocheck.triton.config import ConfigError, ModelConfig, parameters
from zerocheck.trtllm import ZeroCheckLogitsProcessor
from zerocheck.trtllm import llm_api
from zerocheck.trtllm.llm_api import (Answers, LlmApiParameters, LlmApiScheduler, TokenModel, UnsupportedTensorRTLLM,
                                      check_tensorrt_llm_version, llm_arguments, sampling_arguments)

ROOT = Path(__file__).resolve().parents[1]
FLAVOR = ROOT / "model_repository_trtllm"
PROMPT = [74, 71, 78, 78, 81]
LIMITS = Limits(max_prompt_tokens=64, max_output_tokens=64, max_context=128)


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(conftest.test_artifacts_dir())


def token_request(ids=PROMPT, **fields) -> dict[str, np.ndarray]:
    """A tensorrt_llm request as tensorrtllm_backend's clients send it: [1, ...] arrays."""
    arrays = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32)}
    for name, value in fields.items():
        if name in ("stop_words_list", "bad_words_list"):
            flat = [token for word in value for token in word]
            offsets = list(np.cumsum([len(word) for word in value]))
            arrays[name] = np.array([[flat, offsets + [-1] * (len(flat) - len(offsets))]], np.int32)
        else:
            dtype = {bool: bool, float: np.float32, int: np.int32}[type(value)]
            arrays[name] = np.array([[value]], dtype if name not in ("seed", "random_seed") else np.uint64)
    return arrays


class EngineRequest:
    """One stand-in engine request: streams cumulative outputs; records abort()."""

    def __init__(self, outputs: list, hang: bool) -> None:
        self.outputs, self.hang, self.finished, self.aborted = outputs, hang, False, False

    def abort(self) -> None:
        self.aborted = True

    async def __aiter__(self):
        for output in self.outputs:
            await asyncio.sleep(0)
            self.finished = output.finished
            yield output
        if self.hang:
            await asyncio.Event().wait()  # the engine's next output never comes


def output(ids: list[int], finished: bool, reason: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(finished=finished, outputs=[SimpleNamespace(token_ids=list(ids), finish_reason=reason)])


class StandInEngine:
    """`LLM.generate_async` stood in for, one request per call, as `LlmApiScheduler` calls it. With `script`, each
    request streams those token chunks (finishing with `reason` unless `hang`); without it, the engine's greedy
    loop: seeded random logits [1, 1, V] through the request's logits processor (the PyTorch backend's call), the
    argmax taken, stopping at max_tokens ("length") or end_id ("stop", the end token left out)."""

    def __init__(self, script: list[list[int]] | None = None, reason: str = "length", hang: bool = False,
                 fail: Exception | None = None, vocab: int = 600) -> None:
        self.script, self.reason, self.hang, self.fail, self.vocab = script, reason, hang, fail, vocab
        self.calls: list[tuple[list[int], dict]] = []
        self.requests: list[EngineRequest] = []

    def __call__(self, prompt_ids: list[int], arguments: dict) -> EngineRequest:
        self.calls.append((prompt_ids, arguments))
        if self.fail is not None:
            raise self.fail
        request = EngineRequest(self._script_outputs() if self.script is not None
                                else self._greedy_outputs(len(self.calls), prompt_ids, arguments), self.hang)
        self.requests.append(request)
        return request

    def _script_outputs(self) -> list:
        ids, outputs = [], []
        for index, chunk in enumerate(self.script):
            ids += chunk
            last = index == len(self.script) - 1 and not self.hang
            outputs.append(output(ids, last, self.reason if last else None))
        return outputs

    def _greedy_outputs(self, req_id: int, prompt: list[int], arguments: dict) -> list:
        generator = torch.Generator().manual_seed(1234)
        generated, outputs = [], []
        while True:
            logits = torch.randn(1, 1, self.vocab, generator=generator)
            arguments["logits_processor"](req_id, logits, [prompt + generated], None, None)
            token = int(logits.argmax())
            if token == arguments.get("end_id"):
                outputs.append(output(generated, True, "stop"))
                return outputs
            generated.append(token)
            done = len(generated) == arguments["max_tokens"]
            outputs.append(output(generated, done, "length" if done else None))
            if done:
                return outputs


def model(tokenizer, engine: StandInEngine) -> TokenModel:
    service = GenerateService(tokenizer, LlmApiScheduler(engine, cancel_poll_s=0.01), LIMITS, max_active=4,
                              max_queue=4)
    return TokenModel(service)


def serve(token_model: TokenModel, arrays: dict, parameters: dict | None = None, request_id: str = "",
          cancelled=lambda: False) -> list:
    """Serve one request; its responses as (arrays or None, final) and errors as ("error", exception)."""
    sent: list = []
    answers = Answers(lambda arrays, final: sent.append((arrays, final)), lambda error: sent.append(("error", error)))
    rows = token_model.prepare(arrays, parameters or {})
    asyncio.run(token_model.serve(request_id, rows, answers, cancelled))
    return sent


def ids_of(arrays: dict) -> list[int]:
    assert arrays["output_ids"].shape[:2] == (1, 1)  # [batch, beam, T]
    return arrays["output_ids"].reshape(-1).tolist()


# -- the version check ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("version", ["1.0.0", "1.0.0rc4", "1.1.0", "1.2.0rc2", "1.2.1"])
def test_a_supported_version_is_accepted(version: str) -> None:
    check_tensorrt_llm_version(version)


@pytest.mark.parametrize("version", ["0.21.0", "0.9.0", "1.3.0", "1.3.0rc1", "2.0.0", "unknown"])
def test_an_unsupported_version_is_refused_by_name(version: str) -> None:
    expected = rf"speaks TensorRT-LLM 1\.0, 1\.1 or 1\.2 .*; found TensorRT-LLM '{re.escape(version)}'"
    with pytest.raises(UnsupportedTensorRTLLM, match=expected):
        check_tensorrt_llm_version(version)


def test_a_missing_tensorrt_llm_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise llm_api.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(llm_api.importlib.metadata, "version", missing)
    with pytest.raises(UnsupportedTensorRTLLM, match="the tensorrt_llm package.*not installed.*FLAVOR=trtllm"):
        llm_api.installed_tensorrt_llm_version()


# -- request conversion --------------------------------------------------------------------------------------------

def test_the_engine_runs_greedy_with_the_pytorch_backend_and_no_overlap_scheduler() -> None:
    params = parameters(LlmApiParameters, flavor_model_config())
    arguments = llm_arguments(Path("/artifacts/hf_model"), params)
    assert arguments == {"model": "/artifacts/hf_model", "backend": "pytorch", "disable_overlap_scheduler": True,
                         "dtype": "bfloat16", "max_batch_size": 64, "max_seq_len": 2048,
                         "kv_cache_config": {"free_gpu_memory_fraction": 0.5}}


def test_token_inputs_become_zerocheck_sampling_and_llm_api_arguments(tokenizer) -> None:
    token_model = model(tokenizer, StandInEngine())
    (row,) = token_model.prepare(token_request(
        request_output_len=12, temperature=0.7, runtime_top_k=40, runtime_top_p=0.9, repetition_penalty=1.2,
        presence_penalty=0.5, frequency_penalty=0.25, min_tokens=3, seed=7, end_id=5, streaming=True,
        stop_words_list=[[9, 10], [11]], bad_words_list=[[12]]), {})
    seq = Sequence(tokenizer, row.request, row.prompt_ids, row.path, LIMITS.max_context, index=1)
    arguments = sampling_arguments(seq)
    processor = arguments.pop("logits_processor")
    # the engine: greedy, ids out, max_tokens and the end id; no penalties, bad words, min_tokens or stop words
    assert arguments == {"max_tokens": 12, "temperature": 0.0, "top_k": 1, "detokenize": False, "end_id": 5}
    # the draw: the request's sampling in zerocheck's processor, sequence 1 seeded seed + 1
    assert isinstance(processor, ZeroCheckLogitsProcessor)
    assert processor.params == seq.sampling and processor.params.seed == 8
    sampled = (processor.params.temperature, processor.params.top_k, processor.params.top_p)
    assert sampled == pytest.approx((0.7, 40, 0.9))
    assert (processor.params.repetition_penalty, processor.params.presence_penalty,
            processor.params.frequency_penalty) == pytest.approx((1.2, 0.5, 0.25))
    assert processor.params.bad_words == ((12,),)
    assert processor.min_tokens == 3 and processor.end_ids == {5}
    assert seq.stop_ids == [[9, 10], [11]]  # the Sequence ends at them, not the engine


def test_the_model_end_ids_and_end_id_minus_one(tokenizer) -> None:
    token_model = model(tokenizer, StandInEngine())
    (default,) = token_model.prepare(token_request(), {})
    arguments = sampling_arguments(Sequence(tokenizer, default.request, default.prompt_ids, default.path, 128))
    assert arguments["end_id"] == tokenizer.end_ids[0] and "ignore_eos" not in arguments
    assert arguments["max_tokens"] == LIMITS.max_output_tokens  # as many as fit, up to the limit
    (never,) = token_model.prepare(token_request(end_id=-1), {})
    arguments = sampling_arguments(Sequence(tokenizer, never.request, never.prompt_ids, never.path, 128))
    assert arguments["ignore_eos"] is True and "end_id" not in arguments
    assert arguments["logits_processor"].end_ids == frozenset()


@pytest.mark.parametrize("fields, parameters, message", [
    ({"return_log_probs": True}, {}, "return_log_probs is not served by the trtllm flavor"),
    ({}, {"zerocheck": "off"}, "zerocheck off: the trtllm flavor's tensorrt_llm model draws with zerocheck's sampler"),
    ({"input_ids": [700]}, {}, r"input_ids must be token ids in \[0, 600\)"),
    ({"beam_width": 2}, {}, "beam_width must be 1"),
])
def test_what_the_flavor_does_not_serve_is_refused_by_name(tokenizer, fields, parameters, message) -> None:
    arrays = token_request(**{k: v for k, v in fields.items() if k != "input_ids"})
    if "input_ids" in fields:
        arrays = {**arrays, "input_ids": np.array([fields["input_ids"]], np.int32),
                  "input_lengths": np.array([[1]], np.int32)}
    with pytest.raises(InvalidRequest, match=message):
        model(tokenizer, StandInEngine()).prepare(arrays, parameters)


def test_a_guide_is_refused_by_name(tokenizer) -> None:
    arrays = {**token_request(), "guided_decoding_guide_type": np.array([[b"regex"]], object),
              "guided_decoding_guide": np.array([[b"a+"]], object)}
    with pytest.raises(InvalidRequest, match="guided_decoding_guide_type: the trtllm flavor's tensorrt_llm model"):
        model(tokenizer, StandInEngine()).prepare(arrays, {})


# -- requests served over a stand-in engine ------------------------------------------------------------------------

def test_a_streamed_request_sends_its_tokens_as_the_engine_emits_them(tokenizer) -> None:
    engine = StandInEngine(script=[[20], [21, 22], [23]], reason="length")
    sent = serve(model(tokenizer, engine), token_request(request_output_len=4, streaming=True))
    streamed = [ids_of(arrays) for arrays, final in sent if not final]
    assert streamed == [[20], [21], [22], [23]]  # one response per token (stream_interval 1)
    last, final = sent[-1]
    assert final and ids_of(last) == [] and last["finish_reason"][0][0] == b"length"
    assert last["completion_tokens"][0][0] == 4 and last["zerocheck_bypass"][0][0]
    assert engine.calls[0][0] == PROMPT and not engine.requests[0].aborted


def test_a_whole_answer_includes_the_prompt_unless_excluded(tokenizer) -> None:
    engine = StandInEngine(script=[[20, 21]], reason="length")
    ((arrays, final),) = serve(model(tokenizer, engine), token_request(request_output_len=2))
    assert final and ids_of(arrays) == PROMPT + [20, 21] and arrays["sequence_length"][0][0] == 7
    ((arrays, _),) = serve(model(tokenizer, engine), token_request(request_output_len=2, exclude_input_in_output=True))
    assert ids_of(arrays) == [20, 21]


def test_a_stop_word_ends_the_sequence_and_aborts_the_engines_request(tokenizer) -> None:
    engine = StandInEngine(script=[[20], [9], [10], [30], [31]], hang=True)
    ((arrays, final),) = serve(model(tokenizer, engine), token_request(
        request_output_len=10, exclude_input_in_output=True, stop_words_list=[[9, 10]]))
    assert ids_of(arrays) == [20, 9, 10] and arrays["finish_reason"][0][0] == b"stop"  # the stop word kept
    assert engine.requests[0].aborted


@pytest.mark.parametrize("script, reason", [([[20], [21, 1]], "stop"), ([[20], [21]], "stop")])
def test_the_engines_end_token_ends_with_eos_whether_it_is_returned_or_not(tokenizer, script, reason) -> None:
    engine = StandInEngine(script=script, reason=reason)
    ((arrays, _),) = serve(model(tokenizer, engine), token_request(request_output_len=10, exclude_input_in_output=True))
    assert ids_of(arrays) == [20, 21] and arrays["finish_reason"][0][0] == b"eos"


def test_a_cancelled_request_ends_cancelled_and_aborts_the_engines_request(tokenizer) -> None:
    engine = StandInEngine(script=[[20]], hang=True)
    sent = serve(model(tokenizer, engine), token_request(request_output_len=10, streaming=True),
                 cancelled=lambda: bool(engine.requests))  # the client leaves once the engine has the request
    assert sent[-1][1] and sent[-1][0]["finish_reason"][0][0] == b"cancelled"
    assert engine.requests[0].aborted


def test_a_stop_request_stops_the_request_with_its_id(tokenizer) -> None:
    engine = StandInEngine(script=[[20]], hang=True)
    token_model = model(tokenizer, engine)
    sent: list = []
    answers = Answers(lambda arrays, final: sent.append((arrays, final)), lambda error: sent.append(("error", error)))

    async def scenario() -> None:
        rows = token_model.prepare(token_request(request_output_len=10, streaming=True), {})
        serving = asyncio.ensure_future(token_model.serve("req-1", rows, answers))
        while not engine.requests:
            await asyncio.sleep(0.01)
        token_model.stop("req-1")
        await serving

    asyncio.run(scenario())
    assert sent[-1][1] and sent[-1][0]["finish_reason"][0][0] == b"cancelled" and engine.requests[0].aborted
    with pytest.raises(InvalidRequest, match="stop: give the request id"):
        token_model.stop("")


def test_an_engine_failure_is_the_requests_error_without_a_traceback(tokenizer) -> None:
    sent = serve(model(tokenizer, StandInEngine(fail=RuntimeError("CUDA error: out of memory"))), token_request())
    ((kind, error),) = sent
    assert kind == "error" and isinstance(error, RuntimeError)  # classified INTERNAL by the model's error_for
    ended = serve(model(tokenizer, StandInEngine(script=[[20]], reason="cancelled")),
                  token_request(request_output_len=5, exclude_input_in_output=True))
    assert ended[-1][0] == "error"
    assert "TensorRT-LLM ended the request (cancelled) after 1 of 5 tokens" in str(ended[-1][1])


def test_the_processor_decides_the_tokens_and_a_seed_repeats_them(tokenizer) -> None:
    """Through the stand-in's greedy loop the processor's one-hot mask decides each token: a seeded request gets the
    same tokens again, another seed others, and two sequences of one request (seed, seed + 1) differ."""
    def tokens(seed: int, count: int = 1) -> list[list[int]]:
        sent = serve(model(tokenizer, StandInEngine()), token_request(
            request_output_len=12, temperature=1.0, seed=seed, exclude_input_in_output=True, end_id=-1,
            num_return_sequences=count))
        return [ids_of(arrays) for arrays, _ in sent]

    assert tokens(3) == tokens(3) and tokens(3) != tokens(4)
    first, second = tokens(3, count=2)
    assert first == tokens(3)[0] and first != second and len(second) == 12


def test_answers_send_the_final_flag_with_the_last_response() -> None:
    sent: list = []
    answers = Answers(lambda arrays, final: sent.append((arrays, final)), lambda error: sent.append(("error", error)))
    answers.send({"a": 1}, final=False)
    answers.send({"b": 2}, final=True)
    answers.send({"c": 3}, final=True)
    answers.close()
    assert sent == [({"a": 1}, False), ({"b": 2}, False), ({"c": 3}, True)]
    sent.clear()
    Answers(lambda arrays, final: sent.append((arrays, final)), lambda error: sent.append(("error", error))).close()
    assert sent == [(None, True)]


# -- the flavor's repository, model and image ---------------------------------------------------------------------

def flavor_config() -> str:
    return (FLAVOR / "tensorrt_llm" / "config.pbtxt").read_text()


def flavor_model_config(**extra: str) -> ModelConfig:
    found = dict(re.findall(r'parameters \{ key: "(\w+)" value: \{ string_value: "([^"]*)" \} \}', flavor_config()))
    return ModelConfig({"model_config": json.dumps({"name": "tensorrt_llm", "parameters": {
        key: {"string_value": value} for key, value in {**found, **extra}.items()}})})


def test_the_flavor_holds_only_a_tensorrt_llm_model() -> None:
    assert sorted(path.relative_to(FLAVOR).as_posix() for path in FLAVOR.rglob("*")
                  if path.is_file() and "__pycache__" not in path.parts) == [
        "tensorrt_llm/1/model.py", "tensorrt_llm/config.pbtxt"]


def test_the_flavors_config_declares_the_default_doors_inputs_and_outputs() -> None:
    flavor, default = flavor_config(), default_config("tensorrt_llm")
    for section in ("input", "output"):
        assert list(tensors(flavor, section).items()) == list(tensors(default, section).items()), section
    for line in ('name: "tensorrt_llm"', 'backend: "python"', "max_batch_size: 64", "decoupled: true"):
        assert line in flavor and line in default


def test_the_flavors_parameters_parse_and_a_bad_one_is_named() -> None:
    params = parameters(LlmApiParameters, flavor_model_config())
    assert params.limits() == Limits(max_prompt_tokens=1024, max_output_tokens=1024, max_context=2048)
    with pytest.raises(ConfigError, match="kv_cache_free_gpu_memory_fraction must be in \\(0, 1\\], got 1.5"):
        parameters(LlmApiParameters, flavor_model_config(kv_cache_free_gpu_memory_fraction="1.5"))
    with pytest.raises(ConfigError, match="parameter dtype must be auto, bfloat16 or float16, got 'float32'"):
        parameters(LlmApiParameters, flavor_model_config(dtype="float32"))


def test_the_docker_trtllm_flavor_installs_the_overlay_and_builds_no_engine() -> None:
    instructions = conftest.dockerfile_instructions()
    base = instructions.index(next(i for i in instructions if i[0] == "FROM" and i[1].endswith(" AS base-trtllm")))
    env = next(rest for word, rest in instructions[base + 1:] if word == "ENV")
    assert "ZEROCHECK_ENGINE=none" in env.split()
    install = next(rest for word, rest in instructions if word == "RUN" and "zerocheck-install-package" in rest)
    assert 'if [ "${FLAVOR}" = trtllm ]' in install and "model_repository_trtllm/. src/model_repository/" in install
    assert any(word == "COPY" and rest.split()[0] == "model_repository_trtllm/" for word, rest in instructions)


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="tensorrt_llm is installed here")
def test_the_models_load_stops_naming_the_missing_tensorrt_llm(tmp_path: Path) -> None:
    """The flavor's model.py imported under a stand-in pb_utils (as tests/test_openmp.py does): initialize raises
    naming the missing package before it reads any artifact."""
    args = {"model_config": json.dumps({"name": "tensorrt_llm", "parameters": {
        key: {"string_value": value} for key, value in flavor_model_config().parameters.items()}})}
    code = f"""
import importlib.util, json, sys, types
sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
sys.modules["triton_python_backend_utils"].TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
spec = importlib.util.spec_from_file_location("flavor_model", {str(FLAVOR / "tensorrt_llm/1/model.py")!r})
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model = module.TritonPythonModel()
try:
    model.initialize({args!r})
except Exception as error:
    print(type(error).__name__, error)
model.finalize()
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "ZEROCHECK_ARTIFACTS": str(tmp_path / "none")})
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("UnsupportedTensorRTLLM the trtllm flavor's tensorrt_llm model needs TensorRT-LLM")
    assert "which is not installed" in result.stdout

