"""Streamed generate calls over gRPC (`tritonclient.grpc.aio`): `stream_chunks` on a shared channel,
and one client attempt (`grpc_attempt`); cancelling either cancels the call."""
from __future__ import annotations

import time
from collections.abc import AsyncIterator

import grpc
import tritonclient.grpc.aio as aiogrpc
from tritonclient.utils import InferenceServerException

from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.errors import ZerocheckError, error_from_grpc
from zerocheck.clients.grpc_transport import grpc_headers, grpc_inputs
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import Chunk, Sink


async def stream_chunks(client: aiogrpc.InferenceServerClient, model: str, request: GenerateRequest,
                        parameters: dict[str, str], headers: dict[str, str],
                        timeout_s: float | None = None) -> AsyncIterator[Chunk]:
    """The chunks of one streamed request over `client`'s channel (shared by many calls). Raises a
    ZerocheckError for the server's error or a failed call; leaving the iteration early (break,
    cancellation) cancels the call, which cancels the request on the server."""

    async def one_request():
        yield {"model_name": model, "inputs": grpc_inputs(request.arrays()), "parameters": parameters}

    responses = None
    finished = False
    try:
        responses = client.stream_infer(one_request(), stream_timeout=timeout_s, headers=headers)
        async for result, error in responses:
            received = time.perf_counter()
            if error is not None:
                raise error_from_grpc(None, error.message())
            outputs = result.get_response().outputs
            yield Chunk.from_outputs({output.name: result.as_numpy(output.name) for output in outputs}, received)
        finished = True
    except grpc.RpcError as error:
        raise error_from_grpc(error.code().name, error.details() or str(error.code())) from None
    except InferenceServerException as error:
        raise error_from_grpc(error.status(), error.message()) from None
    finally:
        if responses is not None and not finished:
            responses.cancel()


async def grpc_attempt(endpoint: Endpoint, request: GenerateRequest, parameters: dict[str, str],
                       timeout_s: float, sink: Sink) -> None:
    """Run one attempt to its end, pushing chunks, then None (stream closed) or an error, into `sink`."""
    client = aiogrpc.InferenceServerClient(endpoint.url, channel_args=endpoint.grpc_channel_args())
    try:
        async for chunk in stream_chunks(client, endpoint.model, request, parameters,
                                         grpc_headers(endpoint, request), timeout_s):
            sink(chunk)
        sink(None)
    except ZerocheckError as error:
        sink(error)
    finally:
        await client.close()
