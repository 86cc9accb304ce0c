"""`TritonServer`: run a real tritonserver process on loopback ports, wait for its models, stop it cleanly."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import NoReturn
from pathlib import Path

import psutil

from zerocheck import paths
from zerocheck.api.headers import API_KEY_HEADER, GRPC_API_KEY_HEADER
from zerocheck.serve.binary import find_tritonserver, prepare_backend_dir, server_environment
from zerocheck.serve.shm import live_stub_regions, remove_regions, server_processes

RESTRICTED_APIS = ("model-repository", "shared-memory", "trace", "logging")
HEADER_FORWARD_PATTERN = "zerocheck.*"
# error lines Triton prints on any CPU-only machine; left out of failure messages
HARMLESS_ERRORS = ("CudaDriverHelper", "NVML", "DCGM", "CUDA driver version is insufficient", "pinned memory")
STARTED_LINE = {"grpc": "Started GRPCInferenceService at {}", "http": "Started HTTPService at {}",
                "metrics": "Started Metrics Service at {}"}


class TritonServerError(RuntimeError):
    """The server exited, a model became UNAVAILABLE, or it was not ready in time; message ends with the log tail."""


def free_ports(host: str, count: int) -> list[int]:
    """`count` distinct ports that are free on `host` now (all sockets held open until every one is picked)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def port_is_free(host: str, port: int) -> bool:
    """True when a server could listen on `host:port` now (SO_REUSEADDR, as servers do: TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class TritonServer:
    """One tritonserver process over `model_repository`; a context manager that starts, waits ready and stops.

    Ports left None (or 0) are picked free on `host`. `env` entries are added to this process's environment.
    With `restricted_api_key`, the APIs in RESTRICTED_APIS need header `admin-key: <key>` over HTTP and
    metadata `triton-grpc-protocol-admin-key: <key>` over gRPC; inference, health, metadata and statistics stay open.
    """

    def __init__(
        self,
        model_repository: str | os.PathLike[str],
        http_port: int | None = None,
        grpc_port: int | None = None,
        metrics_port: int | None = None,
        host: str = "127.0.0.1",
        tritonserver: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
        log_file: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        restricted_api_key: str | None = None,
    ) -> None:
        self.model_repository = Path(model_repository).absolute()
        self.host = host
        self.binary = find_tritonserver(tritonserver)
        self.extra_args = tuple(extra_args)
        self.env = dict(env or {})
        self.restricted_api_key = restricted_api_key
        self._requested_ports = {"http": http_port, "grpc": grpc_port, "metrics": metrics_port}
        self.ports: dict[str, int] = {}
        self._log_file = Path(log_file).absolute() if log_file else None
        self._process: subprocess.Popen[bytes] | None = None
        self._shm_regions: set[str] = set()
        self._stubs: list[psutil.Process] = []  # as they were once ready: a server that died leaves them orphaned
        self._bound = False

    # -- addresses -------------------------------------------------------------------------------------------
    @property
    def _connect_host(self) -> str:
        return "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host

    def _address_of(self, endpoint: str) -> str:
        """The address Triton binds `endpoint` (http, grpc, metrics) to."""
        return self.host

    @property
    def triton_http_url(self) -> str:
        """`host:port` of Triton's own HTTP endpoint (tritonclient style, no scheme)."""
        address = self._address_of("http")
        return f"{'127.0.0.1' if address in ('0.0.0.0', '') else address}:{self.ports['http']}"

    @property
    def http_url(self) -> str:
        """`host:port` of the public HTTP endpoint (here Triton's own)."""
        return self.triton_http_url

    @property
    def grpc_url(self) -> str:
        """`host:port` of the gRPC endpoint."""
        return f"{self._connect_host}:{self.ports['grpc']}"

    @property
    def metrics_url(self) -> str:
        """`host:port` of the Prometheus metrics endpoint (`/metrics`)."""
        return f"{self._connect_host}:{self.ports['metrics']}"

    @property
    def pid(self) -> int | None:
        """Process id of tritonserver (also its process group id), None before `start()`."""
        return self._process.pid if self._process else None

    @property
    def log_path(self) -> Path:
        """File receiving the server's stdout and stderr (model `print`s and stub tracebacks included); by
        default a new file in the log directory (`zerocheck paths logs`)."""
        if self._log_file is None:
            fd, name = tempfile.mkstemp(prefix="tritonserver-", suffix=".log", dir=paths.log_dir())
            os.close(fd)
            self._log_file = Path(name)
        return self._log_file

    def log_tail(self, n: int = 40) -> str:
        """The last `n` lines of the server log ("" when there is none yet)."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(lines[-n:])

    def log_errors(self, limit: int = 20) -> list[str]:
        """The first `limit` error lines (`E...`) of the log, without the harmless CPU-only ones."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return []
        errors = [line for line in lines if line.startswith("E") and not any(h in line for h in HARMLESS_ERRORS)]
        return errors[:limit]

    def api_key_headers(self, protocol: str = "http") -> dict[str, str]:
        """Headers that unlock the restricted APIs over `protocol` ("http" or "grpc"); {} without a key."""
        if self.restricted_api_key is None:
            return {}
        return {GRPC_API_KEY_HEADER if protocol == "grpc" else API_KEY_HEADER: self.restricted_api_key}

    # -- lifecycle -------------------------------------------------------------------------------------------
    def command(self) -> list[str]:
        """The tritonserver command line (ports must be assigned)."""
        args = [
            str(self.binary),
            f"--model-repository={self.model_repository}",
            "--model-control-mode=none",
            "--strict-readiness=true",
            "--exit-on-error=true",
            "--exit-timeout-secs=10",
            f"--grpc-header-forward-pattern={HEADER_FORWARD_PATTERN}",
            # per-model latency quantiles (p50 to p99 of queue, compute and request time) beside the totals
            "--metrics-config=summary_latencies=true",
        ]
        for name, port in self.ports.items():
            args += [f"--{name}-address={self._address_of(name)}", f"--{name}-port={port}"]
        backend_dir = prepare_backend_dir(self.binary)
        if backend_dir is not None:
            args.append(f"--backend-directory={backend_dir}")
        if self.restricted_api_key is not None:
            restriction = f"{','.join(RESTRICTED_APIS)}:{API_KEY_HEADER}={self.restricted_api_key}"
            args += [f"--http-restricted-api={restriction}", f"--grpc-restricted-protocol={restriction}"]
        return args + list(self.extra_args)

    def start(self) -> TritonServer:
        """Launch tritonserver in its own process group (session), output to `log_path`; does not wait."""
        if self.is_alive():
            raise TritonServerError(f"already running (pid {self.pid})")
        self._bound = False
        picked = iter(free_ports(self.host or "0.0.0.0", 3))
        self.ports = {name: port or next(picked) for name, port in self._requested_ports.items()}
        env = server_environment(self.binary, {**os.environ, **self.env})
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                self.command(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=env, start_new_session=True,
            )
        return self

    def is_alive(self) -> bool:
        """True while the tritonserver process runs."""
        return self._process is not None and self._process.poll() is None

    def wait_ready(self, timeout: float = 300.0) -> None:
        """Block until HTTP, gRPC and metrics are bound by this process and every model is READY.

        Raises TritonServerError (with the log's errors and tail) as soon as the process exits or a model is
        UNAVAILABLE, or after `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while True:
            if not self.is_alive():
                self._fail(f"tritonserver exited with code {self._process.returncode if self._process else None}")
            if self._all_bound():
                if unavailable := self.unavailable_models():
                    self._fail(f"model(s) UNAVAILABLE: {unavailable}")
                if self._health_ready():
                    self._shm_regions |= live_stub_regions(self.pid)
                    self._stubs = server_processes(self.pid)
                    return
            if time.monotonic() > deadline:
                self._fail(f"not ready after {timeout:.0f} s")
            time.sleep(0.2)

    def _all_bound(self) -> bool:
        """True once the log says this process listens on all three ports (a port taken by another process
        would answer health checks but never print this)."""
        if not self._bound:
            log = self.log_path.read_text(errors="replace")
            self._bound = all(STARTED_LINE[name].format(f"{self._address_of(name)}:{port}") in log
                              for name, port in self.ports.items())
        return self._bound

    def _health_ready(self) -> bool:
        """`GET /v2/health/ready` is 200: with --strict-readiness, also every model is READY."""
        try:
            with urllib.request.urlopen(f"http://{self.triton_http_url}/v2/health/ready", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def unavailable_models(self) -> dict[str, str]:
        """{model: reason} for each model the repository index reports UNAVAILABLE."""
        return {m["name"]: m.get("reason", "") for m in self.repository_index() if m.get("state") == "UNAVAILABLE"}

    def repository_index(self) -> list[dict[str, str]]:
        """`POST /v2/repository/index`: [{name, version, state, reason}] for every model ([] when unreachable)."""
        request = urllib.request.Request(
            f"http://{self.triton_http_url}/v2/repository/index", data=b"{}", method="POST",
            headers=self.api_key_headers("http"),
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as reply:
                return json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError):
            return []

    def _fail(self, reason: str) -> NoReturn:
        errors = "\n".join(self.log_errors())
        raise TritonServerError(f"{reason}; log {self.log_path}\nerrors:\n{errors}\nlast lines:\n{self.log_tail(20)}")

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `timeout` s; reap, kill leftover stubs, free shm regions.

        Returns the server's exit code (None if never started). Safe to call twice.
        """
        process = self._process
        if process is None:
            return None
        children = list({child.pid: child for child in [*self._stubs, *server_processes(process.pid)]}.values())
        self._shm_regions |= live_stub_regions(process.pid)
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(process.pid, signal.SIGKILL)
                process.wait()
        for child in children:  # stubs that outlived the server (psutil guards against pid reuse)
            with contextlib.suppress(psutil.Error):
                child.kill()
        psutil.wait_procs(children, timeout=5)
        remove_regions(self._shm_regions)
        self._wait_ports_free(deadline=time.monotonic() + 5)
        return process.returncode

    def _wait_ports_free(self, deadline: float) -> None:
        while any(not port_is_free(self.host, port) for port in self.ports.values()) and time.monotonic() < deadline:
            time.sleep(0.1)

    def __enter__(self) -> TritonServer:
        self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"TritonServer(pid={self.pid}, http={self.ports.get('http')}, repository={self.model_repository})"


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
