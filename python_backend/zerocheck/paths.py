"""Where zerocheck reads the files it ships and writes its own: one place for each, each overridable.

Read from the installed package (`importlib.resources`), never from a checkout's layout:
- the model repository Triton serves: `zerocheck/model_repository` in the package (the checkout's top-level
  `model_repository/`, which the package links to); `$ZEROCHECK_MODEL_REPOSITORY` or `--model-repository`
  serve another.

Written under the user's XDG directories, as installed command-line tools do:
- artifacts (converted weights, tokenizer, ONNX; rebuilt by `zerocheck build`): `$ZEROCHECK_ARTIFACTS`,
  else `$XDG_CACHE_HOME/zerocheck/artifacts` (default `~/.cache/zerocheck/artifacts`);
- the Python backend copied beside this interpreter's stub: `$XDG_CACHE_HOME/zerocheck/backends-*`;
- server logs: `$XDG_STATE_HOME/zerocheck/logs` (default `~/.local/state/zerocheck/logs`).

`zerocheck paths` prints them.
"""
from __future__ import annotations

import argparse
import os
from importlib import resources
from pathlib import Path

MODEL_REPOSITORY_ENV = "ZEROCHECK_MODEL_REPOSITORY"
ARTIFACTS_ENV = "ZEROCHECK_ARTIFACTS"


def packaged_model_repository() -> Path:
    """The model repository installed with the package (`zerocheck/model_repository`)."""
    return Path(str(resources.files("zerocheck") / "model_repository"))


def model_repository() -> Path:
    """$ZEROCHECK_MODEL_REPOSITORY, else the packaged model repository."""
    return Path(os.environ.get(MODEL_REPOSITORY_ENV) or packaged_model_repository())


def cache_dir() -> Path:
    """`$XDG_CACHE_HOME/zerocheck` (default `~/.cache/zerocheck`): what can be rebuilt."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zerocheck"


def state_dir() -> Path:
    """`$XDG_STATE_HOME/zerocheck` (default `~/.local/state/zerocheck`): logs."""
    return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "zerocheck"


def artifacts_dir() -> Path:
    """$ZEROCHECK_ARTIFACTS, else `artifacts` in the cache directory: where `zerocheck build` writes and
    `zerocheck serve` and the models read."""
    return Path(os.environ.get(ARTIFACTS_ENV) or cache_dir() / "artifacts")


def log_dir() -> Path:
    """The server logs' directory (created)."""
    path = state_dir() / "logs"
    path.mkdir(parents=True, exist_ok=True)
    return path


def locations() -> dict[str, Path]:
    """Every location above by name, as `zerocheck paths` prints them."""
    return {"model-repository": model_repository(), "artifacts": artifacts_dir(),
            "backend-cache": cache_dir(), "logs": state_dir() / "logs"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", choices=sorted(locations()),
                        help="print this location alone (for scripts); default: every location, one per line")


def run(args: argparse.Namespace) -> int:
    """`zerocheck paths [NAME]`."""
    if args.name:
        print(locations()[args.name])
    else:
        for name, path in locations().items():
            print(f"{name:<17} {path}")
    return 0
