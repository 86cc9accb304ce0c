"""`PackedTransformer`: `Transformer`'s step on a CPU in bfloat16, with its weights packed once for oneDNN.

The module's forward runs ~2,500 small torch ops per step, and its bf16 `linear`s go through a generic
GEMM that re-lays the weights out on every call (measured at batch 1: 172 us a matmul, 36 ms of a 60 ms
step). Here, at load:
- q/k/v projections are one matrix, and gate/up another (4 GEMMs a layer instead of 7);
- every weight is reordered once into oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, the
  packing torch.compile's freezing pass uses), so each GEMM is one AMX / AVX512-BF16 call;
- the attention mask becomes one additive float32 bias per step, shared by all layers; attention stays
  the module's grouped-query matmuls (its fp32 softmax), faster at decode than the fused SDPA kernel
  (0.17 vs 1.8 ms a layer at 32 rows).
Numerics are the module's: RMSNorm, rotary angles, softmax and logits in float32, the rest in bf16.
Same inputs and outputs as `Transformer.forward` (a `StepFunction`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F

from zerocheck.decoder.model import Transformer, apply_rotary, rotary_cos_sin

_MKLDNN = torch.ops.mkldnn


def packing_available() -> bool:
    """Whether this torch can pack bf16 weights for oneDNN and the CPU multiplies bf16 (AMX / AVX512-BF16)."""
    return torch.backends.mkldnn.is_available() and bool(_MKLDNN._is_mkldnn_bf16_supported())


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return _MKLDNN._reorder_linear_weight(weight.detach().to(torch.bfloat16).contiguous(), 1)


def _linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return _MKLDNN._linear_pointwise(x, packed, None, "none", [], "")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm.forward` (statistics in float32, scaled in the input's dtype)."""
    wide = x.to(torch.float32)
    return weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    post_attention_norm: torch.Tensor
    qkv: torch.Tensor  # packed [q; k; v]
    qkv_bias: torch.Tensor | None  # Qwen2's attention bias, [q; k; v]
    o: torch.Tensor
    gate_up: torch.Tensor  # packed [gate; up]
    down: torch.Tensor


class PackedTransformer:
    """`model`'s step with packed bf16 weights; `model` keeps only the embedding and rotary frequencies."""

    def __init__(self, model: Transformer) -> None:
        if not packing_available():
            raise RuntimeError("PackedTransformer needs torch with oneDNN and a CPU with bf16 instructions")
        config = model.config
        self.config, self.eps, self.inv_freq = config, config.rms_norm_eps, model.inv_freq
        self.embedding = model.embed_tokens.weight.detach().to(torch.bfloat16)
        self.layers = []
        for layer in model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            projections = (attention.q_proj, attention.k_proj, attention.v_proj)
            self.layers.append(_Layer(
                input_norm=layer.input_layernorm.weight.detach().to(torch.bfloat16),
                post_attention_norm=layer.post_attention_layernorm.weight.detach().to(torch.bfloat16),
                qkv=_pack(torch.cat([p.weight for p in projections])),
                qkv_bias=torch.cat([p.bias for p in projections]).detach().to(torch.bfloat16)
                if config.attention_bias else None,
                o=_pack(attention.o_proj.weight),
                gate_up=_pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                down=_pack(mlp.down_proj.weight),
            ))
        self.norm = model.norm.weight.detach().to(torch.bfloat16)
        self.lm_head = _pack(model.lm_head.weight)

    @torch.no_grad()
    def __call__(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        attention_mask: torch.Tensor,
        last_index: torch.Tensor,
        past_keys: torch.Tensor,
        past_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """As `Transformer.forward`; past_keys/values in bfloat16."""
        config = self.config
        heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        groups, q_width, kv_width = heads // kv_heads, heads * head_dim, kv_heads * head_dim
        b, t = tokens.shape
        cos, sin = (angle.to(torch.bfloat16) for angle in rotary_cos_sin(positions, self.inv_freq))
        # [B, 1, 1, T, P+T]: 0 where visible, float32's min elsewhere (as the module's masked_fill)
        bias = torch.zeros(attention_mask.shape, dtype=torch.float32).masked_fill_(
            ~attention_mask, torch.finfo(torch.float32).min)[:, None, None]
        scale = head_dim**-0.5
        x = F.embedding(tokens, self.embedding)
        new_keys, new_values = [], []
        for i, layer in enumerate(self.layers):
            qkv = _linear(_rms_norm(x, layer.input_norm, self.eps), layer.qkv)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            q, k, v = qkv.split([q_width, kv_width, kv_width], dim=-1)
            q = apply_rotary(q.view(b, t, heads, head_dim).transpose(1, 2), cos, sin)
            k = apply_rotary(k.view(b, t, kv_heads, head_dim).transpose(1, 2), cos, sin)
            v = v.view(b, t, kv_heads, head_dim).transpose(1, 2)
            # query heads grouped per KV head, [B, Hkv, G*T, D]: keys and values are read as they are (a
            # broadcast matmul would copy them G times); past and new keys are scored apart (no copy of the past)
            q = q.reshape(b, kv_heads, groups * t, head_dim)
            scores = torch.cat([torch.matmul(q, past_keys[i].transpose(-1, -2)), torch.matmul(q, k.transpose(-1, -2))],
                               dim=-1).to(torch.float32)
            past = past_keys.shape[3]
            weights = torch.softmax(scores.view(b, kv_heads, groups, t, past + t).mul_(scale).add_(bias), dim=-1)
            weights = weights.to(torch.bfloat16).view(b, kv_heads, groups * t, past + t)
            attended = torch.matmul(weights[..., :past], past_values[i]) + torch.matmul(weights[..., past:], v)
            attended = attended.view(b, heads, t, head_dim).transpose(1, 2).reshape(b, t, q_width)
            x = x + _linear(attended, layer.o)
            gate, up = _linear(_rms_norm(x, layer.post_attention_norm, self.eps), layer.gate_up).chunk(2, dim=-1)
            x = x + _linear(F.silu(gate) * up, layer.down)
            new_keys.append(k)
            new_values.append(v)
        index = last_index.view(-1, 1, 1).expand(-1, 1, x.shape[-1])
        last_hidden = torch.gather(x, 1, index).squeeze(1)
        logits = _linear(_rms_norm(last_hidden, self.norm, self.eps), self.lm_head).to(torch.float32)
        return logits, torch.stack(new_keys), torch.stack(new_values)
