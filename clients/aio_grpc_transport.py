"""Streamed generate calls over gRPC (`tritonclient.grpc.aio`): `stream_chunks` on a shared channel,
and one client attempt (`grpc_attempt`); cancelling either stops the request with a stop request."""
from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import tritonclient.grpc.aio as aiogrpc
from tritonclient.utils import InferenceServerException

from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.errors import ZerocheckError, error_from_grpc
from zerocheck.clients.grpc_transport import STOP_WAIT_S, grpc_headers, grpc_inputs, stop_inputs
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import Chunk, Sink

log = logging.getLogger("zerocheck.clients")


# per client: the tasks reading its calls to their end (strong references; a client closed before they are
# done would cancel those calls)
_FINISHING: dict[aiogrpc.InferenceServerClient, set[asyncio.Task]] = {}


async def stream_chunks(client: aiogrpc.InferenceServerClient, model: str, request: GenerateRequest,
                        parameters: dict[str, str], headers: dict[str, str],
                        timeout_s: float | None = None) -> AsyncIterator[Chunk]:
    """The chunks of one streamed request over `client`'s channel (shared by many calls). Raises a
    ZerocheckError for the server's error or a failed call. Leaving the iteration early (break,
    cancellation) stops the request with a stop request on the same call, which then ends by itself (see
    `GrpcAttempt` for why the call is not cancelled). The call is read by a task of its own, so
    cancelling the caller never cancels the call."""
    request_id = uuid.uuid4().hex
    ended, stop = asyncio.Event(), asyncio.Event()

    async def requests():
        # the aio client cannot ask for empty final responses; every request of `generate` ends with a
        # response that has outputs (or an error), flagged final
        yield {"model_name": model, "inputs": grpc_inputs(request.arrays()), "request_id": request_id,
               "parameters": parameters}
        await _first(ended, stop)
        if not ended.is_set():
            yield {"model_name": model, "inputs": stop_inputs(), "request_id": request_id}
        # returning half-closes the call: the server ends it once its requests have ended

    try:
        responses = client.stream_infer(requests(), stream_timeout=timeout_s, headers=headers)
    except InferenceServerException as error:
        raise error_from_grpc(error.status(), error.message()) from None
    arrived: asyncio.Queue = asyncio.Queue()
    reader = asyncio.get_running_loop().create_task(_read(responses, arrived))
    try:
        while (item := await arrived.get()) is not None:
            if isinstance(item, ZerocheckError):
                raise item
            result, error, received = item
            if error is not None:
                raise error_from_grpc(None, error.message())
            response = result.get_response()
            if response.outputs:
                yield Chunk.from_outputs({o.name: result.as_numpy(o.name) for o in response.outputs}, received)
            if response.parameters["triton_final_response"].bool_param:
                ended.set()
    finally:
        if not ended.is_set():
            stop.set()
        tasks = _FINISHING.setdefault(client, set())
        task = asyncio.get_running_loop().create_task(_finish(reader, request_id))
        tasks.add(task)
        task.add_done_callback(tasks.discard)


async def _read(responses, arrived: asyncio.Queue) -> None:
    """Every response of the call into `arrived` as (result, error, arrival time), a failed call as its
    ZerocheckError, then None."""
    try:
        async for result, error in responses:
            arrived.put_nowait((result, error, time.perf_counter()))
    except grpc.RpcError as error:
        arrived.put_nowait(error_from_grpc(error.code().name, error.details() or str(error.code())))
    except InferenceServerException as error:
        arrived.put_nowait(error_from_grpc(error.status(), error.message()))
    finally:
        arrived.put_nowait(None)


async def _first(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for wait in waits:
            wait.cancel()


async def _finish(reader: asyncio.Task, request_id: str) -> None:
    """Let the call end by itself; cancel it (by cancelling its reader) when it has not after STOP_WAIT_S."""
    done, _ = await asyncio.wait({reader}, timeout=STOP_WAIT_S)
    if not done:
        log.warning("request %s did not end %.0f s after its stop request; cancelling the call", request_id,
                    STOP_WAIT_S)
        reader.cancel()


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
        closing = asyncio.get_running_loop().create_task(close_when_done(client))
        _CLOSING.add(closing)
        closing.add_done_callback(_CLOSING.discard)


_CLOSING: set[asyncio.Task] = set()


async def close_when_done(client: aiogrpc.InferenceServerClient) -> None:
    """Close `client` once its calls have ended (a stopped call ends a decode step later)."""
    finishing = _FINISHING.pop(client, set())
    if finishing:
        await asyncio.wait(finishing)
    await client.close()
