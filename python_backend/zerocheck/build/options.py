"""`BuildOptions`: everything that determines the artifacts (equal options -> identical build)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path


def default_intermediate_size(hidden: int) -> int:
    """gpt-fast's SwiGLU width: 8/3 * hidden rounded up to a multiple of 64."""
    width = int(8 * hidden / 3)
    return -(-width // 64) * 64


@dataclass(frozen=True)
class BuildOptions:
    vocab_size: int = 32000
    layers: int = 4
    hidden: int = 256
    heads: int = 8
    kv_heads: int = 2
    intermediate: int | None = None  # None: default_intermediate_size(hidden)
    max_seq_len: int = 1024
    seed: int = 0
    hf_checkpoint: str | None = None  # absolute path; replaces the seeded tiny model and its tokenizer
    onnx: bool = True
    tensorrt: bool = False
    tensorrt_llm: bool = False
    tokenizer_corpus_files: int | None = None  # None: the whole standard library (tests use a few files)

    def __post_init__(self) -> None:
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"--hidden {self.hidden} must divide by --heads {self.heads}, "
                             f"and --heads by --kv-heads {self.kv_heads}")
        if self.vocab_size < 512:
            raise ValueError(f"--vocab-size {self.vocab_size} is below 512 (256 bytes + specials + merges)")

    @property
    def intermediate_size(self) -> int:
        return self.intermediate or default_intermediate_size(self.hidden)

    def as_dict(self) -> dict:
        options = asdict(self)
        options["intermediate"] = self.intermediate_size
        if self.hf_checkpoint:
            options["hf_checkpoint"] = str(Path(self.hf_checkpoint).resolve())
        return options
