"""tensorrtllm_backend's clients' calls, made the way they make them (tritonclient gRPC bidirectional
streams, their input names, dtypes and [1, 1] shapes, their requested outputs, their indexing of the
results), against the session server: `ensemble` / `tensorrt_llm_bls` as `end_to_end_grpc_client.py`
calls them (its 2024 and May-2025 versions), `tensorrt_llm` as `inflight_batcher_llm_client.py` does,
and the inputs Triton's OpenAI frontend adds. Their code is not copied here; the closing notes of the
issue list runs of the clients themselves."""
from __future__ import annotations

import json
import queue
import time
from functools import partial

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from generate_calls import slots_in_use
from zerocheck.api.request import parse_generate_request

PROMPT, OTHER = "def fibonacci(n):", "class Stack:"
PERF = ("kv_cache_alloc_new_blocks", "kv_cache_reused_blocks", "kv_cache_alloc_total_blocks", "arrival_time_ns",
        "first_scheduled_time_ns", "first_token_time_ns", "last_token_time_ns", "acceptance_rate",
        "total_accepted_draft_tokens", "total_draft_tokens")


def tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    item = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    item.set_data_from_numpy(array)
    return item


def text_inputs(prompt: str | list[str], max_tokens: int = 8, streaming: bool = False, **extra) -> list:
    """end_to_end_grpc_client.py's prepare_inputs: every value [1, 1] (words [1, k]); a list of prompts is
    one request of that many rows, every input concatenated along axis 0, as with --batch-inputs."""
    prompts = prompt if isinstance(prompt, list) else [prompt]
    rows = []
    for text in prompts:
        inputs = {"text_input": np.array([[text]]).astype(object),
                  "max_tokens": np.ones_like([[text]]).astype(np.int32) * max_tokens,
                  "stream": np.array([[streaming]], dtype=bool), "beam_width": np.array([[1]], dtype=np.int32),
                  "temperature": np.array([[1.0]], dtype=np.float32)}
        for name, value in extra.items():
            inputs[name] = value
        rows.append(inputs)
    return [tensor(name, np.concatenate([row[name] for row in rows], axis=0)) for name in rows[0]]


def run(url: str, model: str, inputs: list, outputs: list[str] | None = None, request_id: str = "",
        headers: dict | None = None) -> list:
    """start_stream, async_stream_infer, stop_stream (waits for the server to end the stream), then drain:
    the client's transport for streamed and non-streamed requests alike."""
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=partial(lambda q, result, error: q.put(error or result), results), headers=headers)
    requested = [grpcclient.InferRequestedOutput(name) for name in outputs] if outputs else None
    client.async_stream_infer(model, inputs, outputs=requested, request_id=request_id)
    client.stop_stream()
    client.close()
    out = []
    while not results.empty():
        out.append(results.get())
    return out


def ok(results: list) -> list[grpcclient.InferResult]:
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert not errors, errors[0].message()
    return results


@pytest.mark.parametrize("model", ["ensemble", "tensorrt_llm_bls"])
def test_e2e_client_2025_streaming_and_not(triton_server, model):
    greedy = {"temperature": np.array([[0.0]], dtype=np.float32),
              "exclude_input_in_output": np.array([[False]], dtype=bool)}
    streamed = ok(run(triton_server.grpc_url, model, text_inputs(PROMPT, 8, True, **greedy), ["text_output"]))
    text = "".join(r.as_numpy("text_output")[0].decode("utf-8") for r in streamed)
    assert all(r.as_numpy("text_output").shape == (1,) for r in streamed)  # 1-D: text_output[0] is bytes
    assert {r.get_response().outputs[0].name for r in streamed} == {"text_output"}  # only what was requested
    whole = ok(run(triton_server.grpc_url, model, text_inputs(PROMPT, 8, False, **greedy), ["text_output"]))
    assert len(whole) == 1 and whole[0].as_numpy("text_output")[0].decode() == PROMPT + text  # the prompt is echoed
    excluded = ok(run(triton_server.grpc_url, model, text_inputs(PROMPT, 8, False, **{
        **greedy, "exclude_input_in_output": np.array([[True]], dtype=bool)}), ["text_output"]))
    assert excluded[0].as_numpy("text_output")[0].decode() == text


