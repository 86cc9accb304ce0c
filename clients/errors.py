"""Typed errors raised to callers, each carrying the server's message and its code.

The server starts every error message with its code (`zerocheck.api.errors.ErrorCode`:
`INVALID_ARGUMENT: ...`, `RESOURCE_EXHAUSTED: ...`); the code picks the type, on every wire. A message
without one (Triton's own refusals, a transport failure) is typed by the gRPC status or HTTP status,
and an in-stream one counts as INVALID_ARGUMENT.
"""
from __future__ import annotations

import re

from zerocheck.api.errors import ErrorCode, parse_code

ENSEMBLE_PREFIX = re.compile(r"^in ensemble '[^']*', ")  # Triton's prefix for an error inside an ensemble step


class ZerocheckError(Exception):
    """Base of every client error. `retryable`: a new attempt may succeed (only before the first token)."""

    retryable = False

    def __init__(self, message: str, retry_after_s: float | None = None, code: ErrorCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s
        self.code = code  # the server's code, when it sent one


class InvalidRequest(ZerocheckError):
    """The server refused the request (INVALID_ARGUMENT / HTTP 400); never retried."""


class Unavailable(ZerocheckError):
    """Server down, unreachable or overloaded (UNAVAILABLE, connection refused/reset, HTTP 503/429)."""

    retryable = True


class Timeout(ZerocheckError):
    """The call's total deadline passed (a connect timeout of one attempt is `Unavailable`: retried)."""


class Cancelled(ZerocheckError):
    """The request was cancelled (by the caller, or by the server)."""


_TYPE_OF_CODE: dict[ErrorCode, type[ZerocheckError]] = {
    ErrorCode.INVALID_ARGUMENT: InvalidRequest, ErrorCode.RESOURCE_EXHAUSTED: Unavailable,
    ErrorCode.UNAVAILABLE: Unavailable, ErrorCode.CANCELLED: Cancelled, ErrorCode.INTERNAL: ZerocheckError,
}
_GRPC_ERRORS: dict[str, type[ZerocheckError]] = {
    "INVALID_ARGUMENT": InvalidRequest, "OUT_OF_RANGE": InvalidRequest, "NOT_FOUND": InvalidRequest,
    "UNAVAILABLE": Unavailable, "RESOURCE_EXHAUSTED": Unavailable,
    "DEADLINE_EXCEEDED": Timeout, "CANCELLED": Cancelled,
}
_HTTP_ERRORS: dict[int, type[ZerocheckError]] = {400: InvalidRequest, 404: InvalidRequest, 422: InvalidRequest,
                                                 429: Unavailable, 503: Unavailable, 408: Timeout, 504: Timeout}


def _coded(message: str, fallback: type[ZerocheckError], retry_after_s: float | None = None) -> ZerocheckError:
    code, text = parse_code(ENSEMBLE_PREFIX.sub("", message))
    kind = _TYPE_OF_CODE[code] if code is not None else fallback
    return kind(text, retry_after_s=retry_after_s, code=code)


def error_from_message(message: str) -> ZerocheckError:
    """An error that arrived inside a stream (gRPC `error_message`, SSE `{"error": ...}`): no status."""
    return _coded(message, InvalidRequest)


def error_from_grpc(status: str | None, message: str) -> ZerocheckError:
    """status: a gRPC code name, also as "StatusCode.UNAVAILABLE"; None for an in-stream error."""
    if status is None:
        return error_from_message(message)
    return _coded(message, _GRPC_ERRORS.get(status.removeprefix("StatusCode."), ZerocheckError))


def error_from_http(status: int, message: str, retry_after: str | None = None) -> ZerocheckError:
    """An HTTP error status (with its Retry-After header, seconds) as a typed error."""
    fallback = _HTTP_ERRORS.get(status)
    if fallback is None and parse_code(message)[0] is None:
        return ZerocheckError(f"HTTP {status}: {message}")
    return _coded(message, fallback or ZerocheckError, _seconds(retry_after))


def error_label(error: ZerocheckError) -> str:
    """How a CLI names an error: the server's code, else the error's type."""
    return error.code.value if error.code is not None else type(error).__name__


def _seconds(retry_after: str | None) -> float | None:
    try:
        return max(0.0, float(retry_after)) if retry_after else None
    except ValueError:  # an HTTP date: not worth parsing for a retry hint
        return None
