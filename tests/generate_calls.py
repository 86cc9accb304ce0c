"""Raw tritonclient / HTTP calls to the `generate` model for the server tests (no zerocheck.clients,
so the tests pin the wire contract itself)."""
from __future__ import annotations

import json
import queue
import re
import time
import uuid
from typing import Any, Callable

import numpy as np
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import np_to_triton_dtype

from zerocheck.api.request import INPUTS_BY_NAME

_NUMPY = {"TYPE_STRING": object, "TYPE_INT32": np.int32, "TYPE_FP32": np.float32, "TYPE_BOOL": bool,
          "TYPE_UINT64": np.uint64, "TYPE_FP16": np.float16}


def grpc_inputs(fields: dict[str, Any]) -> list[grpcclient.InferInput]:
    """tensorrtllm_backend-style inputs: every value as a [1, 1] (or [1, N] for lists) tensor; a numpy
    array goes as it is (the token door's inputs)."""
    inputs = []
    for name, value in fields.items():
        if isinstance(value, np.ndarray):
            tensor = grpcclient.InferInput(name, list(value.shape), np_to_triton_dtype(value.dtype))
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
            continue
        spec = INPUTS_BY_NAME[name]
        values = value if isinstance(value, list) else [value]
        if spec.dtype == "TYPE_STRING":
            values = [v.encode() if isinstance(v, str) else v for v in values]
        array = np.array([values], dtype=_NUMPY[spec.dtype])
        tensor = grpcclient.InferInput(name, list(array.shape), spec.dtype.removeprefix("TYPE_").replace("STRING", "BYTES"))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def decode_result(result: grpcclient.InferResult) -> dict[str, Any]:
    out = {}
    for output in result.get_response().outputs:
        array = result.as_numpy(output.name)
        if array is None:
            continue
        flat = array.reshape(-1).tolist()
        flat = [v.decode("utf-8", errors="replace") if isinstance(v, bytes) else v for v in flat]
        out[output.name] = flat[0] if output.name not in ("output_ids", "output_log_probs") else flat
    return out


def grpc_generate(url: str, fields: dict[str, Any], parameters: dict[str, str] | None = None,
                  headers: dict[str, str] | None = None, model: str = "ensemble", timeout: float = 120.0,
                  cancel_after: int | None = None,
                  on_response: Callable[[dict[str, Any]], None] | None = None,
                  request_id: str = "") -> list[dict[str, Any]]:
    """Stream one request; returns decoded responses (with `t` = seconds since sending) in arrival
    order. Raises the server's error. With cancel_after, stops the request after that many responses as
    the project's clients do (a stop request with its id on the same stream, then the stream closes once
    the request ended; see zerocheck.clients.grpc_transport); on_response sees each response as it arrives."""
    request_id = request_id or uuid.uuid4().hex
    responses: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: responses.put((result, error, time.perf_counter())),
                        headers=headers)
    start = time.perf_counter()
    client.async_stream_infer(model, grpc_inputs(fields), parameters=parameters or {}, request_id=request_id,
                              enable_empty_final_response=True)
    out: list[dict[str, Any]] = []
    stopped, finals = False, 0
    try:
        while True:
            result, error, at = responses.get(timeout=timeout)
            if error is not None:
                raise error
            response = result.get_response()
            final = bool(response.parameters.get("triton_final_response")
                         and response.parameters["triton_final_response"].bool_param)
            if stopped:  # the stopped request's last responses and the stop request's empty answer
                finals += final
                if final and (response.outputs or finals == 2):
                    return out
                continue
            if response.outputs:
                out.append({**decode_result(result), "t": at - start})
                if on_response is not None:
                    on_response(out[-1])
            if final:
                return out
            if cancel_after is not None and len(out) >= cancel_after:
                client.async_stream_infer(model, grpc_inputs({"stop": True}), request_id=request_id,
                                          enable_empty_final_response=True)
                stopped = True
    finally:
        client.stop_stream()
        client.close()


def http_generate(url: str, body: dict[str, Any], stream: bool = False, model: str = "ensemble",
                  timeout: float = 120.0) -> requests.Response | list[dict[str, Any]]:
    """POST generate (the Response) or generate_stream (the decoded SSE events)."""
    endpoint = "generate_stream" if stream else "generate"
    response = requests.post(f"http://{url}/v2/models/{model}/{endpoint}", json=body, stream=stream, timeout=timeout)
    if not stream:
        return response
    events = []
    for line in response.iter_lines():
        if line.startswith(b"data: "):
            events.append(json.loads(line[6:]))
    return events


def decoder_metric(server, name: str, absent: float) -> float:
    """The decoder's metric `name` on the metrics port (`absent` when it is not exported)."""
    text = requests.get(f"http://{server.metrics_url}/metrics", timeout=10).text
    match = re.search(rf'^{name}\{{model="decoder"\}} (\S+)$', text, re.M)
    return float(match.group(1)) if match else absent


def slots_in_use(server) -> float:
    """The decoder's `zerocheck_kv_slots_in_use` gauge (-1 when absent)."""
    return decoder_metric(server, "zerocheck_kv_slots_in_use", -1.0)


def wait_slots_free(server, timeout_s: float = 15.0) -> float:
    """`slots_in_use` once it reads 0, or at timeout_s: generate frees an ended sequence's slot in the
    background (a call beside its next step), so the gauge can lag the final response by a step."""
    deadline = time.monotonic() + timeout_s
    while (slots := slots_in_use(server)) != 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    return slots


def prefix_reused_tokens(server) -> float:
    """The decoder's `zerocheck_prefix_cache_reused_tokens_total` counter (0 before its first push)."""
    return decoder_metric(server, "zerocheck_prefix_cache_reused_tokens_total", 0.0)