def test_e2e_client_2024_reads_batch_index_of_every_response(triton_server, tokenizer):
    results = ok(run(triton_server.grpc_url, "ensemble", text_inputs(PROMPT, 6, True)))  # no outputs requested
    assert results and all(r.as_numpy("batch_index")[0][0] == 0 for r in results)
    texts = [r.as_numpy("text_output") for r in results]
    assert all(t.shape == (1,) and isinstance(t[0], bytes) for t in texts)  # the client reads text_output[0]
    pieces = [t[0].decode("utf-8") for t in texts]  # each piece is whole UTF-8 (decoding raises otherwise)
    ids = [int(i) for r in results for i in r.as_numpy("output_ids")[0]]
    assert "".join(pieces) == tokenizer.decode(ids)
    reasons = [r.as_numpy("finish_reason")[0][0].decode() for r in results]
    assert reasons[-1] in ("length", "eos") and not any(reasons[:-1]), reasons  # only the last response is final
    assert results[-1].as_numpy("completion_tokens")[0][0] == len(ids) <= 6


@pytest.mark.parametrize("streaming", [False, True])
def test_batch_inputs_are_generated_row_by_row(triton_server, streaming):
    greedy = {"temperature": np.array([[0.0]], dtype=np.float32)}
    results = ok(run(triton_server.grpc_url, "ensemble", text_inputs([PROMPT, OTHER], 6, streaming, **greedy),
                     ["text_output", "batch_index"]))
    texts = {0: "", 1: ""}
    for result in results:
        batch_index = result.as_numpy("batch_index")[0][0]
        texts[batch_index] += result.as_numpy("text_output")[0].decode("utf-8")
    for index, prompt in enumerate((PROMPT, OTHER)):
        alone = ok(run(triton_server.grpc_url, "ensemble", text_inputs(prompt, 6, streaming, **greedy),
                       ["text_output"]))
        assert texts[index] == "".join(r.as_numpy("text_output")[0].decode() for r in alone)


def test_num_return_sequences_are_told_apart(triton_server):
    # min_length: the tiny random model can draw its end token at once (one CI run ended a sequence empty)
    results = ok(run(triton_server.grpc_url, "ensemble", text_inputs(
        PROMPT, 6, True, num_return_sequences=np.array([[2]], dtype=np.int32), min_length=np.array([[6]], dtype=np.int32)),
        ["text_output", "sequence_index"]))
    texts = {0: "", 1: ""}
    for result in results:
        texts[result.as_numpy("sequence_index")[0][0]] += result.as_numpy("text_output")[0].decode()
    assert texts[0] and texts[1] and texts[0] != texts[1]


def test_log_probs_and_perf_metrics_on_every_response(triton_server):
    flags = {"return_log_probs": np.array([[True]]), "return_perf_metrics": np.array([[True]])}
    outputs = ["text_output", "cum_log_probs", "output_log_probs", *PERF]
    results = ok(run(triton_server.grpc_url, "ensemble", text_inputs(PROMPT, 5, True, **flags), outputs))
    for result in results:
        assert {o.name for o in result.get_response().outputs} == set(outputs)
        values = {name: result.as_numpy(name)[0][0] for name in PERF}
        assert values["kv_cache_alloc_total_blocks"] == 1 and values["acceptance_rate"] == 0.0
        assert values["arrival_time_ns"] <= values["first_scheduled_time_ns"] <= time.time_ns()
        assert result.as_numpy("cum_log_probs")[0][0] <= 0
    assert results[-1].as_numpy("first_token_time_ns")[0][0] <= results[-1].as_numpy("last_token_time_ns")[0][0]


