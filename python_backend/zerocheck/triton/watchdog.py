"""`StubWatchdog`: notice a Python-backend model instance (stub process) of this server that died.

Triton 2.51 neither restarts a dead stub nor marks its model not-ready: every later request to it
fails with "Stub process '<model>_0_0' is not healthy" while /v2/health/ready stays 200. The
watchdog, run inside one model (generate), polls its sibling stubs (the server's children running
`triton_python_backend_stub`) and calls `on_death` once when one it has seen is gone; the generate
model then asks the server to stop (SIGTERM), so health turns not-ready at once and an orchestrator
restarts it. Uses psutil only (no pb_utils: safe on its own thread).
"""
from __future__ import annotations

import os
import re
import signal
import threading
from typing import Callable

import psutil

STUB_NAME = "triton_python_backend_stub"
INSTANCE_NAME = re.compile(r".+_\d+_\d+$")  # <model>_<group>_<index>; the short-lived auto-complete stubs lack it


def sibling_stubs(server_pid: int) -> dict[int, str]:
    """pid -> instance name (e.g. decoder_0_0) of every model-instance stub of server `server_pid` that is
    alive (zombies excluded). Stub argv: stub, model.py, shm region, sizes, parent pid, lib dir, ipc, name, ..."""
    stubs = {}
    try:
        children = psutil.Process(server_pid).children()
    except psutil.Error:
        return stubs
    for child in children:
        try:
            argv = child.cmdline()
            if (child.status() != psutil.STATUS_ZOMBIE and len(argv) > 8 and argv[0].endswith(STUB_NAME)
                    and INSTANCE_NAME.match(argv[8])):
                stubs[child.pid] = argv[8]
        except psutil.Error:
            continue
    return stubs


def stub_alive(pid: int) -> bool:
    """Whether process `pid` runs (one read of /proc/<pid>/stat; a zombie is dead)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class StubWatchdog:
    """Polls every `interval_s`; `on_death(pid, instance)` is called once, for the first stub seen dying.
    The stubs it knows are checked one by one at every poll (cheap); the server's children are listed
    again (a scan of every process) every `rescan_every` polls, to find stubs of models that load later."""

    def __init__(self, on_death: Callable[[int, str], None], interval_s: float = 0.5,
                 server_pid: int | None = None, rescan_every: int = 20) -> None:
        self.on_death, self.interval_s, self.rescan_every = on_death, interval_s, rescan_every
        self.server_pid = server_pid or os.getppid()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stub-watchdog", daemon=True)

    def start(self) -> "StubWatchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        seen: dict[int, str] = {}
        polls = 0
        while not self._stop.wait(self.interval_s):
            if polls % self.rescan_every == 0:
                alive = sibling_stubs(self.server_pid)
            else:
                alive = {pid: name for pid, name in seen.items() if stub_alive(pid)}
            polls += 1
            dead = [pid for pid in seen if pid not in alive]
            if dead and not self._stop.is_set():
                self.on_death(dead[0], seen[dead[0]])
                return
            seen.update(alive)


def stop_server(pid: int, instance: str) -> None:
    """`on_death` for the server: SIGTERM it (tritonserver ignores a second SIGTERM while it shuts down)."""
    print(f"zerocheck: model instance {instance} (stub pid {pid}) died; stopping tritonserver so that its health "
          f"turns not-ready (restart it)", flush=True)
    os.kill(os.getppid(), signal.SIGTERM)
