"""Locate a tritonserver binary and prepare what it needs to run Python-backend models here."""
from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from zerocheck import paths

NGC_BINARY = Path("/opt/tritonserver/bin/tritonserver")
STUB_NAME = "triton_python_backend_stub"
PY_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"


class TritonServerNotFound(FileNotFoundError):
    """No tritonserver binary at the given path, $ZEROCHECK_TRITONSERVER, nvidia-pytriton, PATH or /opt/tritonserver."""


def pytriton_root() -> Path | None:
    """`.../site-packages/pytriton/tritonserver` of the installed nvidia-pytriton wheel, if any."""
    try:
        import pytriton
    except ImportError:
        return None
    root = Path(pytriton.__file__).parent / "tritonserver"
    return root if (root / "bin" / "tritonserver").is_file() else None


def find_tritonserver(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The binary to run: `explicit`, else $ZEROCHECK_TRITONSERVER, else the wheel's, else `tritonserver` on
    PATH, else the NGC container's."""
    explicit = explicit or os.environ.get("ZEROCHECK_TRITONSERVER") or None
    if explicit is not None:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise TritonServerNotFound(f"tritonserver not executable: {path}")
        return path.absolute()
    wheel = pytriton_root()
    candidates = [wheel / "bin" / "tritonserver" if wheel else None, shutil.which("tritonserver"), NGC_BINARY]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate).absolute()
    raise TritonServerNotFound(
        "tritonserver not found: install nvidia-pytriton, put tritonserver on PATH or pass its path"
    )


def wheel_root_of(binary: Path) -> Path | None:
    """The pytriton `tritonserver` dir when `binary` is the one bundled in the wheel (it ships stubs)."""
    root = binary.resolve().parents[1]
    return root if (root / "python_backend_stubs").is_dir() else None


def prepare_backend_dir(binary: Path) -> Path | None:
    """A `--backend-directory` whose python backend runs this interpreter's version, or None to keep Triton's.

    For the wheel's binary, copies `backends/python` to `~/.cache/zerocheck/backends-<lib hash>-py3.X` and
    puts `python_backend_stubs/3.X/triton_python_backend_stub` beside `libtriton_python.so`. Idempotent;
    concurrent callers build in private temp dirs and the first rename wins.
    """
    wheel = wheel_root_of(binary)
    if wheel is None:
        return None
    source = wheel / "backends" / "python"
    stub = wheel / "python_backend_stubs" / PY_TAG / STUB_NAME
    if not stub.is_file():
        raise TritonServerNotFound(f"nvidia-pytriton ships no python backend stub for Python {PY_TAG}: {stub}")
    digest = hashlib.sha256((source / "libtriton_python.so").read_bytes() + stub.read_bytes()).hexdigest()[:12]
    target = paths.cache_dir() / f"backends-{digest}-py{PY_TAG}"
    if (target / "python" / STUB_NAME).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    staging.chmod(0o755)
    try:
        shutil.copytree(source, staging / "python", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(stub, staging / "python" / STUB_NAME)
        os.rename(staging, target)
    except OSError:
        if not (target / "python" / STUB_NAME).is_file():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


# OpenMP settings of the server's processes (see `server_environment`); benchmarks of in-server code use them too
THREAD_ENVIRONMENT = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000"}


def server_environment(binary: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for `binary`: the wheel's `nvidia_pytriton.libs` on LD_LIBRARY_PATH (the copied stub
    needs its libcudart), this interpreter's `bin` first on PATH (so the stub's Python uses this venv),
    and OMP_WAIT_POLICY=PASSIVE unless set: the model stubs take turns on the same cores, and OpenMP
    threads that spin after each torch op take the CPU from the model that runs next (benchmarks/e2e.py
    measures the time per output token); and GOMP_SPINCOUNT=10000 unless set (libgomp: spin that many
    times before sleeping, which PASSIVE alone sets to 0): the ops of one forward follow each other within
    microseconds, and waking a sleeping thread for each of them slows the packed bf16 decoder's step
    (benchmarks/decoder.py measures it)."""
    env = dict(os.environ if base is None else base)
    for name, value in THREAD_ENVIRONMENT.items():
        env.setdefault(name, value)
    wheel = wheel_root_of(binary)
    if wheel is not None:
        libs = wheel.parents[1] / "nvidia_pytriton.libs"
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs), env.get("LD_LIBRARY_PATH")]))
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
    return env
