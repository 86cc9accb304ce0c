"""`check_health`: server live/ready and every model's state (repository index), over gRPC or HTTP."""
from __future__ import annotations

from dataclasses import dataclass, field

import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from zerocheck.clients.endpoint import Endpoint


@dataclass(frozen=True)
class ModelState:
    name: str
    version: str
    state: str  # READY | UNAVAILABLE | LOADING | ...
    reason: str = ""


@dataclass(frozen=True)
class Health:
    """error: why the server could not be asked ("" when it answered)."""

    live: bool
    ready: bool
    models: list[ModelState] = field(default_factory=list)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.live and self.ready and bool(self.models) and all(m.state == "READY" for m in self.models)


def check_health(endpoint: Endpoint) -> Health:
    """Never raises for an unreachable or failing server: the answer says so."""
    try:
        return _grpc_health(endpoint) if endpoint.protocol == "grpc" else _http_health(endpoint)
    except (InferenceServerException, requests.RequestException, ValueError) as error:
        return Health(live=False, ready=False, error=str(error))


def _grpc_health(endpoint: Endpoint) -> Health:
    headers, timeout = endpoint.headers(), endpoint.connect_timeout_s
    with grpcclient.InferenceServerClient(endpoint.url, channel_args=endpoint.grpc_channel_args()) as client:
        live = client.is_server_live(headers=headers, client_timeout=timeout)
        ready = client.is_server_ready(headers=headers, client_timeout=timeout)
        index = client.get_model_repository_index(headers=headers, client_timeout=timeout)
    return Health(live, ready, [ModelState(m.name, m.version, m.state, m.reason) for m in index.models])


def _http_health(endpoint: Endpoint) -> Health:
    base, headers, timeout = endpoint.http_base, endpoint.headers(), endpoint.connect_timeout_s
    live = requests.get(f"{base}/v2/health/live", headers=headers, timeout=timeout).status_code == 200
    ready = requests.get(f"{base}/v2/health/ready", headers=headers, timeout=timeout).status_code == 200
    reply = requests.post(f"{base}/v2/repository/index", json={}, headers=headers, timeout=timeout)
    reply.raise_for_status()
    models = [ModelState(m["name"], str(m.get("version", "")), m.get("state", ""), m.get("reason", ""))
              for m in reply.json()]
    return Health(live, ready, models)
