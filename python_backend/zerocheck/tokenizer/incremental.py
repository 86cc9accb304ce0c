"""Streaming detokenization with a prefix offset (the vLLM / TGI scheme).

Each `push` decodes only the window `ids[prefix_offset:]` against `ids[prefix_offset:read_offset]`
and emits the difference once it no longer ends in an incomplete UTF-8 character (U+FFFD).
Decoding a window with a little left context keeps leading spaces that tokenizers strip from the
first token of a decode. Cost per call is O(window), independent of vocabulary size and total length.
"""
from __future__ import annotations

from typing import Sequence

from zerocheck.tokenizer.text_tokenizer import TextTokenizer

REPLACEMENT_CHAR = "\ufffd"


class IncrementalDetokenizer:
    """Turns a stream of token ids into a stream of final text pieces; `"".join(pieces) == decode(ids)`."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0  # start of the left-context window
        self._read_offset = 0  # ids before this index have been emitted as text

    @classmethod
    def resume(cls, tokenizer: TextTokenizer, ids: Sequence[int], prefix_offset: int, read_offset: int) -> IncrementalDetokenizer:
        """Rebuild the state a stateless caller kept as (ids, offsets); needs 0 <= prefix <= read <= len(ids)."""
        if not 0 <= prefix_offset <= read_offset <= len(ids):
            raise ValueError(f"offsets must satisfy 0 <= prefix_offset <= read_offset <= {len(ids)}, "
                             f"got {prefix_offset}, {read_offset}")
        detokenizer = cls(tokenizer)
        detokenizer._ids = list(ids)
        detokenizer._prefix_offset, detokenizer._read_offset = prefix_offset, read_offset
        return detokenizer

    @property
    def offsets(self) -> tuple[int, int]:
        """(prefix_offset, read_offset): with the ids, everything `resume` needs."""
        return self._prefix_offset, self._read_offset

    def push(self, new_ids: Sequence[int]) -> str:
        """Append `new_ids`; return the text that became final (may be empty)."""
        self._ids.extend(new_ids)
        window = self._ids[self._prefix_offset :]
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tokenizer.decode(window)
        if len(new_text) <= len(prefix_text) or new_text.endswith(REPLACEMENT_CHAR):
            return ""  # nothing new, or a multi-byte character is still incomplete
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return whatever is still held back (an incomplete character decodes as U+FFFD)."""
        prefix_text = self._tokenizer.decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._tokenizer.decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text) :]
