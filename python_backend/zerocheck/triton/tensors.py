"""Tensors in and out of the `model.py` adapters, and errors as Triton answers them.

`pb_utils` (triton_python_backend_utils) exists only inside the Python backend stub, so every
function takes it as an argument; the package itself never imports it.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping

import numpy as np

from zerocheck.api.errors import classify


def request_arrays(pb_utils: Any, request: Any, names: Iterable[str]) -> dict[str, np.ndarray]:
    """Inputs present in `request` among `names`, as numpy arrays (batch dimension included)."""
    wanted = set(names)
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs() if tensor.name() in wanted}


def host_array(tensor: Any) -> np.ndarray:
    """A pb_utils input tensor as a numpy array on the host, wherever Triton placed it (a model that leaves
    its inputs on the GPU, FORCE_CPU_ONLY_INPUT_TENSORS "no", may get GPU tensors)."""
    if tensor.is_cpu():
        return tensor.as_numpy()
    import torch

    return torch.utils.dlpack.from_dlpack(tensor.to_dlpack()).cpu().numpy()


def request_parameters(request: Any) -> dict[str, Any]:
    text = request.parameters()
    return json.loads(text) if text else {}


def error_for(pb_utils: Any, error: BaseException) -> Any:
    """A TritonError for `error`: the client sees the message of a refused request, never a traceback."""
    code, message = classify(error)
    return pb_utils.TritonError(f"{code.value}: {message}", getattr(pb_utils.TritonError, code.triton_code))


def error_response(pb_utils: Any, error: BaseException) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=error_for(pb_utils, error))


def tensors(pb_utils: Any, arrays: Mapping[str, np.ndarray]) -> list[Any]:
    return [pb_utils.Tensor(name, array) for name, array in arrays.items()]
