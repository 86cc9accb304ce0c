"""The two step backends behind `DecoderEngine`: the torch module, or its ONNX export in onnxruntime.

Both are `StepFunction`s: (tokens [B,T] int64, positions [B,T] int64, attention_mask [B,T,P+T] bool,
last_index [B] int64, past_keys [L,B,Hkv,P,D] f32, past_values) -> (logits [B,V] f32, new_keys
[L,B,Hkv,T,D] f32, new_values), torch tensors on the decoder's device (onnxruntime: the CPU).
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
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


def onnxruntime_step(onnx_path: Path, num_threads: int | None = None) -> StepFunction:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads yield the CPU
    if num_threads:
        options.intra_op_num_threads = num_threads
    session = ort.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])

    def step(*inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        feeds = {name: np.ascontiguousarray(t.numpy()) for name, t in zip(ONNX_INPUT_NAMES, inputs)}
        logits, new_keys, new_values = session.run(ONNX_OUTPUT_NAMES, feeds)
        return torch.from_numpy(logits), torch.from_numpy(new_keys), torch.from_numpy(new_values)

    return step
