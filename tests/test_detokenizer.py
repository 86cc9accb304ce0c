"""Streaming detokenization: pieces concatenate to exactly `decode(all_ids)`."""
from __future__ import annotations

import pytest

from zerocheck.tokenizer import IncrementalDetokenizer, TextTokenizer, load_tokenizer, stdlib_corpus_files, train_bpe_tokenizer

TEXTS = [
    "def f(x):\n    return x  # done\n",
    "   leading spaces,\ttabs\t\tand\n\nnewlines ",
    "emoji 🎉🚀👩‍💻 mixed with text",
    "中文字符和日本語のテキスト",
    "café naïve façade — “quotes” ∑∫√",
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    out = tmp_path_factory.mktemp("tok")
    train_bpe_tokenizer(out, vocab_size=512, files=stdlib_corpus_files(20))
    return load_tokenizer(out)


def stream(tokenizer: TextTokenizer, ids: list[int], chunk: int) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.push(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]
    return pieces + [detokenizer.flush()]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("chunk", [1, 3])
def test_stream_concatenates_to_decode(tokenizer: TextTokenizer, text: str, chunk: int) -> None:
    ids = tokenizer.encode(text)
    pieces = stream(tokenizer, ids, chunk)
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert not any("\ufffd" in piece for piece in pieces)


def test_multibyte_characters_are_held_until_complete(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("🎉")
    assert len(ids) > 1  # the tiny vocab splits the emoji's 4 bytes over several tokens
    pieces = stream(tokenizer, ids, 1)
    assert [p for p in pieces if p] == ["🎉"]


def test_special_tokens_and_incomplete_tail(tokenizer: TextTokenizer) -> None:
    ids = [tokenizer.bos_id, *tokenizer.encode("ok 🎉"), tokenizer.eos_id]
    assert "".join(stream(tokenizer, ids, 1)) == "ok 🎉"
    truncated = tokenizer.encode("ok 🎉")[:-1]  # ends inside the emoji
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert "".join(detokenizer.push([t]) for t in truncated) == "ok "
    assert detokenizer.flush().startswith("\ufffd")


def test_window_stays_small_on_long_text(tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode("word " * 2000)
    detokenizer = IncrementalDetokenizer(tokenizer)
    out = []
    for token in ids:
        out.append(detokenizer.push([token]))
        prefix_offset, _ = detokenizer.offsets
        assert len(out) - prefix_offset <= 8  # the decoded window is O(1) tokens, not O(text)
    assert "".join(out) + detokenizer.flush() == "word " * 2000


@pytest.mark.parametrize("text", TEXTS)
def test_resume_from_offsets_matches_streaming(tokenizer: TextTokenizer, text: str) -> None:
    """A stateless caller (Triton postprocessing) keeps only ids and offsets between calls."""
    ids = tokenizer.encode(text)
    pieces, offsets = [], (0, 0)
    for end in range(1, len(ids) + 1):
        detokenizer = IncrementalDetokenizer.resume(tokenizer, ids[:end], *offsets)
        pieces.append(detokenizer.push([]))
        offsets = detokenizer.offsets
    pieces.append(IncrementalDetokenizer.resume(tokenizer, ids, *offsets).flush())
    assert "".join(pieces) == text
    with pytest.raises(ValueError, match="prefix_offset <= read_offset"):
        IncrementalDetokenizer.resume(tokenizer, ids, 2, 1)
