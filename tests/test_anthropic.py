"""The Anthropic Messages API, called with the official `anthropic` SDK (sync, async, streaming), curl and
raw HTTP, against `zerocheck serve` over the real model (session fixture `real_server`); the bypass rate
read by a real Prometheus from the front end's metrics."""
from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import anthropic
import openai
import pytest
import requests
import yaml

from generate_calls import slots_in_use, wait_slots_free
from zerocheck.serve.server import free_ports

MODEL = "smollm2-135m-instruct"
BETA = {"anthropic-beta": "zero-check-layer-2024-06"}
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
RULES = Path(__file__).resolve().parents[1] / "deploy" / "prometheus" / "alerts.yml"


@pytest.fixture(scope="module")
def client(real_server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=real_server.anthropic_url, api_key="unused", max_retries=0, timeout=120)


def test_the_described_client_code_runs_with_only_its_base_url_changed(real_server):
    client = anthropic.Anthropic(base_url=real_server.anthropic_url, api_key="sk-ant-unused")
    response = client.messages.with_raw_response.create(
        model=MODEL,
        max_tokens=1024,
        temperature=0.5,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        extra_headers={"anthropic-beta": "zero-check-layer-2024-06"},
    )
    assert response.headers["X-Anthropic-ZeroCheck-Bypass"] == "true"
    assert response.headers["X-ZeroCheck-Sampler"] == "zero_check" and response.headers["request-id"].startswith("req_")
    message = response.parse()
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.model == MODEL and message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.stop_sequence is None
    assert message.usage.input_tokens > 20 and 0 < message.usage.output_tokens <= 1024


def test_without_the_beta_the_checked_chain_answers_and_says_so(client):
    response = client.messages.with_raw_response.create(model=MODEL, max_tokens=8, temperature=0, messages=FRANCE)
    assert response.headers["X-Anthropic-ZeroCheck-Bypass"] == "false"
    assert response.headers["X-ZeroCheck-Sampler"] == "checked" and "Paris" in response.parse().content[0].text
    other = client.messages.with_raw_response.create(model=MODEL, max_tokens=8, temperature=0, messages=FRANCE,
                                                     extra_headers={"anthropic-beta": "other-beta-2025-01-01"})
    assert other.headers["X-Anthropic-ZeroCheck-Bypass"] == "false"  # an unknown beta is ignored


def test_the_openai_endpoints_answer_with_the_header_too(real_server):
    chat = openai.OpenAI(base_url=real_server.openai_url, api_key="unused", max_retries=0)
    reply = chat.chat.completions.with_raw_response.create(model=MODEL, messages=FRANCE, max_tokens=4,
                                                           extra_headers=BETA)
    assert reply.headers["X-Anthropic-ZeroCheck-Bypass"] == "true"
    degraded = chat.chat.completions.with_raw_response.create(model=MODEL, messages=FRANCE, max_tokens=4, logprobs=True,
                                                              extra_headers=BETA)
    assert degraded.headers["X-Anthropic-ZeroCheck-Bypass"] == "false"  # log-probabilities: the checked chain


def test_a_streamed_answer_equals_the_whole_one(client):
    whole = client.messages.create(model=MODEL, max_tokens=24, temperature=0, messages=FRANCE, extra_headers=BETA)
    with client.messages.stream(model=MODEL, max_tokens=24, temperature=0, messages=FRANCE,
                                extra_headers=BETA) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text == final.content[0].text and "Paris" in text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert final.usage.input_tokens == whole.usage.input_tokens


