"""Llama-family decoder with a slot-based KV cache; `load_decoder` is the entry point."""
from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.engine import (
    BACKENDS,
    DEFAULT_BACKEND,
    DecoderEngine,
    StepRequest,
    StepResult,
    load_decoder,
)
from zerocheck.decoder.errors import DecoderError, PoolFullError, SequenceTooLongError
from zerocheck.decoder.kv_cache import KVCachePool
from zerocheck.decoder.model import Transformer
from zerocheck.decoder.weights import load_transformer

__all__ = [
    "BACKENDS",
    "DEFAULT_BACKEND",
    "DecoderConfig",
    "DecoderEngine",
    "DecoderError",
    "KVCachePool",
    "PoolFullError",
    "SequenceTooLongError",
    "StepRequest",
    "StepResult",
    "Transformer",
    "load_decoder",
    "load_transformer",
]
