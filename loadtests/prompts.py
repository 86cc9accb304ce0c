"""Prompts of a target token length: synthetic ones from the local tokenizer's vocabulary, or built from
the bundled `prompts.txt` when no tokenizer is available. Lengths are drawn from a `LengthDistribution`."""
from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Protocol

from zerocheck import paths
from zerocheck.loadtests.profiles import LengthDistribution

BUNDLED_PROMPTS = Path(__file__).resolve().parent / "prompts.txt"
CHARS_PER_TOKEN = 4  # length estimate for prompt-file text when no tokenizer counts tokens
VOCAB_SAMPLE = 4000  # token ids tried when building the synthetic word pool


class PromptSource(Protocol):
    def prompt(self, tokens: int, rng: random.Random) -> str:
        """A prompt of about `tokens` tokens."""
        ...


def draw_length(lengths: LengthDistribution, rng: random.Random) -> int:
    """One token length from `lengths` (lognormal: median * exp(sigma * N(0, 1))), clipped to [min, max]."""
    if lengths.distribution == "uniform":
        return rng.randint(lengths.min, lengths.max)
    value = lengths.median * math.exp(lengths.sigma * rng.gauss(0.0, 1.0))
    return min(lengths.max, max(lengths.min, round(value)))


class SyntheticPrompts:
    """Random sequences of vocabulary tokens that decode to clean text (one token each when re-encoded)."""

    def __init__(self, pieces: list[str]) -> None:
        if not pieces:
            raise ValueError("no usable vocabulary tokens for synthetic prompts")
        self.pieces = pieces

    @classmethod
    def from_tokenizer(cls, artifacts_dir: Path, seed: int = 0) -> SyntheticPrompts:
        from zerocheck.tokenizer import load_tokenizer

        tokenizer = load_tokenizer(artifacts_dir)
        rng = random.Random(seed)
        ids = rng.sample(range(tokenizer.vocab_size), min(VOCAB_SAMPLE, tokenizer.vocab_size))
        special = {tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id}
        pieces = [text for token_id in ids if token_id not in special
                  for text in [tokenizer.decode([token_id])]
                  if text.strip() and text.isprintable() and tokenizer.encode(text) == [token_id]]
        return cls(pieces)

    def prompt(self, tokens: int, rng: random.Random) -> str:
        return "".join(rng.choice(self.pieces) for _ in range(tokens))


class FilePrompts:
    """Lines of a prompt file (`\\n` in a line is a newline), joined until they reach about
    `tokens` * CHARS_PER_TOKEN characters."""

    def __init__(self, lines: list[str]) -> None:
        if not lines:
            raise ValueError("prompt file has no prompts")
        self.lines = lines

    @classmethod
    def from_file(cls, path: Path = BUNDLED_PROMPTS) -> FilePrompts:
        return cls([line.strip().replace("\\n", "\n") for line in path.read_text().splitlines() if line.strip()])

    def prompt(self, tokens: int, rng: random.Random) -> str:
        text = rng.choice(self.lines)
        while len(text) < tokens * CHARS_PER_TOKEN:
            text += "\n" + rng.choice(self.lines)
        return text[: tokens * CHARS_PER_TOKEN]


def load_prompt_source(source: str = "synthetic", artifacts: Path | None = None) -> PromptSource:
    """`synthetic` (tokenizer vocabulary; falls back to the bundled file without a tokenizer) or `file[:PATH]`."""
    if source.startswith("file"):
        _, _, path = source.partition(":")
        return FilePrompts.from_file(Path(path) if path else BUNDLED_PROMPTS)
    try:
        return SyntheticPrompts.from_tokenizer(artifacts or paths.artifacts_dir())
    except (FileNotFoundError, ImportError):
        return FilePrompts.from_file()
