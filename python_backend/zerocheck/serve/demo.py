"""`zerocheck serve --demo`: stream one chat answer from the `generate` model over gRPC."""
from __future__ import annotations

import json
import queue
from collections.abc import Iterator

import numpy as np


class DemoError(RuntimeError):
    """The `generate` stream answered an error or fell silent."""


def stream_chat(grpc_url: str, question: str, max_tokens: int, temperature: float, top_p: float,
                model: str = "generate", timeout: float = 120.0) -> Iterator[str]:
    """Yield each `text_output` piece of one streamed chat request (`messages` with one user turn,
    `max_tokens`, `temperature`, `top_p`, `stream` as [1, 1]); raises DemoError on an error response or
    after `timeout` s without one."""
    import tritonclient.grpc as grpcclient

    messages = json.dumps([{"role": "user", "content": question}])
    inputs = [grpcclient.InferInput("messages", [1, 1], "BYTES"),
              grpcclient.InferInput("max_tokens", [1, 1], "INT32"),
              grpcclient.InferInput("temperature", [1, 1], "FP32"),
              grpcclient.InferInput("top_p", [1, 1], "FP32"),
              grpcclient.InferInput("stream", [1, 1], "BOOL")]
    inputs[0].set_data_from_numpy(np.array([[messages.encode()]], dtype=np.object_))
    inputs[1].set_data_from_numpy(np.array([[max_tokens]], dtype=np.int32))
    inputs[2].set_data_from_numpy(np.array([[temperature]], dtype=np.float32))
    inputs[3].set_data_from_numpy(np.array([[top_p]], dtype=np.float32))
    inputs[4].set_data_from_numpy(np.array([[True]], dtype=np.bool_))
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        while True:
            try:
                result, error = responses.get(timeout=timeout)
            except queue.Empty:
                raise DemoError(f"{model}: no response for {timeout:.0f} s") from None
            if error is not None:
                raise DemoError(f"{model}: {error}")
            output = result.as_numpy("text_output")
            if output is not None:
                yield "".join(piece.decode(errors="replace") for piece in output.reshape(-1))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return
    finally:
        client.stop_stream()
        client.close()
