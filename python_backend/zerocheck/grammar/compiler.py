"""`GrammarCompiler`: guides compiled against one tokenizer, behind a cache and a time limit, and
`GrammarMatcher`, one sequence's position in its grammar.

A compile runs in a worker thread (llguidance releases the GIL while it builds the lexer), so the caller
waits at most `timeout_s` and other work goes on meanwhile; a guide over the limit is refused with
INVALID_ARGUMENT naming the limit, and remembered as refused (a client repeating it costs nothing). The
compiled matcher of each guide is kept (least recently used out past `cache_size`); each sequence gets a
copy of it. llguidance's parser limits bound a compile's and a mask's work whatever the grammar.
"""
from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Sequence

import llguidance
import llguidance.numpy
import numpy as np

from zerocheck.api.guide import GUIDE_INPUT, Guide, GuideError
from zerocheck.grammar.guide import grammar_of
from zerocheck.tokenizer import TextTokenizer

COMPILE_TIMEOUT_S = 2.0
CACHE_SIZE = 256
COMPILE_WORKERS = 2
# llguidance's defaults, with error messages that do not echo the grammar back (verbose_errors off)
PARSER_LIMITS = dict(verbose_errors=False)


def bitmask_words(vocab_size: int) -> int:
    """int32 words of one row's token bitmask (bit t % 32 of word t // 32: token t allowed)."""
    return (vocab_size + 31) // 32


class GrammarMatcher:
    """One sequence's matcher: `consume` the tokens it sampled, `fill` the next token's bitmask row.
    A grammar that has finished allows only the end ids it was compiled with."""

    def __init__(self, matcher: llguidance.LLMatcher) -> None:
        self._matcher = matcher

    def consume(self, tokens: Sequence[int]) -> None:
        """Advance over sampled tokens (each was allowed by the mask it was drawn under)."""
        for token in tokens:
            self._matcher.consume_token(int(token))

    def fill(self, bitmask: np.ndarray, row: int) -> None:
        """Write the allowed next tokens into bitmask[row] (int32 [R, W], C-contiguous); releases the GIL."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, bitmask, row)

    @property
    def error(self) -> str | None:
        """Why the matcher stopped accepting tokens (a resource limit, a token outside the grammar), or None."""
        return self._matcher.get_error() if self._matcher.is_error() else None


class GrammarCompiler:
    """Guides compiled against one tokenizer (`tokenizer_json`: the text of its tokenizer.json; `end_ids`: the
    ids a finished grammar allows)."""

    def __init__(self, tokenizer_json: str, end_ids: Sequence[int], vocab_size: int,
                 timeout_s: float = COMPILE_TIMEOUT_S, cache_size: int = CACHE_SIZE) -> None:
        self.tokenizer = llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(end_ids))
        self.timeout_s, self.cache_size = timeout_s, cache_size
        self._compiled: OrderedDict[Guide, llguidance.LLMatcher] = OrderedDict()
        self._refused: OrderedDict[Guide, str] = OrderedDict()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(COMPILE_WORKERS, thread_name_prefix="zerocheck-grammar")

    @classmethod
    def for_tokenizer(cls, tokenizer: TextTokenizer, vocab_size: int | None = None) -> GrammarCompiler:
        """The compiler of a served model: its tokenizer, its end ids (what a finished guide allows) and its
        logits' width (`vocab_size`, default the tokenizer's: a model may pad its vocabulary)."""
        return cls(tokenizer.json(), tokenizer.end_ids, vocab_size or tokenizer.vocab_size)

    def check(self, guide: Guide) -> None:
        """Compile `guide` (or find it compiled), waiting at most timeout_s; GuideError when it cannot be served."""
        self._matcher(guide)

    async def check_async(self, guide: Guide) -> None:
        """`check` for an event loop: the loop goes on while the guide compiles."""
        future = self._submit(guide)
        try:
            await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), self.timeout_s)
        except asyncio.TimeoutError:
            raise self._too_slow(guide) from None

    def matcher(self, guide: Guide) -> GrammarMatcher:
        """A fresh matcher of `guide` at its start."""
        return GrammarMatcher(self._matcher(guide).deep_copy())

    def _matcher(self, guide: Guide) -> llguidance.LLMatcher:
        try:
            return self._submit(guide).result(timeout=self.timeout_s)
        except FutureTimeout:
            raise self._too_slow(guide) from None

    def _submit(self, guide: Guide) -> Future:
        """The compile of `guide`: done when it is cached or refused, else running in a worker."""
        with self._lock:
            if guide in self._compiled:
                self._compiled.move_to_end(guide)
                future: Future = Future()
                future.set_result(self._compiled[guide])
                return future
            if guide in self._refused:
                future = Future()
                future.set_exception(GuideError(self._refused[guide]))
                return future
        return self._pool.submit(self._compile, guide)

    def _too_slow(self, guide: Guide) -> GuideError:
        self._refuse(guide, f"{GUIDE_INPUT}: the grammar took longer than {self.timeout_s:g} s to compile "
                            f"(the server's limit); simplify it")
        return GuideError(self._refused[guide])

    def _compile(self, guide: Guide) -> llguidance.LLMatcher:
        """In a worker: the matcher at the guide's start, cached; a refusal is remembered."""
        try:
            matcher = llguidance.LLMatcher(self.tokenizer, grammar_of(guide), log_level=0,
                                           limits=llguidance.LLParserLimits(**PARSER_LIMITS))
            if matcher.is_error():
                raise GuideError(f"{GUIDE_INPUT}: {' '.join(matcher.get_error().split())}")  # one line
        except GuideError as error:
            self._refuse(guide, str(error))
            raise
        with self._lock:
            self._compiled[guide] = matcher
            while len(self._compiled) > self.cache_size:
                self._compiled.popitem(last=False)
        return matcher

    def _refuse(self, guide: Guide, message: str) -> None:
        with self._lock:
            self._refused[guide] = message
            while len(self._refused) > self.cache_size:
                self._refused.popitem(last=False)
