"""`DecoderConfig`: the architecture numbers read from a Hugging Face `config.json`."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("default", "llama3")
LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope_theta: float
    attention_bias: bool  # q/k/v projections carry biases (Qwen2)
    tie_word_embeddings: bool
    model_type: str
    rope_type: str = "default"
    rope_scaling: dict[str, float] = field(default_factory=dict)  # llama3: LLAMA3_ROPE_KEYS
    sliding_window: int | None = None  # Mistral/Qwen2 window; None: full attention

    @classmethod
    def from_hf_dict(cls, hf: dict) -> DecoderConfig:
        model_type = hf.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not supported; expected one of {SUPPORTED_MODEL_TYPES}")
        rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported; expected one of {SUPPORTED_ROPE_TYPES}")
        uses_window = model_type == "mistral" or hf.get("use_sliding_window", False)
        heads = hf["num_attention_heads"]
        return cls(
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope.get("rope_theta", hf.get("rope_theta", 10000.0))),
            attention_bias=model_type == "qwen2" or bool(hf.get("attention_bias", False)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            model_type=model_type,
            rope_type=rope_type,
            rope_scaling={key: float(rope[key]) for key in LLAMA3_ROPE_KEYS} if rope_type == "llama3" else {},
            sliding_window=hf.get("sliding_window") if uses_window else None,
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> DecoderConfig:
        return cls.from_hf_dict(json.loads((Path(model_dir) / "config.json").read_text()))
