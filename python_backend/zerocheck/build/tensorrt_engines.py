"""GPU-only builds: a TensorRT engine from the ONNX step, and a TensorRT-LLM engine from the HF model.

Both stop with `BuildError` when CUDA or the package is missing. Untested here (no GPU).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from zerocheck.build.errors import BuildError
from zerocheck.decoder.config import DecoderConfig

TENSORRT_PLAN = "decoder.plan"
TENSORRT_LLM_DIR = "tensorrt_llm"
MAX_BATCH = 32


def require_gpu_package(package: str, flag: str) -> None:
    if importlib.util.find_spec(package) is None:
        raise BuildError(f"{flag} needs the `{package}` package, which is not installed (pip install {package.replace('_', '-')})")
    if not torch.cuda.is_available():
        raise BuildError(f"{flag} needs a CUDA GPU; torch {torch.__version__} sees none")


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
    cache = lambda b, p: (config.num_layers, b, config.num_kv_heads, p, config.head_dim)  # noqa: E731
    shapes = {  # name: (min, opt, max)
        "tokens": ((1, 1), (8, 1), (MAX_BATCH, max_seq_len)),
        "positions": ((1, 1), (8, 1), (MAX_BATCH, max_seq_len)),
        "attention_mask": ((1, 1, 2), (8, 1, 257), (MAX_BATCH, max_seq_len, 2 * max_seq_len)),
        "last_index": ((1,), (8,), (MAX_BATCH,)),
        "past_keys": (cache(1, 1), cache(8, 256), cache(MAX_BATCH, max_seq_len)),
        "past_values": (cache(1, 1), cache(8, 256), cache(MAX_BATCH, max_seq_len)),
    }
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


def build_tensorrt_llm_engine(hf_model_dir: Path, max_seq_len: int, out_dir: Path) -> Path:
    """Build with the TensorRT-LLM LLM API from the Hugging Face directory and save the engine."""
    from tensorrt_llm import LLM, BuildConfig

    build_config = BuildConfig(max_batch_size=MAX_BATCH, max_seq_len=max_seq_len)
    llm = LLM(model=str(hf_model_dir), build_config=build_config)
    engine_dir = out_dir / TENSORRT_LLM_DIR
    llm.save(str(engine_dir))
    return engine_dir
