"""The two sampler paths a request can take, and why a zero-check request may be served by the checked one."""
from __future__ import annotations

from enum import StrEnum


class SamplerPath(StrEnum):
    """zero_check: the fused one-pass sampler in the decoder's process; checked: the reference chain
    penalties -> softmax -> top_k_top_p -> multinomial. The values are the metric labels, the
    `X-ZeroCheck-Sampler` header values and the bench's row names."""

    ZERO_CHECK = "zero_check"
    CHECKED = "checked"


DEGRADE_LOG_PROBS = "return_log_probs"  # log-probabilities need the normalised distribution: the checked chain's
DEGRADE_REASONS = (DEGRADE_LOG_PROBS,)  # every reason a zero-check request is served by the checked path
