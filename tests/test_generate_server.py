"""End-to-end tests of the model repository on a real tritonserver (session fixture `triton_server`)."""
from __future__ import annotations

import queue
import re
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

import conftest
from generate_calls import decode_result, grpc_generate, grpc_inputs, http_generate, slots_in_use, wait_slots_free
from zerocheck.api.sampler_path import SamplerPath
from zerocheck.sampling.params import SamplingParams
from zerocheck.tokenizer import load_tokenizer
from zerocheck.wire.step import Registration, StepCall, release_arrays, step_arrays

EXPECTED_MODELS = {"preprocessing", "decoder", "zero_check_sampler", "penalties", "softmax", "top_k_top_p",
                   "multinomial", "checked_sampler", "postprocessing", "zero_check_step", "checked_step",
                   "generate", "ensemble", "tensorrt_llm_bls", "tensorrt_llm"}
PROMPT = "def fibonacci(n):"


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(conftest.test_artifacts_dir())


def final(responses):
    assert responses, "no response"
    assert responses[-1]["finish_reason"], "the last response must carry finish_reason"
    return responses[-1]


def stream_text(responses):
    return "".join(r["text_output"] for r in responses)


def stream_ids(responses):
    return [i for r in responses for i in r.get("output_ids", [])]


def greedy_ids(server, max_tokens=12, **fields):
    responses = grpc_generate(server.grpc_url, {"text_input": PROMPT, "max_tokens": max_tokens, "temperature": 0.0,
                                                "stream": True, **fields})
    return stream_ids(responses), final(responses)


def single_token_words(tokenizer, ids):
    """Generated ids whose text encodes back to exactly that one id (usable as a 1-token word)."""
    return [(i, tokenizer.decode([i])) for i in dict.fromkeys(ids)
            if tokenizer.decode([i]).strip() and tokenizer.encode(tokenizer.decode([i])) == [i]]




def test_every_model_is_ready(triton_server):
    index = triton_server.repository_index()
    states = {m["name"]: m.get("state") for m in index}
    assert EXPECTED_MODELS <= set(states), f"missing models: {EXPECTED_MODELS - set(states)}"
    assert all(states[name] == "READY" for name in EXPECTED_MODELS), states


def test_grpc_stream_is_incremental_with_final_fields(triton_server):
    responses = grpc_generate(triton_server.grpc_url, {"text_input": PROMPT, "max_tokens": 12, "stream": True,
                                                       "temperature": 0.8, "seed": 7})
    last = final(responses)
    assert len(responses) >= 12  # one response per token, then the final one
    assert [r["t"] for r in responses] == sorted(r["t"] for r in responses)
    assert responses[-1]["t"] - responses[0]["t"] > 0  # tokens arrived over time, not in one burst
    assert last["finish_reason"] == "length"
    assert last["completion_tokens"] == 12 and last["prompt_tokens"] > 0
    assert last["sampler"] == "zero_check" and last["zerocheck_bypass"] is True


def test_http_generate_stream_is_incremental_with_final_fields(triton_server):
    events = http_generate(triton_server.http_url, {"text_input": PROMPT, "max_tokens": 10, "stream": True,
                                                    "temperature": 0.8, "seed": 7}, stream=True)
    assert len(events) >= 10 and not any("error" in e for e in events)
    last = events[-1]
    assert last["finish_reason"] == "length" and last["completion_tokens"] == 10
    assert last["zerocheck_bypass"] is True and last["sampler"] == "zero_check"


def test_http_generate_answers_once_with_the_fields(triton_server):
    response = http_generate(triton_server.http_url, {"text_input": PROMPT, "max_tokens": 6, "temperature": 0.0})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["text_output"].startswith(PROMPT)  # exclude_input_in_output defaults to false
    for field in ("zerocheck_bypass", "sampler", "prompt_tokens", "completion_tokens", "finish_reason"):
        assert field in body


def test_greedy_is_identical_on_both_paths_and_reproducible(triton_server):
    zero = [greedy_ids(triton_server, random_seed=11)[0] for _ in range(2)]
    checked = [greedy_ids(triton_server, random_seed=11, )[0] for _ in range(1)]
    responses = grpc_generate(triton_server.grpc_url, {"text_input": PROMPT, "max_tokens": 12, "temperature": 0.0,
                                                       "stream": True, "random_seed": 11},
                              parameters={"zerocheck": "off"})
    assert final(responses)["sampler"] == "checked" and final(responses)["zerocheck_bypass"] is False
    assert zero[0] == zero[1] == checked[0] == stream_ids(responses)


