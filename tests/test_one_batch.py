"""One generation loop for every door: `ensemble`, `tensorrt_llm_bls` and `tensorrt_llm` forward to `generate`,
whose one scheduler puts every active sequence in one decoder call per step, under one admission."""
from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from generate_calls import grpc_generate, http_generate, wait_slots_free
from zerocheck.api.errors import InvalidRequest
from zerocheck.generate.relay import Relay, error_arrays
from zerocheck.triton.forward import is_stop_request

TOKENS = 40
PROMPT = "def fibonacci(n):"


def test_a_relay_hands_out_responses_in_order_and_marks_the_last():
    """A sequence's final response is held until the next one, so only the request's last is marked final;
    an error travels as data after what was queued."""
    async def drain(relay: Relay, count: int) -> list:
        return [await relay.next() for _ in range(count)]

    relay = Relay()
    relay.send({"text_output": np.array([b"a"], dtype=object)}, False)
    relay.send({"text_output": np.array([b"b"], dtype=object)}, True)  # the first sequence's end
    relay.send({"text_output": np.array([b"c"], dtype=object)}, True)  # the second's
    relay.close()
    got = asyncio.run(drain(relay, 3))
    assert [(arrays["text_output"][0], last, bool(arrays["relay_final"][0][0])) for arrays, last in got] == [
        (b"a", False, False), (b"b", False, False), (b"c", True, True)]
    failed = Relay()
    failed.send({"text_output": np.array([b"a"], dtype=object)}, True)
    failed.close(InvalidRequest("max_tokens must be >= 1"))
    (first, _), (error, last) = asyncio.run(drain(failed, 2))
    assert first["text_output"][0] == b"a" and last
    assert error["error"][0][0] == b"INVALID_ARGUMENT: max_tokens must be >= 1"
    assert error_arrays(InvalidRequest("x"))["relay_final"][0][0]
    assert is_stop_request({"stop": np.array([[True]])}) and not is_stop_request({"stop": np.array([[False]])})
    assert not is_stop_request({"text_input": np.array([[b"x"]], dtype=object)})


def decoder_stats(stack) -> tuple[int, int, int]:
    """The decoder's executions, requests and rows (inference count) so far."""
    stats = requests.get(f"http://{stack.http_url}/v2/models/decoder/stats", timeout=10).json()["model_stats"][0]
    return int(stats["execution_count"]), int(stats["inference_stats"]["success"]["count"]), \
        int(stats["inference_count"])


def token_request(stack, ids: list[int]) -> int:
    """A tensorrt_llm (token door) request over gRPC: its completion tokens."""
    fields = {"input_ids": np.array([ids], np.int32), "input_lengths": np.array([[len(ids)]], np.int32),
              "request_output_len": np.array([[TOKENS]], np.int32), "min_tokens": np.array([[TOKENS]], np.int32),
              "streaming": np.array([[True]]), "temperature": np.array([[0.8]], np.float32)}
    responses = grpc_generate(stack.grpc_url, fields, model="tensorrt_llm")
    return int(responses[-1]["completion_tokens"])


def test_mixed_doors_share_one_decoder_call_per_step(triton_server, tmp_path):
    """Twelve streams at once, four through each kind of door (gRPC `ensemble`, HTTP `generate_stream`,
    the token door `tensorrt_llm`): all run as rows of the same decoder calls. With a scheduler per door
    the calls would alternate between the doors, each holding a third of the rows."""
    from zerocheck.tokenizer import load_tokenizer

    import conftest

    ids = load_tokenizer(conftest.test_artifacts_dir()).encode(PROMPT)
    text = {"text_input": PROMPT, "max_tokens": TOKENS, "min_tokens": TOKENS, "stream": True, "temperature": 0.8}
    jobs = [lambda: int(grpc_generate(triton_server.grpc_url, text, model="ensemble")[-1]["completion_tokens"]),
            lambda: int(http_generate(triton_server.http_url, text, stream=True, model="generate")[-1]
                        ["completion_tokens"]),
            lambda: token_request(triton_server, ids)] * 4
    wait_slots_free(triton_server)
    executes, calls, rows = decoder_stats(triton_server)
    with ThreadPoolExecutor(len(jobs)) as pool:
        tokens = list(pool.map(lambda job: job(), jobs))
    executes, calls, rows = (after - before for after, before in zip(decoder_stats(triton_server),
                                                                     (executes, calls, rows)))
    assert tokens == [TOKENS] * len(jobs)
    # ~TOKENS steps of up to 12 rows, plus the slots' releases (calls without rows)
    print(f"decoder: {executes} executes, {calls} calls, {rows} rows: {rows / executes:.1f} rows per execute")
    assert rows / executes > 6, (executes, calls, rows)  # a scheduler per door: at most 4 (its third of 12)


def test_a_burst_as_large_as_the_kv_cache_starts_at_once(triton_server):
    """32 streams against the shipped 32 KV slots: every one is admitted and streams its first token before
    any of them has ended (none waits for another's whole generation), and none is refused."""
    server = triton_server
    wait_slots_free(server)
    fields = {"text_input": PROMPT, "max_tokens": 128, "min_tokens": 128, "stream": True, "temperature": 0.8}

    def stream(seed: int) -> tuple[float, float]:
        """(first token, end) of one stream, on the clock the others use."""
        sent = time.perf_counter()
        responses = grpc_generate(server.grpc_url, {**fields, "seed": seed})
        assert responses[-1]["finish_reason"] == "length"
        return sent + responses[0]["t"], sent + responses[-1]["t"]

    with ThreadPoolExecutor(32) as pool:
        firsts, ends = zip(*pool.map(stream, range(32)))
    assert max(firsts) < min(ends), (sorted(firsts)[-3:], sorted(ends)[:3])


@pytest.mark.parametrize("door", ["ensemble", "tensorrt_llm_bls"])
def test_cancelling_through_a_forwarding_door_frees_the_slot(triton_server, door):
    """A stop request at the door (tensorrtllm_backend's `stop` with the request's id) reaches `generate`:
    the request ends early and its KV slot is freed."""
    fields = {"text_input": PROMPT, "max_tokens": 200, "min_tokens": 200, "stream": True}
    responses = grpc_generate(triton_server.grpc_url, fields, model=door, cancel_after=3)
    assert 3 <= len(responses) < 50 and sum(r["completion_tokens"] for r in responses[-1:]) < 200, responses[-1]
    assert wait_slots_free(triton_server) == 0
