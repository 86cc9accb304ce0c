"""Errors a program can act on: each has a stable code, and every message the server sends starts with
it (`INVALID_ARGUMENT: top_p must be in (0, 1], got 1.5`), on gRPC streams (which carry no status),
unary gRPC, HTTP bodies and the rows of a batched step alike.

| code               | meaning                                   | retry?        | gRPC status        | HTTP |
|--------------------|-------------------------------------------|---------------|--------------------|------|
| INVALID_ARGUMENT   | the request is wrong; the message names the field | never | INVALID_ARGUMENT   | 400  |
| RESOURCE_EXHAUSTED | overloaded: every slot and the queue are full | after a while | UNAVAILABLE (*)    | 429  |
| UNAVAILABLE        | the server cannot serve now (starting, stopping, a model down) | yes | UNAVAILABLE | 503  |
| CANCELLED          | the request was cancelled                  | no            | CANCELLED          | 499  |
| INTERNAL           | a server fault; details only in the server log | no        | INTERNAL           | 500  |

(*) a Python-backend model of Triton 2.51 can raise only INVALID_ARG, UNAVAILABLE, INTERNAL,
CANCELLED, ...: an overload leaves Triton as UNAVAILABLE (HTTP 503) and the message's code tells
it apart; zerocheck's HTTP front end answers it 429 with Retry-After.
"""
from __future__ import annotations

import enum
import logging

log = logging.getLogger("zerocheck")


class ErrorCode(str, enum.Enum):
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAVAILABLE = "UNAVAILABLE"
    CANCELLED = "CANCELLED"
    INTERNAL = "INTERNAL"

    @property
    def triton_code(self) -> str:
        """The `pb_utils.TritonError` code a model raises for it."""
        return _TRITON_CODES[self]

    @property
    def http_status(self) -> int:
        return _HTTP_STATUS[self]

    @property
    def retryable(self) -> bool:
        return self in (ErrorCode.RESOURCE_EXHAUSTED, ErrorCode.UNAVAILABLE)


_TRITON_CODES = {ErrorCode.INVALID_ARGUMENT: "INVALID_ARG", ErrorCode.RESOURCE_EXHAUSTED: "UNAVAILABLE",
                 ErrorCode.UNAVAILABLE: "UNAVAILABLE", ErrorCode.CANCELLED: "CANCELLED",
                 ErrorCode.INTERNAL: "INTERNAL"}
_HTTP_STATUS = {ErrorCode.INVALID_ARGUMENT: 400, ErrorCode.RESOURCE_EXHAUSTED: 429, ErrorCode.UNAVAILABLE: 503,
                ErrorCode.CANCELLED: 499, ErrorCode.INTERNAL: 500}


class ServingError(Exception):
    """A refused or failed request whose message is what the client may read."""

    code = ErrorCode.INTERNAL


class InvalidRequest(ServingError, ValueError):
    """The request is wrong; the message names the field and the allowed range."""

    code = ErrorCode.INVALID_ARGUMENT


class Overloaded(ServingError):
    """Every KV-cache slot and the queue are taken: retry later."""

    code = ErrorCode.RESOURCE_EXHAUSTED


class Unavailable(ServingError):
    """The server cannot serve this now (a model it needs is not ready, or it is stopping)."""

    code = ErrorCode.UNAVAILABLE


class Cancelled(ServingError):
    code = ErrorCode.CANCELLED


class InternalError(ServingError):
    """A server-side failure whose message is already what the client may read."""

    code = ErrorCode.INTERNAL


_EXCEPTION_OF = {cls.code: cls for cls in (InvalidRequest, Overloaded, Unavailable, Cancelled, InternalError)}


def classify(error: BaseException) -> tuple[ErrorCode, str]:
    """(code, client-readable message) of `error`. A ServingError keeps its message; anything else is
    logged with its traceback and named by its type only, so no traceback or internal detail reaches
    a client."""
    if isinstance(error, ServingError):
        return error.code, str(error)
    log.error("internal error", exc_info=error)
    return ErrorCode.INTERNAL, f"internal error ({type(error).__name__}); see the server log"


def code_of(error: BaseException) -> ErrorCode:
    """The code `error` is answered with (without logging it: see `classify`)."""
    return error.code if isinstance(error, ServingError) else ErrorCode.INTERNAL


def coded_message(error: BaseException) -> str:
    """`<CODE>: <message>`: the text every wire carries for `error`."""
    code, message = classify(error)
    return f"{code.value}: {message}"


def parse_code(text: str) -> tuple[ErrorCode | None, str]:
    """(code, message without it) of a coded message; (None, text) when it carries no known code."""
    head, sep, rest = text.partition(": ")
    if sep and head in ErrorCode.__members__:
        return ErrorCode(head), rest
    return None, text


def error_from_message(text: str, default: ErrorCode = ErrorCode.INTERNAL) -> ServingError:
    """The exception a coded message stands for (an uncoded one gets `default`)."""
    code, message = parse_code(text)
    return _EXCEPTION_OF[code or default](message)