def test_seeded_sampling_is_reproducible_on_each_path(triton_server):
    for switch in ("on", "off"):
        runs = [stream_ids(grpc_generate(triton_server.grpc_url,
                                         {"text_input": PROMPT, "max_tokens": 10, "stream": True, "temperature": 1.0,
                                          "top_k": 20, "top_p": 0.9, "random_seed": 1234},
                                         parameters={"zerocheck": switch})) for _ in range(2)]
        assert runs[0] == runs[1], switch


def test_header_switches_the_path(triton_server):
    responses = grpc_generate(triton_server.grpc_url, {"text_input": PROMPT, "max_tokens": 3, "stream": True},
                              headers={"zerocheck": "off"})
    assert final(responses)["sampler"] == "checked"


def test_http_json_key_switches_the_path(triton_server):
    body = http_generate(triton_server.http_url, {"text_input": PROMPT, "max_tokens": 3, "zerocheck": "off"}).json()
    assert body["sampler"] == "checked" and body["zerocheck_bypass"] is False


def test_streamed_text_equals_non_streamed_text(triton_server):
    fields = {"text_input": PROMPT, "max_tokens": 16, "temperature": 0.9, "seed": 99}
    streamed = grpc_generate(triton_server.grpc_url, {**fields, "stream": True})
    whole = grpc_generate(triton_server.grpc_url, {**fields, "stream": False, "exclude_input_in_output": True})
    assert len(whole) == 1
    assert stream_text(streamed) == whole[0]["text_output"]
    assert stream_ids(streamed) == whole[0]["output_ids"]


def test_stop_words_and_end_id_stop_generation(triton_server, tokenizer):
    ids, _ = greedy_ids(triton_server, max_tokens=16)
    candidates = [(i, word) for i, word in single_token_words(tokenizer, ids) if ids.index(i) >= 1]
    assert candidates, f"no single-token word in {ids}"
    token, word = candidates[0]
    position = ids.index(token)
    stopped, last = greedy_ids(triton_server, max_tokens=16, stop_words=[word])
    assert last["finish_reason"] == "stop" and stopped == ids[:position + 1]
    ended, last = greedy_ids(triton_server, max_tokens=16, end_id=token)
    assert last["finish_reason"] == "eos" and ended == ids[:position]


def test_bad_words_never_appear(triton_server, tokenizer):
    ids, _ = greedy_ids(triton_server, max_tokens=16)
    banned = single_token_words(tokenizer, ids)[:3]
    assert banned
    for switch in ("on", "off"):
        responses = grpc_generate(triton_server.grpc_url,
                                  {"text_input": PROMPT, "max_tokens": 16, "temperature": 0.0, "stream": True,
                                   "bad_words": [w for _, w in banned]}, parameters={"zerocheck": switch})
        assert not set(stream_ids(responses)) & {i for i, _ in banned}, switch


def test_concurrent_streams_are_batched(triton_server):
    # min_tokens: a seeded draw may differ with the batch it lands in (GEMMs may round by batch size)
    fields = {"text_input": PROMPT, "max_tokens": 16, "min_tokens": 16, "stream": True, "temperature": 0.7}
    start = time.perf_counter()
    grpc_generate(triton_server.grpc_url, fields)
    one = time.perf_counter() - start
    start = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda i: grpc_generate(triton_server.grpc_url, {**fields, "seed": i}), range(16)))
    sixteen = time.perf_counter() - start
    assert all(final(r)["finish_reason"] == "length" and final(r)["completion_tokens"] == 16 for r in results)
    print(f"one stream {one:.2f}s, 16 concurrent streams {sixteen:.2f}s ({sixteen / one:.1f}x)")  # no timing assert
    stats = requests.get(f"http://{triton_server.http_url}/v2/models/decoder/stats", timeout=10).json()
    sizes = [b["batch_size"] for b in stats["model_stats"][0]["batch_stats"]]
    assert max(sizes) > 1, f"decoder batch sizes seen: {sizes}"


def cancel_the_call_after(url: str, fields: dict, responses_before: int) -> None:
    """What a tritonclient user does to give up: stop_stream(cancel_requests=True) cancels the gRPC call."""
    arrived: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: arrived.put(error))
    client.async_stream_infer("ensemble", grpc_inputs(fields))
    for _ in range(responses_before):
        assert arrived.get(timeout=60) is None
    client.stop_stream(cancel_requests=True)
    client.close()


