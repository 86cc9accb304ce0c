"""Bad requests at every model of the repository, over gRPC and HTTP (session fixture `triton_server`).

Table-driven: each case is (protocol, model, fields, expected code, expected substring). Every case
asserts the error code where the wire carries one, that the message names the problem, and that no
Python traceback reaches the client; after it the server is still healthy and generates.

protocols: "grpc-stream" (decoupled `ensemble` / `generate`: a gRPC stream error carries only a
message, no status code, so the code is checked over HTTP for the same kind of fault), "http"
(`generate` / `generate_stream` JSON), "grpc" and "http-infer" (unary infer on a non-decoupled model).
Limits here are those of the repository's config with the test artifacts (vocabulary 600,
max_seq_len 256: context 256, prompt <= 255 tokens, max_tokens <= 256).
"""
from __future__ import annotations

import json
import math
import queue
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from generate_calls import grpc_generate, http_generate
from zerocheck.api.request import INPUTS_BY_NAME

PROMPT = "def fibonacci(n):"
V = 600  # vocabulary of the test artifacts
_NUMPY = {"TYPE_STRING": object, "TYPE_INT32": np.int32, "TYPE_FP32": np.float32, "TYPE_BOOL": bool,
          "TYPE_UINT64": np.uint64, "TYPE_FP16": np.float16}


@dataclass(frozen=True)
class Case:
    id: str
    protocol: str  # grpc-stream | http | http-stream | grpc | http-infer
    model: str
    fields: dict[str, Any]  # generate: name -> python value or numpy array; models: name -> numpy array
    code: str  # INVALID_ARGUMENT (HTTP 400)
    expect: str  # substring of the message naming the problem
    parameters: dict[str, str] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    raw_body: bytes | None = None  # http: sent as is instead of json(fields)


def s(value, dtype) -> np.ndarray:
    return np.array([[value]], dtype=dtype)


def ids(values, dtype=np.int32) -> np.ndarray:
    return np.array([values], dtype=dtype)


def step(tokens, seq_id="bad-input", start=True, end=True, dtype=np.int32) -> dict[str, np.ndarray]:
    return {"sequence_id": np.array([[seq_id.encode()]], dtype=object), "input_ids": np.array([tokens], dtype=dtype),
            "sequence_start": s(start, bool), "sequence_end": s(end, bool)}


def text(value: bytes) -> np.ndarray:
    return np.array([[value]], dtype=object)


LOGITS = np.linspace(-3, 3, V, dtype=np.float32)[None]
PROBS = np.full((1, V), 1.0 / V, np.float32)
G, E, INV = "grpc-stream", "ensemble", "INVALID_ARGUMENT"