def test_words_and_penalties_as_the_client_sends_them(triton_server, tokenizer, prompt_ids):
    words = {"stop_words": np.array([["\n\n", "return"]], dtype=object),
             "bad_words": np.array([["fibonacci"]], dtype=object),
             "embedding_bias_words": np.array([["def"]], dtype=object),
             "embedding_bias_weights": np.array([["2.5"]]).astype(np.float32),
             "repetition_penalty": np.array([[1.1]], dtype=np.float32),
             "presence_penalty": np.array([[0.2]], dtype=np.float32),
             "frequency_penalty": np.array([[0.1]], dtype=np.float32),
             "end_id": np.array([[2]], dtype=np.int32), "pad_id": np.array([[2]], dtype=np.int32),
             "random_seed": np.array([[7]], dtype=np.uint64), "min_length": np.array([[2]], dtype=np.int32)}
    # the client's inputs; besides text_output, the outputs that show what the words did
    results = ok(run(triton_server.grpc_url, "ensemble", text_inputs(PROMPT, 8, True, **words),
                     ["text_output", "output_ids", "finish_reason", "completion_tokens"]))
    ids = [int(i) for r in results for i in r.as_numpy("output_ids")[0]]
    assert all(r.as_numpy("output_ids").dtype == np.int32 for r in results)
    text = "".join(r.as_numpy("text_output")[0].decode() for r in results)
    assert text == tokenizer.decode(ids)  # the streamed pieces are the generated ids' text
    reasons = [r.as_numpy("finish_reason")[0][0].decode() for r in results]
    assert not any(reasons[:-1]) and reasons[-1] in ("stop", "length", "eos"), reasons
    assert results[-1].as_numpy("completion_tokens")[0][0] == len(ids) <= 8
    # the words as the server reads them: each element a CSV line, as tensorrtllm_backend's preprocessing reads it
    parsed = parse_generate_request({"text_input": np.array([[PROMPT]], dtype=object), **words}, {})
    stops = [tokenizer.encode(word) for word in parsed.stop_words]
    assert stops and parsed.bad_words

    def ends_with_stop(tokens: list[int]) -> bool:
        return any(tokens[len(tokens) - len(stop):] == stop for stop in stops if len(tokens) >= len(stop))

    assert not any(ends_with_stop(ids[:end]) for end in range(1, len(ids)))  # a stop word ends the generation
    if reasons[-1] == "stop":
        assert ends_with_stop(ids)  # ... and stays in the text, as TensorRT-LLM returns it
    elif reasons[-1] == "length":
        assert len(ids) == 8
    else:
        assert len(ids) >= 2  # min_length 2: end_id 2 is banned until two tokens were generated
    history = prompt_ids + ids  # a bad word's last token is banned where the history ends with the rest of it
    for bad in (tokenizer.encode(word) for word in parsed.bad_words):
        ends = range(max(len(prompt_ids) + 1, len(bad)), len(history) + 1)  # ends within the generated ids
        assert not any(history[end - len(bad):end] == bad for end in ends), bad


@pytest.mark.parametrize("name, value, message", [
    ("beam_width", np.array([[2]], dtype=np.int32), "beam_width must be 1"),
    ("return_context_logits", np.array([[True]]), "return_context_logits is not supported"),
    ("lora_task_id", np.array([[3]], dtype=np.uint64), "lora_task_id is not supported"),
    ("guided_decoding_guide_type", np.array([["structural_tag"]]).astype(object),
     "guided_decoding_guide_type must be one of json, json_schema, regex, ebnf_grammar, lark, choice"),
    ("num_draft_tokens", np.array([[2]], dtype=np.int32), "speculative decoding is not supported"),
])
def test_what_cannot_be_honoured_is_refused_naming_the_input(triton_server, name, value, message):
    results = run(triton_server.grpc_url, "ensemble", text_inputs(PROMPT, 4, True, **{name: value}), ["text_output"])
    assert len(results) == 1 and isinstance(results[0], InferenceServerException)
    assert message in results[0].message() and results[0].message().startswith("INVALID_ARGUMENT: ")


GUIDED = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 999}},
          "required": ["n"], "additionalProperties": False}


@pytest.mark.parametrize("model, streaming", [("ensemble", False), ("tensorrt_llm_bls", True)])
def test_guided_decoding_flags_as_the_e2e_client_sends_them(triton_server, model, streaming):
    """end_to_end_grpc_client.py's --guided-decoding-guide-type / --guided-decoding-guide: [[str]] object
    arrays; the answer is a document of the schema (the tiny model's nonsense, masked)."""
    guide = {"guided_decoding_guide_type": np.array([["json_schema"]]).astype(object),
             "guided_decoding_guide": np.array([[json.dumps(GUIDED)]]).astype(object),
             "exclude_input_in_output": np.array([[True]])}
    results = ok(run(triton_server.grpc_url, model, text_inputs(PROMPT, 40, streaming, **guide), ["text_output"]))
    document = json.loads("".join(r.as_numpy("text_output")[0].decode() for r in results))
    assert set(document) == {"n"} and 0 <= document["n"] <= 999


