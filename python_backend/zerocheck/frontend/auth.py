"""The client API key of the OpenAI and Anthropic APIs: with one configured, every `/v1/` request must
carry it as `x-api-key: KEY` (Anthropic's SDK) or `Authorization: Bearer KEY` (OpenAI's); else 401 in
the API's own error shape (app.json_errors renders the refusal). `/health` and `/metrics` stay open
(probes and Prometheus)."""
from __future__ import annotations

import hmac

from aiohttp import web

from zerocheck.frontend.errors import FrontendError
from zerocheck.frontend.metrics import FrontendMetrics

ENDPOINT_OF = {"/v1/messages": "messages", "/v1/messages/count_tokens": "count_tokens", "/v1/chat/completions": "chat",
               "/v1/completions": "completions"}


def presented_key(headers) -> str | None:
    """The key a request carries: `x-api-key`, else a bearer token."""
    if headers.get("x-api-key"):
        return headers["x-api-key"]
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def client_key_middleware(api_key: str, metrics: FrontendMetrics):
    """An aiohttp middleware refusing `/v1/` requests without `api_key`."""
    expected = api_key.encode()

    @web.middleware
    async def require_key(request: web.Request, handler):
        if not request.path.startswith("/v1/"):
            return await handler(request)
        given = presented_key(request.headers)
        if given is not None and hmac.compare_digest(given.encode(), expected):
            return await handler(request)
        metrics.answered(ENDPOINT_OF.get(request.path, "models"), 401)
        what = "no API key" if given is None else "an invalid API key"
        raise FrontendError(401, f"{what}: send header x-api-key: <key> or Authorization: Bearer <key>",
                            code="invalid_api_key")

    return require_key


__all__ = ["client_key_middleware", "presented_key"]
