"""`generate`'s tensorrt_llm engine, the trtllm flavor (zerocheck.trtllm.llm_api, model_repository_trtllm/), without
TensorRT-LLM: the version check, tensorrtllm_backend's token inputs turned into zerocheck's sampling and the LLM
API's SamplingParams arguments, whole requests served over a stand-in for `LLM.generate_async` (streaming, stop
words, end ids, max_tokens, cancellation, engine failures), the flavor's config against the default `generate`'s, the
Docker flavor, the load refusing cleanly where tensorrt_llm is not installed, and a real tritonserver serving the
flavor over a stand-in tensorrt_llm package (tests/fixtures/fake_tensorrt_llm): every door reaches the engine."""
from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import openai
import pytest
import requests
import torch
from tritonclient.utils import InferenceServerException

import conftest
from test_model_repository import config as default_config, model_config as default_model_config, tensors
from test_trtllm_clients import ok, run, text_inputs, token_inputs
from zerocheck.api.errors import InvalidRequest
from zerocheck.api.request import TOKENS, Limits
from zerocheck.generate.sequence import Sequence
from zerocheck.generate.service import GenerateService
from zerocheck.tokenizer import load_tokenizer
from zerocheck.tokenizer.chat import Message
from zerocheck.serve.repository import copy_repository
from zerocheck.serve.stack import ServingStack
from zerocheck.triton.config import ConfigError, GenerateParameters, ModelConfig, parameters
from zerocheck.trtllm import ZeroCheckLogitsProcessor
from zerocheck.trtllm import llm_api
from zerocheck.trtllm.llm_api import (LlmApiParameters, LlmApiScheduler, UnsupportedTensorRTLLM,
                                      check_tensorrt_llm_version, llm_arguments, refuse_unserved, sampling_arguments)

ROOT = Path(__file__).resolve().parents[1]
FLAVOR = ROOT / "model_repository_trtllm"
FAKE_TENSORRT_LLM = ROOT / "tests" / "fixtures" / "fake_tensorrt_llm"
PROMPT_TEXT = "def fibonacci(n):"
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


class TokenModel:
    """`generate`'s service over the tensorrt_llm engine as its model.py builds it (refuse_unserved), with its token
    interface (what the tensorrt_llm door forwards): `prepare` a request's rows, `serve` them to their responses."""

    def __init__(self, tokenizer, engine: StandInEngine) -> None:
        self.service = GenerateService(tokenizer, LlmApiScheduler(engine, cancel_poll_s=0.01), LIMITS, max_active=4,
                                       max_queue=4, refuse_unserved=refuse_unserved)

    def prepare(self, arrays: dict, parameters: dict) -> list:
        return self.service.prepare_batch(arrays, {**parameters, "interface": TOKENS})

    async def serve(self, rows: list, send, cancelled=lambda: False) -> None:
        self.service.reserve(len(rows))
        async with self.service.admission(sum(row.request.num_return_sequences for row in rows)):
            await self.service.serve(rows, send, cancelled)


def model(tokenizer, engine: StandInEngine) -> TokenModel:
    return TokenModel(tokenizer, engine)


def serve(token_model: TokenModel, arrays: dict, parameters: dict | None = None, cancelled=lambda: False) -> list:
    """Serve one request; its responses as (arrays, sequence's final) and an error as ("error", exception)."""
    sent: list = []
    rows = token_model.prepare(arrays, parameters or {})
    try:
        asyncio.run(token_model.serve(rows, lambda arrays, final: sent.append((arrays, final)), cancelled))
    except Exception as error:
        sent.append(("error", error))
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
    params = parameters(LlmApiParameters, flavor_model_config(), shared_with=(GenerateParameters,))
    arguments = llm_arguments(Path("/artifacts/hf_model"), params, max_batch_size=64, max_seq_len=2048)
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
    ({"return_log_probs": True}, {}, r"return_log_probs is not served by the tensorrt_llm engine \(trtllm flavor\)"),
    ({}, {"zerocheck": "off"}, r"zerocheck off: the tensorrt_llm engine \(trtllm flavor\) draws with zerocheck's"),
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
    with pytest.raises(InvalidRequest, match=r"guided_decoding_guide_type: the tensorrt_llm engine \(trtllm flavor\) serves no guides"):
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


