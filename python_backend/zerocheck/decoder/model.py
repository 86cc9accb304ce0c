"""A Llama-family decoder (Llama, Mistral, Qwen2) with explicit KV cache inputs and outputs.

Reads top to bottom like gpt-fast: RMSNorm, rotary embeddings, grouped-query attention, SwiGLU.
Module and parameter names mirror Hugging Face (`layers.0.self_attn.q_proj.weight`, ...) so a
checkpoint loads by name. The forward is a pure function of its inputs (no cache state inside),
which makes the same module the torch backend and the ONNX export.

Shapes: B batch rows, T new tokens per row (rows padded to T), P cached positions per row
(padded to P), L layers, Hkv key/value heads, D head_dim, V vocabulary.

Weights and activations are float32 or bfloat16 (the module's dtype, `load_transformer(dtype=...)`);
as in Hugging Face's Llama, RMSNorm, the rotary angles, the attention softmax and the logits are
computed in float32 whatever that dtype.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from zerocheck.decoder.config import DecoderConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = x.to(torch.float32)
        variance = wide.pow(2).mean(-1, keepdim=True)
        return self.weight * (wide * torch.rsqrt(variance + self.eps)).to(x.dtype)


def rotary_inv_freq(config: DecoderConfig) -> torch.Tensor:
    """[D/2] float32 rotary frequencies; `llama3` rescales the low frequencies as Llama 3.1 does."""
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, config.head_dim, 2, dtype=torch.float32) / config.head_dim))
    if config.rope_type != "llama3":
        return inv_freq
    scaling = config.rope_scaling
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(medium, smoothed, scaled)


def rotary_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions: [B, T] int64 -> cos, sin: [B, 1, T, D] float32 (Hugging Face half-split layout)."""
    freqs = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # [B, T, D/2]
    angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, H, T, D]; rotates the two halves of the head dimension."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, config.num_heads * config.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=bias)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=False)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask: torch.Tensor,
        past_k: torch.Tensor,
        past_v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x: [B, T, hidden]; mask: [B, 1, 1, T, P+T] bool; past_k/v: [B, Hkv, P, D].

        Returns the attention output [B, T, hidden] and this step's new_k, new_v: [B, Hkv, T, D].
        """
        b, t, _ = x.shape
        groups = self.num_heads // self.num_kv_heads
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        new_k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        new_v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        q, new_k = apply_rotary(q, cos, sin), apply_rotary(new_k, cos, sin)
        k = torch.cat([past_k, new_k], dim=2).unsqueeze(2)  # [B, Hkv, 1, P+T, D]
        v = torch.cat([past_v, new_v], dim=2).unsqueeze(2)
        q = q.reshape(b, self.num_kv_heads, groups, t, self.head_dim)  # query heads grouped per KV head
        scores = torch.matmul(q, k.transpose(-1, -2)).to(torch.float32) * (self.head_dim**-0.5)  # [B, Hkv, G, T, P+T]
        scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        out = torch.matmul(F.softmax(scores, dim=-1).to(v.dtype), v)  # [B, Hkv, G, T, D]
        out = out.reshape(b, self.num_heads, t, self.head_dim).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out), new_k, new_v


class FeedForward(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = FeedForward(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, mask: torch.Tensor,
        past_k: torch.Tensor, past_v: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        attended, new_k, new_v = self.self_attn(self.input_layernorm(x), cos, sin, mask, past_k, past_v)
        x = x + attended
        return x + self.mlp(self.post_attention_layernorm(x)), new_k, new_v


class Transformer(nn.Module):
    """One decoder step over explicit caches; `forward` is what the ONNX export traces."""

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self.register_buffer("inv_freq", rotary_inv_freq(config), persistent=False)

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attention_mask: torch.Tensor,
        last_index: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One step for B rows.

        tokens, positions: [B, T] int64 (positions drive the rotary embedding);
        attention_mask: [B, T, P+T] bool, True where query t may attend to cached (first P) or new key;
        last_index: [B] int64, the row's last real token in T; past_keys, past_values: [L, B, Hkv, P, D] in the
        module's dtype. Returns logits [B, V] float32 at last_index, new_keys and new_values [L, B, Hkv, T, D]
        in the module's dtype.
        """
        cos, sin = rotary_cos_sin(positions, self.inv_freq)
        mask = attention_mask[:, None, None, :, :]
        x = self.embed_tokens(tokens)
        new_keys, new_values = [], []
        for i, layer in enumerate(self.layers):
            x, new_k, new_v = layer(x, cos, sin, mask, past_keys[i], past_values[i])
            new_keys.append(new_k)
            new_values.append(new_v)
        index = last_index.view(-1, 1, 1).expand(-1, 1, x.shape[-1])
        last_hidden = torch.gather(x, 1, index).squeeze(1)  # [B, hidden]
        logits = self.lm_head(self.norm(last_hidden)).to(torch.float32)
        return logits, torch.stack(new_keys), torch.stack(new_values)
