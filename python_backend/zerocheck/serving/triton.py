"""Small helpers shared by the `model.py` adapters: config, tensors in and out, errors.

`pb_utils` (triton_python_backend_utils) exists only inside the Python backend stub, so every
function takes it as an argument; the package itself never imports it.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from zerocheck.api.errors import classify

REPO_ROOT = Path(__file__).resolve().parents[3]


class ModelConfig:
    """The parsed `model_config` of `initialize(args)`: its string parameters and a few lookups."""

    def __init__(self, args: Mapping[str, str]) -> None:
        self.raw = json.loads(args["model_config"])
        self.name: str = self.raw["name"]
        self.parameters = {k: v["string_value"] for k, v in self.raw.get("parameters", {}).items()}
        self.max_batch_size = int(self.raw.get("max_batch_size", 0))

    def get(self, key: str, default: str) -> str:
        return self.parameters.get(key, default)

    def get_int(self, key: str, default: int) -> int:
        return int(self.get(key, str(default)))

    def get_float(self, key: str, default: float) -> float:
        return float(self.get(key, str(default)))

    def artifacts_dir(self) -> Path:
        """ZEROCHECK_ARTIFACTS, else the `artifacts` parameter, else artifacts/ beside the repository."""
        return Path(os.environ.get("ZEROCHECK_ARTIFACTS") or self.get("artifacts", str(REPO_ROOT / "artifacts")))

    def vocab_size(self) -> int:
        """The decoder's vocabulary size, from the built artifacts."""
        config = json.loads((self.artifacts_dir() / "hf_model" / "config.json").read_text())
        return int(config["vocab_size"])

    def device(self) -> str:
        """The `device` parameter (auto | cpu | cuda), resolved once: auto means cuda when available."""
        import torch

        wanted = self.get("device", "auto")
        return "cuda" if wanted in ("auto", "cuda") and torch.cuda.is_available() else "cpu"


def built_max_seq_len(artifacts_dir: Path) -> int:
    """The decoder's maximum sequence length recorded by build_engines.py (its KV-cache length)."""
    manifest = json.loads((artifacts_dir / "manifest.json").read_text())
    return int(manifest.get("options", {}).get("max_seq_len") or manifest.get("max_seq_len"))


def request_arrays(pb_utils: Any, request: Any, names: Iterable[str]) -> dict[str, np.ndarray]:
    """Inputs present in `request` among `names`, as numpy arrays (batch dimension included)."""
    wanted = set(names)
    return {tensor.name(): tensor.as_numpy() for tensor in request.inputs() if tensor.name() in wanted}


def request_parameters(request: Any) -> dict[str, Any]:
    text = request.parameters()
    return json.loads(text) if text else {}


def error_for(pb_utils: Any, error: BaseException) -> Any:
    """A TritonError for `error`: the client sees the message of a refused request, never a traceback."""
    code, message = classify(error)
    return pb_utils.TritonError(f"{code.value}: {message}", getattr(pb_utils.TritonError, code.triton_code))


def error_response(pb_utils: Any, error: BaseException) -> Any:
    return pb_utils.InferenceResponse(output_tensors=[], error=error_for(pb_utils, error))


def tensors(pb_utils: Any, arrays: Mapping[str, np.ndarray]) -> list[Any]:
    return [pb_utils.Tensor(name, array) for name, array in arrays.items()]