# -- the flavor's repository, model and image ---------------------------------------------------------------------

def flavor_config() -> str:
    return (FLAVOR / "generate" / "config.pbtxt").read_text()


def flavor_model_config(**extra: str) -> ModelConfig:
    found = dict(re.findall(r'parameters \{ key: "(\w+)" value: \{ string_value: "([^"]*)" \} \}', flavor_config()))
    return ModelConfig({"model_config": json.dumps({"name": "generate", "parameters": {
        key: {"string_value": value} for key, value in {**found, **extra}.items()}})})


def test_the_flavor_holds_only_generates_config() -> None:
    assert sorted(path.relative_to(FLAVOR).as_posix() for path in FLAVOR.rglob("*")
                  if path.is_file() and "__pycache__" not in path.parts) == ["generate/config.pbtxt"]


def test_the_flavors_generate_is_the_default_one_on_the_tensorrt_llm_engine() -> None:
    """The same model.py (the flavor has none), inputs, outputs and policy; only its parameters differ: engine
    tensorrt_llm, the engine's own and a max_concurrent_sequences (the engine's max_batch_size)."""
    flavor, default = flavor_config(), default_config("generate")
    for section in ("input", "output"):
        assert list(tensors(flavor, section).items()) == list(tensors(default, section).items()), section
    body = lambda text: text[text.index('name: "generate"'):text.index("instance_group")]  # noqa: E731
    assert body(flavor) == body(default)
    generate = parameters(GenerateParameters, flavor_model_config(), shared_with=(LlmApiParameters,))
    assert generate.engine == "tensorrt_llm" and generate.max_concurrent_sequences == 64
    default_generate = parameters(GenerateParameters, default_model_config("generate"))
    assert default_generate.engine == "zerocheck"
    same = ("max_prompt_tokens", "max_output_tokens", "max_context", "max_queue_size", "queue_timeout_s")
    assert all(getattr(generate, name) == getattr(default_generate, name) for name in same)


def test_the_flavors_parameters_parse_and_a_bad_one_is_named() -> None:
    params = parameters(LlmApiParameters, flavor_model_config(), shared_with=(GenerateParameters,))
    assert params == LlmApiParameters(dtype="bfloat16", kv_cache_free_gpu_memory_fraction=0.5)
    with pytest.raises(ConfigError, match="kv_cache_free_gpu_memory_fraction must be in \\(0, 1\\], got 1.5"):
        parameters(LlmApiParameters, flavor_model_config(kv_cache_free_gpu_memory_fraction="1.5"),
                   shared_with=(GenerateParameters,))
    with pytest.raises(ConfigError, match="parameter dtype must be auto, bfloat16 or float16, got 'float32'"):
        parameters(LlmApiParameters, flavor_model_config(dtype="float32"), shared_with=(GenerateParameters,))
    with pytest.raises(ConfigError, match="max_concurrent_sequences must be >= 1 with engine tensorrt_llm"):
        parameters(GenerateParameters, flavor_model_config(max_concurrent_sequences="0"),
                   shared_with=(LlmApiParameters,))
    with pytest.raises(ConfigError, match="parameter engine must be one of zerocheck, tensorrt_llm, got 'vllm'"):
        parameters(GenerateParameters, flavor_model_config(engine="vllm"), shared_with=(LlmApiParameters,))
    with pytest.raises(ConfigError, match="unknown parameter.*dtype"):  # the engine's parameters are the flavor's
        parameters(GenerateParameters, flavor_model_config())


