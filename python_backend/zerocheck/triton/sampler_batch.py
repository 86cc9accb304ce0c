"""The requests of one `execute` of a sampler model (`zero_check_sampler`, the checked chain), parsed
and stacked into one batch, and answered: a malformed request fails alone, with its own error."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from zerocheck.api.errors import InvalidRequest
from zerocheck.sampling import SamplingParams
from zerocheck.triton.tensors import error_response, host_array
from zerocheck.wire.sampling import SAMPLER_INPUTS, SamplerRow, parse_sampler_rows


def float_rows(present: dict[str, Any], name: str, vocab_size: int | None) -> torch.Tensor:
    """The [R, V] float tensor input `name` of one request as a torch view (DLPack, no copy)."""
    tensor = present.get(name)
    if tensor is None:
        raise InvalidRequest(f"{name} is required")
    rows = torch.utils.dlpack.from_dlpack(tensor.to_dlpack())
    if rows.dim() != 2 or rows.shape[0] < 1 or rows.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise InvalidRequest(f"{name} must be a float tensor of shape [R, V], got {rows.dtype} {list(rows.shape)}")
    if vocab_size is not None and rows.shape[1] != vocab_size:
        raise InvalidRequest(f"{name} must have {vocab_size} values (the vocabulary size), got {rows.shape[1]}")
    return rows


@dataclass
class SamplerBatch:
    """The rows of the well-formed requests of one `execute` call, stacked; malformed requests
    already answered.

    tensors: input name -> [B, V] (B = rows of the well-formed requests); spans: per well-formed
    request, (request index, first row, end row); responses: one slot per request, filled with an
    error for the malformed ones and by `answer` for the rest.
    """

    rows: list[SamplerRow]
    tensors: dict[str, torch.Tensor]
    responses: list[Any]
    spans: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def params(self) -> list[SamplingParams]:
        return [row.params for row in self.rows]

    @property
    def history(self) -> list[list[int]]:
        return [row.history for row in self.rows]

    @property
    def steps(self) -> list[int]:
        return [row.step for row in self.rows]


Check = Callable[[dict[str, Any], dict[str, torch.Tensor]], None]


def gather_batch(pb_utils: Any, requests: Sequence[Any], names: Sequence[str], vocab_size: int | None,
                 check: Check | None = None) -> SamplerBatch:
    """Parse every request; stack the [R, V] inputs `names` of the well-formed ones. `check(present,
    values)` may refuse a request further (raise InvalidRequest); a refused request fails alone."""
    batch = SamplerBatch([], {}, [None] * len(requests))
    columns: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    for i, request in enumerate(requests):
        try:
            present = {tensor.name(): tensor for tensor in request.inputs()}  # one call, not one per name
            values = {name: float_rows(present, name, vocab_size) for name in names}
            rows = {len(value) for value in values.values()}
            if len(rows) != 1:
                raise InvalidRequest(f"{', '.join(names)} must have the same number of rows")
            parsed = parse_sampler_rows({spec.name: host_array(present[spec.name]) for spec in SAMPLER_INPUTS
                                         if spec.name in present}, rows.pop(), vocab_size)
            if check is not None:
                check(present, values)
        except Exception as error:
            batch.responses[i] = error_response(pb_utils, error)
            continue
        batch.spans.append((i, len(batch.rows), len(batch.rows) + len(parsed)))
        batch.rows += parsed
        for name, value in values.items():
            columns[name].append(value)
    batch.tensors = {name: col[0] if len(col) == 1 else torch.cat(col) for name, col in columns.items() if col}
    return batch


def refuse_nan(*names: str, probabilities: bool = False) -> Check:
    """A `gather_batch` check: the inputs `names` must hold no NaN (probabilities: values in [0, 1])."""
    def check(present: dict[str, Any], values: dict[str, torch.Tensor]) -> None:
        for name in names:
            x = values[name]
            if bool(torch.isnan(x).any()):
                raise InvalidRequest(f"{name} contain NaN")
            if probabilities and bool(((x < 0) | (x > 1)).any()):
                raise InvalidRequest(f"{name} must be probabilities in [0, 1]")
    return check


def answer(pb_utils: Any, batch: SamplerBatch, outputs: dict[str, np.ndarray], errors: Sequence[str | None]) -> list[Any]:
    """Fill the responses of the well-formed requests: their rows of every output, or the error of
    their failed rows."""
    for i, begin, end in batch.spans:
        failed = [(r - begin, errors[r]) for r in range(begin, end) if errors[r]]
        if failed:
            message = failed[0][1] if end - begin == 1 else "; ".join(f"row {r}: {e}" for r, e in failed)
            batch.responses[i] = error_response(pb_utils, InvalidRequest(message))
        else:
            batch.responses[i] = pb_utils.InferenceResponse(
                [pb_utils.Tensor(name, np.ascontiguousarray(array[begin:end])) for name, array in outputs.items()])
    return batch.responses


Compute = Callable[[SamplerBatch], tuple[dict[str, np.ndarray], Sequence[str | None]]]


def respond(pb_utils: Any, batch: SamplerBatch, compute: Compute) -> list[Any]:
    """Answer the well-formed requests with `compute(batch)` -> (outputs [B, ...], per-row errors).
    If the batched computation itself raises, each of them gets that error (never a traceback)."""
    if batch.rows:
        try:
            outputs, errors = compute(batch)
        except Exception as error:
            for i, _, _ in batch.spans:
                batch.responses[i] = error_response(pb_utils, error)
        else:
            answer(pb_utils, batch, outputs, errors)
    return batch.responses