CASES = [
    # -- generate / ensemble over gRPC streaming ------------------------------------------------------------
    Case("max_tokens_zero", G, E, {"text_input": PROMPT, "max_tokens": 0}, INV, "max_tokens must be an integer in [1, 256]"),
    Case("max_tokens_huge", G, E, {"text_input": PROMPT, "max_tokens": 100000}, INV, "max_tokens must be an integer in [1, 256]"),
    Case("max_tokens_past_context", G, "generate", {"text_input": PROMPT, "max_tokens": 250}, INV,
         "exceeds the context of 256 tokens"),
    Case("temperature_nan", G, E, {"text_input": PROMPT, "temperature": math.nan}, INV, "temperature must be finite"),
    Case("top_p_inf", G, E, {"text_input": PROMPT, "top_p": math.inf}, INV, "top_p must be finite"),
    Case("temperature_negative", G, E, {"text_input": PROMPT, "temperature": -1.0}, INV, "temperature must be in [0, inf)"),
    Case("top_p_above_one", G, E, {"text_input": PROMPT, "top_p": 1.5}, INV, "top_p must be in (0, 1]"),
    Case("top_k_negative", G, E, {"text_input": PROMPT, "top_k": -1}, INV, "top_k must be in [0, "),
    Case("min_p_one", G, "generate", {"text_input": PROMPT, "min_p": 1.0}, INV, "min_p must be in [0, 1)"),
    Case("repetition_penalty_zero", G, E, {"text_input": PROMPT, "repetition_penalty": 0.0}, INV,
         "repetition_penalty must be in (0, inf)"),
    Case("presence_penalty_high", G, E, {"text_input": PROMPT, "presence_penalty": 3.0}, INV,
         "presence_penalty must be in [-2, 2]"),
    Case("empty_prompt", G, E, {"text_input": ""}, INV, "text_input must not be empty"),
    Case("prompt_too_many_tokens", G, E, {"text_input": "hello world " * 200}, INV, "the limit is 255"),
    Case("prompt_too_many_bytes", G, E, {"text_input": "x" * 70000}, INV, "text_input must be at most 65536 bytes"),
    Case("prompt_bad_utf8", G, E, {"text_input": b"abc\xff\xfe"}, INV, "text_input is not valid UTF-8"),
    Case("bad_words_too_many", G, E, {"text_input": PROMPT, "bad_words": [f"w{i}" for i in range(300)]}, INV,
         "bad_words must hold at most 256 words, got 300"),
    Case("stop_words_too_many", G, "generate", {"text_input": PROMPT, "stop_words": [",".join(f"w{i}" for i in range(40))] * 10},
         INV, "stop_words must hold at most 256 words, got 400"),
    Case("bad_word_too_long", G, E, {"text_input": PROMPT, "bad_words": ["y" * 300]}, INV,
         "bad_words must be at most 256 bytes"),
    Case("stop_word_bad_utf8", G, E, {"text_input": PROMPT, "stop_words": [b"\xc3("]}, INV, "stop_words is not valid UTF-8"),
    Case("unknown_parameter", G, E, {"text_input": PROMPT}, INV, "unknown request parameter(s): colour",
         parameters={"colour": "red"}),
    Case("unknown_header_parameter", G, E, {"text_input": PROMPT}, INV, "unknown request parameter(s): zerocheck-debug",
         headers={"zerocheck-debug": "1"}),
    Case("zerocheck_switch_bad", G, E, {"text_input": PROMPT}, INV, "zerocheck must be 'on' or 'off'",
         parameters={"zerocheck": "maybe"}),
    Case("beam_width", G, E, {"text_input": PROMPT, "beam_width": 4}, INV, "beam_width must be 1"),
    Case("num_return_sequences", G, E, {"text_input": PROMPT, "num_return_sequences": 9}, INV,
         "num_return_sequences must be an integer in [1, 4]"),
    Case("stream_interval_zero", G, E, {"text_input": PROMPT, "stream_interval": 0}, INV,
         "stream_interval must be an integer in [1, 256]"),
    Case("min_tokens_negative", G, E, {"text_input": PROMPT, "min_tokens": -1}, INV, "min_tokens must be an integer in [0, 256]"),
    Case("end_id_outside_vocab", G, E, {"text_input": PROMPT, "end_id": 5000}, INV,
         "end_id must be -1 or a token id in [0, 600)"),
    Case("context_logits", G, E, {"text_input": PROMPT, "return_context_logits": True}, INV,
         "return_context_logits is not supported"),
    Case("lora", G, E, {"text_input": PROMPT, "lora_task_id": 3}, INV, "lora_task_id is not supported"),
    Case("draft_tokens", G, E, {"text_input": PROMPT, "num_draft_tokens": 2}, INV, "speculative decoding is not supported"),
    Case("bias_words_weights_mismatch", G, E, {"text_input": PROMPT, "embedding_bias_words": ["a"],
                                               "embedding_bias_weights": [1.0, 2.0]}, INV,
         "embedding_bias_words has 1 words but embedding_bias_weights has 2 values"),
    Case("wrong_dtype", G, E, {"text_input": PROMPT, "max_tokens": s(3.0, np.float32)}, INV,
         "'max_tokens' data-type is 'FP32', but model 'ensemble' expects 'INT32'"),
    Case("wrong_shape", G, E, {"text_input": PROMPT, "temperature": np.ones((1, 3), np.float32)}, INV,
         "unexpected shape for input 'temperature'"),
    Case("batch_rows_disagree", G, "generate", {"text_input": np.array([[b"a"], [b"b"]], dtype=object),
                                                "max_tokens": s(3, np.int32)}, INV,
         "batch size does not match other inputs"),  # Triton core's own check
    Case("batch_of_nine", G, "generate", {"text_input": np.array([[b"a"]] * 9, dtype=object)}, INV,
         "a request may hold at most 8 rows, got 9"),
    Case("unknown_input", G, E, {"text_input": PROMPT, "colour": s(1, np.int32)}, INV, "unexpected inference input 'colour'"),
    Case("missing_prompt", G, E, {"max_tokens": 3}, INV, "text_input or messages is required"),
    Case("messages_not_json", G, E, {"messages": "[{role: user}]"}, INV,
         'messages must be a JSON array of {"role", "content"} objects: Expecting property name'),
    Case("messages_not_a_list", G, E, {"messages": '{"role": "user", "content": "hi"}'}, INV,
         "messages must be a JSON array of {\"role\", \"content\"} objects, got an object"),
    Case("messages_empty", G, E, {"messages": "[]"}, INV, "messages must hold at least one message"),
    Case("messages_unknown_role", G, E, {"messages": '[{"role": "wizard", "content": "hi"}]'}, INV,
         "messages[0].role must be one of system, user, assistant, got 'wizard'"),
    Case("messages_content_not_a_string", G, "generate",
         {"messages": '[{"role": "system", "content": "be brief"}, {"role": "user", "content": 5}]'}, INV,
         "messages[1].content must be a string, got a number"),
    Case("messages_unknown_key", G, E, {"messages": '[{"role": "user", "content": "hi", "tool": 1}]'}, INV,
         "messages[0] has unknown key(s) tool"),
    Case("messages_too_long", G, E, {"messages": '[{"role": "user", "content": "' + "x" * 70000 + '"}]'}, INV,
         "messages must be at most 65536 bytes"),
    Case("messages_and_text_input", G, E, {"text_input": PROMPT, "messages": '[{"role": "user", "content": "hi"}]'},
         INV, "give exactly one of text_input (a prompt) and messages (a chat)"),
    # -- generate / ensemble over HTTP ------------------------------------------------------------------------
    Case("http_max_tokens_zero", "http", E, {"text_input": PROMPT, "max_tokens": 0}, INV,
         "max_tokens must be an integer in [1, 256]"),
    Case("http_temperature_nan", "http", E, {}, INV, "temperature must be finite",
         raw_body=b'{"text_input": "def f():", "temperature": NaN}'),
    Case("http_unknown_key", "http", E, {"text_input": PROMPT, "colour": "red"}, INV, "unknown request parameter(s): colour"),
    Case("http_bad_utf8", "http", E, {}, INV, "text_input is not valid UTF-8", raw_body=b'{"text_input": "ab\xff"}'),
    Case("http_batch_rows_disagree", "http", E, {"text_input": [PROMPT, PROMPT], "max_tokens": 3}, INV,
         "batch size does not match other inputs"),
    Case("http_missing_prompt", "http", E, {"max_tokens": 3}, INV, "text_input or messages is required"),
    Case("http_messages_not_json", "http", E, {"messages": "hello"}, INV,
         'messages must be a JSON array of {"role", "content"} objects'),
    Case("http_messages_content_null", "http-stream", E,
         {"messages": '[{"role": "user", "content": null}]', "stream": True}, INV,
         "messages[0].content must be a string, got null"),
    Case("http_context", "http", "generate", {"text_input": PROMPT, "max_tokens": 256}, INV, "exceeds the context"),
    Case("http_top_k_negative", "http", E, {"text_input": PROMPT, "top_k": -1}, INV, "top_k must be in [0, "),
    Case("http_stream_bad", "http-stream", E, {"text_input": PROMPT, "stream": True, "top_p": 0.0}, INV,
         "top_p must be in (0, 1]"),
    Case("http_stream_too_many_words", "http-stream", E, {"text_input": PROMPT, "stream": True,
                                                          "bad_words": [f"w{i}" for i in range(300)]}, INV,
         "bad_words must hold at most 256 words"),
    # -- the decoder ----------------------------------------------------------------------------------------
    Case("decoder_token_outside_vocab", "grpc", "decoder", step([1, 9999]), INV, "token id 9999 outside [0, 600)"),
    Case("decoder_token_negative", "http-infer", "decoder", step([-3]), INV, "token id -3 outside [0, 600)"),
    Case("decoder_unknown_sequence", "grpc", "decoder", step([5], "never-started", start=False, end=False), INV,
         "holds no KV cache slot"),
    Case("decoder_empty_prompt", "grpc", "decoder", step([], end=False), INV, "tokens is empty"),
    Case("decoder_prompt_too_long", "grpc", "decoder", step([5] * 300), INV, "would reach 300 tokens, max_seq_len is 256"),
    Case("decoder_wrong_dtype", "grpc", "decoder", step([5], dtype=np.float32), INV,
         "'input_ids' data-type is 'FP32', but model 'decoder' expects 'INT32'"),
    Case("decoder_registration_bad_knob", "grpc", "decoder", {**step([5]), "temperature": s(-1.0, np.float32)}, INV,
         "temperature must be in [0, inf), got -1.0"),
    Case("decoder_end_ids_outside_vocab", "grpc", "decoder",
         {**step([5]), "min_tokens": s(2, np.int32), "end_ids": ids([700])}, INV,
         "end_ids must hold token ids in [0, 600), got 700"),
    Case("decoder_missing_input", "grpc", "decoder", {k: v for k, v in step([5]).items() if k != "sequence_end"}, INV,
         "missing required input(s) ['sequence_end']"),
    # -- the zero-check sampler -------------------------------------------------------------------------------
    Case("sampler_wrong_vocab", "grpc", "zero_check_sampler", {"logits": np.zeros((1, 10), np.float32)}, INV,
         "logits must have 600 values (the vocabulary size), got 10"),
    Case("sampler_fp16", "grpc", "zero_check_sampler", {"logits": LOGITS.astype(np.float16)}, INV,
         "'logits' data-type is 'FP16', but model 'zero_check_sampler' expects 'FP32'"),
    Case("sampler_one_dim", "grpc", "zero_check_sampler", {"logits": np.zeros((8,), np.float32)}, INV,
         "unexpected shape for input 'logits'"),
    Case("sampler_nan", "grpc", "zero_check_sampler", {"logits": np.full((1, V), np.nan, np.float32)}, INV,
         "logits contain NaN"),
    Case("sampler_nan_http", "http-infer", "zero_check_sampler", {"logits": np.where(np.arange(V) == 7, np.nan, LOGITS)
                                                                   .astype(np.float32)}, INV, "logits contain NaN"),
    Case("sampler_temperature_nan", "grpc", "zero_check_sampler", {"logits": LOGITS, "temperature": s(np.nan, np.float32)},
         INV, "temperature must be finite"),
    Case("sampler_history_outside_vocab", "grpc", "zero_check_sampler",
         {"logits": LOGITS, "repetition_penalty": s(1.2, np.float32), "history": ids([1, 99999])}, INV,
         "history must hold token ids in [0, 600), got 99999"),
    Case("sampler_bias_outside_vocab", "grpc", "zero_check_sampler",
         {"logits": LOGITS, "logit_bias_ids": ids([600]), "logit_bias_values": ids([1.0], np.float32)}, INV,
         "logit_bias_ids must hold token ids in [0, 600), got 600"),
    Case("sampler_bias_nan", "grpc", "zero_check_sampler",
         {"logits": LOGITS, "logit_bias_ids": ids([5]), "logit_bias_values": ids([np.nan], np.float32)}, INV,
         "logit_bias values must be finite"),
    Case("sampler_bad_words_offsets", "grpc", "zero_check_sampler",
         {"logits": LOGITS, "bad_words": np.array([[[5, 6], [9, -1]]], np.int32)}, INV, "bad_words offsets must increase"),
    Case("sampler_bad_words_outside_vocab", "grpc", "zero_check_sampler",
         {"logits": LOGITS, "bad_words": np.array([[[99999], [1]]], np.int32)}, INV,
         "bad_words must hold token ids in [0, 600)"),
    Case("sampler_step_negative", "grpc", "zero_check_sampler", {"logits": LOGITS, "step": s(-5, np.int32)}, INV,
         "step must be an integer in [0, "),
    # -- the checked chain ------------------------------------------------------------------------------------
    Case("penalties_nan", "grpc", "penalties", {"logits": np.full((1, V), np.nan, np.float32)}, INV, "logits contain NaN"),
    Case("penalties_history_outside_vocab", "grpc", "penalties",
         {"logits": LOGITS, "presence_penalty": s(0.5, np.float32), "history": ids([-2])}, INV,
         "history must hold token ids in [0, 600), got -2"),
    Case("softmax_nan", "grpc", "softmax", {"penalized_logits": np.full((1, V), np.nan, np.float32)}, INV,
         "penalized_logits contain NaN"),
    Case("softmax_wrong_vocab", "http-infer", "softmax", {"penalized_logits": np.zeros((1, 7), np.float32)}, INV,
         "penalized_logits must have 600 values"),
    Case("top_k_top_p_negative_probs", "grpc", "top_k_top_p", {"probs": np.full((1, V), -1.0, np.float32)}, INV,
         "probs must be probabilities in [0, 1]"),
    Case("multinomial_ids_shape", "grpc", "multinomial", {"sorted_probs": PROBS, "sorted_ids": np.zeros((1, 3), np.int32)},
         INV, "sorted_ids must have the shape of sorted_probs"),
    Case("multinomial_ids_outside_vocab", "grpc", "multinomial",
         {"sorted_probs": PROBS, "sorted_ids": np.full((1, V), 99999, np.int32)}, INV, "sorted_ids must hold token ids in [0, 600)"),
    Case("multinomial_nan", "grpc", "multinomial", {"sorted_probs": np.full((1, V), np.nan, np.float32),
                                                    "sorted_ids": np.zeros((1, V), np.int32)}, INV, "sorted_probs contain NaN"),
    Case("checked_sampler_wrong_vocab", "grpc", "checked_sampler", {"logits": np.zeros((1, 10), np.float32)}, INV,
         "logits must have 600 values"),
    Case("checked_sampler_nan", "grpc", "checked_sampler", {"logits": np.full((1, V), np.nan, np.float32)}, INV,
         "logits contain NaN"),
    Case("zero_check_step_outside_vocab", "grpc", "zero_check_step", step([99999]), INV, "token id 99999 outside [0, 600)"),
    Case("checked_step_outside_vocab", "grpc", "checked_step", step([700], "bad-checked"), INV, "token id 700 outside [0, 600)"),
    # -- pre- and postprocessing ------------------------------------------------------------------------------
    Case("preprocessing_bad_utf8", "grpc", "preprocessing", {"text_input": text(b"\xff\xfe")}, INV,
         "text_input is not valid UTF-8"),
    Case("preprocessing_too_many_words", "grpc", "preprocessing",
         {"text_input": text(b"hi"), "bad_words": np.array([[f"w{i}".encode() for i in range(300)]], dtype=object)}, INV,
         "bad_words must hold at most 256 words"),
    Case("preprocessing_wrong_dtype", "grpc", "preprocessing", {"text_input": s(5, np.int32)}, INV,
         "'text_input' data-type is 'INT32', but model 'preprocessing' expects 'BYTES'"),
    Case("postprocessing_offsets", "grpc", "postprocessing", {"output_ids": ids([5, 6]), "prefix_offset": s(3, np.int32)},
         INV, "offsets must satisfy 0 <= prefix_offset <= read_offset <= 2"),
    Case("postprocessing_negative_id", "grpc", "postprocessing", {"output_ids": ids([5, -1])}, INV,
         "output_ids must hold token ids in [0, 600), got -1"),
    Case("postprocessing_outside_vocab", "http-infer", "postprocessing", {"output_ids": ids([5, 99999])}, INV,
         "output_ids must hold token ids in [0, 600), got 99999"),
]
HTTP_STATUS = {"INVALID_ARGUMENT": 400, "UNAVAILABLE": 503}


