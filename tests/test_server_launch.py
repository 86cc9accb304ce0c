"""`zerocheck.serve`: a real tritonserver over tests/fixtures/echo_repository (ports, readiness, header
forwarding, restricted APIs, clean stop) and `zerocheck serve --demo`."""
from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import psutil
import pytest
import requests
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

import zerocheck

from zerocheck.serve import TritonServer, TritonServerError, cli
from zerocheck.api.headers import API_KEY_HEADER, GRPC_API_KEY_HEADER
from zerocheck.serve.server import port_is_free
from zerocheck.serve.shm import SHM_DIR

ECHO_REPOSITORY = Path(__file__).parent / "fixtures" / "echo_repository"
FAKE_ARTIFACTS = "/nonexistent/zerocheck-artifacts"


@pytest.fixture(scope="module")
def echo_server(tritonserver_binary: Path) -> Iterator[TritonServer]:
    with TritonServer(ECHO_REPOSITORY, tritonserver=tritonserver_binary,
                      env={"ZEROCHECK_ARTIFACTS": FAKE_ARTIFACTS}) as server:
        yield server


def grpc_echo(server: TritonServer, text: bytes, headers: dict[str, str] | None = None) -> grpcclient.InferResult:
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text], dtype=np.object_))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        return client.infer("echo", [tensor], headers=headers)


def test_ready_and_infer_over_http_and_grpc(echo_server: TritonServer) -> None:
    http = httpclient.InferenceServerClient(echo_server.http_url)
    assert http.is_server_ready() and http.is_model_ready("echo") and http.is_model_ready("generate")
    tensor = httpclient.InferInput("text_input", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([b"a", b"bc"], dtype=np.object_))
    assert http.infer("echo", [tensor]).as_numpy("text_output").tolist() == [b"a", b"bc"]
    with grpcclient.InferenceServerClient(echo_server.grpc_url) as grpc:
        assert grpc.is_server_ready() and grpc.is_model_ready("echo")
    assert grpc_echo(echo_server, b"hello").as_numpy("text_output").tolist() == [b"hello"]
    assert requests.get(f"http://{echo_server.metrics_url}/metrics", timeout=5).ok


def test_models_run_in_this_venv_with_the_given_environment(echo_server: TritonServer) -> None:
    seen = json.loads(grpc_echo(echo_server, b"x").as_numpy("environment")[0])
    assert seen["ZEROCHECK_ARTIFACTS"] == FAKE_ARTIFACTS
    assert Path(seen["zerocheck"]).resolve() == Path(zerocheck.__file__).resolve()


def test_grpc_zerocheck_headers_arrive_as_parameters(echo_server: TritonServer) -> None:
    result = grpc_echo(echo_server, b"x", headers={"zerocheck": "off", "other-header": "dropped"})
    parameters = json.loads(result.as_numpy("parameters")[0])
    assert parameters["zerocheck"] == "off" and "other-header" not in parameters


def test_http_generate_extra_keys_arrive_as_parameters(echo_server: TritonServer) -> None:
    body = {"text_input": "hi", "zerocheck": "off", "temperature": 0.5}
    reply = requests.post(f"http://{echo_server.http_url}/v2/models/echo/generate", json=body, timeout=10)
    reply.raise_for_status()
    assert reply.json()["text_output"] == "hi"
    assert json.loads(reply.json()["parameters"]) == {"zerocheck": "off", "temperature": 0.5}


def test_restricted_apis_need_the_key(server_factory) -> None:
    server = server_factory(ECHO_REPOSITORY, restricted_api_key="s3cret")
    index = f"http://{server.http_url}/v2/repository/index"
    assert requests.post(index, timeout=5).status_code == 403
    assert requests.post(index, headers={API_KEY_HEADER: "wrong"}, timeout=5).status_code == 403
    assert {m["name"] for m in requests.post(index, headers=server.api_key_headers(), timeout=5).json()} == {
        "echo", "generate"}
    assert requests.get(f"http://{server.http_url}/v2/models/echo/stats", timeout=5).ok  # statistics stay open
    with grpcclient.InferenceServerClient(server.grpc_url) as grpc:
        with pytest.raises(Exception, match="restricted"):
            grpc.get_model_repository_index()
        assert len(grpc.get_model_repository_index(headers={GRPC_API_KEY_HEADER: "s3cret"}).models) == 2
    assert grpc_echo(server, b"open").as_numpy("text_output").tolist() == [b"open"]  # inference stays open


def test_stop_frees_ports_processes_and_shm_and_a_second_server_reuses_them(server_factory) -> None:
    first = server_factory(ECHO_REPOSITORY)
    children = psutil.Process(first.pid).children(recursive=True)
    regions = {arg for child in children for arg in child.cmdline() if "shm_region" in arg}
    assert len(children) == len(regions) == 2  # one stub per model instance
    assert first.stop() == 0 and not first.is_alive()
    assert not any(child.is_running() for child in children)
    assert not any((SHM_DIR / region).exists() for region in regions)
    assert all(port_is_free(first.host, port) for port in first.ports.values())
    second = server_factory(ECHO_REPOSITORY, **{f"{name}_port": port for name, port in first.ports.items()})
    assert grpc_echo(second, b"again").as_numpy("text_output").tolist() == [b"again"]


def test_wait_ready_fails_fast_when_a_model_cannot_load(server_factory, tmp_path: Path) -> None:
    repository = tmp_path / "broken"
    shutil.copytree(ECHO_REPOSITORY / "echo", repository / "echo")
    (repository / "echo" / "1" / "model.py").write_text("raise ImportError('broken on purpose')\n")
    with pytest.raises(TritonServerError, match="broken on purpose"):
        server_factory(repository)


def test_serve_demo_streams_generate(tritonserver_binary: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    args = parser.parse_args(["--model-repository", str(ECHO_REPOSITORY), "--artifacts", str(tmp_path),
                              "--no-build", "--demo", "--tritonserver", str(tritonserver_binary),
                              "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"])
    assert cli.run(args) == 0
    out = capsys.readouterr().out
    assert f"user> {cli.DEMO_QUESTION}\nassistant> {cli.DEMO_QUESTION[::-1]}" in out
    assert "tritonserver stopped" in out
