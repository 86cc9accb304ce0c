"""Imports follow the layers: each package of zerocheck imports only the ones below it (the model.py
adapters sit on top), and the clients, the Triton-free API and the step wire load without torch or the
server's process tools (a client machine needs neither)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "python_backend" / "zerocheck"
# package -> the packages it may import ("" is zerocheck itself: paths, __version__)
ALLOWED = {
    "jit": set(),  # numba and its threading layer, for every compiled kernel
    "tokenizer": set(),
    "sampling": {"api", "jit"},  # the error types its parameters raise
    "api": {"sampling", "tokenizer"},  # the request contract: sampling parameters, chat messages (both torch-free)
    "wire": {"api", "sampling"},
    "decoder": {"api", "grammar", "jit", "sampling", "tokenizer", "wire"},
    "trtllm": {"api", "decoder", "generate", "grammar", "sampling", "tokenizer", "wire"},  # the LLM API's processor
    "grammar": {"api", "tokenizer"},  # guides: the error types, the tokenizer llguidance reads
    "generate": {"api", "grammar", "sampling", "tokenizer", "wire"},
    "triton": {"", "api", "generate", "sampling", "wire"},  # generate: the relay contract the doors speak
    "build": {"", "decoder", "tokenizer"},
    "frontend": {"", "api", "clients", "grammar", "tokenizer"},
    "serve": {"", "api", "build", "frontend"},
    "bench": {"", "clients", "serve"},
}


def imported_packages(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else \
            [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        for name in names:
            parts = name.split(".")
            if parts[0] == "zerocheck":
                found.add(parts[1] if len(parts) > 1 else "")
    return found


def test_packages_import_only_the_layers_below() -> None:
    wrong = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).parts
        if len(parts) == 1:
            continue  # zerocheck/__init__.py and cli.py: the top
        package = parts[0]
        assert package in ALLOWED, f"{package}: a new package needs its place in ALLOWED"
        extra = imported_packages(path) - ALLOWED[package] - {package}
        if extra:
            wrong[str(path.relative_to(PACKAGE))] = sorted(extra)
    assert wrong == {}


def heavy_modules_loaded(modules: list[str], heavy: tuple[str, ...]) -> list[str]:
    """Which of `heavy` a fresh interpreter holds after importing `modules`."""
    code = f"import sys, {', '.join(modules)}; print(' '.join(m for m in {heavy!r} if m in sys.modules))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()


def test_clients_api_and_wire_import_without_torch_or_the_server() -> None:
    assert heavy_modules_loaded(
        ["zerocheck.api", "zerocheck.api.headers", "zerocheck.api.request", "zerocheck.api.sampler_path",
         "zerocheck.clients", "zerocheck.wire.step"],
        ("torch", "psutil", "zerocheck.serve", "zerocheck.decoder", "zerocheck.generate", "zerocheck.triton")) == []


def test_generates_imports_load_no_torch() -> None:
    """`generate` (one stub per server, on every door's path) imports its model.py's modules without torch: the
    trtllm flavor's parameters and refusals come from zerocheck.trtllm.llm_api, whose processor loads on first use."""
    assert heavy_modules_loaded(
        ["zerocheck.generate.scheduler", "zerocheck.generate.service", "zerocheck.generate.metrics",
         "zerocheck.generate.relay", "zerocheck.grammar", "zerocheck.triton.config", "zerocheck.triton.tensors",
         "zerocheck.triton.watchdog", "zerocheck.tokenizer", "zerocheck.trtllm.llm_api", "zerocheck.wire.step"],
        ("torch",)) == []
