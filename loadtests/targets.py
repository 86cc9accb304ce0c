"""Load targets: default loopback endpoints and the guard that refuses other hosts without --allow-remote."""
from __future__ import annotations

import ipaddress
import socket

DEFAULT_GRPC_URL = "127.0.0.1:8001"
DEFAULT_HTTP_URL = "127.0.0.1:8000"
DEFAULT_METRICS_URL = "127.0.0.1:8002"
DEFAULT_OPENAI_URL = "http://127.0.0.1:9000/v1"


class RemoteTargetRefused(ValueError):
    """A target host that is not loopback, without --allow-remote."""


def is_loopback(url: str) -> bool:
    """True when the host of `host:port` (or `scheme://host:port/...`) resolves only to loopback addresses."""
    host = url.split("://")[-1].split("/")[0].rsplit(":", 1)[0].strip("[]")
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except socket.gaierror:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def check_targets(urls: list[str], allow_remote: bool) -> None:
    """Raise RemoteTargetRefused for a non-loopback url unless `allow_remote`."""
    remote = [url for url in urls if not is_loopback(url)]
    if remote and not allow_remote:
        raise RemoteTargetRefused(f"refusing non-loopback target(s) {', '.join(remote)}: pass --allow-remote")
