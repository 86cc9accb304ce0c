"""`SequenceTable`: what the decoder's process keeps per live sequence besides its KV cache: how it
samples (registered with its first step) and the history penalties and bad words read, counted as it
grows. An entry lives as long as the sequence's KV slot: it goes when the slot is freed (the
sequence's end, a release, a failed first step, idle reclaim).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from zerocheck.grammar import GUIDE_TYPE_INPUT, GrammarCompiler, GrammarMatcher, GuideError
from zerocheck.sampling.history import TokenHistory
from zerocheck.sampling.params import SamplingParams, fresh_seed
from zerocheck.wire.step import Registration


@dataclass
class SequenceState:
    """One sequence's entry. fed: ids in its KV cache (prompt, then each sampled token as it is fed back)."""

    params: SamplingParams
    early: SamplingParams  # params with end_ids banned: while fewer than min_tokens were sampled
    min_tokens: int
    prompt_length: int  # 0: the first step's tokens
    history: TokenHistory | None  # kept when penalties or bad words read it
    end_ids: frozenset[int] = frozenset()  # a multi-step call stops the sequence after drawing one
    fed: int = 0
    grammar: GrammarMatcher | None = None  # where the answer stands in its guide (structured output)

    @classmethod
    def register(cls, registration: Registration, grammars: GrammarCompiler | None = None) -> SequenceState:
        """The entry of a starting sequence; a guide needs `grammars` (GuideError when it cannot be served)."""
        params = registration.params
        if params.seed is None:  # its own noise stream for its whole life, wherever it sits in a batch
            params = replace(params, seed=fresh_seed())
        early = replace(params, bad_words=params.bad_words + tuple((end,) for end in registration.end_ids)) \
            if registration.min_tokens and registration.end_ids else params
        keeps = params.has_penalties or bool(params.bad_words)  # end-id bans are one token: no history needed
        grammar = None
        if registration.guide is not None:
            if grammars is None:
                raise GuideError(f"{GUIDE_TYPE_INPUT}: this decoder serves no guides")
            grammar = grammars.matcher(registration.guide)
        return cls(params, early, registration.min_tokens, registration.prompt_length,
                   TokenHistory() if keeps else None, frozenset(registration.end_ids), grammar=grammar)

    def sampled(self, tokens: list[int]) -> list[int]:
        """Which of a step's `tokens` were sampled (not prompt): all of them once the prompt is in, else none."""
        return tokens if self.prompt_length and self.fed >= self.prompt_length else []

    def samples_after(self, count: int) -> bool:
        """Whether a token is drawn for this sequence after a step that feeds it `count` ids (its prompt is in)."""
        return self.fed + count >= (self.prompt_length or count)

    def feed(self, tokens: list[int]) -> None:
        """The ids of a step that went into the KV cache."""
        if self.fed == 0 and not self.prompt_length:
            self.prompt_length = len(tokens)
        self.fed += len(tokens)
        if self.history is not None:
            self.history.extend(tokens)

    @property
    def step(self) -> int:
        """Tokens sampled before this step's (the noise counter); negative while the prompt is still going in."""
        return self.fed - self.prompt_length

    @property
    def sampling(self) -> SamplingParams:
        """The parameters of this step's draw."""
        return self.early if self.step < self.min_tokens else self.params

    @property
    def ids(self) -> TokenHistory | tuple[()]:
        """The history for penalties and bad words (empty when neither is on)."""
        return self.history if self.history is not None else ()


class SequenceTable:
    """seq_id -> SequenceState; `drop` is the KV pool's release hook."""

    def __init__(self) -> None:
        self._entries: dict[str, SequenceState] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, seq_id: str) -> SequenceState | None:
        return self._entries.get(seq_id)

    def put(self, seq_id: str, state: SequenceState) -> None:
        self._entries[seq_id] = state

    def drop(self, seq_id: str) -> None:
        self._entries.pop(seq_id, None)
