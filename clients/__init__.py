"""Clients of the zerocheck generate model: `Client` (blocking) and `AsyncClient` (asyncio), over gRPC or HTTP."""
from zerocheck.clients.async_client import AsyncClient
from zerocheck.clients.client import Client
from zerocheck.clients.errors import Cancelled, InvalidRequest, Timeout, Unavailable, ZerocheckError
from zerocheck.clients.response import GenerateResult, TokenEvent

__all__ = ["AsyncClient", "Cancelled", "Client", "GenerateResult", "InvalidRequest", "Timeout", "TokenEvent",
           "Unavailable", "ZerocheckError"]
