"""The guarded HTTP door in front of Triton's HTTP API.

Part 1, the door alone over a recording stand-in for Triton: what is refused never reaches it (413,
408, 400, 405, 404), what is allowed arrives unchanged, answers stream back unbuffered, overloads
become 429 with Retry-After. Part 2, `zerocheck serve`'s stack over the real tritonserver: bodies
that crash Triton 2.51's own HTTP server are refused and the server keeps serving; generate,
generate_stream, infer, health, metadata and config pass through; gRPC refuses huge messages itself.
The long sweep (up to 64 MB bodies, 256 MB gRPC messages) is tests/test_fuzz_http.py (slow).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pytest
import requests
import tritonclient.grpc as grpcclient
from aiohttp import web
from tritonclient.utils import InferenceServerException

from generate_calls import grpc_generate, http_generate
from zerocheck.frontend.app import Frontend, FrontendOptions
from zerocheck.frontend.limits import HttpLimits

LIMITS = HttpLimits(max_body_bytes=1024 * 1024, body_timeout_s=1.0, header_timeout_s=2.0)
MB = 1024 * 1024


@dataclass
class Door:
    """The door on a background event loop, in front of a recording stand-in for Triton."""

    url: str = ""
    seen: list[tuple[str, str, int, dict]] = field(default_factory=list)
    answers: dict[str, tuple[int, bytes]] = field(default_factory=dict)  # path -> canned (status, body)


@pytest.fixture(scope="module")
def door() -> Iterator[Door]:
    state = Door()
    ready, stop = threading.Event(), None

    async def upstream(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        state.seen.append((request.method, request.path_qs, len(body), dict(request.headers)))
        if request.path in state.answers:
            status, canned = state.answers[request.path]
            return web.Response(status=status, body=canned, content_type="application/json")
        if request.path.endswith("/generate_stream"):  # three events, 0.3 s apart
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for i in range(3):
                await response.write(f"data: {{\"i\": {i}, \"t\": {time.monotonic()}}}\n\n".encode())
                await asyncio.sleep(0.3)
            await response.write_eof()
            return response
        return web.json_response({"echo": len(body)})

    async def main() -> None:
        nonlocal stop
        stop = asyncio.Event()
        app = web.Application(client_max_size=100 * MB)
        app.router.add_route("*", "/{tail:.*}", upstream)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        frontend = Frontend(FrontendOptions(grpc_url="127.0.0.1:1", openai_port=None, door_port=0, limits=LIMITS,
                                            triton_http_url=f"http://127.0.0.1:{runner.addresses[0][1]}"))
        state.url = f"http://127.0.0.1:{(await frontend.start())['door']}"
        ready.set()
        await stop.wait()
        await frontend.stop()
        await runner.cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(30)
    yield state
    loop.call_soon_threadsafe(stop.set)
    thread.join(10)


def raw_exchange(url: str, payload: bytes, wait_s: float) -> tuple[bytes, float]:
    """Send `payload` on a fresh connection; (what came back, seconds until it did or the socket closed)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(payload)
        sock.settimeout(wait_s)
        began = time.monotonic()
        try:
            data = sock.recv(65536)
        except (TimeoutError, ConnectionResetError):
            data = b""
        return data, time.monotonic() - began


@pytest.mark.parametrize("size, status", [(0, 200), (1000, 200), (MB, 200), (MB + 1, 413), (5 * MB, 413),
                                          (8 * MB, 413), (20 * MB, 413)])
def test_bodies_over_the_limit_never_reach_triton(door, size, status):
    before = len(door.seen)
    reply = requests.post(f"{door.url}/v2/models/ensemble/generate", data=b"x" * size, timeout=30)
    assert reply.status_code == status
    if status == 413:
        error = reply.json()["error"]
        assert error["code"] == "REQUEST_TOO_LARGE" and f"limit of {MB} bytes" in error["message"]
        assert len(door.seen) == before
    else:
        assert door.seen[-1][2] == size and reply.json() == {"echo": size}


