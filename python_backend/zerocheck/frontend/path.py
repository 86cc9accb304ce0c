"""Which sampler path a request asks for (from its headers) and the headers that say which path served it.

A request asks for the zero-check path with `zerocheck: on` (`off` asks for the checked chain), or by
listing `zero-check-layer-2024-06` in `anthropic-beta`; the `zerocheck` header, when sent, decides.
Without either, each API has its default: the OpenAI API's is the zero-check path, the Anthropic
API's the checked chain (the beta opts in, as Anthropic's clients expect). Unknown betas are ignored.
"""
from __future__ import annotations

from typing import Mapping

from zerocheck.api.errors import InvalidRequest
from zerocheck.api.headers import (ANTHROPIC_BYPASS_HEADER, BETA_HEADER, BYPASS_HEADER, SAMPLER_HEADER, SWITCH_HEADER,
                                   ZERO_CHECK_BETA)
from zerocheck.api.request import parse_switch
from zerocheck.api.sampler_path import SamplerPath
from zerocheck.frontend.errors import invalid


def betas(headers: Mapping[str, str]) -> set[str]:
    """The names listed in `anthropic-beta` (comma-separated, spaces ignored)."""
    return {name.strip() for name in headers.get(BETA_HEADER, "").split(",") if name.strip()}


def asks_zero_check(headers: Mapping[str, str], default: bool) -> bool:
    """Whether the request asks for the zero-check path; a bad `zerocheck` header is a 400 naming it."""
    switch = headers.get(SWITCH_HEADER)
    if switch is not None:
        try:
            return parse_switch(switch)
        except InvalidRequest as error:
            raise invalid(f"header {error}", SWITCH_HEADER) from None
    return True if ZERO_CHECK_BETA in betas(headers) else default


def path_headers(bypass: bool, sampler: str) -> dict[str, str]:
    """The answer's headers about the path that served it."""
    flag = "true" if bypass else "false"
    return {BYPASS_HEADER: flag, ANTHROPIC_BYPASS_HEADER: flag, SAMPLER_HEADER: sampler}


def requested_headers(zero_check: bool) -> dict[str, str]:
    """The headers of an answer given before the server said which path it took (an early refusal):
    the path asked for, not bypassed."""
    return path_headers(False, SamplerPath.ZERO_CHECK if zero_check else SamplerPath.CHECKED)


def served_headers(fields: Mapping[str, object], zero_check: bool) -> dict[str, str]:
    """The headers from the first response's fields (`zerocheck_bypass`, `sampler`)."""
    default = SamplerPath.ZERO_CHECK if zero_check else SamplerPath.CHECKED
    return path_headers(bool(fields.get("zerocheck_bypass")), str(fields.get("sampler", default)))


__all__ = ["asks_zero_check", "betas", "path_headers", "requested_headers", "served_headers"]
