"""`HttpLimits`: what one HTTP request may cost the front end, on both of its ports.

- body: at most `max_body_bytes` (413 with a JSON error naming the limit, at once when Content-Length
  says so, else as soon as the chunks pass it), arriving within `body_timeout_s` (408);
- headers: request line and each header field at most `max_header_bytes`, at most `max_headers`
  fields (aiohttp's parser answers 400 past them);
- time: a connection that has not sent a whole request within `header_timeout_s` of connecting (or
  of its previous request) is closed (aiohttp's keep-alive timer).
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from zerocheck.frontend.errors import FrontendError

# the smallest body seen to crash Triton 2.51's HTTP server (sent with `Expect: 100-continue`, as curl does;
# triton-inference-server/server#5840): the door's limit stays below it
TRITON_CRASH_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class HttpLimits:
    max_body_bytes: int = 2 * 1024 * 1024
    body_timeout_s: float = 30.0
    header_timeout_s: float = 15.0
    max_header_bytes: int = 8190
    max_headers: int = 100

    def __post_init__(self) -> None:
        if not 0 < self.max_body_bytes < TRITON_CRASH_BYTES:
            raise ValueError(f"max_body_bytes must be in (0, {TRITON_CRASH_BYTES}): Triton 2.51 crashed on bodies of "
                             f"4 MB (triton-inference-server/server#5840), got {self.max_body_bytes}")
        if self.body_timeout_s <= 0 or self.header_timeout_s <= 0:
            raise ValueError("body_timeout_s and header_timeout_s must be positive")

    def handler_args(self) -> dict:
        """aiohttp's per-connection settings that enforce the header and time limits."""
        return {"max_line_size": self.max_header_bytes, "max_field_size": self.max_header_bytes,
                "max_headers": self.max_headers, "keepalive_timeout": self.header_timeout_s}


async def read_body(request: web.Request, limits: HttpLimits) -> bytes:
    """The whole body within the limits (FrontendError 413 or 408 otherwise)."""
    if request.content_length is not None and request.content_length > limits.max_body_bytes:
        raise too_large(limits, request.content_length)
    body = bytearray()

    async def read() -> None:
        async for block in request.content.iter_any():
            body.extend(block)
            if len(body) > limits.max_body_bytes:
                raise too_large(limits, None)

    try:
        await asyncio.wait_for(read(), limits.body_timeout_s)
    except asyncio.TimeoutError:
        raise FrontendError(408, f"the request body did not arrive within {limits.body_timeout_s:g} s") from None
    except ConnectionResetError:  # the client closed the connection mid-body: nobody reads the answer
        raise FrontendError(400, "the connection closed before the request body ended") from None
    return bytes(body)


def too_large(limits: HttpLimits, size: int | None) -> FrontendError:
    got = f" (Content-Length {size})" if size is not None else ""
    return FrontendError(413, f"request body larger than the limit of {limits.max_body_bytes} bytes{got}",
                         code="REQUEST_TOO_LARGE")
