"""Security defaults: loopback bind, restricted admin APIs (model control, shared memory, trace, logging)
over HTTP and gRPC on the real repository, models only from the configured repository, and
`zerocheck serve` locking those APIs with a random key when no --api-key is given."""
from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest
import requests
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import conftest
from generate_calls import grpc_generate
from zerocheck.paths import packaged_model_repository
from zerocheck.serve import TritonServer, cli
from zerocheck.api.headers import API_KEY_HEADER, GRPC_API_KEY_HEADER

KEY = conftest.ADMIN_KEY
ECHO_REPOSITORY = Path(__file__).parent / "fixtures" / "echo_repository"
# one call per restricted API group: (method, path, body)
HTTP_RESTRICTED = [
    ("POST", "/v2/repository/index", "{}"),                               # model-repository
    ("POST", "/v2/repository/models/decoder/unload", "{}"),               # model-repository (control)
    ("GET", "/v2/systemsharedmemory/status", None),                       # shared-memory
    ("POST", "/v2/systemsharedmemory/region/x/register", '{"key": "/etc/passwd", "offset": 0, "byte_size": 8}'),
    ("GET", "/v2/trace/setting", None),                                   # trace
    ("POST", "/v2/trace/setting", '{"trace_file": "/tmp/zerocheck-trace.json"}'),
    ("GET", "/v2/logging", None),                                         # logging
    ("POST", "/v2/logging", '{"log_file": "/tmp/zerocheck-log.txt"}'),
]
GRPC_RESTRICTED = [
    ("get_model_repository_index", ()),
    ("unload_model", ("decoder",)),
    ("get_system_shared_memory_status", ()),
    ("get_trace_settings", ()),
    ("get_log_settings", ()),
]


@pytest.fixture(scope="module")
def locked_server(triton_server):
    """The session's server: locked with KEY, HTTP through the front end's door, as `zerocheck serve` runs."""
    assert triton_server.restricted_api_key == KEY
    return triton_server


def http_call(server, method: str, path: str, body: str | None, headers=None) -> requests.Response:
    return requests.request(method, f"http://{server.http_url}{path}", data=body, headers=headers, timeout=10)


@pytest.mark.parametrize("method,path,body", HTTP_RESTRICTED, ids=[f"{m} {p}" for m, p, _ in HTTP_RESTRICTED])
def test_http_restricted_apis_are_refused_without_the_key(locked_server, method, path, body) -> None:
    for headers in (None, {API_KEY_HEADER: "wrong"}):
        reply = http_call(locked_server, method, path, body, headers)
        assert reply.status_code == 403, (path, reply.status_code, reply.text)


def test_http_restricted_apis_are_allowed_with_the_key(locked_server) -> None:
    key = {API_KEY_HEADER: KEY}
    for method, path, body in HTTP_RESTRICTED:
        if method == "GET":
            assert http_call(locked_server, method, path, body, key).status_code == 200, path
    index = http_call(locked_server, "POST", "/v2/repository/index", "{}", key).json()
    assert {m["name"] for m in index} >= {"generate", "decoder"}
    # model control with the key still cannot load anything: --model-control-mode=none
    reply = http_call(locked_server, "POST", "/v2/repository/models/evil/load", "{}", key)
    assert reply.status_code != 200 and "explicit model load / unload is not allowed" in reply.text


@pytest.mark.parametrize("method,args", GRPC_RESTRICTED, ids=[m for m, _ in GRPC_RESTRICTED])
def test_grpc_restricted_apis_need_the_key(locked_server, method, args) -> None:
    with grpcclient.InferenceServerClient(locked_server.grpc_url) as client:
        with pytest.raises(InferenceServerException, match="restricted"):
            getattr(client, method)(*args)
        with pytest.raises(InferenceServerException, match="restricted"):
            getattr(client, method)(*args, headers={GRPC_API_KEY_HEADER: "wrong"})
        if method != "unload_model":
            getattr(client, method)(*args, headers={GRPC_API_KEY_HEADER: KEY})  # allowed with the key


def test_inference_health_and_metadata_stay_open(locked_server) -> None:
    assert requests.get(f"http://{locked_server.http_url}/v2/health/ready", timeout=10).status_code == 200
    assert requests.get(f"http://{locked_server.http_url}/v2/models/generate", timeout=10).status_code == 200
    responses = grpc_generate(locked_server.grpc_url, {"text_input": "def f():", "max_tokens": 2, "stream": True})
    assert responses[-1]["finish_reason"]
    with grpcclient.InferenceServerClient(locked_server.grpc_url) as client:
        assert client.is_model_ready("decoder")  # the unload attempts above changed nothing


def test_binds_loopback_and_serves_only_the_configured_repository(locked_server) -> None:
    assert inspect.signature(TritonServer).parameters["host"].default == "127.0.0.1"
    assert locked_server.host == "127.0.0.1"
    command = locked_server.command()
    for name in ("http", "grpc", "metrics"):
        assert f"--{name}-address=127.0.0.1" in command
    assert "--model-control-mode=none" in command
    assert [arg for arg in command if arg.startswith("--model-repository=")] == [
        f"--model-repository={packaged_model_repository()}"]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert parser.parse_args([]).host == "127.0.0.1"


def test_zerocheck_serve_without_api_key_still_restricts(tritonserver_binary: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    seen = {}

    def check_while_serving(server: TritonServer) -> None:  # replaces the demo: runs while the server is up
        seen["key"] = server.restricted_api_key
        index = f"http://{server.http_url}/v2/repository/index"
        seen["without"] = requests.post(index, timeout=10).status_code
        seen["with"] = requests.post(index, headers=server.api_key_headers(), timeout=10).status_code
        seen["logging"] = requests.get(f"http://{server.http_url}/v2/logging", timeout=10).status_code

    monkeypatch.setattr(cli, "run_demo", check_while_serving)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model-repository", str(ECHO_REPOSITORY), "--artifacts", str(tmp_path), "--no-build",
                              "--demo", "--tritonserver", str(tritonserver_binary),
                              "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"])
    assert args.api_key is None
    assert cli.run(args) == 0
    assert seen["key"] and len(seen["key"]) >= 32
    assert seen["without"] == 403 and seen["logging"] == 403 and seen["with"] == 200