def generate_inputs(fields: dict[str, Any]) -> list[grpcclient.InferInput]:
    """Python values as tensorrtllm_backend-style [1, 1] / [1, N] tensors of the table's dtype; numpy arrays as they are."""
    inputs = []
    for name, value in fields.items():
        if not isinstance(value, np.ndarray):
            dtype = INPUTS_BY_NAME[name].dtype
            values = [v.encode() if isinstance(v, str) else v for v in (value if isinstance(value, list) else [value])]
            value = np.array([values], dtype=_NUMPY[dtype])
        inputs.append(infer_input(name, value))
    return inputs


def infer_input(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def grpc_stream_error(url: str, case: Case) -> str:
    """The error message of a streamed request that must fail (a stream error carries no status code)."""
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)), headers=case.headers or None)
    try:
        client.async_stream_infer(case.model, generate_inputs(case.fields), parameters=case.parameters,
                                  enable_empty_final_response=True)
        while True:
            result, error = responses.get(timeout=60)
            if error is not None:
                return error.message()
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                pytest.fail(f"{case.id}: no error, the request succeeded")
    finally:
        client.stop_stream()
        client.close()


def grpc_unary_error(url: str, case: Case) -> tuple[str, str]:
    with grpcclient.InferenceServerClient(url) as client:
        try:
            client.infer(case.model, [infer_input(name, a) for name, a in case.fields.items()])
        except InferenceServerException as error:
            return str(error.status()).removeprefix("StatusCode."), error.message()
    pytest.fail(f"{case.id}: no error, the request succeeded")