def test_chunked_bodies_are_counted_as_they_arrive(door):
    def chunks(total: int) -> Iterator[bytes]:
        for _ in range(total // 65536):
            yield b"y" * 65536

    before = len(door.seen)
    assert requests.post(f"{door.url}/v2/models/x/infer", data=chunks(MB // 2), timeout=30).json() == {"echo": MB // 2}
    assert door.seen[-1][:3] == ("POST", "/v2/models/x/infer", MB // 2)
    reply = requests.post(f"{door.url}/v2/models/x/infer", data=chunks(6 * MB), timeout=30)
    assert reply.status_code == 413 and len(door.seen) == before + 1


def test_slow_and_truncated_requests_time_out_without_reaching_triton(door):
    before = len(door.seen)
    head = b"POST /v2/models/x/generate HTTP/1.1\r\nHost: door\r\nContent-Length: 1000\r\n\r\nabc"
    answer, waited = raw_exchange(door.url, head, 10)  # the body never finishes
    assert answer.startswith(b"HTTP/1.1 408") and b"did not arrive within 1 s" in answer
    assert LIMITS.body_timeout_s <= waited < LIMITS.body_timeout_s + 2
    answer, waited = raw_exchange(door.url, b"POST /v2/models/x/generate HTTP/1.1\r\nHost: door\r\n", 10)
    assert answer == b"" and LIMITS.header_timeout_s <= waited < LIMITS.header_timeout_s + 2  # closed: headers never end
    raw_exchange(door.url, head, 0.2)  # a client that gives up mid-body
    assert len(door.seen) == before


def test_header_limits(door):
    answer, _ = raw_exchange(door.url, b"GET /v2/health/ready HTTP/1.1\r\nHost: door\r\nX-Big: "
                             + b"z" * MB + b"\r\n\r\n", 10)
    assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400"))
    many = b"".join(f"X-H{i}: v\r\n".encode() for i in range(LIMITS.max_headers + 50))
    answer, _ = raw_exchange(door.url, b"GET /v2/health/ready HTTP/1.1\r\nHost: door\r\n" + many + b"\r\n", 10)
    assert answer.startswith((b"HTTP/1.0 400", b"HTTP/1.1 400"))


def test_unknown_routes_and_methods(door):
    before = len(door.seen)
    outside = requests.get(f"{door.url}/admin", timeout=10)
    assert outside.status_code == 404 and "error" in outside.json()
    assert requests.put(f"{door.url}/v2/health/ready", timeout=10).status_code == 405
    assert requests.delete(f"{door.url}/v2/models/x", timeout=10).status_code == 405
    assert len(door.seen) == before


def test_requests_arrive_unchanged_and_streams_are_not_buffered(door):
    reply = requests.post(f"{door.url}/v2/models/m/infer?x=1", data=b'{"inputs": []}', timeout=10,
                          headers={"admin-key": "k", "Content-Type": "application/json", "Connection": "keep-alive"})
    assert reply.json() == {"echo": 14}
    method, path, size, headers = door.seen[-1]
    assert (method, path, size) == ("POST", "/v2/models/m/infer?x=1", 14) and headers["admin-key"] == "k"
    requests.post(f"{door.url}/v2/models/m/generate", data=b"{}" * 1000, headers={"Expect": "100-continue"},
                  timeout=10)
    assert "Expect" not in door.seen[-1][3]  # the door read the body; Triton 2.51 crashes on Expect with big ones
    began = time.monotonic()
    with requests.post(f"{door.url}/v2/models/m/generate_stream", data=b"{}", stream=True, timeout=10) as stream:
        events = (json.loads(line.removeprefix(b"data: ")) for line in stream.iter_lines() if line)
        assert next(events)["i"] == 0
        assert time.monotonic() - began < 0.25  # before the stand-in wrote its second event
        assert [event["i"] for event in events] == [1, 2]


def test_an_overload_is_429_with_retry_after(door):
    door.answers["/v2/models/ensemble/generate"] = (503, b'{"error": "RESOURCE_EXHAUSTED: overloaded; retry later"}')
    door.answers["/v2/models/other/generate"] = (503, b'{"error": "UNAVAILABLE: model not ready"}')
    overloaded = requests.post(f"{door.url}/v2/models/ensemble/generate", data=b"{}", timeout=10)
    assert overloaded.status_code == 429 and overloaded.headers["Retry-After"] == "1"
    assert overloaded.json() == {"error": "RESOURCE_EXHAUSTED: overloaded; retry later"}
    assert requests.post(f"{door.url}/v2/models/other/generate", data=b"{}", timeout=10).status_code == 503
    door.answers["/v2/models/busy/generate_stream"] = (
        400, b'data: {"error":"RESOURCE_EXHAUSTED: overloaded: 16/16 sequences active; retry later"}\n\n')
    streamed = requests.post(f"{door.url}/v2/models/busy/generate_stream", data=b"{}", timeout=10)
    assert streamed.status_code == 429 and streamed.headers["Retry-After"] == "1"
    assert streamed.json() == {"error": "RESOURCE_EXHAUSTED: overloaded: 16/16 sequences active; retry later"}


# -- part 2: the real stack -----------------------------------------------------------------------------------

def alive_and_serving(server) -> None:
    assert server.is_alive()
    assert requests.get(f"http://{server.http_url}/v2/health/ready", timeout=10).status_code == 200
    # min_tokens: the tiny random-weight model, sampling unseeded, can draw its end token within 4 (seen once)
    final = grpc_generate(server.grpc_url, {"text_input": "def f():", "max_tokens": 4, "min_tokens": 4})[-1]
    assert final["finish_reason"] == "length"


@pytest.mark.parametrize("endpoint, body", [("generate", b'{"text_input": "' + b"a" * (6 * MB) + b'"}'),
                                            ("generate", b"\x00junk" * (2 * MB)), ("infer", b"\xff" * (8 * MB)),
                                            ("generate_stream", b"{" * (5 * MB))])
def test_bodies_that_crash_triton_are_refused_and_it_keeps_serving(triton_server, endpoint, body):
    reply = requests.post(f"http://{triton_server.http_url}/v2/models/ensemble/{endpoint}", data=body, timeout=60)
    assert reply.status_code == 413 and "limit of" in reply.json()["error"]["message"]
    alive_and_serving(triton_server)


def test_the_http_api_passes_through(triton_server):
    door, inner = f"http://{triton_server.http_url}", f"http://{triton_server.triton_http_url}"
    for path in ("/v2", "/v2/models/ensemble", "/v2/models/ensemble/config", "/v2/health/live"):
        assert requests.get(door + path, timeout=10).content == requests.get(inner + path, timeout=10).content, path
    answer = http_generate(triton_server.http_url, {"text_input": "def f():", "max_tokens": 4, "temperature": 0})
    assert answer.status_code == 200 and answer.json()["completion_tokens"] == 4
    events = http_generate(triton_server.http_url, {"text_input": "def f():", "max_tokens": 4, "min_tokens": 4,
                                                    "stream": True}, stream=True)
    assert events[-1]["finish_reason"] == "length"
    infer = {"inputs": [{"name": "output_ids", "shape": [1, 2], "datatype": "INT32", "data": [5, 6]},
                        {"name": "prefix_offset", "shape": [1, 1], "datatype": "INT32", "data": [0]},
                        {"name": "read_offset", "shape": [1, 1], "datatype": "INT32", "data": [0]}]}
    assert requests.post(door + "/v2/models/postprocessing/infer", json=infer, timeout=10).json() == \
        requests.post(inner + "/v2/models/postprocessing/infer", json=infer, timeout=10).json()
    index = door + "/v2/repository/index"
    assert requests.post(index, timeout=10).status_code == 403  # Triton's restricted-API rule, through the door
    assert requests.post(index, headers=triton_server.api_key_headers(), timeout=10).status_code == 200
    bad = requests.post(door + "/v2/models/ensemble/generate", json={"text_input": "x", "top_p": 7}, timeout=10)
    assert bad.status_code == 400 and bad.json()["error"].startswith("INVALID_ARGUMENT: top_p must be in (0, 1]")


@pytest.mark.parametrize("megabytes", [5, 20])
def test_grpc_refuses_huge_messages_itself(triton_server, megabytes):
    prompt = np.array([[b"a" * (megabytes * MB)]], dtype=object)
    tensor = grpcclient.InferInput("text_input", [1, 1], "BYTES")
    tensor.set_data_from_numpy(prompt)
    client = grpcclient.InferenceServerClient(triton_server.grpc_url, channel_args=[
        ("grpc.max_send_message_length", 2**31 - 1), ("grpc.max_receive_message_length", 2**31 - 1)])
    with pytest.raises(InferenceServerException, match="must be at most 65536 bytes"):
        client.infer("preprocessing", [tensor])
    client.close()
    alive_and_serving(triton_server)