def test_a_stop_request_ends_a_text_request_as_cancelled(triton_server):
    """The project's clients give up with a stop request (same request id, same stream): the request ends at
    its next step with finish_reason "cancelled" and its slot is freed."""
    request_id, arrived = "stop-me", queue.Queue()
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    client.start_stream(callback=lambda result, error: arrived.put((result, error)))
    # min_tokens: the sampled sequence cannot end by itself (end id) before the stop arrives (it once drew the
    # end id at its second token, a final with finish_reason "eos")
    client.async_stream_infer("ensemble", grpc_inputs({"text_input": PROMPT, "max_tokens": 200, "min_tokens": 200,
                                                       "stream": True}),
                              request_id=request_id, enable_empty_final_response=True)
    assert arrived.get(timeout=60)[1] is None
    client.async_stream_infer("ensemble", grpc_inputs({"stop": True}), request_id=request_id,
                              enable_empty_final_response=True)
    finals = []
    while len(finals) < 2:
        result, error = arrived.get(timeout=60)
        assert error is None, error
        if result.get_response().parameters["triton_final_response"].bool_param:
            finals.append(decode_result(result))
    client.stop_stream()
    client.close()
    assert {} in finals and any(f.get("finish_reason") == "cancelled" for f in finals), finals
    assert wait_slots_free(triton_server) == 0


@pytest.mark.parametrize("how", ["stop request", "cancelled call"])
def test_cancelled_stream_frees_its_slot(triton_server, how):
    fields = {"text_input": PROMPT, "max_tokens": 200, "stream": True}
    if how == "stop request":
        grpc_generate(triton_server.grpc_url, fields, cancel_after=2)
    else:
        cancel_the_call_after(triton_server.grpc_url, fields, 2)
    assert wait_slots_free(triton_server) == 0
    assert final(grpc_generate(triton_server.grpc_url, {"text_input": PROMPT, "max_tokens": 2, "stream": True}))


def test_unsupported_combination_degrades_to_checked(triton_server):
    responses = grpc_generate(triton_server.grpc_url, {"text_input": PROMPT, "max_tokens": 4, "stream": True,
                                                       "return_log_probs": True}, parameters={"zerocheck": "on"})
    last = final(responses)
    assert last["sampler"] == "checked" and last["zerocheck_bypass"] is False
    assert len(last["output_log_probs"]) == 0 or all(lp <= 0 for lp in last["output_log_probs"])
    assert all(lp <= 0 for r in responses for lp in r.get("output_log_probs", []))


def step_inputs(rows: dict) -> list:
    """gRPC inputs of a step request (name -> numpy array)."""
    inputs = [grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype)) for name, array in rows.items()]
    for tensor, array in zip(inputs, rows.values()):
        tensor.set_data_from_numpy(array)
    return inputs


def test_a_release_batched_with_a_step_is_answered_before_its_forward(server_factory, tmp_path):
    """A release-only decoder request (what generate sends for a cancelled sequence) that the dynamic batcher
    merges with a step is answered before that step's forward, not after it: the freed slot is acknowledged
    without waiting (unless that step holds the released sequence). The decoder's test_delay_ms makes every
    forward take 1.5 s; the step and the release queue together behind a first step."""
    server = server_factory(conftest.copied_repository(tmp_path, decoder={"test_delay_ms": "1500"}),
                            env={"ZEROCHECK_ARTIFACTS": str(conftest.test_artifacts_dir())})
    start = lambda seq_id: step_arrays([StepCall(seq_id, [5, 6, 7], True, False,  # noqa: E731
                                                 Registration(SamplingParams()), SamplerPath.ZERO_CHECK, False)])
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        def behind_a_forward(stepped: str, released: str) -> dict[str, float]:
            """A first step, then while its forward runs a step of `stepped` and a release of `released`, which
            must share one execute: when each of the three was answered."""
            done: dict[str, tuple[float, object]] = {}
            executions = requests.get(f"http://{server.http_url}/v2/models/decoder/stats",
                                      timeout=10).json()["model_stats"][0]["execution_count"]
            for name, rows in (("first", start(f"before-{stepped}")), ("step", start(stepped)),
                               ("release", release_arrays([released]))):
                def answered(result, error, name: str = name) -> None:
                    done.setdefault(name, (time.monotonic(), error))
                client.async_infer("decoder", step_inputs(rows), outputs=[grpcclient.InferRequestedOutput("error")],
                                   callback=answered)
                if name == "first":
                    time.sleep(0.5)  # its forward is running: the next two queue and go in one execute
            deadline = time.monotonic() + 30
            while len(done) < 3 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert {name: error for name, (_, error) in done.items()} == {"first": None, "step": None, "release": None}
            stats = requests.get(f"http://{server.http_url}/v2/models/decoder/stats", timeout=10).json()
            assert stats["model_stats"][0]["execution_count"] == executions + 2  # the step and the release in one
            return {name: at for name, (at, _) in done.items()}

        client.infer("decoder", step_inputs(start("held")))
        answered = behind_a_forward("other", "held")
        assert answered["step"] - answered["release"] > 1.0  # the release did not wait for the step's 1.5 s forward
        client.infer("decoder", step_inputs(start("held")))  # its slot was freed: it starts again
        # a release of a sequence that a step in the same execute starts keeps its place: after that step
        behind_a_forward("again", "again")
        client.infer("decoder", step_inputs(start("again")))  # started, then freed: it starts again


