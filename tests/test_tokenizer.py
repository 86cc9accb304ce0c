"""Tokenizer training, loading and encode/decode round trips (tiny vocab, a few stdlib files)."""
from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from zerocheck.tokenizer import (
    copy_hf_tokenizer,
    load_tokenizer,
    stdlib_corpus_files,
    train_bpe_tokenizer,
)

TEXTS = [
    "def main():\n    return 0\n",
    "  two leading spaces and  double  spaces",
    "\ttabs\tand\nnewlines\n\n\r\nend ",
    "émoji 🎉🚀 and ZWJ 👩‍💻 family",
    "中文字符 日本語 한국어",
    "accents: café naïve façade Ωmega",
    "",
    " ",
]


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(out, vocab_size=512, files=stdlib_corpus_files(20))
    return out


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tokenizer_dir: Path, text: str) -> None:
    tokenizer = load_tokenizer(tokenizer_dir)
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_special_tokens_and_vocab_size(tokenizer_dir: Path) -> None:
    tokenizer = load_tokenizer(tokenizer_dir)
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (0, 1, 2)
    assert tokenizer.vocab_size == 512
    ids = tokenizer.encode("x = 1", add_bos=True)
    assert ids[0] == tokenizer.bos_id
    assert tokenizer.decode(ids + [tokenizer.eos_id]) == "x = 1"
    assert tokenizer.decode([tokenizer.eos_id], skip_special_tokens=False) == "</s>"


def test_loads_with_hugging_face(tokenizer_dir: Path) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(tokenizer_dir)
    ours = load_tokenizer(tokenizer_dir)
    text = "import os  # comment 🎉"
    assert hf.encode(text, add_special_tokens=False) == ours.encode(text)
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (ours.bos_id, ours.eos_id, ours.pad_id)
    assert Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")).get_vocab_size() == 512


def test_training_is_deterministic(tmp_path: Path, tokenizer_dir: Path) -> None:
    train_bpe_tokenizer(tmp_path, vocab_size=512, files=stdlib_corpus_files(20))
    assert (tmp_path / "tokenizer.json").read_bytes() == (tokenizer_dir / "tokenizer.json").read_bytes()


def test_small_corpus_pads_with_reserved_tokens(tmp_path: Path) -> None:
    trained = train_bpe_tokenizer(tmp_path, vocab_size=6000, files=stdlib_corpus_files(2))
    tokenizer = load_tokenizer(tmp_path)
    assert trained.vocab_size == tokenizer.vocab_size == 6000
    assert trained.reserved_tokens == 6000 - trained.learned_tokens > 0
    assert tokenizer.decode(tokenizer.encode("<|reserved_0|>"), skip_special_tokens=False) == "<|reserved_0|>"


def test_token_ids_of(tokenizer_dir: Path) -> None:
    tokenizer = load_tokenizer(tokenizer_dir)
    words = ["return", " import", "🎉"]
    ids = tokenizer.token_ids_of(words)
    assert [tokenizer.decode(seq) for seq in ids] == words
    assert all(seq for seq in ids)


def test_copy_hf_tokenizer(tmp_path: Path, tokenizer_dir: Path) -> None:
    copied = copy_hf_tokenizer(tokenizer_dir, tmp_path)
    assert copied.vocab_size == 512
    assert load_tokenizer(tmp_path).encode("abc") == load_tokenizer(tokenizer_dir).encode("abc")


def test_missing_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="zerocheck build"):
        load_tokenizer(tmp_path)