def test_the_docker_trtllm_flavor_installs_the_overlay_and_builds_no_engine() -> None:
    instructions = conftest.dockerfile_instructions()
    base = instructions.index(next(i for i in instructions if i[0] == "FROM" and i[1].endswith(" AS base-trtllm")))
    env = next(rest for word, rest in instructions[base + 1:] if word == "ENV")
    assert "ZEROCHECK_ENGINE=none" in env.split()
    install = next(rest for word, rest in instructions if word == "RUN" and "zerocheck-install-package" in rest)
    assert 'if [ "${FLAVOR}" = trtllm ]' in install and "model_repository_trtllm/. src/model_repository/" in install
    assert any(word == "COPY" and rest.split()[0] == "model_repository_trtllm/" for word, rest in instructions)


def flavored_repository(root: Path) -> Path:
    """The packaged model repository with the flavor laid over it, as the Docker image does (cp -r)."""
    repository = copy_repository(root / "model_repository", {})
    shutil.copytree(FLAVOR, repository, dirs_exist_ok=True)
    return repository


def generate_load_error(config: ModelConfig, artifacts: Path) -> str:
    """generate's model.py imported under a stand-in pb_utils (as tests/test_openmp.py does) and initialized with
    `config`'s parameters: the error its load stops with, as "ClassName message"."""
    args = {"model_config": json.dumps({"name": "generate", "parameters": {
        key: {"string_value": value} for key, value in config.parameters.items()}})}
    code = f"""
import importlib.util, json, sys, types
pb_utils = sys.modules["triton_python_backend_utils"] = types.ModuleType("triton_python_backend_utils")
pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
pb_utils.InferenceResponse = lambda output_tensors=(), parameters=None: None
spec = importlib.util.spec_from_file_location("generate_model", {str(ROOT / "model_repository/generate/1/model.py")!r})
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
                            env={**os.environ, "ZEROCHECK_ARTIFACTS": str(artifacts)})
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.skipif(importlib.util.find_spec("tensorrt_llm") is not None, reason="tensorrt_llm is installed here")
def test_the_flavors_load_stops_naming_the_missing_tensorrt_llm(tmp_path: Path) -> None:
    """The flavor's generate (the default model.py with the flavor's config): the load stops naming the missing
    package before it reads any artifact."""
    error = generate_load_error(flavor_model_config(), tmp_path / "none")
    assert error.startswith("UnsupportedTensorRTLLM generate's engine tensorrt_llm (the trtllm flavor) needs")
    assert "which is not installed" in error


def test_the_default_generate_refuses_the_engines_parameters(tmp_path: Path) -> None:
    """The tensorrt_llm engine's parameters are known to generate's config only with that engine."""
    error = generate_load_error(default_model_config("generate", dtype="bfloat16"), tmp_path / "none")
    assert error.startswith("ConfigError model generate: unknown parameter(s) dtype")


@pytest.fixture(scope="module")
def flavor_server(tritonserver_binary: Path, tmp_path_factory: pytest.TempPathFactory):
    """`zerocheck serve` over the flavored repository, with the stand-in tensorrt_llm (package and metadata) beside
    generate's model.py, where its stub imports from, and its calls logged; yields (server, a function that reads the
    log's events)."""
    root = tmp_path_factory.mktemp("trtllm_flavor")
    events = root / "tensorrt_llm.jsonl"
    repository = flavored_repository(root)
    shutil.copytree(FAKE_TENSORRT_LLM, repository / "generate" / "1", dirs_exist_ok=True)
    env = {"ZEROCHECK_ARTIFACTS": str(conftest.test_artifacts_dir()), "FAKE_TENSORRT_LLM_LOG": str(events)}
    server = ServingStack(repository, tritonserver=tritonserver_binary, env=env)
    server.start()
    try:
        server.wait_ready(conftest.READY_TIMEOUT_S)
        yield server, lambda: [json.loads(line) for line in events.read_text().splitlines()]
    finally:
        server.stop()


