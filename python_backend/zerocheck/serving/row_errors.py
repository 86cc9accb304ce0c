"""Errors of single rows of a multi-row request, carried in a BYTES output tensor.

A batched decode step is one request for many sequences; a row that fails (KV cache pool full,
unknown sequence, a failed forward) must fail only its own sequence. Such a row carries its coded
message (`zerocheck.api.errors`: "<CODE>: <message>") in its `error` output, "" when it succeeded.
"""
from __future__ import annotations

from zerocheck.api.errors import ErrorCode, ServingError, coded_message, error_from_message


def row_error_text(error: BaseException | None) -> str:
    """The `error` output of one row: "" when it succeeded."""
    return "" if error is None else coded_message(error)


def row_error(text: str | bytes) -> ServingError | None:
    """The exception a row's `error` output stands for (inverse of `row_error_text`); None for ""."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    return error_from_message(text, ErrorCode.INTERNAL) if text else None
