"""GPU-only build: a TensorRT engine from the ONNX step, which the decoder loads as its backend `tensorrt`
(`decoder.backends.tensorrt_step`).

It stops with `BuildError` when CUDA or the `tensorrt` package is missing. Untested here (no GPU).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from zerocheck.build.errors import BuildError
from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.engine import TENSORRT_PLAN

MAX_BATCH = 64  # the decoder model's max_batch_size
OPT_BATCH, OPT_PAST = 8, 256  # the profile's optimum: a typical decode step


def require_gpu_package(package: str, flag: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise BuildError(f"{flag} needs the `{package}` package, which is not installed (pip install {package.replace('_', '-')})")
    if not torch.cuda.is_available():
        raise BuildError(f"{flag} needs a CUDA GPU; torch {torch.__version__} sees none")


def profile_shapes(config: DecoderConfig, max_seq_len: int, max_batch: int = MAX_BATCH
                   ) -> dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]:
    """(min, opt, max) shape of every input of the ONNX step: batch 1..max_batch, new tokens 1..max_seq_len,
    past positions 1..max_seq_len; the optimum (a decode step of OPT_BATCH rows over OPT_PAST positions)
    clamped into the range, as TensorRT requires min <= opt <= max."""
    batch, past = min(OPT_BATCH, max_batch), min(OPT_PAST, max_seq_len)

    def cache(b: int, p: int) -> tuple[int, ...]:
        return config.num_layers, b, config.num_kv_heads, p, config.head_dim

    return {
        "tokens": ((1, 1), (batch, 1), (max_batch, max_seq_len)),
        "positions": ((1, 1), (batch, 1), (max_batch, max_seq_len)),
        "attention_mask": ((1, 1, 2), (batch, 1, past + 1), (max_batch, max_seq_len, 2 * max_seq_len)),
        "last_index": ((1,), (batch,), (max_batch,)),
        "past_keys": (cache(1, 1), cache(batch, past), cache(max_batch, max_seq_len)),
        "past_values": (cache(1, 1), cache(batch, past), cache(max_batch, max_seq_len)),
    }


def build_tensorrt_engine(onnx_path: Path, config: DecoderConfig, max_seq_len: int, out_dir: Path) -> Path:
    """Parse the ONNX step and build an engine with one optimization profile over B, T, P."""
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildError(f"TensorRT could not parse {onnx_path}: {errors}")
    shapes = profile_shapes(config, max_seq_len)
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in shapes.items():
        profile.set_shape(name, low, opt, high)
    builder_config = builder.create_builder_config()
    builder_config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, builder_config)
    if serialized is None:
        raise BuildError("TensorRT engine build failed (see the TensorRT log above)")
    plan = out_dir / TENSORRT_PLAN
    plan.write_bytes(bytes(serialized))
    return plan
