"""Sampling: the zero-check sampler, the checked reference chain, and their shared parameters.

    from zerocheck.sampling import SamplingParams, zero_check_sample, checked_sample

The parameter table and `SamplingParams` import without torch (clients use them); the samplers are
imported on first use.
"""
from importlib import import_module
from typing import Any

from .params import SAMPLING_PARAMETERS, SamplingParamError, SamplingParams

_LAZY = {"CheckedSampler": ".checked", "checked_sample": ".checked", "SampleOutput": ".zero_check",
         "ZeroCheckSampler": ".zero_check", "zero_check_sample": ".zero_check"}

__all__ = ["SAMPLING_PARAMETERS", "SamplingParamError", "SamplingParams", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
