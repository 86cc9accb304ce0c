"""zerocheck inside TensorRT-LLM's LLM API (PyTorch backend): `ZeroCheckLogitsProcessor` draws each request's
tokens with the zero-check sampler and hands the engine a one-hot row; `llm_api` runs `generate`'s sequences on the
LLM API (the trtllm flavor); `engine_loop` stands in for the engine's calls where tensorrt_llm is not installed
(tests, benchmarks, the GPU check). The processor (and torch with it) loads on first use: `generate` reads
`llm_api`'s parameters and refusals at every load, and draws with the processor only in the flavor."""
from __future__ import annotations

from typing import Any

__all__ = ["ZeroCheckLogitsProcessor"]


def __getattr__(name: str) -> Any:
    if name == "ZeroCheckLogitsProcessor":
        from zerocheck.trtllm.processor import ZeroCheckLogitsProcessor

        return ZeroCheckLogitsProcessor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
