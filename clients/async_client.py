"""`AsyncClient`: the asyncio client of the generate model, over gRPC (grpc.aio) or HTTP (aiohttp)."""
from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import aiohttp

from zerocheck.clients.aio_grpc_transport import grpc_attempt
from zerocheck.clients.aio_http_transport import http_attempt
from zerocheck.clients.attempts import Attempts
from zerocheck.clients.errors import Cancelled
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import GenerateResult, TokenEvent
from zerocheck.clients.settings import ClientSettings
from zerocheck.api.request import RETRY_UNAVAILABLE


class AsyncClient(ClientSettings):
    """Like `Client`, with coroutines: `await generate(...)`, `async for event in stream(...)`.
    Cancelling the task, or `aclose()` of the stream, cancels the request on the server. Use as
    `async with AsyncClient(...)` (or call `close()`) to close its HTTP session."""

    _session: aiohttp.ClientSession | None = None

    async def generate(self, prompt: str, *, timeout: float | None = None, **kwargs: Any) -> GenerateResult:
        """The whole completion; arguments as `Client.generate`."""
        return await _result(self.stream(prompt, timeout=timeout, **kwargs))

    def stream(self, prompt: str, *, timeout: float | None = None, **kwargs: Any) -> AsyncIterator[TokenEvent]:
        """TokenEvents as they arrive; the last one has `.final`."""
        return self._run(GenerateRequest.build(prompt, **kwargs), self._timeout(timeout))

    async def chat(self, messages: Sequence[Mapping[str, str]], *, timeout: float | None = None,
                   **kwargs: Any) -> GenerateResult:
        """The assistant's reply to `messages`; arguments as `Client.chat`."""
        return await _result(self.chat_stream(messages, timeout=timeout, **kwargs))

    def chat_stream(self, messages: Sequence[Mapping[str, str]], *, timeout: float | None = None,
                    **kwargs: Any) -> AsyncIterator[TokenEvent]:
        """TokenEvents of the assistant's reply to `messages`."""
        return self._run(GenerateRequest.build(None, messages=messages, **kwargs), self._timeout(timeout))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _transport(self):
        if self.endpoint.protocol == "grpc":
            return grpc_attempt
        if self._session is None:
            self._session = aiohttp.ClientSession()
        return functools.partial(http_attempt, self._session)

    async def _run(self, request: GenerateRequest, timeout: float) -> AsyncIterator[TokenEvent]:
        state = Attempts(self.policy, timeout)
        arrived: asyncio.Queue = asyncio.Queue()
        running: dict[int, asyncio.Task] = {}
        transport = self._transport()

        def launch(retry_reason: str | None) -> None:
            attempt = state.launch()
            sink = lambda item, attempt=attempt: arrived.put_nowait((attempt, item))  # noqa: E731
            running[attempt] = asyncio.create_task(
                transport(self.endpoint, request, request.parameters(retry_reason), state.remaining_s(), sink))

        launch(None)
        try:
            while True:
                try:
                    attempt, item = await _get(arrived, state.wait_s())
                except asyncio.TimeoutError:
                    launch(state.on_timer())
                    continue
                delay, event, losers = state.on_item(attempt, item)
                for loser in losers:
                    running.pop(loser).cancel()
                if delay is not None:
                    await asyncio.sleep(delay)
                    launch(RETRY_UNAVAILABLE)
                if event is not None:
                    yield event
                    if event.final is not None:
                        return
        finally:
            for task in running.values():
                task.cancel()
            await asyncio.gather(*running.values(), return_exceptions=True)


async def _get(queue: asyncio.Queue, timeout_s: float | None):
    """`queue.get()` within timeout_s (asyncio.TimeoutError after it). Not `asyncio.wait_for`: before Python
    3.12 it returns the item when the caller's cancellation arrives as the item does, and the cancellation is
    lost (the stream then runs on to its end); here it is raised (the item is dropped with the stream)."""
    getter = asyncio.ensure_future(queue.get())
    try:
        done, _ = await asyncio.wait({getter}, timeout=timeout_s)
    finally:
        getter.cancel()  # nothing when it is done
    if not done:
        raise asyncio.TimeoutError
    return getter.result()


async def _result(stream: AsyncIterator[TokenEvent]) -> GenerateResult:
    try:
        async for event in stream:
            if event.final is not None:
                return event.final
    finally:
        await stream.aclose()
    raise Cancelled("the stream ended without a result")
