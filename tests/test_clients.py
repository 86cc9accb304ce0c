"""zerocheck.clients against the session server: protocol/sync/async parity, typed errors,
cancellation freeing the KV slot, and the `generate` / `health` CLI."""
from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import time

import pytest
import requests

import conftest
from generate_calls import wait_slots_free
from zerocheck.clients.async_client import AsyncClient
from zerocheck.clients.client import Client
from zerocheck.clients.errors import InvalidRequest
from zerocheck.serve import TritonServer

PROMPT = "def main():"
SEEDED = {"max_tokens": 8, "seed": 1234, "temperature": 0.8, "top_p": 0.9}


def url_of(server: TritonServer, protocol: str) -> str:
    return server.grpc_url if protocol == "grpc" else server.http_url


async def async_results(server: TritonServer, protocol: str) -> list[list[int]]:
    async with AsyncClient(url_of(server, protocol), protocol) as client:
        streamed = [event.token_ids async for event in client.stream(PROMPT, **SEEDED)]
        together = await asyncio.gather(client.generate(PROMPT, **SEEDED), client.generate(PROMPT, **SEEDED))
    return [sum(streamed, []), *(result.token_ids for result in together)]


def test_same_seed_same_tokens_everywhere(triton_server: TritonServer) -> None:
    reference = Client(triton_server.grpc_url).generate(PROMPT, **SEEDED)
    assert len(reference.token_ids) == reference.completion_tokens == 8
    assert reference.finish_reason == "length" and reference.sampler == "zero_check" and reference.prompt_tokens > 0
    assert reference.retries == 0 and not reference.hedged and 0 < reference.ttft_s <= reference.latency_s
    for protocol in ("grpc", "http"):
        client = Client(url_of(triton_server, protocol), protocol)
        events = list(client.stream(PROMPT, **SEEDED))
        assert events[-1].final is not None and all(event.final is None for event in events[:-1])
        assert sum((event.token_ids for event in events), []) == reference.token_ids
        assert "".join(event.text for event in events) == events[-1].final.text == reference.text
        assert client.generate(PROMPT, **SEEDED).token_ids == reference.token_ids
        assert asyncio.run(async_results(triton_server, protocol)) == [reference.token_ids] * 3
    # the server's non-streamed path agrees with the streamed one
    body = {"text_input": PROMPT, "exclude_input_in_output": True, **SEEDED}
    answer = requests.post(f"http://{triton_server.http_url}/v2/models/ensemble/generate", json=body, timeout=30)
    assert answer.json()["output_ids"] == reference.token_ids and answer.json()["text_output"] == reference.text


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_zerocheck_off_takes_the_checked_path(triton_server: TritonServer, protocol: str) -> None:
    result = Client(url_of(triton_server, protocol), protocol).generate(PROMPT, max_tokens=4, zerocheck=False)
    assert result.sampler == "checked" and not result.zerocheck_bypass


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_bad_parameter_is_a_typed_error_without_retry(triton_server: TritonServer, protocol: str) -> None:
    client = Client(url_of(triton_server, protocol), protocol, retries=5, backoff_s=2.0)
    started = time.monotonic()
    with pytest.raises(InvalidRequest, match=re.escape("top_p must be in (0, 1], got 1.5")):
        client.generate(PROMPT, max_tokens=4, top_p=1.5)
    assert time.monotonic() - started < 1.0  # no backoff slept: a retry would wait >= 1 s
    with pytest.raises(InvalidRequest, match="top_p"):
        asyncio.run(AsyncClient(url_of(triton_server, protocol), protocol, retries=5).generate(PROMPT, top_p=1.5))


def cancel_sync_stream(client: Client) -> None:
    stream = client.stream(PROMPT, max_tokens=200, temperature=0, min_tokens=200)
    for index, _ in enumerate(stream):
        if index == 2:
            break
    stream.close()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