def test_the_event_stream_has_anthropic_events_in_order(real_server):
    body = {"model": MODEL, "max_tokens": 6, "messages": FRANCE, "stream": True}
    reply = requests.post(real_server.anthropic_url + "/v1/messages", json=body, timeout=60,
                          headers={"anthropic-version": "2023-06-01", **BETA})
    assert reply.status_code == 200 and reply.headers["Content-Type"].startswith("text/event-stream")
    names = re.findall(r"^event: (\S+)$", reply.text, re.M)
    assert names[:3] == ["message_start", "content_block_start", "ping"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    delta = json.loads(re.findall(r"^data: (.*)$", reply.text, re.M)[-2])
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert delta["usage"] == {"output_tokens": 6}


def test_system_stop_sequences_and_a_prefill(client):
    answer = client.messages.create(model=MODEL, max_tokens=64, temperature=0, system="Answer in one short sentence.",
                                    messages=FRANCE, stop_sequences=["Paris"], extra_headers=BETA)
    assert answer.stop_reason == "stop_sequence" and answer.stop_sequence == "Paris"
    assert "Paris" not in answer.content[0].text
    prefilled = client.messages.create(model=MODEL, max_tokens=4, temperature=0, extra_headers=BETA, messages=[
        *FRANCE, {"role": "assistant", "content": "The capital of France is"}])
    assert prefilled.content[0].text.startswith(" Paris")  # the answer continues the prefill


def test_count_tokens_counts_what_a_request_is_charged(client):
    counted = client.messages.count_tokens(model=MODEL, messages=FRANCE, system="Be brief.")
    answered = client.messages.create(model=MODEL, max_tokens=1, messages=FRANCE, system="Be brief.")
    assert counted.input_tokens == answered.usage.input_tokens > 20


def test_the_async_client_creates_and_streams(real_server):
    async def scenario():
        async with anthropic.AsyncAnthropic(base_url=real_server.anthropic_url, api_key="unused",
                                            max_retries=0) as aclient:
            whole, streamed = await asyncio.gather(
                aclient.messages.create(model=MODEL, max_tokens=16, temperature=0, messages=FRANCE, extra_headers=BETA),
                aclient.messages.create(model=MODEL, max_tokens=16, temperature=0, messages=FRANCE, extra_headers=BETA,
                                        stream=True))
            text = "".join([event.delta.text async for event in streamed if event.type == "content_block_delta"])
            assert text == whole.content[0].text and "Paris" in text
            async with aclient.messages.stream(model=MODEL, max_tokens=16, temperature=0, messages=FRANCE,
                                               extra_headers=BETA) as stream:
                assert "".join([piece async for piece in stream.text_stream]) == text

    asyncio.run(scenario())


def test_errors_map_to_the_sdk_exception_classes(client, real_server):
    with pytest.raises(anthropic.BadRequestError) as error:
        client.messages.create(model=MODEL, max_tokens=8, temperature=1.5, messages=FRANCE)
    assert error.value.body == {"type": "error", "error": {"type": "invalid_request_error",
                                                          "message": "temperature must be in [0, 1], got 1.5"}}
    with pytest.raises(anthropic.BadRequestError, match="tool use is not supported"):
        client.messages.create(model=MODEL, max_tokens=8, messages=FRANCE,
                               tools=[{"name": "f", "input_schema": {"type": "object"}}])
    with pytest.raises(anthropic.BadRequestError, match="only text blocks"):
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}])
    with pytest.raises(anthropic.NotFoundError) as missing:
        client.messages.create(model="claude-sonnet-4-5", max_tokens=8, messages=FRANCE)
    assert missing.value.body["error"]["type"] == "not_found_error"
    raw = requests.post(real_server.anthropic_url + "/v1/messages", data=b'{"model": ', timeout=30)
    assert raw.status_code == 400 and raw.json()["type"] == "error" and "Traceback" not in raw.text


