"""One asyncio attempt over gRPC (`tritonclient.grpc.aio`); cancelling its task cancels the call."""
from __future__ import annotations

import grpc
import tritonclient.grpc.aio as aiogrpc
from tritonclient.utils import InferenceServerException

from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.errors import error_from_grpc
from zerocheck.clients.grpc_transport import grpc_headers, grpc_inputs
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import Chunk, Sink


async def grpc_attempt(endpoint: Endpoint, request: GenerateRequest, parameters: dict[str, str],
                       timeout_s: float, sink: Sink) -> None:
    """Run one attempt to its end, pushing chunks, then None (stream closed) or an error, into `sink`."""
    client = aiogrpc.InferenceServerClient(endpoint.url, channel_args=endpoint.grpc_channel_args())

    async def one_request():
        yield {"model_name": endpoint.model, "inputs": grpc_inputs(request.arrays()), "parameters": parameters}

    try:
        responses = client.stream_infer(one_request(), stream_timeout=timeout_s,
                                        headers=grpc_headers(endpoint, request))
        async for result, error in responses:
            if error is not None:
                sink(error_from_grpc(None, error.message()))
                return
            outputs = result.get_response().outputs
            sink(Chunk.from_outputs({output.name: result.as_numpy(output.name) for output in outputs}))
        sink(None)
    except grpc.RpcError as error:
        sink(error_from_grpc(error.code().name, error.details() or str(error.code())))
    except InferenceServerException as error:
        sink(error_from_grpc(error.status(), error.message()))
    finally:
        await client.close()