def http_json_input(name: str, array: np.ndarray) -> dict[str, Any]:
    data = [v.decode() if isinstance(v, bytes) else (None if isinstance(v, float) and math.isnan(v) else v)
            for v in array.reshape(-1).tolist()]
    body = {"name": name, "shape": list(array.shape), "datatype": np_to_triton_dtype(array.dtype), "data": data}
    return body


def http_error(url: str, case: Case) -> tuple[int, str]:
    if case.protocol == "http-infer":
        inputs = [http_json_input(name, a) for name, a in case.fields.items()]
        body = json.dumps({"inputs": inputs}).replace("null", "NaN").encode()  # NaN is not JSON; Triton reads it
        reply = requests.post(f"http://{url}/v2/models/{case.model}/infer", data=body, timeout=60)
        return reply.status_code, reply.json().get("error", reply.text)
    endpoint = "generate_stream" if case.protocol == "http-stream" else "generate"
    body = case.raw_body if case.raw_body is not None else json.dumps(case.fields).encode()
    reply = requests.post(f"http://{url}/v2/models/{case.model}/{endpoint}", data=body, timeout=60)
    text = reply.text
    if case.protocol == "http-stream":
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        assert events and "error" in events[-1], f"{case.id}: no error event in {text[:300]!r}"
        return reply.status_code, events[-1]["error"]
    return reply.status_code, reply.json().get("error", text)


