"""zerocheck.clients retries and hedging against servers of their own: a server that comes up only
after the call started, and one whose first attempts are slow (test_delay_ms=3000)."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import conftest
from zerocheck.clients.async_client import AsyncClient
from zerocheck.clients.client import Client
from zerocheck.serve import TritonServer
from zerocheck.serve.server import free_ports

PROMPT = "def main():"
GREEDY = {"max_tokens": 8, "temperature": 0}


def slow_repository(tmp: Path) -> Path:
    """model_repository/ with test_delay_ms=3000 in generate (every door's requests run there)."""
    return conftest.copied_repository(tmp, generate={"test_delay_ms": "3000"})


class LateServer:
    """A slow server on ports fixed now and started later, on a thread (`start_after`)."""

    def __init__(self, server: TritonServer, grpc_port: int) -> None:
        self.server = server
        self.grpc_url = f"127.0.0.1:{grpc_port}"  # known before the server starts
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start_after(self, delay_s: float) -> None:
        def start() -> None:
            threading.Event().wait(delay_s)
            try:
                self.server.start().wait_ready(conftest.READY_TIMEOUT_S)
            except BaseException as error:  # reported by ready()
                self.error = error
        self.thread = threading.Thread(target=start, daemon=True)
        self.thread.start()

    def ready(self) -> TritonServer:
        if self.thread is None:
            self.start_after(0)
        self.thread.join()
        if self.error is not None:
            raise self.error
        return self.server


@pytest.fixture(scope="module")
def late_server(tritonserver_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LateServer]:
    http, grpc, metrics = free_ports("127.0.0.1", 3)
    server = TritonServer(slow_repository(tmp_path_factory.mktemp("slow")), http_port=http, grpc_port=grpc,
                          metrics_port=metrics, tritonserver=tritonserver_binary,
                          env={"ZEROCHECK_ARTIFACTS": str(conftest.test_artifacts_dir())})
    late = LateServer(server, grpc)
    yield late
    server.stop()


def test_retries_until_the_server_is_up(late_server: LateServer, triton_server: TritonServer) -> None:
    expected = Client(triton_server.grpc_url).generate(PROMPT, **GREEDY).token_ids
    late_server.start_after(3.0)
    client = Client(late_server.grpc_url, retries=1000, connect_timeout=1.0, timeout=conftest.READY_TIMEOUT_S)
    result = client.generate(PROMPT, **GREEDY)
    assert result.retries > 0 and result.token_ids == expected and result.finish_reason == "length"
    late_server.ready()


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_hedge_answers_a_slow_request(late_server: LateServer, triton_server: TritonServer, protocol: str) -> None:
    server = late_server.ready()
    expected = Client(triton_server.grpc_url).generate(PROMPT, **GREEDY).token_ids
    url = server.grpc_url if protocol == "grpc" else server.http_url
    result = Client(url, protocol, hedge_after_s=0.3, timeout=30).generate(PROMPT, **GREEDY)
    assert result.hedged and result.retries == 0 and result.token_ids == expected and result.finish_reason

    async def hedged_async() -> list[int]:
        async with AsyncClient(url, protocol, hedge_after_s=0.3, timeout=30) as client:
            answer = await client.generate(PROMPT, **GREEDY)
            assert answer.hedged
            return answer.token_ids

    assert asyncio.run(hedged_async()) == expected
    # without a hedge the first attempt waits out the delay, then answers the same tokens
    slow = Client(url, protocol, timeout=30).generate(PROMPT, **GREEDY)
    assert not slow.hedged and slow.ttft_s >= 3.0 and slow.token_ids == expected


def test_a_cancellation_that_arrives_with_the_next_item_is_not_lost() -> None:
    """The stream's wait for its next item: cancelled in the same loop turn as the item arrives, the
    consumer is cancelled (asyncio.wait_for before Python 3.12 returned the item and dropped the cancellation,
    so a cancelled stream ran on to its end: seen as a flaky test_cancelling_the_task_frees_the_slot)."""
    from zerocheck.clients.async_client import _get

    async def main() -> None:
        queue: asyncio.Queue = asyncio.Queue()
        waiter = asyncio.create_task(_get(queue, 5.0))
        await asyncio.sleep(0)  # the waiter is now waiting on the queue
        queue.put_nowait("item")
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert waiter.cancelled()
        with pytest.raises(asyncio.TimeoutError):
            await _get(queue, 0.01)  # the item went with the cancelled wait; an empty queue times out
        queue.put_nowait("next")
        assert await _get(queue, None) == "next"

    asyncio.run(main())
