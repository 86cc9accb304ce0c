"""`PackedTransformer`: `Transformer`'s step on a CPU in bfloat16, with its weights packed once for oneDNN.

The module's forward runs ~2,500 small torch ops per step, and its bf16 `linear`s go through a generic
GEMM that re-lays the weights out on every call, a cost that dominates small steps. Here:
- q/k/v projections are one matrix, and gate/up another (4 GEMMs a layer instead of 7);
- every weight is reordered once into oneDNN's blocked layout (`mkldnn._reorder_linear_weight`, the
  packing torch.compile's freezing pass uses), so each GEMM is one AMX / AVX512-BF16 call;
- the KV cache pool is read and written in place: new keys and values go straight into the rows' slots
  (no step gathers every row's past into a batch copy);
- with numba (`compiled`), one-token steps (decode) attend with `attention_kernel.decode_attention`: one
  numba call a layer rotates, stores and attends for every row over its own positions only (no padding to
  the longest row, and at one row the ~20 torch ops a layer it stands in for cost more to dispatch than
  their arithmetic); longer steps (prefill), and decode without numba, use the module's grouped-query
  matmuls (its fp32 softmax) over the slots as a view, one additive float32 attention bias per step serving
  all layers (faster than the fused SDPA kernel on a CPU at batched steps; benchmarks/decoder.py measures
  the step);
- with numba, every step's residual adds, norms and activation are `layer_kernel` calls, three a layer
  in place of ~25 torch ops, each dearer to dispatch than its arithmetic at one row;
- optionally (`int4_single_row`), steps of one row and one token use int4 copies of the layers' weights
  (groups of INT4_GROUP inputs, torch's `_weight_int4pack_mm_for_cpu`): such a step reads its weights from
  memory and is bound by their size (benchmarks/decoder.py: "torch:bf16+int4"); from two rows on the
  bf16 GEMMs are faster (the int4 kernel is compute-bound), so batches keep bf16. GGUF Q4_1 weights (blocks
  of 32 inputs, w = q d + m) come back with their own q; the loss is bf16 rounding of scale and zero;
- optionally (`int8_lm_head_single_row`, with numba), such a step's lm_head reads an int8 copy of its weight
  (`int8_kernel`: half the bytes of bf16, per-row scales).
Numerics are the module's: RMSNorm, rotary angles, softmax and logits in float32, the rest in bf16 (the
compiled decode attention also keeps queries, scores and weights in float32).
`step` takes the pool's caches and the rows' slots instead of `Transformer.forward`'s gathered caches.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from zerocheck.decoder import attention_kernel, int8_kernel, layer_kernel
from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.model import Transformer, apply_rotary, rotary_cos_sin

_MKLDNN = torch.ops.mkldnn
INT4_GROUP = 32  # inputs per int4 scale and zero (GGUF Q4_0/Q4_1 blocks are 32)


def packing_available() -> bool:
    """Whether this torch can pack bf16 weights for oneDNN and the CPU multiplies bf16 (AMX / AVX512-BF16)."""
    return torch.backends.mkldnn.is_available() and bool(_MKLDNN._is_mkldnn_bf16_supported())


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return _MKLDNN._reorder_linear_weight(weight.detach().to(torch.bfloat16).contiguous(), 1)


def _linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return _MKLDNN._linear_pointwise(x, packed, None, "none", [], "")


@dataclass(frozen=True)
class _Int4:
    packed: torch.Tensor  # `_convert_weight_to_int4pack_for_cpu` of the [N, K] codes 0..15
    scales_and_zeros: torch.Tensor  # [K / INT4_GROUP, N, 2] bfloat16: w = (q - 8) * scale + zero


def _pack_int4(weight: torch.Tensor) -> _Int4:
    """Asymmetric min-max int4 codes per group of INT4_GROUP inputs of weight [N, K] (K a multiple of it), with
    the bf16 scale and zero (`_nearest_bf16_pair`) that reproduce each group best."""
    rows, inputs = weight.shape
    groups = weight.detach().to(torch.float32).reshape(rows, inputs // INT4_GROUP, INT4_GROUP)
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = (high - low).clamp(min=torch.finfo(torch.float32).tiny) / 15
    codes = torch.round((groups - low) / scale).clamp_(0, 15)
    scale, zero = _nearest_bf16_pair(groups, codes - 8, scale, low + 8 * scale)
    return _Int4(torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32).reshape(rows, inputs), 1),
                 torch.cat([scale, zero], -1).transpose(0, 1).contiguous())


def _nearest_bf16_pair(groups: torch.Tensor, centred: torch.Tensor, scale: torch.Tensor,
                       zero: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 (scale, zero) of each group, among each one's bf16 rounding and its two neighbours, whose
    weights `centred * scale + zero` are nearest `groups` (least squares). The int4 kernel takes bf16 scales and
    zeros; rounding each on its own shifts a whole group of 32 weights the same way (one rounding error times
    up to 8 codes), where a neighbour pair can cancel part of it (GGUF Q4_1 weights: their codes come back
    exactly, so this is all the int4 copy loses)."""
    c, w = centred.double(), groups.double()  # the squared error of a pair from five sums a group, in float64
    cc, c1, cw, w1, ww = (c * c).sum(-1, True), c.sum(-1, True), (c * w).sum(-1, True), w.sum(-1, True), \
        (w * w).sum(-1, True)
    n = groups.shape[-1]

    def error(pair: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        s, z = (value.double() for value in pair)
        return s * s * cc + 2 * s * z * c1 - 2 * s * cw + n * z * z - 2 * z * w1 + ww

    rounded = best = (scale.to(torch.bfloat16), zero.to(torch.bfloat16))
    best_error = error(best)
    for step_scale, step_zero in ((s, z) for s in (-1, 0, 1) for z in (-1, 0, 1) if s or z):
        # one bf16 step either way (a step off +0 or the largest finite value gives NaN or inf: never better)
        pair = tuple((value.view(torch.int16) + step).view(torch.bfloat16)
                     for value, step in zip(rounded, (step_scale, step_zero)))
        candidate = error(pair)
        better = candidate < best_error
        best_error = torch.where(better, candidate, best_error)
        best = tuple(torch.where(better, new, old) for new, old in zip(pair, best))
    return best


def _linear_int4(x: torch.Tensor, weight: _Int4) -> torch.Tensor:
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(_matrix(x), weight.packed, INT4_GROUP, weight.scales_and_zeros)
    return out if x.dim() == 2 else out.view(*x.shape[:-1], out.shape[-1])


def int4_supported(config: DecoderConfig) -> bool:
    """Whether `int4_single_row` can pack this model: the kernel exists and every layer input width (hidden,
    intermediate, heads x head_dim) is a multiple of INT4_GROUP."""
    aten = torch.ops.aten
    kernel = hasattr(aten, "_weight_int4pack_mm_for_cpu") and hasattr(aten, "_convert_weight_to_int4pack_for_cpu")
    widths = (config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim)
    return kernel and all(width % INT4_GROUP == 0 for width in widths)


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """`RMSNorm.forward` (statistics in float32, scaled in the input's dtype)."""
    wide = x.to(torch.float32)
    return weight * (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


@dataclass(frozen=True)
class _Layer:
    qkv: torch.Tensor  # packed [q; k; v]
    qkv_bias: torch.Tensor | None  # Qwen2's attention bias, [q; k; v]
    o: torch.Tensor
    gate_up: torch.Tensor  # packed [gate; up]
    down: torch.Tensor
    int4: tuple[_Int4, _Int4, _Int4, _Int4] | None  # qkv, o, gate_up, down for one-row steps


class PackedTransformer:
    """`model`'s step with packed bf16 weights (and, for one-row steps, int4 copies of the layers' weights with
    `int4_single_row`, an int8 copy of lm_head's with `int8_lm_head_single_row`); `model` keeps only the embedding
    and rotary frequencies."""

    def __init__(self, model: Transformer, int4_single_row: bool = False, compiled: bool = False,
                 int8_lm_head_single_row: bool = False) -> None:
        """compiled: numba kernels for one-token steps' attention (`attention_kernel`) and every step's norms,
        residual adds and activation (`layer_kernel`); int8_lm_head_single_row needs them."""
        if not packing_available():
            raise RuntimeError("PackedTransformer needs torch with oneDNN and a CPU with bf16 instructions")
        config = model.config
        if int4_single_row and not int4_supported(config):
            raise ValueError(f"int4 weights need torch's CPU int4 GEMM and layer widths that are multiples of "
                             f"{INT4_GROUP} (hidden {config.hidden_size}, intermediate {config.intermediate_size})")
        if compiled and not attention_kernel.available():
            raise ValueError("compiled kernels need numba")
        if int8_lm_head_single_row and not compiled:
            raise ValueError("the int8 lm_head of one-row steps is a compiled kernel: it needs compiled=True")
        self.compiled = compiled
        if compiled:
            attention_kernel.warm_up()
            layer_kernel.warm_up()
        if int8_lm_head_single_row:
            int8_kernel.warm_up()
        self.config, self.eps, self.inv_freq = config, config.rms_norm_eps, model.inv_freq
        self.embedding = model.embed_tokens.weight.detach().to(torch.bfloat16)
        self.layers = []
        self.norms: list[torch.Tensor] = []  # each layer's input and post-attention norms, then the final norm
        for layer in model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            projections = (attention.q_proj, attention.k_proj, attention.v_proj)
            qkv = torch.cat([p.weight for p in projections])
            gate_up = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])
            self.norms += [norm.weight.detach().to(torch.bfloat16)
                           for norm in (layer.input_layernorm, layer.post_attention_layernorm)]
            self.layers.append(_Layer(
                qkv=_pack(qkv),
                qkv_bias=torch.cat([p.bias for p in projections]).detach().to(torch.bfloat16)
                if config.attention_bias else None,
                o=_pack(attention.o_proj.weight),
                gate_up=_pack(gate_up),
                down=_pack(mlp.down_proj.weight),
                int4=tuple(_pack_int4(w) for w in (qkv, attention.o_proj.weight, gate_up, mlp.down_proj.weight))
                if int4_single_row else None,
            ))
        self.norms.append(model.norm.weight.detach().to(torch.bfloat16))
        self.norm_bits = [attention_kernel.as_bits(norm) for norm in self.norms] if compiled else None
        self.lm_head = _pack(model.lm_head.weight)
        self.lm_head_int8 = int8_kernel.quantise_rows(model.lm_head.weight) if int8_lm_head_single_row else None

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, counts: torch.Tensor, lengths: torch.Tensor, slots: torch.Tensor,
             keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        """One step for B rows that reads and writes the KV cache pool in place (no per-step gather).

        tokens: [B, T] int64, row b's first counts[b] real (the rest padding); lengths: [B] cached positions
        of each row; slots: [B] distinct pool slots; keys, values: the pool's [L, S, Hkv, max_seq_len, D]
        bfloat16 caches (`KVCachePool.keys` / `.values`). Each row's new keys and values are written at
        positions lengths[b] .. lengths[b] + counts[b] - 1 of its slot (the caller then advances its length;
        a forward that fails leaves them past the length, unseen), and every query attends to its slot's
        first lengths[b] + t + 1 positions. Returns the logits [B, V] float32 at each row's last real token.
        With `compiled`, one-token steps attend with the compiled kernel (other steps with torch) and every
        step's glue between the GEMMs is `layer_kernel`'s; such a step's activations are [B, width] matrices
        (not [B, 1, width]): each GEMM and kernel call takes them as they are, without a reshape and a view
        around it (~15 tensor-metadata calls a layer, which weigh on a one-row step).
        """
        b, t = tokens.shape
        positions = lengths[:, None] + torch.arange(t)
        angles = rotary_cos_sin(positions, self.inv_freq)
        decode = self.compiled and t == 1
        if decode:
            attend = _CompiledAttention(self.config, angles, lengths, slots, keys, values)
        else:
            attend = _TorchAttention(self.config, angles, counts, lengths, slots, keys, values)
        glue = _CompiledGlue(self, b * t) if self.compiled else _TorchGlue(self)
        single = b * t == 1
        x = F.embedding(tokens[:, 0] if decode else tokens, self.embedding)
        normed = glue.norm(x, 0)
        for i, layer in enumerate(self.layers):
            if single and layer.int4 is not None:
                linear, (qkv_weight, o_weight, gate_up_weight, down_weight) = _linear_int4, layer.int4
            else:
                linear, qkv_weight, o_weight, gate_up_weight, down_weight = (
                    _linear, layer.qkv, layer.o, layer.gate_up, layer.down)
            qkv = linear(normed, qkv_weight)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            x, normed = glue.add_norm(x, linear(attend(i, qkv), o_weight), 2 * i + 1)
            activated = glue.silu_mul(linear(normed, gate_up_weight))
            x, normed = glue.add_norm(x, linear(activated, down_weight), 2 * i + 2)  # the next layer's or the final norm
        if decode and single and self.lm_head_int8 is not None:
            logits = torch.empty(1, self.lm_head_int8[0].shape[0])
            int8_kernel.matvec(*self.lm_head_int8, attention_kernel.as_bits(normed)[0], logits.numpy()[0])
            return logits
        if decode:
            return _linear(normed, self.lm_head).to(torch.float32)
        index = (counts - 1).view(-1, 1, 1).expand(-1, 1, normed.shape[-1])
        return _linear(torch.gather(normed, 1, index).squeeze(1), self.lm_head).to(torch.float32)


