"""The guarded door to Triton's HTTP API: the only public HTTP port; Triton's own binds an internal one.

Triton 2.51's HTTP server crashes (SIGSEGV, every stream lost) on a large request body (4 MB sent by
curl, with `Expect: 100-continue`, did it; upstream issue triton-inference-server/server#5840) and has
no flag to cap it. The door reads each body itself under a limit (413 with a JSON error naming it), within a
time limit (408), and only then forwards the request to Triton with the same method, path, query,
headers and body; the answer comes back as Triton gave it, streamed (`generate_stream` SSE passes
through chunk by chunk). Triton keeps enforcing its restricted-API keys. One change: an overload
(an error whose message starts `RESOURCE_EXHAUSTED:`, which Triton answers 400 at `generate` and
`generate_stream`, as an SSE error event there, and 503 at `infer`) is answered 429 with
`Retry-After` and a JSON body `{"error": message}`.
"""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from aiohttp import web

from zerocheck.frontend.errors import RETRY_AFTER_S, FrontendError
from zerocheck.frontend.limits import HttpLimits, read_body
from zerocheck.frontend.metrics import FrontendMetrics

# not forwarded: hop-by-hop headers, and `Expect: 100-continue` (the door has read the body already; with a
# large body it is what crashes Triton 2.51's HTTP server)
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
              "transfer-encoding", "upgrade", "host", "content-length", "expect"}
METHODS = ("GET", "POST", "HEAD")


class TritonDoor:
    """Forwards `/v2/...` to Triton's internal HTTP endpoint `upstream` (http://host:port)."""

    def __init__(self, upstream: str, limits: HttpLimits, metrics: FrontendMetrics) -> None:
        self.upstream, self.limits, self.metrics = upstream.rstrip("/"), limits, metrics
        self.session: aiohttp.ClientSession | None = None

    def add_to(self, app: web.Application) -> None:
        app.router.add_route("*", "/v2{tail:.*}", self.forward)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)

    async def _open(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=30)
        self.session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                             timeout=aiohttp.ClientTimeout(total=None, sock_connect=5))

    async def _close(self, app: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def forward(self, request: web.Request) -> web.StreamResponse:
        try:
            if request.method not in METHODS:
                raise FrontendError(405, f"method {request.method} is not allowed here")
            body = await read_body(request, self.limits)
            return await self._relay(request, body)
        except FrontendError as error:
            self.metrics.answered("door", error.status)
            return error.response()
        except asyncio.CancelledError:
            self.metrics.disconnects["door"] += 1
            raise

    async def _relay(self, request: web.Request, body: bytes) -> web.StreamResponse:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = f"{self.upstream}{request.rel_url}"
        try:
            upstream = await self.session.request(request.method, url, headers=headers, data=body or None,
                                                  allow_redirects=False)
        except aiohttp.ClientError as error:
            raise FrontendError(503, f"tritonserver is not reachable: {error}") from None
        async with upstream:
            answer_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
            if upstream.status >= 400:  # small JSON errors: read whole, overloads answered 429
                return self._error(upstream.status, await upstream.read(), answer_headers)
            response = web.StreamResponse(status=upstream.status, headers=answer_headers)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for block in upstream.content.iter_any():
                arrived = time.perf_counter()
                await response.write(block)
                self.metrics.forwarded("door", time.perf_counter() - arrived)
            await response.write_eof()
            self.metrics.answered("door", upstream.status)
            return response

    def _error(self, status: int, body: bytes, headers: dict[str, str]) -> web.Response:
        """Triton's error answer, passed on; an overload becomes 429 with Retry-After and a JSON body
        (`generate_stream` sends its error as one SSE event, `data: {"error": ...}`, with status 400)."""
        text = body.decode("utf-8", errors="replace").strip()
        if text.startswith("data:"):
            text = text[len("data:"):].strip()
        try:
            message = str(json.loads(text).get("error", ""))
        except (ValueError, AttributeError):
            message = ""
        if message.startswith("RESOURCE_EXHAUSTED:"):
            status, body = 429, json.dumps({"error": message}).encode()
            headers = {**{k: v for k, v in headers.items() if k.lower() not in ("content-type", "content-length")},
                       "Content-Type": "application/json", "Retry-After": str(RETRY_AFTER_S)}
        self.metrics.answered("door", status)
        return web.Response(status=status, body=body, headers=headers)
