"""`GenerateRequest`: one generate call, validated for names once, encoded for gRPC or HTTP.

Input names and dtypes come from the server's table (`zerocheck.api.request.GENERATE_INPUTS`),
sampling knobs from `zerocheck.sampling.SAMPLING_PARAMETERS`; value ranges are left to the server,
so its message reaches the caller unchanged.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zerocheck.sampling import SAMPLING_PARAMETERS
from zerocheck.api.request import INPUTS_BY_NAME, word_list_element

SAMPLING_NAMES = tuple(spec.name for spec in SAMPLING_PARAMETERS)
_NUMPY_OF = {"TYPE_STRING": np.object_, "TYPE_BOOL": np.bool_, "TYPE_INT32": np.int32, "TYPE_UINT64": np.uint64,
             "TYPE_FP32": np.float32}


@dataclass(frozen=True)
class GenerateRequest:
    """A generate call: a prompt, or `messages` (a chat the server renders with the model's chat
    template). None (or empty) fields are not sent: the server's default applies.

    sampling: SAMPLING_PARAMETERS name -> value (temperature, top_k, top_p, ...).
    """

    prompt: str | None
    max_tokens: int | None = None
    sampling: dict[str, float] = field(default_factory=dict)
    seed: int | None = None
    stop: tuple[str, ...] = ()
    bad_words: tuple[str, ...] = ()
    min_tokens: int | None = None
    zerocheck: bool = True
    request_id: str | None = None
    messages: tuple[dict[str, str], ...] | None = None
    num_return_sequences: int | None = None
    return_log_probs: bool = False
    top_log_probs: int = 0  # with return_log_probs: also this many alternatives per token
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias)
    end_id: int | None = None  # -1: never stop at an end token
    # structured output: guided_decoding_guide_type (json, json_schema, regex, ebnf_grammar, lark, choice) and
    # guided_decoding_guide (the schema, regex, grammar or JSON array of choices; none for json)
    guide_type: str | None = None
    guide: str | None = None

    @classmethod
    def build(cls, prompt: str | None, *, messages: Sequence[Mapping[str, str]] | None = None, stop: str | list[str] | tuple[str, ...] | None = None,
              bad_words: str | list[str] | tuple[str, ...] | None = None, **fields: Any) -> GenerateRequest:
        """From `generate()` keyword arguments; sampling knobs are split off by name (unknown: TypeError)."""
        sampling = {name: fields.pop(name) for name in SAMPLING_NAMES if fields.get(name) is not None}
        for name in SAMPLING_NAMES:
            fields.pop(name, None)
        unknown = set(fields) - {"max_tokens", "seed", "min_tokens", "zerocheck", "request_id", "num_return_sequences",
                                 "return_log_probs", "top_log_probs", "logit_bias", "end_id", "guide_type", "guide"}
        if unknown:
            raise TypeError(f"unknown generate argument(s): {', '.join(sorted(unknown))}")
        if (prompt is None) == (messages is None):
            raise TypeError("give a prompt or messages, not both")
        chat = tuple(dict(message) for message in messages) if messages is not None else None
        return cls(prompt, sampling=sampling, stop=_words(stop), bad_words=_words(bad_words), messages=chat, **fields)

    def values(self) -> dict[str, Any]:
        """Model input name -> python value (list for word inputs), always streamed on the wire."""
        prompt = {"messages": json.dumps(list(self.messages))} if self.messages is not None else \
            {"text_input": self.prompt}
        values: dict[str, Any] = {**prompt, "stream": True, **self.sampling}
        optional = {"max_tokens": self.max_tokens, "min_tokens": self.min_tokens, "seed": self.seed,
                    "stop_words": [word_list_element(word) for word in self.stop],
                    "bad_words": [word_list_element(word) for word in self.bad_words],
                    "num_return_sequences": self.num_return_sequences, "end_id": self.end_id,
                    "return_log_probs": self.return_log_probs or None,
                    "return_top_log_probs": self.top_log_probs or None,
                    "logit_bias_ids": [token for token, _ in self.logit_bias],
                    "logit_bias_values": [bias for _, bias in self.logit_bias],
                    "guided_decoding_guide_type": self.guide_type, "guided_decoding_guide": self.guide}
        values.update({name: value for name, value in optional.items() if value not in (None, [])})
        return values

    def parameters(self, retry_reason: str | None = None) -> dict[str, str]:
        """Request parameters: the zero-check switch always, plus retry_reason and request_id when set."""
        parameters = {"zerocheck": "on" if self.zerocheck else "off"}
        if retry_reason:
            parameters["retry_reason"] = retry_reason
        if self.request_id:
            parameters["request_id"] = self.request_id
        return parameters

    def arrays(self) -> dict[str, np.ndarray]:
        """gRPC inputs: name -> numpy array with the leading batch dimension ([1, 1], or [1, N] for words)."""
        arrays = {}
        for name, value in self.values().items():
            dtype = _NUMPY_OF[INPUTS_BY_NAME[name].dtype]
            items = value if isinstance(value, list) else [value]
            if dtype is np.object_:
                items = [item.encode("utf-8") for item in items]
            arrays[name] = np.array([items], dtype=dtype)
        return arrays

    def json_body(self, retry_reason: str | None = None) -> dict[str, Any]:
        """HTTP generate_stream body: inputs and request parameters as top-level keys."""
        return {**self.values(), **self.parameters(retry_reason)}


def _words(words: str | list[str] | tuple[str, ...] | None) -> tuple[str, ...]:
    if words is None:
        return ()
    return (words,) if isinstance(words, str) else tuple(words)