class _TorchGlue:
    """A step's norms, residual adds and activation in torch ops (`_rms_norm`, `+`, `F.silu`), new tensors."""

    def __init__(self, model: PackedTransformer) -> None:
        self.norms, self.eps = model.norms, model.eps

    def norm(self, x: torch.Tensor, k: int) -> torch.Tensor:
        return _rms_norm(x, self.norms[k], self.eps)

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(x + delta, its norm with the k-th norm weights)."""
        x = x + delta
        return x, _rms_norm(x, self.norms[k], self.eps)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


class _CompiledGlue:
    """`_TorchGlue`'s operations as `layer_kernel` calls, one each for all of a step's `rows` (tokens): the
    residual stream is updated in place, and the norm and the activation are written into buffers of the
    step that each next GEMM reads before they are written again."""

    def __init__(self, model: PackedTransformer, rows: int) -> None:
        config = model.config
        self.norm_bits, self.eps, self.hidden = model.norm_bits, model.eps, config.hidden_size
        self.normed = torch.empty(rows, config.hidden_size, dtype=torch.bfloat16)
        self.activated = torch.empty(rows, config.intermediate_size, dtype=torch.bfloat16)
        self.normed_bits = attention_kernel.as_bits(self.normed)
        self.activated_bits = attention_kernel.as_bits(self.activated)
        self.x_bits = None

    def norm(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """The first norm; `x` (a fresh [B, T, H] or, in a compiled one-token step, [B, H] tensor) becomes the
        residual stream, updated in place."""
        self.x_bits = attention_kernel.as_bits(x.view(-1, self.hidden))
        layer_kernel.rms_norm(self.x_bits, self.norm_bits[k], self.eps, self.normed_bits)
        return _like(self.normed, x)

    def add_norm(self, x: torch.Tensor, delta: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        layer_kernel.add_rms_norm(self.x_bits, attention_kernel.as_bits(_matrix(delta)), self.norm_bits[k], self.eps,
                                  self.normed_bits)
        return x, _like(self.normed, x)

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        layer_kernel.silu_mul(attention_kernel.as_bits(_matrix(gate_up)), self.activated_bits)
        return self.activated if gate_up.dim() == 2 else self.activated.view(*gate_up.shape[:-1], -1)


def _matrix(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, width] (itself when it is one already: no view call)."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _like(buffer: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A step's [rows, width] buffer shaped as x (itself for a matrix x)."""
    return buffer if x.dim() == 2 else buffer.view(x.shape)


