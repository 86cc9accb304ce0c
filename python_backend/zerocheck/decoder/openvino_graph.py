"""The decoder as an OpenVINO model with paged attention: built from the checkpoint's tensors with OpenVINO's
opset, then turned into the paged form OpenVINO GenAI runs.

The graph is first written as a stateful Llama (each layer's keys and values held in ReadValue / Assign
variables, concatenated before ScaledDotProductAttention, the form Hugging Face exports take);
`paged_attention_transformation` (the step OpenVINO GenAI applies to any model) then replaces each
attention with PagedAttention over `key_cache.N` / `value_cache.N` block tensors that the runtime writes in
place. Its inputs afterwards: `input_ids`, `position_ids` ([tokens] int64: every row's new tokens one after
another), `past_lens`, `subsequence_begins`, `block_indices`, `block_indices_begins`, `max_context_len` (int32,
see `zerocheck.decoder.openvino_paged`), the caches, and `logits_indices` ([rows] int64: which of the tokens'
hidden states reach the final norm and lm_head). Output `logits`: [rows, V] float32.

Weights (`WEIGHTS`): fp32 as in the checkpoint; int8: GGUF Q8_0's form, int8 codes in symmetric groups of 32
along the input with a float scale per group (`compress_symmetric`, each group's scale fitted to the grid a 4-bit
checkpoint's weights lie on), which OpenVINO's CPU plugin multiplies in integers where the CPU has them
(AVX512-VNNI, with its dynamic quantization of activations; symmetric groups need no zero-point correction and
step faster in batches than asymmetric ones with integer zero points); int4: GGUF Q4_1's form, a float scale and
minimum per group of 32 (`compress_minimum`: the packaged model's weights come back exactly, the least memory,
float products). Compressed weights are Constants of i8 / u4 codes that the graph converts, shifts and scales:
the decompression pattern the CPU plugin fuses into its matrix multiplies. With compressed layers the embedding
table and lm_head (tied or not) are int8 (the packaged model's token_embd is Q8_0: it comes back exactly); the
gather reads its rows through the same decompression.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np
import openvino as ov
import openvino.opset15 as ops
from openvino import PartialShape, Type
from openvino._offline_transformations import paged_attention_transformation
from openvino.op.util import Variable, VariableInfo

from zerocheck.decoder.config import DecoderConfig
from zerocheck.decoder.model import rotary_inv_freq

WEIGHTS = ("fp32", "int8", "int4")
GROUP = 32  # inputs sharing a scale (and for int4 a minimum) in compressed weights
GRID_CANDIDATES = 6  # grid steps compress_symmetric tries per group (more fit Q4_1 a little better, load slower)
CACHE_INPUTS = ("past_lens", "subsequence_begins", "block_indices", "block_indices_begins", "max_context_len")


def _const(array: np.ndarray | list | float, dtype: type = np.int64) -> ov.Node:
    return ops.constant(np.asarray(array, dtype=dtype))


def compress_symmetric(weight: np.ndarray, group: int = GROUP) -> tuple[np.ndarray, np.ndarray]:
    """[O, I] float -> int8 codes in -127..127 [O, I/group, group] and float32 scales [O, I/group, 1]:
    w ~= code * scale, symmetric groups along the input (GGUF Q8_0's blocks: a Q8_0 weight comes back exactly).

    Each group takes the scale with the least squared error among max |w| / 127 and the steps of a 16-level grid
    over its range divided by whole numbers (range / 15 / m for the GRID_CANDIDATES largest m keeping every code
    within 127): a weight dequantized from a 4-bit format (the packaged GGUF's Q4_1) lies on such a grid, so one of
    them holds its codes up to the rounding of the group's minimum."""
    out_features, in_features = weight.shape
    blocks = weight.reshape(out_features, in_features // group, group).astype(np.float32)
    largest = np.abs(blocks).max(axis=2, keepdims=True)
    largest[largest == 0] = 1.0
    plain = largest / 127.0
    step = (blocks.max(axis=2, keepdims=True) - blocks.min(axis=2, keepdims=True)) / 15
    step[step == 0] = 1.0

    def fit(scale: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        codes = np.clip(np.rint(blocks / scale), -127, 127)
        return codes, np.square(codes * scale - blocks).sum(axis=2, keepdims=True)

    best_codes, best_error = fit(plain)
    best_scale = plain
    most = np.floor(step / plain)  # the largest m with step / m >= max |w| / 127
    for fewer in range(GRID_CANDIDATES):
        scale = step / np.maximum(most - fewer, 1)
        codes, error = fit(scale)
        better = error < best_error
        best_error = np.where(better, error, best_error)
        best_codes, best_scale = np.where(better, codes, best_codes), np.where(better, scale, best_scale)
    return best_codes.astype(np.int8), best_scale.astype(np.float32)


def compress_minimum(weight: np.ndarray, group: int = GROUP) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[O, I] float -> 4-bit codes uint8 [O, I/group, group], scales and minima float32 [O, I/group, 1]:
    w ~= codes * scale + minimum, GGUF Q4_1's block form (a Q4_1 checkpoint's weights come back exactly)."""
    out_features, in_features = weight.shape
    blocks = weight.reshape(out_features, in_features // group, group).astype(np.float32)
    low, high = blocks.min(axis=2, keepdims=True), blocks.max(axis=2, keepdims=True)
    scale = (high - low) / 15
    scale[scale == 0] = 1.0
    codes = np.clip(np.rint((blocks - low) / scale), 0, 15).astype(np.uint8)
    return codes, scale.astype(np.float32), low.astype(np.float32)


def _packed(codes: np.ndarray) -> ov.Node:
    """uint8 codes 0..15 as a u4 Constant (two a byte, the first in the low nibble)."""
    packed = ov.Tensor(Type.u4, ov.Shape(list(codes.shape)))  # groups of 32: an even count of codes
    flat = codes.reshape(-1)
    packed.data[:] = flat[0::2] | (flat[1::2] << 4)
    return ov.op.Constant(packed)


def groups_supported(config: DecoderConfig) -> bool:
    return all(width % GROUP == 0 for width in
               (config.hidden_size, config.intermediate_size, config.num_heads * config.head_dim))


def _weight(weight: np.ndarray, kind: str) -> ov.Node:
    """A [O, I] float32 weight as a graph node in `kind` (WEIGHTS)."""
    if kind == "fp32":
        return _const(weight, np.float32)
    if kind == "int8":
        codes, scale = compress_symmetric(weight)
        dequantized = ops.multiply(ops.convert(ops.constant(codes), Type.f32), _const(scale, np.float32))
    else:  # Q4_1's form: a float zero point (-minimum / scale), which the CPU plugin decompresses to float products
        codes, scale, low = compress_minimum(weight)
        shifted = ops.subtract(ops.convert(_packed(codes), Type.f32), _const(-low / scale, np.float32))
        dequantized = ops.multiply(shifted, _const(scale, np.float32))
    return ops.reshape(dequantized, _const(list(weight.shape)), special_zero=False)


def _linear(x: ov.Node, weight: np.ndarray, kind: str, bias: np.ndarray | None = None) -> ov.Node:
    out = ops.matmul(x, _weight(weight, kind), transpose_a=False, transpose_b=True)
    return out if bias is None else ops.add(out, _const(bias, np.float32))


def _rms_norm(x: ov.Node, weight: np.ndarray, eps: float) -> ov.Node:
    variance = ops.reduce_mean(ops.power(x, _const(2.0, np.float32)), _const([-1]), keep_dims=True)
    normed = ops.multiply(x, ops.divide(_const(1.0, np.float32), ops.sqrt(ops.add(variance, _const(eps, np.float32)))))
    return ops.multiply(normed, _const(weight, np.float32))


def _rotate(x: ov.Node, cos: ov.Node, sin: ov.Node, head_dim: int) -> ov.Node:
    """Hugging Face's rotate_half over [B, H, T, D]: x * cos + cat(-x2, x1) * sin, written as the pattern the
    CPU plugin fuses into one RoPE op (a VariadicSplit on axis 3, a multiply by -1)."""
    first, second = ops.variadic_split(x, _const(3), _const([head_dim // 2, head_dim // 2])).outputs()
    rotated = ops.concat([ops.multiply(second, _const(-1.0, np.float32)), first], -1)
    return ops.add(ops.multiply(x, cos), ops.multiply(rotated, sin))


def _heads(x: ov.Node, heads: int, head_dim: int) -> ov.Node:
    """[B, T, heads * D] -> [B, heads, T, D]."""
    return ops.transpose(ops.reshape(x, _const([0, 0, heads, head_dim]), special_zero=True), _const([0, 2, 1, 3]))


def _cache(current: ov.Node, beam_idx: ov.Node, batch: ov.Node, name: str, kv_heads: int, head_dim: int,
           ) -> tuple[ov.Node, ov.Node]:
    """The stateful form paged_attention_transformation matches: ReadValue -> Gather(beam_idx) -> Concat -> Assign."""
    info = VariableInfo()
    info.data_shape, info.data_type, info.variable_id = PartialShape([-1, kv_heads, -1, head_dim]), Type.f32, name
    variable = Variable(info)
    empty = ops.broadcast(_const(0.0, np.float32), ops.concat([batch, _const([kv_heads, 0, head_dim])], 0))
    past = ops.gather(ops.read_value(empty, variable), beam_idx, _const(0))
    joined = ops.concat([past, current], 2)
    return joined, ops.assign(joined, variable)


def _repeat_kv(x: ov.Node, groups: int, heads: int, head_dim: int) -> ov.Node:
    """[B, Hkv, S, D] -> [B, Hkv * groups, S, D], each KV head repeated for its query heads."""
    if groups == 1:
        return x
    shape = ops.shape_of(x)
    expanded = ops.broadcast(ops.unsqueeze(x, _const([2])), ops.concat([
        ops.gather(shape, _const([0, 1]), _const(0)), _const([groups]), ops.gather(shape, _const([2, 3]), _const(0))], 0))
    return ops.reshape(expanded, _const([0, heads, -1, head_dim]), special_zero=True)


def build_paged_model(config: DecoderConfig, state: Mapping[str, np.ndarray], weights: str = "fp32") -> ov.Model:
    """The paged OpenVINO model of the checkpoint tensors `state` (Hugging Face names without `model.`,
    float32 numpy arrays); `weights` in WEIGHTS."""
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(WEIGHTS)}, got {weights!r}")
    if weights != "fp32" and not groups_supported(config):
        raise ValueError(f"{weights} weights need layer widths that are multiples of {GROUP}")
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    input_ids = ops.parameter([-1, -1], Type.i64, name="input_ids")
    attention_mask = ops.parameter([-1, -1], Type.i64, name="attention_mask")
    position_ids = ops.parameter([-1, -1], Type.i64, name="position_ids")
    beam_idx = ops.parameter([-1], Type.i32, name="beam_idx")
    logits_indices = ops.parameter([-1], Type.i64, name="logits_indices")
    batch = ops.gather(ops.shape_of(input_ids), _const([0]), _const(0))

    inv_freq = rotary_inv_freq(config).numpy().astype(np.float32)
    freqs = ops.multiply(ops.unsqueeze(ops.convert(position_ids, Type.f32), _const([-1])), _const(inv_freq, np.float32))
    angles = ops.unsqueeze(ops.concat([freqs, freqs], -1), _const([1]))  # [B, 1, T, D]
    cos, sin = ops.cos(angles), ops.sin(angles)
    # an additive mask from attention_mask, as exports carry; the paged form drops it (its attention is causal)
    mask = ops.convert(ops.unsqueeze(attention_mask, _const([1, 2])), Type.f32)
    mask = ops.multiply(ops.subtract(_const(1.0, np.float32), mask), _const(-1e9, np.float32))

    embedding = "fp32" if weights == "fp32" else "int8"
    table = _weight(state["embed_tokens.weight"], embedding)
    x = ops.gather(table, input_ids, _const(0))
    sinks = []
    for i in range(config.num_layers):
        p = f"layers.{i}."
        h = _rms_norm(x, state[p + "input_layernorm.weight"], config.rms_norm_eps)
        # q, k and v (and below gate and up) as one matrix multiply each: fewer, larger calls
        projections = [p + f"self_attn.{name}_proj." for name in "qkv"]
        qkv = _linear(h, np.concatenate([state[name + "weight"] for name in projections]), weights,
                      np.concatenate([state[name + "bias"] for name in projections]) if config.attention_bias else None)
        widths = [heads * head_dim, kv_heads * head_dim, kv_heads * head_dim]
        q, k, v = ops.variadic_split(qkv, _const(-1), _const(widths)).outputs()
        q, k, v = _heads(q, heads, head_dim), _heads(k, kv_heads, head_dim), _heads(v, kv_heads, head_dim)
        q, k = _rotate(q, cos, sin, head_dim), _rotate(k, cos, sin, head_dim)
        keys, key_sink = _cache(k, beam_idx, batch, f"past_key_values.{i}.key", kv_heads, head_dim)
        values, value_sink = _cache(v, beam_idx, batch, f"past_key_values.{i}.value", kv_heads, head_dim)
        sinks += [key_sink, value_sink]
        attended = ops.scaled_dot_product_attention(
            q, _repeat_kv(keys, heads // kv_heads, heads, head_dim), _repeat_kv(values, heads // kv_heads, heads, head_dim),
            mask, _const(head_dim**-0.5, np.float32), causal=False)
        attended = ops.reshape(ops.transpose(attended, _const([0, 2, 1, 3])), _const([0, 0, heads * head_dim]),
                               special_zero=True)
        x = ops.add(x, _linear(attended, state[p + "self_attn.o_proj.weight"], weights))
        h = _rms_norm(x, state[p + "post_attention_layernorm.weight"], config.rms_norm_eps)
        gate_up = _linear(h, np.concatenate([state[p + "mlp.gate_proj.weight"], state[p + "mlp.up_proj.weight"]]), weights)
        gate, up = ops.split(gate_up, _const(-1), 2).outputs()
        x = ops.add(x, _linear(ops.multiply(ops.swish(gate), up), state[p + "mlp.down_proj.weight"], weights))
    # only the rows' last tokens go on: [B, T, hidden] -> [B*T, hidden] -> [rows, hidden]
    flat = ops.reshape(x, _const([-1, config.hidden_size]), special_zero=False)
    last = ops.gather(flat, logits_indices, _const(0))
    # a tied lm_head is the table's own node: one compression, one constant, still fused into a compressed matmul
    head = table if config.tie_word_embeddings else _weight(state["lm_head.weight"], embedding)
    logits = ops.matmul(_rms_norm(last, state["norm.weight"], config.rms_norm_eps), head, transpose_a=False,
                        transpose_b=True)
    result = ops.result(logits, name="logits")
    result.get_output_tensor(0).set_names({"logits"})
    model = ov.Model([result], sinks, [input_ids, attention_mask, position_ids, beam_idx, logits_indices], "zerocheck")
    paged_attention_transformation(model)
    names = {parameter.get_friendly_name() for parameter in model.get_parameters()}
    missing = [name for name in (*CACHE_INPUTS, "key_cache.0", "value_cache.0") if name not in names]
    if missing:
        raise RuntimeError(f"OpenVINO {ov.__version__}'s paged_attention_transformation left no inputs {missing}: "
                           "the attention pattern was not matched")
    return model
