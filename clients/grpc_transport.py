"""One attempt over gRPC (`tritonclient.grpc`): a stream of its own, responses pushed to a sink."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.errors import error_from_grpc
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import Chunk, Sink


def grpc_inputs(arrays: Mapping[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def grpc_headers(endpoint: Endpoint, request: GenerateRequest) -> dict[str, str]:
    """The zero-check switch also as a header (the server forwards `zerocheck.*` headers as parameters)."""
    return {**endpoint.headers(), "zerocheck": request.parameters()["zerocheck"]}


class GrpcAttempt:
    """Starts on construction; `cancel()` cancels the request on the server (stop_stream) and closes."""

    def __init__(self, endpoint: Endpoint, request: GenerateRequest, parameters: dict[str, str],
                 timeout_s: float, sink: Sink) -> None:
        self._sink = sink
        self._client = grpcclient.InferenceServerClient(endpoint.url, channel_args=endpoint.grpc_channel_args())
        self._client.start_stream(self._on_response, stream_timeout=timeout_s, headers=grpc_headers(endpoint, request))
        try:
            self._client.async_stream_infer(endpoint.model, grpc_inputs(request.arrays()), parameters=parameters,
                                            enable_empty_final_response=True)
        except InferenceServerException:
            pass  # the stream failed already (connection refused): the callback reports that error

    def _on_response(self, result: grpcclient.InferResult | None, error: Exception | None) -> None:
        if result is None:
            status = error.status() if hasattr(error, "status") else None
            self._sink(error_from_grpc(status, error.message() if hasattr(error, "message") else str(error)))
            return
        response = result.get_response()
        if response.outputs:
            self._sink(Chunk.from_outputs({output.name: result.as_numpy(output.name) for output in response.outputs}))
        if response.parameters["triton_final_response"].bool_param:
            self._sink(None)

    def cancel(self) -> None:
        self._client.stop_stream(cancel_requests=True)
        self._client.close()
