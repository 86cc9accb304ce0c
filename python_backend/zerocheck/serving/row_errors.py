"""Errors of single rows of a multi-row request, carried in a BYTES output tensor.

A batched decode step is one request for many sequences; a row that fails (KV cache pool full,
unknown sequence, a failed forward) must fail only its own sequence. Such a row carries
"<CODE>: <message>" in its `error` output ("" when it succeeded), CODE being the Triton error
code a request of its own would have got: INVALID_ARG, UNAVAILABLE or INTERNAL.
"""
from __future__ import annotations

import logging

from zerocheck.sampling import SamplingParamError
from zerocheck.serving.inputs import InvalidRequest, Overloaded

log = logging.getLogger("zerocheck")
INVALID_ARG, UNAVAILABLE, INTERNAL = "INVALID_ARG", "UNAVAILABLE", "INTERNAL"


class InternalError(RuntimeError):
    """A server-side failure whose message is already what the client may read."""


def classify(error: BaseException) -> tuple[str, str]:
    """(code, client-readable message) of `error`; an unexpected one is logged with its traceback
    and named by its type only, so no traceback or internal detail reaches a client."""
    if isinstance(error, (InvalidRequest, SamplingParamError)):
        return INVALID_ARG, str(error)
    if isinstance(error, Overloaded):
        return UNAVAILABLE, str(error)
    if isinstance(error, InternalError):
        return INTERNAL, str(error)
    log.error("internal error", exc_info=error)
    return INTERNAL, f"internal error ({type(error).__name__}); see the server log"


def row_error_text(error: BaseException | None) -> str:
    """The `error` output of one row: "" when it succeeded."""
    if error is None:
        return ""
    code, message = classify(error)
    return f"{code}: {message}"


_ERROR_OF = {INVALID_ARG: InvalidRequest, UNAVAILABLE: Overloaded, INTERNAL: InternalError}


def error_of(code: str, message: str) -> Exception:
    """The exception for a Triton error code name and message (an unknown code is internal)."""
    return _ERROR_OF.get(code, InternalError)(message)


def row_error(text: str | bytes) -> Exception | None:
    """The exception a row's `error` output stands for (inverse of `row_error_text`); None for ""."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    if not text:
        return None
    code, _, message = text.partition(": ")
    return error_of(code, message) if code in _ERROR_OF else InternalError(text)
