"""Typed errors raised to callers, each carrying the server's message, and their mapping from
gRPC status codes, HTTP status codes and the bare messages of in-stream errors."""
from __future__ import annotations

import re

# the server's overload message starts with this (zerocheck.serving.inputs.Overloaded)
OVERLOADED_PREFIX = "overloaded"
INTERNAL_PREFIX = "internal error"
ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")  # Triton's prefix for an error inside an ensemble step


class ZerocheckError(Exception):
    """Base of every client error. `retryable`: a new attempt may succeed (only before the first token)."""

    retryable = False

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class InvalidRequest(ZerocheckError):
    """The server refused the request (INVALID_ARGUMENT / HTTP 400); never retried."""


class Unavailable(ZerocheckError):
    """Server down, unreachable or overloaded (UNAVAILABLE, connection refused/reset, HTTP 503/429)."""

    retryable = True


class Timeout(ZerocheckError):
    """The call's total deadline passed (a connect timeout of one attempt is `Unavailable`: retried)."""


class Cancelled(ZerocheckError):
    """The request was cancelled (by the caller, or by the server)."""


def error_from_message(message: str) -> ZerocheckError:
    """An error that arrived inside a stream (gRPC `error_message`, SSE `{"error": ...}`) has no status
    code: the server's contract is INVALID_ARGUMENT unless it says overloaded or internal error."""
    text = ENSEMBLE_PREFIX.sub("", message)
    if text.startswith(OVERLOADED_PREFIX):
        return Unavailable(message)
    if text.startswith(INTERNAL_PREFIX):
        return ZerocheckError(message)
    return InvalidRequest(message)


_GRPC_ERRORS: dict[str, type[ZerocheckError]] = {
    "INVALID_ARGUMENT": InvalidRequest, "OUT_OF_RANGE": InvalidRequest, "NOT_FOUND": InvalidRequest,
    "UNAVAILABLE": Unavailable, "RESOURCE_EXHAUSTED": Unavailable,
    "DEADLINE_EXCEEDED": Timeout, "CANCELLED": Cancelled,
}


def error_from_grpc(status: str | None, message: str) -> ZerocheckError:
    """status: a gRPC code name, also as "StatusCode.UNAVAILABLE"; None for an in-stream error."""
    if status is None:
        return error_from_message(message)
    return _GRPC_ERRORS.get(status.removeprefix("StatusCode."), ZerocheckError)(message)


def error_from_http(status: int, message: str, retry_after: str | None = None) -> ZerocheckError:
    """An HTTP error status (with its Retry-After header, seconds) as a typed error."""
    if status in (429, 503):
        return Unavailable(message, retry_after_s=_seconds(retry_after))
    if status in (400, 404, 422):
        return InvalidRequest(message)
    if status == 408 or status == 504:
        return Timeout(message)
    return ZerocheckError(f"HTTP {status}: {message}")


def _seconds(retry_after: str | None) -> float | None:
    try:
        return max(0.0, float(retry_after)) if retry_after else None
    except ValueError:  # an HTTP date: not worth parsing for a retry hint
        return None