def assert_healthy_and_generating(server) -> None:
    assert requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10).status_code == 200
    responses = grpc_generate(server.grpc_url, {"text_input": PROMPT, "max_tokens": 2, "stream": True}, timeout=60)
    assert responses[-1]["finish_reason"] in ("length", "eos")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_request_gets_a_clear_error(triton_server, case: Case) -> None:
    if case.protocol == "grpc-stream":
        code, message = None, grpc_stream_error(triton_server.grpc_url, case)
    elif case.protocol == "grpc":
        code, message = grpc_unary_error(triton_server.grpc_url, case)
    else:
        status, message = http_error(triton_server.http_url, case)
        assert status == HTTP_STATUS[case.code], f"{case.id}: HTTP {status}: {message}"
        code = case.code
    assert code in (None, case.code), f"{case.id}: {code}: {message}"
    assert case.expect in message, f"{case.id}: {message!r} does not name the problem ({case.expect!r})"
    assert "Traceback" not in message and 'File "' not in message and ".py(" not in message, message
    assert requests.get(f"http://{triton_server.http_url}/v2/health/ready", timeout=10).status_code == 200


def test_over_thirty_distinct_cases_on_both_protocols() -> None:
    assert len({c.id for c in CASES}) == len(CASES) >= 30
    assert {c.protocol for c in CASES} >= {"grpc-stream", "http", "grpc", "http-infer"}