@pytest.mark.parametrize("model", ["generate", "ensemble"])
def test_closing_a_stream_frees_the_slot(triton_server: TritonServer, protocol: str, model: str) -> None:
    assert wait_slots_free(triton_server) == 0  # whatever earlier tests left has finished
    client = Client(url_of(triton_server, protocol), protocol, model=model)
    cancel_sync_stream(client)
    assert wait_slots_free(triton_server) == 0
    assert client.generate(PROMPT, max_tokens=4, min_tokens=4).completion_tokens == 4  # no early eos


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_cancelling_the_task_frees_the_slot(triton_server: TritonServer, protocol: str) -> None:
    assert wait_slots_free(triton_server) == 0  # whatever earlier tests left has finished
    client = AsyncClient(url_of(triton_server, protocol), protocol, model="generate")

    async def main() -> None:
        first_token = asyncio.Event()

        async def consume() -> None:
            async for _ in client.stream(PROMPT, max_tokens=200, temperature=0, min_tokens=200):
                first_token.set()

        async with client:
            task = asyncio.create_task(consume())
            await first_token.wait()
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            assert task.cancelled()

    asyncio.run(main())
    assert wait_slots_free(triton_server) == 0
    assert Client(url_of(triton_server, protocol), protocol).generate(PROMPT, max_tokens=4).finish_reason


def zerocheck_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "zerocheck.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_generate_json(triton_server: TritonServer) -> None:
    done = zerocheck_cli("generate", PROMPT, "--url", triton_server.http_url, "--protocol", "http", "--stream",
                         "--json", "--max-tokens", "8", "--seed", "1234", "--temperature", "0.8", "--top-p", "0.9")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    final = lines[-1]
    assert final["finish_reason"] == "length" and final["completion_tokens"] == 8
    assert sum((line["token_ids"] for line in lines[:-1]), []) == final["token_ids"]
    assert final["token_ids"] == Client(triton_server.grpc_url).generate(PROMPT, **SEEDED).token_ids
    refused = zerocheck_cli("generate", PROMPT, "--url", triton_server.grpc_url, "--top-p", "1.5")
    assert refused.returncode != 0 and "top_p must be in (0, 1], got 1.5" in refused.stderr


def test_cli_health(triton_server: TritonServer) -> None:
    for url, protocol in ((triton_server.grpc_url, "grpc"), (triton_server.http_url, "http")):
        done = zerocheck_cli("health", "--url", url, "--protocol", protocol)
        assert done.returncode == 0, done.stdout + done.stderr
        assert re.search(r"^generate\s+1\s+READY", done.stdout, re.M) and "NOT READY" not in done.stdout
        assert "checked through the model ready API" in done.stdout  # the index is locked: no key given
        keyed = zerocheck_cli("health", "--url", url, "--protocol", protocol, "--api-key", conftest.ADMIN_KEY)
        assert keyed.returncode == 0 and "from the repository index" in keyed.stdout, keyed.stdout + keyed.stderr
        assert re.search(r"^decoder\s+1\s+READY", keyed.stdout, re.M)
        missing = zerocheck_cli("health", "--url", url, "--protocol", protocol, "--model", "nonexistent")
        assert missing.returncode == 1 and re.search(r"^nonexistent\s+NOT READY", missing.stdout, re.M)
    down = zerocheck_cli("health", "--url", "127.0.0.1:1", "--protocol", "http", "--connect-timeout", "1")
    assert down.returncode == 1 and "NOT READY" in down.stdout


def test_chat_stops_a_reply_when_ctrl_c_lands_in_a_finalizer(recwarn) -> None:
    """Python drops an exception raised while a finalizer runs: a Ctrl-C that arrives then still stops the
    reply at the next token (zerocheck chat records the signal as well as raising it)."""
    import io
    import os
    import signal
    from types import SimpleNamespace

    from zerocheck.clients.cli_chat import ChatSession

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):  # the handler runs here, inside the finalizer: its exception is dropped
                pass

    class FakeClient:
        def chat_stream(self, messages, **kwargs):
            for i in range(10):
                if i == 2:
                    Finalized()
                yield SimpleNamespace(text=f"t{i} ")

    out = io.StringIO()
    ChatSession(FakeClient(), None, {}, out).turn("hi")
    assert out.getvalue() == "t0 t1 t2  [stopped]\n", out.getvalue()
