"""Train a deterministic byte-level BPE on the Python standard library, or copy a checkpoint's tokenizer.

The vocabulary is `<s>` (BOS), `</s>` (EOS), `<pad>` (PAD), the 256 byte symbols and learned merges;
its chat template (`TINY_CHAT_TEMPLATE`) frames each turn with `<s>` and `</s>`.
When the local text cannot reach the requested size, reserved special tokens `<|reserved_N|>`
pad the vocabulary up to exactly `vocab_size` (recorded as `reserved_tokens`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
PAD_TOKEN = "<pad>"
SPECIAL_TOKENS = [BOS_TOKEN, EOS_TOKEN, PAD_TOKEN]
# the tiny model's chat template: ChatML's shape over its own specials (a turn ends with EOS)
TINY_CHAT_TEMPLATE = ("{% for message in messages %}<s>{{ message['role'] }}\n{{ message['content'] }}</s>\n"
                      "{% endfor %}{% if add_generation_prompt %}<s>assistant\n{% endif %}")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
    "chat_template.json",
)


@dataclass(frozen=True)
class TrainedTokenizer:
    """What a tokenizer build produced: sizes and the corpus it came from."""

    vocab_size: int
    learned_tokens: int  # specials + bytes + merges, before reserved padding
    reserved_tokens: int
    corpus_files: int
    corpus_sha256: str
    source: str


def stdlib_corpus_files(max_files: int | None = None) -> list[Path]:
    """Every `.py` file of the standard library in sorted walk order (site-packages excluded)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files: list[Path] = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = sorted(d for d in subdirs if d not in ("site-packages", "dist-packages", "__pycache__"))
        files.extend(Path(directory) / name for name in sorted(names) if name.endswith(".py"))
    return files[:max_files] if max_files is not None else files


def _read_texts(files: list[Path]) -> Iterator[str]:
    for path in files:
        try:
            yield path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # a few test fixtures are deliberately not UTF-8


def _corpus_sha256(files: list[Path]) -> str:
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.read_bytes())
    return digest.hexdigest()


def train_bpe_tokenizer(
    out_dir: Path, vocab_size: int, files: list[Path] | None = None, min_frequency: int = 2
) -> TrainedTokenizer:
    """Train on `files` (default: the standard library), pad to `vocab_size`, save HF tokenizer files."""
    files = stdlib_corpus_files() if files is None else files
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_read_texts(files), trainer)
    learned = tokenizer.get_vocab_size()
    reserved = max(0, vocab_size - learned)
    if reserved:
        tokenizer.add_special_tokens([AddedToken(f"<|reserved_{i}|>", special=True) for i in range(reserved)])
    _save_hf_files(tokenizer, Path(out_dir))
    return TrainedTokenizer(
        vocab_size=tokenizer.get_vocab_size(),
        learned_tokens=learned,
        reserved_tokens=reserved,
        corpus_files=len(files),
        corpus_sha256=_corpus_sha256(files),
        source=f"byte-level BPE trained on {sysconfig.get_paths()['stdlib']}",
    )


def _save_hf_files(tokenizer: Tokenizer, out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(out_dir / "tokenizer.json"))
    specials = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1_000_000,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": TINY_CHAT_TEMPLATE,
        **specials,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out_dir / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")


def describe_hf_tokenizer(model_dir: Path, source: str) -> TrainedTokenizer:
    """What a Hugging Face tokenizer in `model_dir` holds (its files' checksum stands for the corpus)."""
    size = Tokenizer.from_file(str(model_dir / "tokenizer.json")).get_vocab_size()
    files = [model_dir / name for name in TOKENIZER_FILES if (model_dir / name).is_file()]
    return TrainedTokenizer(vocab_size=size, learned_tokens=size, reserved_tokens=0, corpus_files=0,
                            corpus_sha256=_corpus_sha256(files), source=source)


def copy_hf_tokenizer(checkpoint_dir: Path, out_dir: Path) -> TrainedTokenizer:
    """Copy a Hugging Face checkpoint's tokenizer files into `out_dir`; needs its `tokenizer.json`."""
    checkpoint_dir, out_dir = Path(checkpoint_dir), Path(out_dir)
    if not (checkpoint_dir / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{checkpoint_dir} has no tokenizer.json (a fast tokenizer is required)")
    out_dir.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (checkpoint_dir / name).is_file():
            shutil.copyfile(checkpoint_dir / name, out_dir / name)
    return describe_hf_tokenizer(out_dir, f"copied from {checkpoint_dir}")
