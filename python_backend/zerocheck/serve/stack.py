"""`ServingStack`: tritonserver and zerocheck's HTTP front end, started, watched and stopped together.

Triton's gRPC and metrics endpoints are public as before. Its HTTP endpoint binds an internal
loopback port that only the front end uses: the public HTTP port is the front end's guarded door
(`zerocheck.frontend.door`), and the OpenAI API gets a port of its own (or none).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from zerocheck.frontend.cli import CLIENT_API_KEY_ENV
from zerocheck.frontend.limits import HttpLimits
from zerocheck.serve.server import TritonServer, TritonServerError


class ServingStack(TritonServer):
    """A TritonServer whose `http_url` is the front end's door and that also serves `openai_url`.

    http_port / openai_port: 0 or None picks a free port; `openai=False` serves no OpenAI API.
    Other arguments are TritonServer's.
    """

    def __init__(self, model_repository, http_port: int | None = None, openai_port: int | None = None,
                 openai: bool = True, limits: HttpLimits = HttpLimits(), served_model_name: str | None = None,
                 client_api_key: str | None = None, **kwargs) -> None:
        super().__init__(model_repository, http_port=0, **kwargs)
        self.door_port, self.openai_port = http_port or 0, (openai_port or 0) if openai else None
        self.limits, self.served_model_name = limits, served_model_name
        self.client_api_key = client_api_key  # passed in the front end's environment, not on its command line
        self.frontend_ports: dict[str, int] = {}
        self.frontend_served_model = ""
        self._frontend: subprocess.Popen[bytes] | None = None
        self._ready_file: Path | None = None

    def _address_of(self, endpoint: str) -> str:
        return "127.0.0.1" if endpoint == "http" else self.host  # only the front end reaches Triton's HTTP

    @property
    def http_url(self) -> str:
        """`host:port` of the public HTTP endpoint: the front end's door to Triton's HTTP API."""
        return f"{self._connect_host}:{self.frontend_ports['door']}"

    @property
    def openai_url(self) -> str:
        """`http://host:port/v1` of the OpenAI API (what the openai SDK takes as `base_url`)."""
        return f"http://{self._connect_host}:{self.frontend_ports['openai']}/v1"

    @property
    def anthropic_url(self) -> str:
        """`http://host:port` of the Anthropic Messages API (what the anthropic SDK takes as `base_url`)."""
        return f"http://{self._connect_host}:{self.frontend_ports['openai']}"

    @property
    def frontend_log_path(self) -> Path:
        return self.log_path.with_suffix(".frontend.log")

    def frontend_command(self) -> list[str]:
        command = [sys.executable, "-m", "zerocheck.frontend", "--url", f"127.0.0.1:{self.ports['grpc']}",
                   "--host", self.host, "--triton-http-url", f"http://{self.triton_http_url}",
                   "--door-port", str(self.door_port), "--ready-file", str(self._ready_file),
                   "--max-body-bytes", str(self.limits.max_body_bytes),
                   "--body-timeout-s", str(self.limits.body_timeout_s),
                   "--header-timeout-s", str(self.limits.header_timeout_s)]
        command += ["--port", str(self.openai_port)] if self.openai_port is not None else ["--no-openai"]
        if self.env.get("ZEROCHECK_ARTIFACTS"):
            command += ["--artifacts", self.env["ZEROCHECK_ARTIFACTS"]]
        if self.served_model_name:
            command += ["--served-model-name", self.served_model_name]
        return command

    def frontend_env(self) -> dict[str, str]:
        env = {**os.environ, **self.env}
        env.pop(CLIENT_API_KEY_ENV, None)
        if self.client_api_key:
            env[CLIENT_API_KEY_ENV] = self.client_api_key
        return env

    def start(self) -> ServingStack:
        super().start()
        self.frontend_ports = {}
        self._ready_file = self.log_path.with_suffix(".frontend.ports")
        self._ready_file.unlink(missing_ok=True)
        with open(self.frontend_log_path, "wb") as log:
            self._frontend = subprocess.Popen(self.frontend_command(), stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT, env=self.frontend_env(),
                                              start_new_session=True)
        return self

    @property
    def frontend_pid(self) -> int | None:
        """Process id of the front end, None before `start()`."""
        return self._frontend.pid if self._frontend else None

    def is_alive(self) -> bool:
        return super().is_alive() and self._frontend is not None and self._frontend.poll() is None

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while not self.frontend_ports:
            if self._frontend is not None and self._frontend.poll() is not None:
                self._fail(f"the front end exited with code {self._frontend.returncode}; its log "
                           f"{self.frontend_log_path}:\n{self.frontend_log_path.read_text(errors='replace')[-3000:]}")
            if self._ready_file is not None and self._ready_file.is_file() and self._ready_file.read_text():
                listening = json.loads(self._ready_file.read_text())
                self.frontend_ports, self.frontend_served_model = listening["ports"], listening["served_model"]
                break
            if time.monotonic() > deadline:
                self._fail(f"the front end did not listen within {timeout:.0f} s")
            time.sleep(0.1)
        super().wait_ready(max(1.0, deadline - time.monotonic()))
        while not self._door_answers():
            if time.monotonic() > deadline:
                self._fail("the front end's door does not answer /v2/health/ready")
            time.sleep(0.1)

    def _door_answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://{self.http_url}/v2/health/ready", timeout=2) as reply:
                return reply.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout: float = 30.0) -> int | None:
        frontend = self._frontend
        if frontend is not None and frontend.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(frontend.pid, signal.SIGTERM)
            try:
                frontend.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(frontend.pid, signal.SIGKILL)
                frontend.wait()
        return super().stop(timeout)


__all__ = ["ServingStack", "TritonServerError"]
