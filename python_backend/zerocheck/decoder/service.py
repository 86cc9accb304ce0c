"""What the `decoder` model does with the requests of one `execute`, without Triton.

Every request holds R rows, one per sequence (`zerocheck.wire.step`). A sequence's first row registers
how it samples; the service keeps that, and the history its penalties and bad words read, in a
`SequenceTable` entry that lives with the sequence's KV slot, so later steps carry only ids. A request
that asks for `output_id` gets the zero-check sampler run on its rows' logits right after the forward,
in this process: the logits of the zero-check path never leave the decoder (no copy into another
model, no check layer). A request that asks for `logits` gets them, and for the checked chain each
row's registered sampling inputs (its `SAMPLER_INPUTS` outputs). Rows fail alone: a refused or failed
row carries its error, the other rows of the step succeed.

Multi-step (`decode_steps` > 1, zero-check requests only): after the first forward and draw, the rows that
asked for more tokens step again on the token just drawn, here, without a round trip to `generate`,
until each has its count or draws one of its registered end ids (`output_ids` holds them in order). The
draws are the ones one-step calls would make (the same noise counter per sequence), so a seeded sequence
gets the same tokens either way.

Structured output: a sequence registered with a guide keeps a grammar matcher in its entry. Each step, the
tokens it sampled advance the matcher before the forward, and the next token's bitmask of every guided row
is filled in a helper thread while the forward runs (llguidance releases the GIL); after the forward the
mask writes -inf at the disallowed tokens of those rows' logits (`zerocheck.sampling.token_mask`), before the
fused sampler draws or the logits go to the checked chain. Every step of a multi-step call does the same.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from zerocheck.api.errors import InternalError, InvalidRequest, Overloaded
from zerocheck.decoder.engine import DecoderEngine, StepRequest, StepResult
from zerocheck.decoder.errors import DecoderError, PoolFullError
from zerocheck.decoder.sequences import SequenceState, SequenceTable
from zerocheck.grammar import GUIDE_INPUT, GrammarCompiler, bitmask_words
from zerocheck.sampling.params import SamplingParams
from zerocheck.sampling.token_mask import TokenMask, apply_token_mask
from zerocheck.wire.sampling import SamplerRow, sampler_arrays
from zerocheck.wire.step import Registration, StepRow

_UNREGISTERED = SequenceState.register(Registration(SamplingParams()))  # what a failed row exports


def client_error(error: Exception) -> Exception:
    """A decoder row error as the client should see it (a failed forward stays an internal error)."""
    if isinstance(error, PoolFullError):
        return Overloaded(f"{error}; retry later")
    return InvalidRequest(str(error)) if isinstance(error, DecoderError) else error


@dataclass
class StepRows:
    """One request: its rows, and which outputs it asked for (`exports`: sampler inputs for the checked chain)."""

    steps: list[StepRow]
    want_token: bool = False
    want_logits: bool = True
    exports: tuple[str, ...] = ()

    @property
    def release_only(self) -> bool:
        """Whether the request only frees slots (every row ends with no tokens): no row computed or sampled."""
        return bool(self.steps) and all(row.end and not row.tokens for row in self.steps)

    def __post_init__(self) -> None:
        if any(row.steps > 1 for row in self.steps) and (self.want_logits or self.exports or not self.want_token):
            raise InvalidRequest("decode_steps > 1 needs the fused sampler: ask for output_id / output_ids and "
                                 "not for logits or sampler inputs (a chain that samples elsewhere takes one step)")


@dataclass
class StepAnswer:
    """Output arrays of one request (row r of each is its r-th row) and per-row errors."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    errors: list[Exception | None] = field(default_factory=list)


