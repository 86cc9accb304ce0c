"""Export `Transformer.forward` (one step over explicit caches) to ONNX, the source of the TensorRT engine, and
check it against torch.

Dynamic axes: batch B, new tokens T, cached positions P. Inputs and outputs are named as in
`zerocheck.decoder.backends` (ONNX_INPUT_NAMES / ONNX_OUTPUT_NAMES).
"""
from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import torch

from zerocheck.decoder.backends import ONNX_INPUT_NAMES, ONNX_OUTPUT_NAMES, torch_step
from zerocheck.decoder.model import Transformer


def example_step_inputs(model: Transformer, batch: int, new_tokens: int, past: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Random step inputs: rows with random cached lengths in [1, past] and new counts in [1, new_tokens]."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, past + 1, (batch,), generator=generator)
    counts = torch.randint(1, new_tokens + 1, (batch,), generator=generator)
    tokens = torch.randint(0, config.vocab_size, (batch, new_tokens), generator=generator)
    steps = torch.arange(new_tokens)
    positions = lengths[:, None] + steps[None, :]
    past_visible = (torch.arange(past)[None, None, :] < lengths[:, None, None]).expand(-1, new_tokens, -1)
    new_visible = (steps[None, :] <= steps[:, None])[None] & (steps[None, None, :] < counts[:, None, None])
    mask = torch.cat([past_visible, new_visible], dim=-1)
    cache_shape = (config.num_layers, batch, config.num_kv_heads, past, config.head_dim)
    past_keys = torch.randn(cache_shape, generator=generator)
    past_values = torch.randn(cache_shape, generator=generator)
    return tokens, positions, mask, counts - 1, past_keys, past_values


def export_onnx(model: Transformer, path: Path) -> None:
    """Write `path` (single file; weights inline) with dynamic batch / new-token / past axes."""
    batch, new_tokens, past = torch.export.Dim("batch"), torch.export.Dim("new_tokens"), torch.export.Dim("past")
    dynamic_shapes = (
        {0: batch, 1: new_tokens},
        {0: batch, 1: new_tokens},
        {0: batch, 1: new_tokens, 2: torch.export.Dim.AUTO},  # = past + new_tokens
        {0: batch},
        {1: batch, 3: past},
        {1: batch, 3: past},
    )
    inputs = example_step_inputs(model.eval(), batch=3, new_tokens=4, past=5)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::..." per op
    try:
        with warnings.catch_warnings():
            # expected here: notes about axes sharing one symbol, and torch's own deprecation of its pytree
            # LeafSpec check, which the exporter still calls
            warnings.filterwarnings("ignore", message=".*axis name.*", category=UserWarning)
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            program = torch.onnx.export(model, inputs, dynamo=True, dynamic_shapes=dynamic_shapes,
                                        input_names=ONNX_INPUT_NAMES, output_names=ONNX_OUTPUT_NAMES,
                                        optimize=True, verbose=False)
    finally:
        exporter_log.setLevel(level)
    program.save(str(path), external_data=False)


def onnx_max_abs_diff(model: Transformer, path: Path) -> float:
    """Largest |ONNX - torch| over all outputs, on random inputs of shapes unlike the export's; the ONNX graph
    runs in OpenVINO (f32 inference), which reads ONNX files."""
    import openvino as ov

    compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    run_torch = torch_step(model.eval())
    worst = 0.0
    for seed, (batch, new_tokens, past) in enumerate([(1, 1, 1), (2, 7, 3), (5, 1, 17)]):
        inputs = example_step_inputs(model, batch, new_tokens, past, seed=seed)
        outputs = compiled({name: tensor.numpy() for name, tensor in zip(ONNX_INPUT_NAMES, inputs)})
        for expected, name in zip(run_torch(*inputs), ONNX_OUTPUT_NAMES):
            worst = max(worst, float(np.abs(expected.numpy() - outputs[compiled.output(name)]).max()))
    return worst