def test_a_guide_on_the_token_level_door(triton_server, tokenizer, prompt_ids):
    guide = {"guided_decoding_guide_type": np.array([["choice"]]).astype(object),
             "guided_decoding_guide": np.array([['["yes", "no"]']]).astype(object),
             "exclude_input_in_output": np.array([[True]]),
             "end_id": np.array([[tokenizer.end_ids[0]]], dtype=np.int32)}  # the client's default, -1, is refused
    (result,) = ok(run(triton_server.grpc_url, "tensorrt_llm", token_inputs(prompt_ids, 8, False, **guide)))
    assert tokenizer.decode(list(result.as_numpy("output_ids")[0][0])) in ("yes", "no")


def test_a_guide_that_cannot_be_enforced_is_refused_naming_it(triton_server):
    guide = {"guided_decoding_guide_type": np.array([["json_schema"]]).astype(object),
             "guided_decoding_guide": np.array([['{"type": "array", "uniqueItems": true}']]).astype(object)}
    (error,) = run(triton_server.grpc_url, "ensemble", text_inputs(PROMPT, 8, False, **guide))
    assert isinstance(error, InferenceServerException)
    assert error.message().startswith("INVALID_ARGUMENT: guided_decoding_guide: JSON schema keyword(s) not supported")
    assert '["uniqueItems"]' in error.message()


def test_openai_frontend_token_counts(triton_server):
    # min_length 7: the test model, unseeded at T=1, drew its end id before the 7th token in ~5 % of requests
    flags = {"return_num_input_tokens": np.array([[True]]), "return_num_output_tokens": np.array([[True]]),
             "min_length": np.array([[7]], dtype=np.int32)}
    results = ok(run(triton_server.grpc_url, "ensemble", text_inputs(PROMPT, 7, True, **flags)))
    assert all(r.as_numpy("text_output").size == 1 for r in results)  # the frontend reads one element
    assert sum(r.as_numpy("num_output_tokens")[0][0] for r in results) == 7  # summed over the stream
    assert results[0].as_numpy("num_input_tokens")[0][0] == results[0].as_numpy("prompt_tokens")[0][0] > 0


# -- the token-level model ------------------------------------------------------------------------------------

def token_inputs(ids: list[int], output_len: int = 6, streaming: bool = False, **extra) -> list:
    """inflight_batcher_llm_client.py's inputs: ids [1, L] and every scalar [1, 1]."""
    values = {"input_ids": np.array([ids], dtype=np.int32), "input_lengths": np.array([[len(ids)]], dtype=np.int32),
              "request_output_len": np.array([[output_len]], dtype=np.int32),
              "beam_width": np.array([[1]], dtype=np.int32), "temperature": np.array([[1.0]], dtype=np.float32),
              "streaming": np.array([[streaming]], dtype=bool), "end_id": np.array([[-1]], dtype=np.int32),
              "pad_id": np.array([[2]], dtype=np.int32), "runtime_top_k": np.array([[1]], dtype=np.int32),
              "runtime_top_p": np.array([[0.0]], dtype=np.float32),
              "return_log_probs": np.array([[False]], dtype=bool), **extra}
    return [tensor(name, value) for name, value in values.items()]


@pytest.fixture(scope="module")
def tokenizer():
    """The tokenizer of the model the session server serves."""
    import conftest
    from zerocheck.tokenizer import load_tokenizer

    return load_tokenizer(conftest.test_artifacts_dir())


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return tokenizer.encode(PROMPT)


def test_token_client_streaming_and_not(triton_server, prompt_ids):
    streamed = ok(run(triton_server.grpc_url, "tensorrt_llm", token_inputs(prompt_ids, 6, True)))
    new = []
    for result in streamed:  # the client's streaming callback
        ids, lengths = result.as_numpy("output_ids"), result.as_numpy("sequence_length")
        if lengths[0][0] > 0:
            new += list(ids[0][0])
    assert len(new) == 6 and all(r.as_numpy("output_ids").ndim == 3 for r in streamed)
    (whole,) = ok(run(triton_server.grpc_url, "tensorrt_llm", token_inputs(prompt_ids, 6, False)))
    length = whole.as_numpy("sequence_length")[0][0]
    tokens = list(whole.as_numpy("output_ids")[0][0])[:length]
    assert tokens == prompt_ids + new  # top_k 1: greedy both times; the prompt's ids come first
    (excluded,) = ok(run(triton_server.grpc_url, "tensorrt_llm", token_inputs(
        prompt_ids, 6, False, exclude_input_in_output=np.array([[True]]))))
    assert list(excluded.as_numpy("output_ids")[0][0]) == new
    assert excluded.as_numpy("sampler")[0][0] == b"zero_check" and excluded.as_numpy("zerocheck_bypass")[0][0]


