"""What the `decoder` model does with the requests of one `execute`, without Triton.

Every request holds R rows, one per sequence (see `parse_step_rows`). A request that asks for
`output_id` gets the zero-check sampler run on its rows' logits right after the forward, in this
process: the logits of the zero-check path never leave the decoder (no copy into another model, no
check layer). A request that asks for `logits` gets them (the checked chain samples elsewhere).
Rows fail alone: a refused or failed row carries its error, the other rows of the step succeed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from zerocheck.decoder import DecoderEngine, PoolFullError, StepRequest
from zerocheck.decoder.errors import DecoderError
from zerocheck.api.errors import InternalError, InvalidRequest, Overloaded
from zerocheck.serving.sampler_inputs import SamplerRow, unpadded


def parse_step_rows(arrays: dict[str, np.ndarray]) -> list[StepRequest]:
    """sequence_id [R, 1] BYTES, input_ids [R, N] INT32 (rows padded at the end with -1: the prompt on
    a sequence's first step, else its last token; no ids with sequence_end only frees the slot),
    sequence_start / sequence_end [R, 1] BOOL -> R step rows."""
    seq_ids = arrays["sequence_id"].reshape(-1)
    ids = arrays["input_ids"]
    if ids.ndim != 2 or ids.shape[0] != len(seq_ids) or ids.dtype.kind not in "iu":
        raise InvalidRequest(f"input_ids must be INT32 of shape [{len(seq_ids)}, N], got {ids.dtype} {list(ids.shape)}")
    starts, ends = arrays["sequence_start"].reshape(-1), arrays["sequence_end"].reshape(-1)
    return [StepRequest(seq_id.decode() if isinstance(seq_id, bytes) else str(seq_id), unpadded(row).tolist(),
                        bool(start), bool(end)) for seq_id, row, start, end in zip(seq_ids, ids, starts, ends)]


def client_error(error: Exception) -> Exception:
    """A decoder row error as the client should see it (a failed forward stays an internal error)."""
    if isinstance(error, PoolFullError):
        return Overloaded(f"{error}; retry later")
    return InvalidRequest(str(error)) if isinstance(error, DecoderError) else error


@dataclass
class StepRows:
    """One request: its rows, their sampling inputs when it asked for `output_id`, and whether it
    asked for `logits`."""

    steps: list[StepRequest]
    sampling: list[SamplerRow] | None = None
    want_logits: bool = True


@dataclass
class StepAnswer:
    """Output arrays of one request (row r of each is its r-th row) and per-row errors."""

    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    errors: list[Exception | None] = field(default_factory=list)


class DecoderService:
    """The engine's batched step, then the zero-check sampler on the rows that want a token.
    forward_s / sample_s: seconds spent in each, summed over the life of the service."""

    def __init__(self, engine: DecoderEngine, sampler: Any) -> None:
        self.engine, self.sampler = engine, sampler
        self.forward_s = self.sample_s = 0.0

    def run(self, requests: Sequence[StepRows]) -> list[StepAnswer]:
        steps = [step for request in requests for step in request.steps]
        began = time.perf_counter()
        result = self.engine.step(steps)
        sampled = time.perf_counter()
        self.forward_s += sampled - began
        errors = [None if error is None else client_error(error) for error in result.errors]
        tokens = self._sample(requests, result.logits, errors)
        self.sample_s += time.perf_counter() - sampled
        logits = result.logits.numpy()
        answers, begin = [], 0
        for request in requests:
            end = begin + len(request.steps)
            answer = StepAnswer(errors=errors[begin:end])
            if request.want_logits:
                answer.outputs["logits"] = logits[begin:end]
            if request.sampling is not None:
                answer.outputs["output_id"] = tokens[begin:end].reshape(-1, 1)
            answers.append(answer)
            begin = end
        return answers

    def _sample(self, requests: Sequence[StepRows], logits, errors: list[Exception | None]) -> np.ndarray:
        """int32 [B] tokens of the rows that asked for one (-1 elsewhere); a row the sampler refuses
        (NaN logits) gets that error."""
        tokens = np.full(len(errors), -1, np.int32)
        rows, sampling, begin = [], [], 0
        for request in requests:
            if request.sampling is not None:
                for offset, row in enumerate(request.sampling):
                    if errors[begin + offset] is None:
                        rows.append(begin + offset)
                        sampling.append(row)
            begin += len(request.steps)
        if rows:
            x = logits if rows == list(range(len(logits))) else logits[rows]  # the common case: no copy
            out = self.sampler.sample(x, [r.params for r in sampling], [r.history for r in sampling],
                                      [r.step for r in sampling])
            tokens[rows] = out.tokens.numpy()
            for row, message in zip(rows, out.errors):
                if message:
                    errors[row] = InternalError(f"the decoder's {message}")
        return tokens
