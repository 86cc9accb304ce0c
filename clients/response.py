"""The response model: `TokenEvent`s as they arrive and the final `GenerateResult`, built from the
server's streamed responses (`Chunk`) the same way for gRPC and HTTP."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zerocheck.clients.errors import ZerocheckError


@dataclass(frozen=True)
class GenerateResult:
    """A finished generation. text: the completion only (without the prompt); token_ids: its tokens.

    ttft_s and latency_s are measured from the call, retries and backoff included; `retries` counts
    attempts after failures, `hedged` says a second attempt was sent because the first was slow.
    """

    text: str
    token_ids: list[int]
    prompt_tokens: int
    completion_tokens: int
    zerocheck_bypass: bool
    sampler: str
    finish_reason: str
    ttft_s: float
    latency_s: float
    retries: int = 0
    hedged: bool = False

    @property
    def tokens_per_s(self) -> float:
        """Completion tokens per second after the first one (decode rate); 0 for a single token."""
        decode_s = self.latency_s - self.ttft_s
        return (self.completion_tokens - 1) / decode_s if self.completion_tokens > 1 and decode_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "tokens_per_s": self.tokens_per_s}


@dataclass(frozen=True)
class TokenEvent:
    """New text and token ids of one streamed response; elapsed_s since the call started.
    The last event of a stream carries the result in `final`."""

    text: str
    token_ids: list[int]
    elapsed_s: float
    final: GenerateResult | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "elapsed_s": self.elapsed_s,
                **({"final": self.final.to_dict()} if self.final else {})}


@dataclass(frozen=True)
class Chunk:
    """One response of the server, normalized: outputs of either protocol as python values.
    `final`: the last response of its sequence (`sequence_index`; a request may ask for several)."""

    text: str
    token_ids: list[int]
    fields: dict[str, Any]  # prompt_tokens, completion_tokens, sampler, zerocheck_bypass, finish_reason
    log_probs: list[float] = field(default_factory=list)  # output_log_probs, when asked for
    received_s: float = 0.0  # time.perf_counter() when it arrived (0: not recorded)
    top_log_probs: list[list[tuple[int, float]]] = field(default_factory=list)  # per token, best first

    @property
    def final(self) -> bool:
        return bool(self.fields.get("finish_reason"))

    @property
    def sequence_index(self) -> int:
        return int(self.fields.get("sequence_index", 0))

    @classmethod
    def from_outputs(cls, outputs: Mapping[str, Any], received_s: float = 0.0) -> Chunk:
        """outputs: output name -> numpy array (gRPC, batch dim first) or JSON value (HTTP, where a
        one-element list arrives as a bare value)."""
        items = {name: _items(value) for name, value in outputs.items()}
        fields = {name: items[name][0] for name in _FIELDS if items.get(name)}
        ids = [int(i) for i in items.get("output_ids", [])]
        top_ids, top_log_probs = items.get("output_top_ids", []), items.get("output_top_log_probs", [])
        k = len(top_ids) // len(ids) if ids and top_ids else 0  # [1, tokens, k], flat here
        top = [[(int(t), float(lp)) for t, lp in zip(top_ids[i * k:(i + 1) * k], top_log_probs[i * k:(i + 1) * k])
                if t >= 0] for i in range(len(ids))] if k else []
        return cls("".join(items.get("text_output", [])), ids, fields,
                   [float(v) for v in items.get("output_log_probs", [])], received_s, top)


# a transport's receiver: each chunk, then None at the end of the stream, or an error
Sink = Callable[[Chunk | ZerocheckError | None], None]
_FIELDS = ("prompt_tokens", "completion_tokens", "sampler", "zerocheck_bypass", "finish_reason", "sequence_index")


def _items(value: Any) -> list[Any]:
    """Flat list of python values (bytes decoded as UTF-8)."""
    if isinstance(value, np.ndarray):
        return [item.decode("utf-8", errors="replace") if isinstance(item, bytes) else item.item()
                for item in value.reshape(-1)]
    return value if isinstance(value, list) else [value]


@dataclass
class ResultBuilder:
    """Collects the chunks of the winning attempt into events and the final result."""

    started: float  # time.monotonic() of the call
    text: list[str] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    ttft_s: float | None = None

    def add(self, chunk: Chunk, now: float, retries: int, hedged: bool) -> TokenEvent:
        elapsed = now - self.started
        if self.ttft_s is None:
            self.ttft_s = elapsed
        self.text.append(chunk.text)
        self.token_ids += chunk.token_ids
        final = None
        if chunk.final:
            fields = chunk.fields
            final = GenerateResult(
                text="".join(self.text), token_ids=list(self.token_ids),
                prompt_tokens=int(fields.get("prompt_tokens", 0)),
                completion_tokens=int(fields.get("completion_tokens", len(self.token_ids))),
                zerocheck_bypass=bool(fields.get("zerocheck_bypass", False)), sampler=str(fields.get("sampler", "")),
                finish_reason=str(fields["finish_reason"]), ttft_s=self.ttft_s, latency_s=elapsed,
                retries=retries, hedged=hedged)
        return TokenEvent(chunk.text, chunk.token_ids, elapsed, final)
