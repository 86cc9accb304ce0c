"""The OpenAI-compatible API, called with the official `openai` SDK (sync, async, streaming) and raw HTTP,
against `zerocheck serve` over the real model (session fixture `real_server`)."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

import anthropic
import openai
import pytest
import requests

import conftest
from generate_calls import slots_in_use
from zerocheck.serve.server import free_ports
from zerocheck.serve.stack import ServingStack

MODEL = "smollm2-135m-instruct"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(real_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_server.openai_url, api_key="unused", max_retries=0, timeout=120)


def raw(real_server, path: str, body: bytes | dict, headers: dict | None = None) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return requests.post(real_server.openai_url + path, data=data, timeout=120,
                         headers={"Content-Type": "application/json", **(headers or {})})


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as error:
        client.models.retrieve("gpt-5")
    assert error.value.code == "model_not_found"


def test_chat_answers_with_usage_and_path_headers(client):
    reply = client.chat.completions.with_raw_response.create(model=MODEL, messages=FRANCE, temperature=0,
                                                             max_tokens=32)
    assert reply.headers["X-ZeroCheck-Bypass"] == "true" and reply.headers["X-ZeroCheck-Sampler"] == "zero_check"
    completion = reply.parse()
    assert completion.object == "chat.completion" and completion.id.startswith("chatcmpl-")
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and "Paris" in choice.message.content and choice.finish_reason == "stop"
    usage = completion.usage
    assert usage.prompt_tokens > 20 and 0 < usage.completion_tokens < 32
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_streamed_chat_equals_the_whole_answer_and_ends_with_usage(client):
    whole = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=24)
    chunks = list(client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=24,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_text_completions_and_max_tokens(client):
    completion = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0)
    assert completion.object == "text_completion" and completion.choices[0].text.startswith(" Paris")
    assert completion.choices[0].finish_reason == "length" and completion.usage.completion_tokens == 6
    stream = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=6, temperature=0,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream) == completion.choices[0].text
    limited = client.chat.completions.create(model=MODEL, messages=FRANCE, max_completion_tokens=3, temperature=0)
    assert limited.choices[0].finish_reason == "length" and limited.usage.completion_tokens == 3


def test_n_and_seed(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Write a short poem."}], max_tokens=16,
                  temperature=1.0)
    first = client.chat.completions.create(n=2, seed=42, **kwargs)
    again = client.chat.completions.create(n=2, seed=42, **kwargs)
    other = client.chat.completions.create(n=2, seed=43, **kwargs)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1] and texts == [c.message.content for c in again.choices]
    assert texts[0] != texts[1] and texts != [c.message.content for c in other.choices]
    assert first.usage.completion_tokens > max(len(t.split()) for t in texts) // 2  # counted over both choices
    streamed = client.chat.completions.create(n=2, seed=42, stream=True, **kwargs)
    pieces = {0: [], 1: []}
    for chunk in streamed:
        for choice in chunk.choices:
            pieces[choice.index].append(choice.delta.content or "")
    assert ["".join(pieces[0]), "".join(pieces[1])] == texts


def test_stop_strings_are_not_returned(client):
    base = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    assert "," in base.choices[0].text
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[","])
    assert stopped.choices[0].finish_reason == "stop" and "," not in stopped.choices[0].text
    assert base.choices[0].text.startswith(stopped.choices[0].text)


def test_extras_logit_bias_and_ignore_eos(client):
    capital = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=8,
                                             extra_body={"top_k": 1, "min_p": 0.05, "repetition_penalty": 1.1})
    assert "Paris" in capital.choices[0].message.content
    long = client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=40,
                                          extra_body={"ignore_eos": True})
    assert long.usage.completion_tokens == 40 and long.choices[0].finish_reason == "length"
    forced = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, temperature=0,
                                       logit_bias={"28": 100})  # token 28 is ","
    assert forced.choices[0].text == ",,,"
    floor = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=4, temperature=0,
                                      extra_body={"min_tokens": 4})
    assert floor.usage.completion_tokens == 4


def test_logprobs_are_served_by_the_checked_path(client):
    reply = client.chat.completions.with_raw_response.create(model=MODEL, messages=FRANCE, temperature=0,
                                                             max_tokens=8, logprobs=True)
    assert reply.headers["X-ZeroCheck-Sampler"] == "checked" and reply.headers["X-ZeroCheck-Bypass"] == "false"
    content = reply.parse().choices[0].logprobs.content
    assert "".join(t.token for t in content) == reply.parse().choices[0].message.content
    assert all(t.logprob <= 0 and t.bytes == list(t.token.encode()) for t in content)
    top = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=4, seed=3, logprobs=True,
                                         top_logprobs=3).choices[0].logprobs.content
    for token in top:  # the alternatives are ordered, and none is more likely than the first
        alternatives = [t.logprob for t in token.top_logprobs]
        assert len(alternatives) == 3 and alternatives == sorted(alternatives, reverse=True)
        assert token.logprob <= alternatives[0] + 1e-6
    text = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=3, seed=3,
                                     logprobs=2).choices[0].logprobs
    assert len(text.tokens) == 3 and all(len(alternatives) == 2 for alternatives in text.top_logprobs)
    assert text.text_offset == [0, len(text.tokens[0]), len(text.tokens[0]) + len(text.tokens[1])]


def test_zerocheck_header_switches_the_path(client):
    reply = client.chat.completions.with_raw_response.create(model=MODEL, messages=FRANCE, temperature=0,
                                                             max_tokens=8, extra_headers={"zerocheck": "off"})
    assert reply.headers["X-ZeroCheck-Sampler"] == "checked" and reply.headers["X-ZeroCheck-Bypass"] == "false"
    assert "Paris" in reply.parse().choices[0].message.content


def test_a_hedge_is_served_and_counted(real_server, client):
    def hedges() -> float:
        text = requests.get(f"http://{real_server.metrics_url}/metrics", timeout=10).text
        match = re.search(r'^zerocheck_retried_requests_total\{reason="slow_response"\} (\S+)$', text, re.M)
        return float(match.group(1)) if match else -1.0

    before = hedges()
    reply = client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=4,
                                           extra_headers={"X-Retry-Reason": "slow_response"})
    assert reply.choices[0].message.content
    assert hedges() == before + 1


@pytest.mark.parametrize("body, param, message", [
    ({"model": MODEL, "messages": FRANCE, "temperature": "hot"}, "temperature", "temperature must be a number"),
    ({"model": MODEL, "messages": FRANCE, "top_p": 2}, "top_p", "top_p must be in (0, 1]"),
    ({"model": MODEL, "messages": []}, "messages", "messages must hold at least one message"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages", "role must be one of"),
    ({"model": MODEL, "messages": FRANCE, "n": 9}, "n", "n must be in [1, 4]"),
    ({"model": MODEL, "messages": FRANCE, "tools": [{"type": "function"}]}, "tools", "tools[0] must be"),
    ({"model": MODEL, "messages": FRANCE, "colour": "red"}, "colour", "unrecognized request argument(s): colour"),
    ({"model": MODEL, "messages": FRANCE, "max_tokens": 5000}, "max_tokens", "max_tokens must be an integer in [1, "),
])
def test_bad_requests_are_400_naming_the_field(real_server, body, param, message):
    reply = raw(real_server, "/chat/completions", body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and message in error["message"] and error["type"] == "invalid_request_error"
    assert error["code"] == "INVALID_ARGUMENT" and "Traceback" not in reply.text


def test_malformed_json_and_unknown_model(real_server, client):
    reply = raw(real_server, "/chat/completions", b'{"model": "x", "messages": [')
    assert reply.status_code == 400 and "not valid JSON" in reply.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.chat.completions.create(model="gpt-5", messages=FRANCE)
    with pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model=MODEL, messages=FRANCE, temperature=-1)
    assert error.value.param == "temperature" and error.value.code == "INVALID_ARGUMENT"


def test_async_client_chat_stream_and_completions(real_server):
    async def scenario():
        async with openai.AsyncOpenAI(base_url=real_server.openai_url, api_key="unused", max_retries=0) as aclient:
            whole, streamed = await asyncio.gather(
                aclient.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=16),
                aclient.chat.completions.create(model=MODEL, messages=FRANCE, temperature=0, max_tokens=16,
                                                stream=True))
            text = "".join([c.choices[0].delta.content or "" async for c in streamed if c.choices])
            assert text == whole.choices[0].message.content and "Paris" in text
            completion = await aclient.completions.create(model=MODEL, prompt="The capital of France is",
                                                          max_tokens=4, temperature=0)
            assert completion.choices[0].text.startswith(" Paris")

    asyncio.run(scenario())


def test_a_disconnected_client_frees_its_slot_within_a_step(real_server):
    body = {"model": MODEL, "messages": FRANCE, "max_tokens": 200, "stream": True, "ignore_eos": True}
    reply = requests.post(real_server.openai_url + "/chat/completions", json=body, stream=True, timeout=60)
    lines = reply.iter_lines()
    for _ in range(5):  # a few tokens have streamed
        while not next(lines).startswith(b"data: "):
            pass
    assert slots_in_use(real_server) == 1
    reply.raw.shutdown()  # the client goes away mid-stream
    reply.close()
    left = time.monotonic()
    while slots_in_use(real_server) != 0 and time.monotonic() - left < 10:
        time.sleep(0.02)
    freed_s = time.monotonic() - left
    assert slots_in_use(real_server) == 0, "the disconnected request still holds its KV slot"
    print(f"\nslot freed {freed_s * 1000:.0f} ms after the client disconnected")
    assert freed_s < 2.0


def test_not_ready_is_503(tmp_path):
    dead_grpc, port = free_ports("127.0.0.1", 2)
    ready = tmp_path / "ports"
    frontend = subprocess.Popen([sys.executable, "-m", "zerocheck.frontend", "--url", f"127.0.0.1:{dead_grpc}",
                                 "--port", str(port), "--served-model-name", MODEL, "--ready-file", str(ready)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (ready.is_file() and ready.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        health = requests.get(f"{base}/health", timeout=10)
        assert health.status_code == 503 and "not ready" in health.json()["error"]["message"]
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.InternalServerError) as error:
            client.chat.completions.create(model=MODEL, messages=FRANCE)
        assert error.value.status_code == 503 and error.value.response.headers["Retry-After"]
    finally:
        frontend.terminate()
        frontend.wait(10)


def test_overload_is_429_with_retry_after_on_every_door(tritonserver_binary, tmp_path):
    """One sequence at a time and no queue: a second concurrent request is refused at once."""
    repository = conftest.copied_repository(tmp_path, generate={"max_concurrent_sequences": "1", "max_queue_size": "0"})
    stack = ServingStack(repository, tritonserver=tritonserver_binary,
                         env={"ZEROCHECK_ARTIFACTS": str(conftest.test_artifacts_dir())})
    stack.start()
    try:
        stack.wait_ready(conftest.READY_TIMEOUT_S)
        client = openai.OpenAI(base_url=stack.openai_url, api_key="unused", max_retries=0)
        messages = anthropic.Anthropic(base_url=stack.anthropic_url, api_key="unused", max_retries=0)
        messages.messages.create(model="tiny", max_tokens=1, messages=[{"role": "user", "content": "hi"}])  # warm
        busy = client.completions.create(model="tiny", prompt="def f():", max_tokens=248, stream=True,
                                         extra_body={"ignore_eos": True})
        next(iter(busy))  # the one slot is taken (for as long as 248 tokens take: every refusal below is immediate)
        with pytest.raises(anthropic.RateLimitError) as limited:
            messages.messages.create(model="tiny", max_tokens=4, messages=[{"role": "user", "content": "def g():"}])
        assert limited.value.response.headers["retry-after"] == "1"
        assert limited.value.body["error"]["type"] == "rate_limit_error"
        with pytest.raises(openai.RateLimitError) as error:
            client.completions.create(model="tiny", prompt="def g():", max_tokens=4)
        assert error.value.response.headers["Retry-After"] == "1" and error.value.code == "RESOURCE_EXHAUSTED"
        door = requests.post(f"http://{stack.http_url}/v2/models/ensemble/generate",
                             json={"text_input": "def g():", "max_tokens": 4}, timeout=30)
        assert door.status_code == 429 and door.headers["Retry-After"] == "1"
        assert door.json()["error"].startswith("RESOURCE_EXHAUSTED: overloaded")
        busy.close()
    finally:
        stack.stop()