class DecoderService:
    """The engine's batched step over the sequences' table entries, then the zero-check sampler on the
    rows that want a token. forward_s / sample_s: seconds spent in each, summed over the service's life;
    forwards: steps run with tokens (a multi-step call runs several)."""

    def __init__(self, engine: DecoderEngine, sampler: Any, grammars: GrammarCompiler | None = None) -> None:
        self.engine, self.sampler, self.grammars = engine, sampler, grammars
        self._masker = ThreadPoolExecutor(1, thread_name_prefix="zerocheck-mask") if grammars is not None else None
        self.table = SequenceTable()
        engine.pool.on_release = self.table.drop
        self.forward_s = self.sample_s = 0.0
        self.forwards = 0

    def run(self, requests: Sequence[StepRows]) -> list[StepAnswer]:
        rows = [row for request in requests for row in request.steps]
        refused: list[Exception | None] = [None] * len(rows)
        states = [self._register(row, refused, index) if row.start else self.table.get(row.seq_id)
                  for index, row in enumerate(rows)]
        masks = self._start_masks(states, [row.tokens for row in rows], refused)
        result = self._forward([StepRequest(row.seq_id, row.tokens, row.start, row.end and row.steps == 1)
                                for row in rows])
        sampled = time.perf_counter()
        errors = [None if error is None else client_error(error) for error in result.errors]
        for index, error in enumerate(refused):
            if error is not None and errors[index] is None:
                errors[index] = error
                self.engine.release(rows[index].seq_id)  # its first step took a slot
        self._advance(rows, states, errors)
        mask = self._apply_masks(masks, result.logits)
        tokens = self._sample(requests, result.logits, states, errors)
        if mask is not None:
            self._check_drawn(mask, list(range(len(rows))), tokens, states, errors)
        self.sample_s += time.perf_counter() - sampled
        drawn = self._more_steps(rows, states, errors, tokens) if any(row.steps > 1 for row in rows) else None
        logits = result.logits.float().cpu().numpy() if any(r.want_logits for r in requests) else None
        answers, begin = [], 0
        for request in requests:
            end = begin + len(request.steps)
            answer = StepAnswer(errors=errors[begin:end])
            if request.want_logits:
                answer.outputs["logits"] = logits[begin:end]
            if request.want_token:
                answer.outputs["output_id"] = tokens[begin:end].reshape(-1, 1)
                answer.outputs["output_ids"] = tokens[begin:end].reshape(-1, 1) if drawn is None else drawn[begin:end]
            if request.exports:
                exported = sampler_arrays([_export(state, error) for state, error in
                                           zip(states[begin:end], errors[begin:end])])
                answer.outputs.update({name: exported[name] for name in request.exports})
            answers.append(answer)
            begin = end
        return answers

    def _more_steps(self, rows: list[StepRow], states: list[SequenceState | None], errors: list[Exception | None],
                    first: np.ndarray) -> np.ndarray:
        """The further steps of multi-step rows (see the module docstring): int32 [B, K] of each row's tokens
        of this call, padded with -1. A row that fails in a later step gets that error (its tokens of the
        call are dropped); a row that stops at an end id before its last step frees its slot when the
        request ended it (`sequence_end` applies after the row's last step)."""
        drawn = np.full((len(rows), max(row.steps for row in rows)), -1, np.int32)
        drawn[:, 0] = first

        def goes_on(r: int, j: int) -> bool:
            """Whether row r drew a token at step j of the call that is none of its end ids."""
            return errors[r] is None and drawn[r, j] >= 0 and int(drawn[r, j]) not in states[r].end_ids

        live = [r for r, row in enumerate(rows) if row.steps > 1 and goes_on(r, 0)]
        for j in range(1, drawn.shape[1]):
            live = [r for r in live if rows[r].steps > j]
            if not live:
                break
            refused: list[Exception | None] = [None] * len(live)
            masks = self._start_masks([states[r] for r in live], [[int(drawn[r, j - 1])] for r in live], refused)
            result = self._forward([StepRequest(rows[r].seq_id, [int(drawn[r, j - 1])], False,
                                                rows[r].end and j == rows[r].steps - 1) for r in live])
            sampled = time.perf_counter()
            for r, error, guide_error in zip(live, result.errors, refused):
                if error is None and guide_error is None:
                    states[r].feed([int(drawn[r, j - 1])])
                else:
                    errors[r] = client_error(error) if error is not None else guide_error
            mask = self._apply_masks(masks, result.logits)
            ok = [i for i, r in enumerate(live) if errors[r] is None]
            if ok:
                tokens, failed = self._draw(result.logits, ok, [states[live[i]] for i in ok])
                for i, token, error in zip(ok, tokens.tolist(), failed):
                    if error is None:
                        drawn[live[i], j] = token
                    else:
                        errors[live[i]] = error
                if mask is not None:
                    self._check_drawn(mask, ok, drawn[live, j], [states[r] for r in live], errors, live)
            self.sample_s += time.perf_counter() - sampled
            live = [r for r in live if goes_on(r, j)]
        for r, row in enumerate(rows):
            if errors[r] is not None and row.steps > 1:
                drawn[r] = -1
            elif row.end and row.steps > 1 and drawn[r, row.steps - 1] < 0:  # stopped early: the slot is still held
                self.engine.release(row.seq_id)
        return drawn

    def _register(self, row: StepRow, refused: list[Exception | None], index: int) -> SequenceState:
        """A starting row's entry; a guide that cannot be served refuses the row (refused[index]) and leaves
        an entry without it, so the row's forward runs with the others and its slot is then freed."""
        registration = row.registration or Registration(SamplingParams())
        try:
            return SequenceState.register(registration, self.grammars)
        except InvalidRequest as error:
            refused[index] = error
            return SequenceState.register(Registration(registration.params))

    def _start_masks(self, states: Sequence[SequenceState | None], tokens: Sequence[list[int]],
                     refused: list[Exception | None]) -> Future | None:
        """Advance each guided row's matcher over the sampled `tokens` this step feeds it, then fill the next
        token's bitmask of every guided row that samples after the step, in the mask thread (the forward runs
        meanwhile): a Future of the TokenMask (None when no row is guided). A matcher that fails on a token
        refuses its row (refused[i])."""
        guided = [i for i, state in enumerate(states) if state is not None and state.grammar is not None
                  and refused[i] is None]
        if not guided:
            return None
        rows = np.zeros(len(states), bool)
        for i in guided:
            state = states[i]
            state.grammar.consume(state.sampled(tokens[i]))
            if state.grammar.error is not None:
                refused[i] = InvalidRequest(f"{GUIDE_INPUT}: the answer left the guide ({state.grammar.error})")
            elif state.samples_after(len(tokens[i])):
                rows[i] = True
        if not rows.any():
            return None
        bits = np.full((len(states), bitmask_words(self.engine.vocab_size)), -1, np.int32)

        def fill() -> TokenMask:
            for i in np.flatnonzero(rows).tolist():
                states[i].grammar.fill(bits, i)
            return TokenMask(bits, rows)

        return self._masker.submit(fill)

    @staticmethod
    def _apply_masks(masks: Future | None, logits) -> TokenMask | None:
        """The step's token mask, written into `logits` (-inf at the tokens the guides do not allow)."""
        if masks is None:
            return None
        mask = masks.result()
        apply_token_mask(logits, mask)
        return mask

    @staticmethod
    def _check_drawn(mask: TokenMask, index: list[int], tokens: np.ndarray, states: Sequence[SequenceState | None],
                     errors: list[Exception | None], positions: Sequence[int] | None = None) -> None:
        """A guided row whose draw its mask does not allow (the guide allowed no token at all) fails with that
        error. index: mask rows to check; tokens: each row's draw (by mask row); positions: each mask row's
        row in `errors` (default the same)."""
        for i in index:
            where = positions[i] if positions is not None else i
            token = int(tokens[i])
            if mask.rows[i] and errors[where] is None and token >= 0 and not mask.allows(i, token):
                state = states[i]
                reason = state.grammar.error if state is not None and state.grammar is not None else None
                errors[where] = InvalidRequest(f"{GUIDE_INPUT}: no token continues the guide here"
                                               + (f" ({reason})" if reason else ""))

    def _advance(self, rows: list[StepRow], states: list[SequenceState | None], errors: list[Exception | None]) -> None:
        """Feed each row's ids into its entry; a started sequence that holds its slot joins the table
        (one that already ended, or failed, does not: its slot is gone)."""
        for index, (row, state) in enumerate(zip(rows, states)):
            if errors[index] is not None or not row.tokens:
                continue
            if state is None:
                errors[index] = InternalError(f"sequence {row.seq_id!r} holds a KV slot but no registered sampling")
                continue
            state.feed(row.tokens)
            if row.start and self.engine.pool.state(row.seq_id) is not None:
                self.table.put(row.seq_id, state)

    def _sample(self, requests: Sequence[StepRows], logits, states: list[SequenceState | None],
                errors: list[Exception | None]) -> np.ndarray:
        """int32 [B] tokens of the rows that asked for one and have their prompt in (-1 elsewhere); a row
        the sampler refuses (NaN logits) gets that error."""
        tokens = np.full(len(errors), -1, np.int32)
        rows, begin = [], 0
        for request in requests:
            if request.want_token:
                rows += [r for r in range(begin, begin + len(request.steps))
                         if errors[r] is None and states[r] is not None and states[r].step >= 0]
            begin += len(request.steps)
        if rows:
            tokens[rows], failed = self._draw(logits, rows, [states[r] for r in rows])
            for row, error in zip(rows, failed):
                if error is not None:
                    errors[row] = error
        return tokens

    def _forward(self, requests: list[StepRequest]) -> StepResult:
        """The engine's step, timed into forward_s and counted in forwards when it computes any row."""
        began = time.perf_counter()
        result = self.engine.step(requests)
        self.forward_s += time.perf_counter() - began
        self.forwards += any(request.tokens for request in requests)
        return result

    def _draw(self, logits, index: list[int], states: list[SequenceState]) -> tuple[np.ndarray, list[Exception | None]]:
        """The zero-check sampler on rows `index` of `logits` (all of them, not copied, in the common case), each
        with its sequence's registered sampling, history and step: int32 tokens, and per row the error of one
        the sampler refuses (NaN logits)."""
        x = logits if index == list(range(len(logits))) else logits[index]
        out = self.sampler.sample(x, [s.sampling for s in states], [s.ids for s in states], [s.step for s in states])
        return out.tokens.cpu().numpy(), [InternalError(f"the decoder's {message}") if message else None
                                          for message in out.errors]


def _export(state: SequenceState | None, error: Exception | None) -> SamplerRow:
    """A row's sampler inputs for the checked chain (defaults on a failed row: its token is not used)."""
    state = state if state is not None and error is None else _UNREGISTERED
    return SamplerRow(state.sampling, list(state.ids), max(state.step, 0))
