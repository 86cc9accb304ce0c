"""`check_health`: server liveness and readiness and each model's readiness, over gRPC or HTTP.

Health and model readiness are open APIs; the repository index (every model with its state and
reason) is an admin API that `zerocheck serve` locks with a key. So models are checked one by one
through `/v2/models/<name>/ready` (and the metadata API for their versions), and the index is read
only when an API key is given. `Health.source` says which was used.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from zerocheck.clients.endpoint import Endpoint

DEFAULT_MODELS = ("ensemble", "generate")  # what the clients call
INDEX, READY_API = "repository index", "model ready API"


@dataclass(frozen=True)
class ModelState:
    name: str
    version: str
    state: str  # READY | NOT READY (model ready API) | the index's states: UNAVAILABLE, LOADING, ...
    reason: str = ""


@dataclass(frozen=True)
class Health:
    """error: why the server could not be asked ("" when it answered); source: where the models' states
    came from (INDEX or READY_API)."""

    live: bool
    ready: bool
    models: list[ModelState] = field(default_factory=list)
    error: str = ""
    source: str = READY_API

    @property
    def ok(self) -> bool:
        return self.live and self.ready and bool(self.models) and all(m.state == "READY" for m in self.models)


def check_health(endpoint: Endpoint, models: Sequence[str] = DEFAULT_MODELS) -> Health:
    """Never raises for an unreachable or failing server: the answer says so. With an API key, every
    model of the repository index; without, `models` through the model ready API."""
    try:
        return _grpc_health(endpoint, models) if endpoint.protocol == "grpc" else _http_health(endpoint, models)
    except (InferenceServerException, requests.RequestException, ValueError) as error:
        return Health(live=False, ready=False, error=str(error))


def _grpc_health(endpoint: Endpoint, models: Sequence[str]) -> Health:
    headers, timeout = endpoint.headers(), endpoint.connect_timeout_s
    with grpcclient.InferenceServerClient(endpoint.url, channel_args=endpoint.grpc_channel_args()) as client:
        live = client.is_server_live(headers=headers, client_timeout=timeout)
        ready = client.is_server_ready(headers=headers, client_timeout=timeout)
        if endpoint.api_key is not None:
            index = client.get_model_repository_index(headers=headers, client_timeout=timeout)
            return Health(live, ready, [ModelState(m.name, m.version, m.state, m.reason) for m in index.models],
                          source=INDEX)
        states = []
        for name in models:
            try:
                is_ready = client.is_model_ready(name, headers=headers, client_timeout=timeout)
                versions = client.get_model_metadata(name, headers=headers, client_timeout=timeout).versions \
                    if is_ready else []
                states.append(ModelState(name, ",".join(versions), "READY" if is_ready else "NOT READY"))
            except InferenceServerException as error:
                states.append(ModelState(name, "", "NOT READY", error.message()))
    return Health(live, ready, states)


def _http_health(endpoint: Endpoint, models: Sequence[str]) -> Health:
    base, headers, timeout = endpoint.http_base, endpoint.headers(), endpoint.connect_timeout_s
    live = requests.get(f"{base}/v2/health/live", headers=headers, timeout=timeout).status_code == 200
    ready = requests.get(f"{base}/v2/health/ready", headers=headers, timeout=timeout).status_code == 200
    if endpoint.api_key is not None:
        reply = requests.post(f"{base}/v2/repository/index", json={}, headers=headers, timeout=timeout)
        reply.raise_for_status()
        return Health(live, ready, [ModelState(m["name"], str(m.get("version", "")), m.get("state", ""),
                                               m.get("reason", "")) for m in reply.json()], source=INDEX)
    states = []
    for name in models:
        if requests.get(f"{base}/v2/models/{name}/ready", headers=headers, timeout=timeout).status_code != 200:
            states.append(ModelState(name, "", "NOT READY"))
            continue
        metadata = requests.get(f"{base}/v2/models/{name}", headers=headers, timeout=timeout).json()
        states.append(ModelState(name, ",".join(metadata.get("versions", [])), "READY"))
    return Health(live, ready, states)
