"""Per-request decoder errors; `DecoderEngine.step` reports their messages row by row."""
from __future__ import annotations


class DecoderError(Exception):
    """A request the decoder cannot serve; other rows of the same step are unaffected."""


class PoolFullError(DecoderError):
    def __init__(self, in_use: int, max_slots: int) -> None:
        super().__init__(f"KV cache pool full: {in_use}/{max_slots} slots in use")


class SequenceTooLongError(DecoderError):
    def __init__(self, seq_id: str, length: int, max_seq_len: int) -> None:
        super().__init__(f"sequence {seq_id!r} would reach {length} tokens, max_seq_len is {max_seq_len}")