@pytest.mark.parametrize("group", ["generate", "models"])
def test_server_still_serves_after_the_bad_requests(triton_server, group: str) -> None:
    """Runs after the table (definition order): the server is healthy and generates on both protocols."""
    assert_healthy_and_generating(triton_server)
    reply = http_generate(triton_server.http_url, {"text_input": PROMPT, "max_tokens": 2})
    assert reply.status_code == 200, reply.text


def test_bad_rows_fail_alone_in_a_batch(triton_server) -> None:
    """Good and malformed requests sent together to the dynamically batched sampler: each bad one gets
    its own error, every good one its token."""
    bad = {"logits contain NaN": {"logits": np.full((1, V), np.nan, np.float32)},
           "history must hold token ids": {"logits": LOGITS, "repetition_penalty": s(1.3, np.float32),
                                           "history": ids([3, 4000])},
           "temperature must be in": {"logits": LOGITS, "temperature": s(-2.0, np.float32)}}
    results: queue.Queue = queue.Queue()
    sent = []
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        for round_ in range(4):
            for name, fields in [("good", {"logits": LOGITS, "temperature": s(0.0, np.float32)}), *bad.items(),
                                 ("good", {"logits": LOGITS, "temperature": s(0.0, np.float32)})]:
                sent.append(name)
                client.async_infer("zero_check_sampler", [infer_input(k, v) for k, v in fields.items()],
                                   callback=lambda result, error, i=len(sent) - 1: results.put((i, result, error)))
        answers = dict((i, (result, error)) for i, result, error in (results.get(timeout=60) for _ in sent))
    for i, name in enumerate(sent):
        result, error = answers[i]
        if name == "good":
            assert error is None, error
            assert result.as_numpy("output_id").reshape(-1).tolist() == [V - 1]  # greedy: the largest logit
        else:
            assert error is not None and name in error.message(), (name, error)
    stats = requests.get(f"http://{triton_server.http_url}/v2/models/zero_check_sampler/stats", timeout=10).json()
    print("zero_check_sampler batch sizes:", sorted(b["batch_size"] for b in stats["model_stats"][0]["batch_stats"]))


@pytest.mark.parametrize("body", [b'{"text_input": ', b'{"text_input": "a", "max_tokens": "ten"}',
                                  b'{"text_input": "a", "temperature": 1e999}', b"[1, 2]"])
def test_malformed_json_is_refused_by_triton_core(triton_server, body: bytes) -> None:
    """Triton core parses the JSON body of `generate` before any model runs; it refuses these with HTTP 400
    or 500 (its own choice, not ours), never a 200, and the server goes on serving."""
    reply = requests.post(f"http://{triton_server.http_url}/v2/models/ensemble/generate", data=body, timeout=30)
    assert reply.status_code in (400, 500), reply.text
    assert "error" in reply.json() and "Traceback" not in reply.text
    assert_healthy_and_generating(triton_server)
