"""Sampling: the zero-check sampler, the checked reference chain, and their shared parameters.

    from zerocheck.sampling import SamplingParams, zero_check_sample, checked_sample
"""
from .checked import CheckedSampler, checked_sample
from .params import SAMPLING_PARAMETERS, SamplingParamError, SamplingParams
from .zero_check import SampleOutput, ZeroCheckSampler, zero_check_sample

__all__ = [
    "SAMPLING_PARAMETERS", "CheckedSampler", "SampleOutput", "SamplingParamError", "SamplingParams",
    "ZeroCheckSampler", "checked_sample", "zero_check_sample",
]