def test_every_door_of_the_flavor_reaches_the_llm_api(flavor_server, tokenizer) -> None:
    """tensorrtllm_backend's ensemble and BLS (gRPC, streamed and not), its tensorrt_llm token door, Triton's HTTP
    generate endpoint and the OpenAI SDK: each request is one generate_async call of the engine, greedy, with
    zerocheck's processor deciding the tokens (a seeded request repeats its answer through another door)."""
    server, events = flavor_server
    (llm,) = [event["llm"] for event in events() if "llm" in event]
    assert llm["backend"] == "pytorch" and llm["disable_overlap_scheduler"] is True
    assert llm["max_batch_size"] == 64 and llm["max_seq_len"] == 256  # the test artifacts' context
    seeded = {"seed": np.array([[5]], np.uint64), "end_id": np.array([[-1]], np.int32)}

    texts = {}
    for model in ("ensemble", "tensorrt_llm_bls"):
        for streaming in (False, True):
            results = ok(run(server.grpc_url, model, text_inputs(PROMPT_TEXT, 6, streaming, **seeded)))
            text = "".join(result.as_numpy("text_output")[0].decode() for result in results)
            texts[model, streaming] = text if streaming else text.removeprefix(PROMPT_TEXT)  # a whole one echoes it
    assert len(set(texts.values())) == 1 and next(iter(texts.values()))  # one seeded answer through every door

    ids = tokenizer.encode(PROMPT_TEXT)
    (whole,) = ok(run(server.grpc_url, "tensorrt_llm", token_inputs(ids, 6, False, exclude_input_in_output=np.array(
        [[True]]), seed=np.array([[5]], np.uint64), temperature=np.array([[1.0]], np.float32),
        runtime_top_k=np.array([[0]], np.int32), runtime_top_p=np.array([[1.0]], np.float32))))
    assert tokenizer.decode(list(whole.as_numpy("output_ids")[0][0])) == next(iter(texts.values()))

    answer = requests.post(f"http://{server.http_url}/v2/models/ensemble/generate", timeout=60,
                           json={"text_input": PROMPT_TEXT, "max_tokens": 4, "seed": 5, "end_id": -1}).json()
    assert answer["text_output"] and answer["finish_reason"] == "length"

    client = openai.OpenAI(base_url=server.openai_url, api_key="unused")
    chat = client.chat.completions.create(model=client.models.list().data[0].id, max_tokens=5, messages=[
        {"role": "user", "content": "hello"}])
    assert chat.choices[0].finish_reason in ("stop", "length") and chat.usage.completion_tokens >= 1

    calls = [event["generate_async"] for event in events() if "generate_async" in event]
    assert len(calls) == 4 + 1 + 1 + 1  # every request above, one engine request each
    assert all(call["temperature"] == 0.0 and call["top_k"] == 1 and call["streaming"] for call in calls)
    assert calls[-1]["prompt"] == tokenizer.encode(tokenizer.apply_chat_template([Message("user", "hello")]))


def test_the_flavor_refuses_by_name_what_the_engine_does_not_serve(flavor_server) -> None:
    server, _ = flavor_server
    for inputs, headers, message in (
            (text_inputs(PROMPT_TEXT, 4), {"zerocheck": "off"}, "zerocheck off: the tensorrt_llm engine"),
            (text_inputs(PROMPT_TEXT, 4, guided_decoding_guide_type=np.array([["regex"]], object),
                         guided_decoding_guide=np.array([["a+"]], object)), None,
             "guided_decoding_guide_type: the tensorrt_llm engine (trtllm flavor) serves no guides")):
        (error,) = run(server.grpc_url, "ensemble", inputs, headers=headers)
        assert isinstance(error, InferenceServerException) and message in error.message()
        assert "Traceback" not in error.message()
    assert ok(run(server.grpc_url, "ensemble", text_inputs(PROMPT_TEXT, 2)))  # and it goes on serving