def test_token_client_log_probs_and_the_checked_path(triton_server, prompt_ids):
    results = ok(run(triton_server.grpc_url, "tensorrt_llm", token_inputs(
        prompt_ids, 4, True, return_log_probs=np.array([[True]])), headers={"zerocheck": "off"}))
    cumulative, every = [], []
    for result in results:
        cum, per_token = result.as_numpy("cum_log_probs"), result.as_numpy("output_log_probs")
        assert cum.dtype == np.float32 and cum.shape == (1, 1)  # [batch, beam]
        assert per_token.dtype == np.float32 and per_token.shape[:2] == (1, 1)  # [batch, beam, tokens]
        tokens = result.as_numpy("sequence_length")[0][0]  # this response's tokens (streamed: no prompt)
        assert per_token.shape[2] == result.as_numpy("output_ids").shape[2] == tokens
        assert np.all(np.isfinite(per_token)) and np.all(per_token <= 1e-6)  # log-probabilities of drawn tokens
        cumulative.append(float(cum[0][0]))
        every += [float(value) for value in per_token[0][0]]
        assert result.as_numpy("sampler")[0][0] == b"checked"
    assert len(every) == 4  # one per generated token (end_id -1: exactly request_output_len)
    assert all(later <= earlier + 1e-5 for earlier, later in zip(cumulative, cumulative[1:]))  # a running sum
    assert cumulative[-1] == pytest.approx(sum(every), rel=1e-4, abs=1e-5)


def test_token_client_stop_request_ends_the_generation(triton_server, prompt_ids):
    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put(error or result))
    client.async_stream_infer("tensorrt_llm", token_inputs(prompt_ids, 200, True), request_id="stop-me")
    first = results.get(timeout=60)
    assert not isinstance(first, InferenceServerException)
    stop = [tensor("input_ids", np.empty([1, 1], dtype=np.int32)), tensor("input_lengths", np.array([[0]], np.int32)),
            tensor("request_output_len", np.array([[0]], np.int32)), tensor("stop", np.array([[True]]))]
    client.async_stream_infer("tensorrt_llm", stop, request_id="stop-me", parameters={"Streaming": True})
    client.stop_stream()
    client.close()
    got = [first] + [results.get() for _ in range(results.qsize())]
    assert not any(isinstance(r, InferenceServerException) for r in got)
    generated = sum(r.as_numpy("sequence_length")[0][0] for r in got if r.as_numpy("sequence_length") is not None)
    assert 0 < generated < 200  # ended early
    assert any(not r.get_response().outputs for r in got)  # the stop request's one empty response
    deadline = time.monotonic() + 10
    while slots_in_use(triton_server) != 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert slots_in_use(triton_server) == 0


def test_token_model_refusals(triton_server, prompt_ids):
    for extra, message in (({"beam_width": np.array([[4]], dtype=np.int32)}, "beam_width must be 1"),
                           ({"input_lengths": np.array([[99]], dtype=np.int32)}, "input_lengths must be in [1, "),
                           ({"embedding_bias": np.ones((1, 3), dtype=np.float32)}, "embedding_bias must hold 600")):
        results = run(triton_server.grpc_url, "tensorrt_llm", token_inputs(prompt_ids, 4, True, **extra))
        assert isinstance(results[0], InferenceServerException) and message in results[0].message(), extra
    prompt_table = token_inputs(prompt_ids, 4, True) + [tensor("prompt_embedding_table",
                                                               np.zeros((1, 2, 2), dtype=np.float16))]
    (error,) = run(triton_server.grpc_url, "tensorrt_llm", prompt_table)
    assert "prompt_embedding_table is not supported" in error.message()
