"""zerocheck inside TensorRT-LLM's LLM API (PyTorch backend): `ZeroCheckLogitsProcessor` draws each request's
tokens with the zero-check sampler and hands the engine a one-hot row; `engine_loop` stands in for the engine's
calls where tensorrt_llm is not installed (tests, benchmarks, the GPU check)."""
from .processor import ZeroCheckLogitsProcessor

__all__ = ["ZeroCheckLogitsProcessor"]
