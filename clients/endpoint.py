"""`Endpoint`: where and how to reach the server, shared by every transport."""
from __future__ import annotations

from dataclasses import dataclass

from zerocheck.api.headers import API_KEY_HEADER, GRPC_API_KEY_HEADER

PROTOCOLS = ("grpc", "http")
DEFAULT_URLS = {"grpc": "127.0.0.1:8001", "http": "127.0.0.1:8000"}
MAX_MESSAGE_BYTES = 2**31 - 1


@dataclass(frozen=True)
class Endpoint:
    """url: host:port (an http:// prefix is accepted for HTTP); api_key: sent as `authorization: Bearer`
    for a gateway in front, and as Triton's restricted-API key (`zerocheck serve --restricted-api-key`)."""

    url: str
    protocol: str = "grpc"
    model: str = "ensemble"
    connect_timeout_s: float = 5.0
    api_key: str | None = None

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {self.protocol!r}")

    @property
    def http_base(self) -> str:
        return self.url if self.url.startswith(("http://", "https://")) else f"http://{self.url}"

    def headers(self) -> dict[str, str]:
        if self.api_key is None:
            return {}
        key_header = GRPC_API_KEY_HEADER if self.protocol == "grpc" else API_KEY_HEADER
        return {"authorization": f"Bearer {self.api_key}", key_header: self.api_key}

    def grpc_channel_args(self) -> list[tuple[str, int]]:
        """grpc core's connect timeout is its minimum reconnect backoff; a local subchannel pool keeps
        a refused connection's backoff out of the next attempt's channel."""
        return [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.min_reconnect_backoff_ms", int(self.connect_timeout_s * 1000)),
                ("grpc.use_local_subchannel_pool", 1)]
