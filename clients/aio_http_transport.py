"""One asyncio attempt over HTTP (`aiohttp`, the `generate_stream` SSE endpoint); cancelling its
task closes the connection, which cancels the request on the server."""
from __future__ import annotations

import asyncio

import aiohttp

from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.errors import Timeout, Unavailable, ZerocheckError, error_from_http
from zerocheck.clients.http_transport import stream_url
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import Sink
from zerocheck.clients.sse import ends_stream, error_text, parse_event_line


async def http_attempt(session: aiohttp.ClientSession, endpoint: Endpoint, request: GenerateRequest,
                       parameters: dict[str, str], timeout_s: float, sink: Sink) -> None:
    """Run one attempt to its end, pushing chunks, then None (stream closed) or an error, into `sink`."""
    url = stream_url(endpoint)
    timeout = aiohttp.ClientTimeout(total=timeout_s, sock_connect=endpoint.connect_timeout_s)
    try:
        async with session.post(url, json={**request.values(), **parameters}, headers=endpoint.headers(),
                                timeout=timeout) as response:
            try:
                if response.status != 200:
                    sink(error_from_http(response.status, error_text(await response.text()),
                                         response.headers.get("Retry-After")))
                    return
                async for line in response.content:
                    item = parse_event_line(line.decode("utf-8", errors="replace").rstrip("\r\n"))
                    if item is not None:
                        sink(item)
                    if ends_stream(item):
                        return
            finally:
                response.close()  # never back to the pool mid-stream
        sink(None)
    except aiohttp.ConnectionTimeoutError as error:
        sink(Unavailable(f"could not connect to {url}: {error}"))
    except asyncio.TimeoutError:
        sink(Timeout(f"no complete answer from {url} within {timeout_s:.3g} s"))
    except aiohttp.ClientConnectionError as error:
        sink(Unavailable(f"connection to {url} failed: {error}"))
    except aiohttp.ClientError as error:
        sink(ZerocheckError(f"request to {url} failed: {type(error).__name__}: {error}"))
