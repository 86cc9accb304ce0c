"""One streamed `generate` call for an HTTP request, shared by the OpenAI and Anthropic APIs."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Mapping

from zerocheck.api.headers import SWITCH_HEADER
from zerocheck.clients.aio_grpc_transport import stream_chunks
from zerocheck.clients.errors import ZerocheckError
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import Chunk
from zerocheck.frontend.errors import from_server


def retry_reason(headers: Mapping[str, str]) -> str | None:
    """`X-Retry-Reason` (e.g. slow_response: a hedge), passed to the server as `retry_reason`."""
    reason = headers.get("x-retry-reason")
    return reason.strip().lower() if reason else None


async def generation(client, model: str, request: GenerateRequest, headers: Mapping[str, str],
                     param_of: Mapping[str, str]) -> AsyncIterator[Chunk]:
    """The chunks of `request` sent to Triton `model` over `client` (tritonclient.grpc.aio); a server
    error becomes the FrontendError to answer with, `param_of` naming the request field at fault."""
    parameters = request.parameters(retry_reason(headers))
    try:
        async for chunk in stream_chunks(client, model, request, parameters,
                                         {SWITCH_HEADER: parameters[SWITCH_HEADER]}):
            yield chunk
    except ZerocheckError as error:
        raise from_server(error, param_of) from None


__all__ = ["generation", "retry_reason"]