class _CompiledAttention:
    """A one-token step's attention, a layer a call: `attention_kernel.decode_attention` on the pool."""

    def __init__(self, config: DecoderConfig, angles: tuple[torch.Tensor, torch.Tensor], lengths: torch.Tensor,
                 slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        rows = len(lengths)
        self.heads, self.kv_heads, self.width = config.num_heads, config.num_kv_heads, config.num_heads * config.head_dim
        self.cos, self.sin = (angle.reshape(rows, config.head_dim).numpy() for angle in angles)
        self.slots, self.lengths = slots.numpy(), lengths.numpy()
        self.keys, self.values = attention_kernel.as_bits(keys), attention_kernel.as_bits(values)
        self.loop = attention_kernel.step_loop(self.lengths, self.kv_heads)  # once for every layer
        self.scale = np.float32(config.head_dim**-0.5)
        # one output for every layer: o_proj reads it before the next layer's call writes it again
        self.attended = torch.empty(rows, self.width, dtype=torch.bfloat16)
        self.attended_bits = attention_kernel.as_bits(self.attended)

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        """qkv: [B, (H + 2 Hkv) x D] bfloat16 -> the attended heads [B, H x D] bfloat16 (the step's buffer)."""
        self.loop(attention_kernel.as_bits(qkv), self.cos, self.sin, self.slots, self.lengths, self.keys[layer],
                  self.values[layer], self.attended_bits, self.heads, self.kv_heads, self.scale)
        return self.attended


class _TorchAttention:
    """A step's attention, a layer a call, in torch ops: the module's grouped-query matmuls (its fp32 softmax)
    over the pool's slots, after writing the step's keys and values into them."""

    def __init__(self, config: DecoderConfig, angles: tuple[torch.Tensor, torch.Tensor], counts: torch.Tensor,
                 lengths: torch.Tensor, slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.config, self.keys, self.values, self.slots = config, keys, values, slots
        b, t = len(lengths), int(counts.max())
        steps = torch.arange(t)
        positions = lengths[:, None] + steps
        self.span = int((lengths + counts).max())  # the positions any row attends to
        self.written = (steps[None, :] < counts[:, None]).nonzero(as_tuple=True)  # (row, step) of each real token
        self.write_slots, self.write_positions = slots[self.written[0]], positions[self.written]
        # The rows' slots as one window of the pool, a view that the attention's matmuls read as it is, when
        # it is not much wider than the batch (rows between are computed and dropped); else a copy per layer.
        self.low = int(slots.min())
        self.window = int(slots.max()) + 1 - self.low
        self.in_window = self.window <= 2 * b
        self.rows, self.place = (self.window, slots - self.low) if self.in_window else (b, None)
        # [rows, 1, 1, T, span]: 0 where visible, float32's min elsewhere (rows outside the batch see all)
        visible = torch.arange(self.span)[None, None, :] <= positions[:, :, None]
        bias = torch.zeros(b, t, self.span).masked_fill_(~visible, torch.finfo(torch.float32).min)[:, None, None]
        if self.in_window:
            bias = bias.new_zeros(self.rows, *bias.shape[1:]).index_copy_(0, self.place, bias)
        self.bias = bias
        self.cos, self.sin = (angle.to(torch.bfloat16) for angle in angles)

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        """qkv: [B, T, (H + 2 Hkv) x D] bfloat16 -> the attended heads [B, T, H x D] bfloat16."""
        config, span, rows, place = self.config, self.span, self.rows, self.place
        heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        groups, q_width, kv_width = heads // kv_heads, heads * head_dim, kv_heads * head_dim
        b, t = qkv.shape[:2]
        # queries and keys rotated as one tensor of heads + kv_heads heads (half the ops of two calls)
        qk, v = qkv.split([q_width + kv_width, kv_width], dim=-1)
        qk = apply_rotary(qk.view(b, t, heads + kv_heads, head_dim).transpose(1, 2), self.cos, self.sin)
        q, k = qk[:, :heads], qk[:, heads:]
        v = v.view(b, t, kv_heads, head_dim).transpose(1, 2)
        layer_keys, layer_values = self.keys[layer], self.values[layer]
        written, write_slots, write_positions = self.written, self.write_slots, self.write_positions
        if t == 1:  # decode: every row writes its one token
            layer_keys[write_slots, :, write_positions] = k.squeeze(2)
            layer_values[write_slots, :, write_positions] = v.squeeze(2)
        else:
            layer_keys[write_slots, :, write_positions] = k[written[0], :, written[1]]
            layer_values[write_slots, :, write_positions] = v[written[0], :, written[1]]
        if self.in_window:
            past_keys, past_values = (cache[self.low : self.low + self.window, :, :span]
                                      for cache in (layer_keys, layer_values))
        else:
            past_keys, past_values = (cache.index_select(0, self.slots)[:, :, :span]
                                      for cache in (layer_keys, layer_values))
        # query heads grouped per KV head, [rows, Hkv, G*T, D]: the keys and values are read as they
        # are (a broadcast matmul would copy them G times)
        grouped = q.reshape(b, kv_heads, groups * t, head_dim)
        if self.in_window:
            grouped = grouped.new_zeros(rows, *grouped.shape[1:]).index_copy_(0, place, grouped)
        # keys as the left operand, read in place (as the right one, transposed, matmul copied them per layer)
        scores = torch.matmul(past_keys, grouped.transpose(-1, -2)).transpose(-1, -2).to(torch.float32)
        scores = scores.view(rows, kv_heads, groups, t, span).mul_(head_dim**-0.5).add_(self.bias)
        weights = torch.softmax(scores, dim=-1)
        attended = torch.matmul(weights.to(torch.bfloat16).view(rows, kv_heads, groups * t, span), past_values)
        if self.in_window:
            attended = attended[place]
        return attended.view(b, heads, t, head_dim).transpose(1, 2).reshape(b, t, q_width)
