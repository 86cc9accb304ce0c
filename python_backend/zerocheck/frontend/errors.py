"""Errors of the HTTP front end, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

`code` is zerocheck's error code (`INVALID_ARGUMENT`, `RESOURCE_EXHAUSTED`, ...; `model_not_found`
for an unknown model), so a program acts on it without reading the message; `param` names the
request field when one is at fault. Overload answers carry `Retry-After`; failures a retry cannot
mend carry `x-should-retry: false` (the openai SDK retries 5xx otherwise).
"""
from __future__ import annotations

import json

from aiohttp import web

from zerocheck.api.errors import ErrorCode
from zerocheck.clients.errors import Cancelled, InvalidRequest, Timeout, Unavailable, ZerocheckError

RETRY_AFTER_S = 1
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error", 408: "timeout",
          413: "invalid_request_error", 429: "rate_limit_error", 499: "cancelled", 500: "server_error",
          503: "service_unavailable", 504: "timeout"}


class FrontendError(Exception):
    """An HTTP error answer: status, message, and the request field at fault."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param = status, message, param
        self.code = code or _default_code(status)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": _TYPES.get(self.status, "error"), "param": self.param,
                          "code": self.code}}

    def headers(self) -> dict[str, str]:
        if self.status in (429, 503):
            return {"Retry-After": str(RETRY_AFTER_S)}
        if self.status >= 500 or self.status == 499:
            return {"x-should-retry": "false"}
        return {}

    def response(self, headers: dict[str, str] | None = None) -> web.Response:
        return web.Response(status=self.status, text=json.dumps(self.body()), content_type="application/json",
                            headers={**self.headers(), **(headers or {})})

    def sse_frame(self) -> bytes:
        """The error as a server-sent event inside a stream already answered 200: an `event: error`
        line (AIPerf counts only those), the message as a comment, the JSON body (the openai SDK
        raises it), then `[DONE]`."""
        message = self.message.replace("\n", " ")
        return (f"event: error\n: {message}\ndata: {json.dumps(self.body())}\n\ndata: [DONE]\n\n").encode()


def _default_code(status: int) -> str:
    for code in ErrorCode:
        if code.http_status == status:
            return code.value
    return str(status)


def invalid(message: str, param: str | None = None) -> FrontendError:
    return FrontendError(400, message, param, ErrorCode.INVALID_ARGUMENT.value)


def from_server(error: ZerocheckError, param_of: dict[str, str]) -> FrontendError:
    """The answer for an error of the generate call; `param_of` maps the server's input names to the
    request's fields (the server's message starts with the input it refused)."""
    if error.code is not None:
        status = error.code.http_status
    elif isinstance(error, InvalidRequest):
        status = 400
    elif isinstance(error, Unavailable):
        status = 503
    elif isinstance(error, Timeout):
        status = 504
    elif isinstance(error, Cancelled):
        status = 499
    else:
        status = 500
    first_word = error.message.split(" ", 1)[0].rstrip(":,")
    param = param_of.get(first_word) if status == 400 else None
    return FrontendError(status, error.message, param, error.code.value if error.code else None)
