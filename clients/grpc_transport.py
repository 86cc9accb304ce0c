"""One attempt over gRPC (`tritonclient.grpc`): a stream of its own, responses pushed to a sink."""
from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from zerocheck.clients.endpoint import Endpoint
from zerocheck.clients.errors import error_from_grpc
from zerocheck.clients.request import GenerateRequest
from zerocheck.clients.response import Chunk, Sink

log = logging.getLogger("zerocheck.clients")


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


STOP_WAIT_S = 5.0  # how long a stopped request may take to send its final response before the call is cancelled


def stop_inputs() -> list[grpcclient.InferInput]:
    """A stop request: only `stop` = true; it names its target by carrying the same request id."""
    return grpc_inputs({"stop": np.array([[True]])})


class GrpcAttempt:
    """Starts on construction, on a stream of its own, under a request id of its own. `cancel()` stops the
    request with a stop request on the same stream (the request ends at its next decode step, its KV slot
    freed), then closes the stream once the request's final response came: cancelling the gRPC call
    instead can crash Triton 2.51 (its stream handler races a cancellation against responses in flight;
    fixed in Triton 24.12/25.04). A request that has not ended after STOP_WAIT_S is cancelled anyway."""

    def __init__(self, endpoint: Endpoint, request: GenerateRequest, parameters: dict[str, str],
                 timeout_s: float, sink: Sink) -> None:
        self._sink, self._model = sink, endpoint.model
        self._request_id = uuid.uuid4().hex
        self._stopping, self._finals_after_stop = False, 0
        self._ended = threading.Event()  # the request's final response (or its error) arrived
        self._client = grpcclient.InferenceServerClient(endpoint.url, channel_args=endpoint.grpc_channel_args())
        self._client.start_stream(self._on_response, stream_timeout=timeout_s, headers=grpc_headers(endpoint, request))
        try:
            self._client.async_stream_infer(endpoint.model, grpc_inputs(request.arrays()), parameters=parameters,
                                            request_id=self._request_id, enable_empty_final_response=True)
        except InferenceServerException:
            pass  # the stream failed already (connection refused): the callback reports that error

    def _on_response(self, result: grpcclient.InferResult | None, error: Exception | None) -> None:
        if result is None:
            self._ended.set()
            if not self._stopping:
                status = error.status() if hasattr(error, "status") else None
                self._sink(error_from_grpc(status, error.message() if hasattr(error, "message") else str(error)))
            return
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        if self._stopping:  # the stop request's own (empty, final) answer, or the request's last responses
            if final and response.outputs:
                self._ended.set()
            elif final:
                self._finals_after_stop += 1
                if self._finals_after_stop == 2:  # the stop request's and the request's empty finals
                    self._ended.set()
            return
        if response.outputs:
            self._sink(Chunk.from_outputs({output.name: result.as_numpy(output.name) for output in response.outputs}))
        if final:
            self._ended.set()
            self._sink(None)

    def cancel(self) -> None:
        """Stop the request on the server and close the stream, in the background (returns at once)."""
        if self._ended.is_set():
            self._client.stop_stream()
            self._client.close()
            return
        self._stopping = True
        threading.Thread(target=self._stop_and_close, daemon=True, name="zerocheck-stop").start()

    def _stop_and_close(self) -> None:
        try:
            self._client.async_stream_infer(self._model, stop_inputs(), request_id=self._request_id,
                                            enable_empty_final_response=True)
        except InferenceServerException:
            self._ended.set()  # the stream is gone: nothing left to stop
        ended = self._ended.wait(STOP_WAIT_S)
        if not ended:
            log.warning("request %s did not end %.0f s after its stop request; cancelling the call",
                        self._request_id, STOP_WAIT_S)
        self._client.stop_stream(cancel_requests=not ended)
        self._client.close()
