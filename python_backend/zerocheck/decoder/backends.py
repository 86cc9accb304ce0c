"""The step backends behind `DecoderEngine` that take the KV cache as inputs (besides the packed CPU path and
the paged OpenVINO graph, which keep it in place): the torch module, or the TensorRT engine built from its ONNX
export (`zerocheck build --tensorrt`).

Both are `StepFunction`s: (tokens [B,T] int64, positions [B,T] int64, attention_mask [B,T,P+T] bool,
last_index [B] int64, past_keys [L,B,Hkv,P,D] f32, past_values) -> (logits [B,V] f32, new_keys
[L,B,Hkv,T,D] f32, new_values), torch tensors on the decoder's device.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from zerocheck.decoder.model import Transformer

StepFunction = Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
ONNX_INPUT_NAMES = ["tokens", "positions", "attention_mask", "last_index", "past_keys", "past_values"]
ONNX_OUTPUT_NAMES = ["logits", "new_keys", "new_values"]


def torch_step(model: Transformer, device: str = "cpu") -> StepFunction:
    """The module's forward on `device` (its weights are there); inputs are moved there, outputs stay."""
    def step(*inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        inputs = tuple(tensor.to(device, non_blocking=True) for tensor in inputs)
        # no_grad, not inference_mode: the zero-check sampler edits the logits in place (penalties, bans),
        # which an inference tensor refuses outside inference mode
        with torch.no_grad():
            return model(*inputs)

    return step


def tensorrt_step(plan_path: Path, device: str, max_rows: int, max_positions: int) -> StepFunction:
    """The TensorRT engine `plan_path` (the ONNX step, built by `zerocheck build --tensorrt`) on CUDA `device`.
    Inputs move there in the engine's dtypes (TensorRT 8 turns int64 inputs into int32), outputs are
    allocated there at the shapes the engine infers from the inputs', and the engine runs on torch's current
    stream (no host sync). Refuses, naming the limit, an engine whose tensors are not the ONNX step's or
    whose optimisation profile holds fewer rows (max_rows: the KV slots) or positions than the decoder uses.
    Written for TensorRT 8.5+ / 10 (the name-based tensor API); not yet run on a GPU."""
    import tensorrt as trt

    dtypes_of = {trt.DataType.FLOAT: torch.float32, trt.DataType.HALF: torch.float16, trt.DataType.INT32: torch.int32,
                 trt.DataType.BOOL: torch.bool}
    for name, dtype in (("INT64", torch.int64), ("BF16", torch.bfloat16)):  # TensorRT 9+ only
        if hasattr(trt.DataType, name):
            dtypes_of[getattr(trt.DataType, name)] = dtype
    engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(plan_path.read_bytes())
    if engine is None:
        raise RuntimeError(f"TensorRT {trt.__version__} could not load {plan_path} (built by another TensorRT "
                           "version or for another GPU? rebuild with zerocheck build --tensorrt)")
    names = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
    if names != {*ONNX_INPUT_NAMES, *ONNX_OUTPUT_NAMES}:
        raise RuntimeError(f"{plan_path} has tensors {sorted(names)}, not the decoder step's "
                           f"{ONNX_INPUT_NAMES + ONNX_OUTPUT_NAMES}")
    unknown = [name for name in names if engine.get_tensor_dtype(name) not in dtypes_of]
    if unknown:
        raise RuntimeError(f"{plan_path}: tensors {unknown} have dtypes this backend does not map to torch")
    dtypes = {name: dtypes_of[engine.get_tensor_dtype(name)] for name in names}
    rows, positions = engine.get_tensor_profile_shape("tokens", 0)[2]
    if rows < max_rows or positions < max_positions:
        raise ValueError(f"{plan_path} takes at most {rows} rows and {positions} positions a step; the decoder "
                         f"needs {max_rows} rows (max_slots) and {max_positions} positions (max_seq_len)")
    context = engine.create_execution_context()
    target = torch.device(device)

    def step(*inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feeds = {name: tensor.to(target, dtypes[name]).contiguous() for name, tensor in zip(ONNX_INPUT_NAMES, inputs)}
        for name, tensor in feeds.items():
            context.set_input_shape(name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        outputs = {name: torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtypes[name], device=target)
                   for name in ONNX_OUTPUT_NAMES}
        for name, tensor in outputs.items():
            context.set_tensor_address(name, tensor.data_ptr())
        if not context.execute_async_v3(torch.cuda.current_stream(target).cuda_stream):
            raise RuntimeError("TensorRT could not run the decoder step (see the TensorRT log)")
        return outputs["logits"], outputs["new_keys"], outputs["new_values"]

    return step