def test_a_disconnected_stream_frees_its_slot(client, real_server):
    assert wait_slots_free(real_server) == 0
    stream = client.messages.create(model=MODEL, max_tokens=200, messages=FRANCE, stream=True, extra_headers=BETA,
                                    extra_body={"ignore_eos": True})
    deltas = 0
    for event in stream:
        deltas += event.type == "content_block_delta"
        if deltas == 5:
            break
    assert slots_in_use(real_server) == 1
    stream.close()  # the client goes away mid-stream
    left = time.monotonic()
    while slots_in_use(real_server) != 0 and time.monotonic() - left < 10:
        time.sleep(0.02)
    assert slots_in_use(real_server) == 0, "the disconnected request still holds its KV slot"
    assert time.monotonic() - left < 2.0


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_the_described_curl_check_prints_the_header(real_server):
    body = json.dumps({"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "Hello"}]})
    command = (f"curl -si {real_server.anthropic_url}/v1/messages -H 'x-api-key: unused' "
               f"-H 'anthropic-version: 2023-06-01' -H 'anthropic-beta: zero-check-layer-2024-06' "
               f"-H 'content-type: application/json' -d '{body}' | grep -i x-anthropic-zerocheck-bypass")
    printed = subprocess.run(command, shell=True, capture_output=True, text=True, timeout=60).stdout
    assert printed.strip().lower() == "x-anthropic-zerocheck-bypass: true"


def test_a_client_key_is_required_when_configured(tmp_path):
    """The front end alone (no Triton behind it: the key is checked before anything else)."""
    dead_grpc, port = free_ports("127.0.0.1", 2)
    ready = tmp_path / "ports"
    frontend = subprocess.Popen([sys.executable, "-m", "zerocheck.frontend", "--url", f"127.0.0.1:{dead_grpc}",
                                 "--port", str(port), "--served-model-name", MODEL, "--ready-file", str(ready),
                                 "--client-api-key", "right-key"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not (ready.is_file() and ready.read_text()) and time.monotonic() < deadline:
            time.sleep(0.1)
        base = f"http://127.0.0.1:{port}"
        wrong = anthropic.Anthropic(base_url=base, api_key="wrong-key", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as error:
            wrong.messages.create(model=MODEL, max_tokens=4, messages=FRANCE)
        assert error.value.body["error"]["type"] == "authentication_error"
        with pytest.raises(anthropic.AuthenticationError):
            anthropic.Anthropic(base_url=base, api_key="wrong-key", max_retries=0).messages.count_tokens(
                model=MODEL, messages=FRANCE)
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="wrong-key", max_retries=0).models.list()
        assert requests.post(f"{base}/v1/messages", json={}, timeout=10).status_code == 401  # no key at all
        right = anthropic.Anthropic(base_url=base, api_key="right-key", max_retries=0)
        with pytest.raises(anthropic.InternalServerError) as past_the_key:  # accepted; Triton is not there
            right.messages.create(model=MODEL, max_tokens=4, messages=FRANCE)
        assert past_the_key.value.status_code == 503
        assert openai.OpenAI(base_url=f"{base}/v1", api_key="right-key").models.list().data[0].id == MODEL
        assert requests.get(f"{base}/metrics", timeout=10).status_code == 200  # Prometheus needs no key
    finally:
        frontend.terminate()
        frontend.wait(10)


@pytest.mark.skipif(shutil.which("prometheus") is None, reason="prometheus not installed (apt-get install prometheus)")
def test_prometheus_reads_the_bypass_rate_from_the_header(real_server, client, tmp_path):
    """A real Prometheus scrapes the front end and evaluates the shipped rules: 3 answers with the zero-check
    path and 1 degraded to the checked chain read as a 75 % header bypass rate, and the < 95 % alert goes pending."""
    chat = openai.OpenAI(base_url=real_server.openai_url, api_key="unused", max_retries=0)

    def one_of_each() -> None:  # a zero-check answer, and one degraded to the checked chain (log-probabilities)
        client.messages.create(model=MODEL, max_tokens=2, messages=FRANCE, extra_headers=BETA)
        chat.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=2, logprobs=True, extra_headers=BETA)

    # both counters start above 0, so rate() extrapolates them alike (a counter starting at 0 is not
    # extrapolated back past its zero, which would skew the ratio of a few seconds' samples)
    one_of_each()
    port = free_ports("127.0.0.1", 1)[0]
    frontend = real_server.anthropic_url.removeprefix("http://")
    config = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"}, "rule_files": [str(RULES)],
              "scrape_configs": [{"job_name": "zerocheck-frontend", "static_configs": [{"targets": [frontend]}]}]}
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    prometheus = subprocess.Popen(["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    api = f"http://127.0.0.1:{port}/api/v1/query"

    def query(expr: str) -> list[dict]:
        try:
            return requests.get(api, params={"query": expr}, timeout=10).json()["data"]["result"]
        except (requests.ConnectionError, KeyError):
            return []

    def wait_for(expr: str, timeout_s: float = 30.0) -> list[dict]:
        deadline = time.monotonic() + timeout_s
        while not (result := query(expr)) and time.monotonic() < deadline:
            time.sleep(0.25)
        return result

    try:
        assert wait_for('count_over_time(up{job="zerocheck-frontend"}[1m]) >= 2'), "Prometheus did not scrape"
        for _ in range(2):
            client.messages.create(model=MODEL, max_tokens=2, messages=FRANCE, extra_headers=BETA)
        one_of_each()  # the degraded answer last: a rate below 99 % counts all four
        rate = wait_for("zerocheck:header_bypass_rate:ratio_rate5m < 0.99")
        assert rate and float(rate[0]["value"][1]) == pytest.approx(0.75, rel=0.02)
        assert wait_for('ALERTS{alertname="ZerocheckBetaHeaderNotTakingEffect",alertstate="pending"}')
    finally:
        prometheus.terminate()
        prometheus.wait(10)


@pytest.mark.parametrize("raw", [b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                                 b'{"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}'])
@pytest.mark.parametrize("path", ["/v1/messages", "/v1/chat/completions"])
def test_hostile_bodies_are_400_on_both_apis(real_server, raw, path):
    reply = requests.post(real_server.anthropic_url + path, data=raw, timeout=30,
                          headers={"Content-Type": "application/json"})
    assert reply.status_code == 400 and "Traceback" not in reply.text
    message = reply.json()["error"]["message"]
    assert "nests too deeply" in message or "not valid Unicode" in message
