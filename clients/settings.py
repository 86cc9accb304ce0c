"""`ClientSettings`: the constructor shared by `Client` and `AsyncClient`."""
from __future__ import annotations

from zerocheck.clients.attempts import RetryPolicy
from zerocheck.clients.endpoint import DEFAULT_URLS, Endpoint


class ClientSettings:
    """url: host:port (default: 127.0.0.1 and the protocol's default port); protocol: grpc | http;
    connect_timeout: seconds to connect, per attempt; timeout: total deadline of one call in seconds,
    retries and backoff included; retries: extra attempts after retryable failures before the first
    token (exponential backoff from backoff_s to backoff_max_s, with jitter); hedge_after_s: send one
    more attempt when no token arrived within this many seconds (None: never; 0.3 is a good value);
    api_key: see `Endpoint`."""

    def __init__(self, url: str | None = None, protocol: str = "grpc", model: str = "ensemble",
                 connect_timeout: float = 5.0, timeout: float = 60.0, retries: int = 3,
                 hedge_after_s: float | None = None, api_key: str | None = None,
                 backoff_s: float = 0.1, backoff_max_s: float = 2.0) -> None:
        self.endpoint = Endpoint(url or DEFAULT_URLS.get(protocol, ""), protocol, model, connect_timeout, api_key)
        self.policy = RetryPolicy(retries, backoff_s, backoff_max_s, hedge_after_s)
        self.timeout = timeout

    def _timeout(self, timeout: float | None) -> float:
        return self.timeout if timeout is None else timeout