@pytest.mark.parametrize("model", ["zero_check_step", "checked_step"])
def test_a_step_request_carries_many_sequences_and_rows_fail_alone(triton_server, model):
    """What generate sends each iteration: one request, a row per sequence (prompts padded with -1).
    A row the decoder refuses carries its error in decoder_error; the others get their tokens."""
    rows = {"sequence_id": np.array([[f"{model}-{i}".encode()] for i in range(3)], dtype=object),
            "input_ids": np.array([[5, 6, 7], [8, -1, -1], [9, 10, -1]], np.int32),
            "sequence_start": np.array([[True], [False], [True]]),  # row 1 was never started
            "sequence_end": np.array([[True], [True], [True]]),
            "temperature": np.zeros((3, 1), np.float32)}
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        result = client.infer(model, step_inputs(rows))
    errors = [e.decode() for e in result.as_numpy("decoder_error").reshape(-1)]
    assert errors[0] == errors[2] == "" and errors[1].startswith("INVALID_ARGUMENT: sequence") and "no KV cache slot" in errors[1]
    tokens = result.as_numpy("output_id").reshape(-1)
    assert 0 <= tokens[0] < 600 and 0 <= tokens[2] < 600
    assert slots_in_use(triton_server) == 0


def test_a_multi_step_call_through_the_server_draws_what_single_steps_draw(triton_server):
    """decode_steps over Triton: a seeded sequence's tokens in output_ids, 3 a call, are those of one-step
    calls to zero_check_step; sequence_end frees the slot after the row's last step; a request for logits
    (a chain that samples elsewhere) with decode_steps > 1 is refused naming it."""
    def call(model, seq_id, tokens, start, end, steps=1, outputs=("output_ids",)):
        rows = {"sequence_id": np.array([[seq_id.encode()]], dtype=object), "input_ids": np.array([tokens], np.int32),
                "sequence_start": np.array([[start]]), "sequence_end": np.array([[end]]),
                "temperature": np.full((1, 1), 0.9, np.float32), "top_k": np.full((1, 1), 40, np.int32),
                "random_seed": np.full((1, 1), 77, np.uint64)}
        if steps > 1:
            rows["decode_steps"] = np.full((1, 1), steps, np.int32)
        if not start:
            rows = {k: v for k, v in rows.items() if k not in ("temperature", "top_k", "random_seed")}
        with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
            result = client.infer(model, step_inputs(rows), outputs=[grpcclient.InferRequestedOutput(n) for n in outputs])
        return [t for t in result.as_numpy(outputs[0]).reshape(-1).tolist() if t >= 0]

    prompt = [5, 6, 7, 8]
    single = call("zero_check_step", "single", prompt, True, False)
    while len(single) < 10:
        single += call("zero_check_step", "single", single[-1:], False, len(single) == 9)
    multi = call("decoder", "multi", prompt, True, False)
    for steps, end in ((3, False), (3, False), (3, True)):
        multi += call("decoder", "multi", multi[-1:], False, end, steps)
    assert multi == single
    assert slots_in_use(triton_server) == 0
    with grpcclient.InferenceServerClient(triton_server.grpc_url) as client:
        rows = {"sequence_id": np.array([[b"logits"]], dtype=object), "input_ids": np.array([[5]], np.int32),
                "sequence_start": np.array([[True]]), "sequence_end": np.array([[True]]),
                "decode_steps": np.full((1, 1), 2, np.int32)}
        with pytest.raises(Exception, match="decode_steps > 1 needs the fused sampler"):
            client.infer("decoder", step_inputs(rows), outputs=[grpcclient.InferRequestedOutput("logits")])


def test_the_decoder_says_what_it_runs_with(triton_server):
    text = requests.get(f"http://{triton_server.metrics_url}/metrics", timeout=10).text
    (line,) = [line for line in text.splitlines() if line.startswith("zerocheck_decoder_info{")]
    assert 'device="cpu"' in line and 'backend="' in line and 'dtype="' in line and line.endswith(" 1"), line


def test_triton_exports_latency_quantiles_per_model(triton_server):
    """`zerocheck serve` turns on Triton's latency summaries: p50-p99 of each model's queue and compute times
    beside the totals (benchmarks/soak.py reads the decoder's p99 execute)."""
    grpc_generate(triton_server.grpc_url, {"text_input": PROMPT, "max_tokens": 2})
    text = requests.get(f"http://{triton_server.metrics_url}/metrics", timeout=10).text
    for name in ("nv_inference_queue_summary_us", "nv_inference_compute_infer_summary_us"):
        assert re.search(rf'^{name}{{[^}}]*model="decoder"[^}}]*quantile="0.99"[^}}]*}} \d', text, re.M), name
