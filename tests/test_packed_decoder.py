"""`PackedTransformer` (the CPU bf16 step with oneDNN-packed weights) against the module it packs."""
from __future__ import annotations

import pytest
import torch

from zerocheck.decoder import DecoderConfig, StepRequest, Transformer, attention_kernel, int8_kernel, load_decoder
from zerocheck.decoder.packed import (INT4_GROUP, PackedTransformer, _linear_int4, _nearest_bf16_pair, _pack_int4,
                                      int4_supported, packing_available)

pytestmark = pytest.mark.skipif(not packing_available(), reason="no oneDNN bf16 on this CPU / torch")

TINY = dict(vocab_size=512, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
            tie_word_embeddings=True)


def tiny_model(model_type: str) -> Transformer:
    config = DecoderConfig.from_hf_dict({**TINY, "model_type": model_type})
    torch.manual_seed(0)
    model = Transformer(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    return model.to(torch.bfloat16).eval()


def module_inputs(pool: tuple[torch.Tensor, torch.Tensor], tokens: torch.Tensor, counts: torch.Tensor,
                  lengths: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """`Transformer.forward`'s inputs for the same rows: caches gathered from the pool, the engine's mask."""
    t, p = tokens.shape[1], int(lengths.max())
    steps = torch.arange(t)
    past_visible = (torch.arange(p)[None, None, :] < lengths[:, None, None]).expand(-1, t, -1)
    new_visible = (steps[None, :] <= steps[:, None])[None] & (steps[None, None, :] < counts[:, None, None])
    keys, values = (cache[:, slots, :, :p] for cache in pool)
    return tokens, lengths[:, None] + steps, torch.cat([past_visible, new_visible], -1), counts - 1, keys, values


STEPS = {"mixed": ([1, 4, 2], False),  # new tokens per row; the compiled kernels (numba)
         "mixed-compiled": ([1, 4, 2], True),  # compiled layer glue, torch's attention
         "decode": ([1, 1, 1], False),
         "decode-compiled": ([1, 1, 1], True)}  # compiled decode attention and layer glue


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])  # qwen2: q/k/v biases
@pytest.mark.parametrize("slots", [[3, 0, 4], [9, 0, 5]], ids=["window", "scattered"])  # a view; a copy per layer
@pytest.mark.parametrize("step", STEPS)
def test_packed_step_is_the_module_step_within_bf16_rounding(model_type: str, slots: list[int], step: str) -> None:
    """Three rows with 6, 3 and 0 cached positions and 1, 4 and 2 new tokens (torch's attention), or one
    each (the compiled decode attention with `compiled`), in torch ops or with the compiled layer glue. The packed step's logits and the keys/values it writes into the
    pool are no further from the same (bf16-valued) weights run in float32 than the bf16 module's own:
    same numerics, only the rounding order differs (the kernel keeps queries, scores and weights in
    float32 where the module rounds them to bf16)."""
    new_tokens, compiled = STEPS[step]
    if compiled and not attention_kernel.available():
        pytest.skip("numba is not installed")
    model = tiny_model(model_type)
    config = model.config
    generator = torch.Generator().manual_seed(1)
    shape = (config.num_layers, 10, config.num_kv_heads, 16, config.head_dim)
    pool = [torch.randn(shape, generator=generator).to(torch.bfloat16) for _ in range(2)]
    tokens = torch.randint(0, config.vocab_size, (3, max(new_tokens)), generator=generator)
    counts, lengths, slot_ids = torch.tensor(new_tokens), torch.tensor([6, 3, 0]), torch.tensor(slots)
    inputs = module_inputs(pool, tokens, counts, lengths, slot_ids)
    with torch.no_grad():
        module = model(*inputs)
        exact = tiny_model(model_type).float()(*inputs[:4], *(cache.float() for cache in inputs[4:]))
    before = [cache.clone() for cache in pool]
    logits = PackedTransformer(model, compiled=compiled).step(tokens, counts, lengths, slot_ids, *pool)
    assert logits.dtype == torch.float32
    errors = {"packed": [(logits - exact[0]).abs().max().item()], "module": [(module[0] - exact[0]).abs().max().item()]}
    for b, c in enumerate(counts.tolist()):
        for cache, module_new, exact_new in zip(pool, module[1:], exact[1:]):
            got = cache[:, slots[b], :, lengths[b] : lengths[b] + c].float()
            errors["packed"].append((got - exact_new[:, b, :, :c]).abs().max().item())
            errors["module"].append((module_new[:, b, :, :c].float() - exact_new[:, b, :, :c]).abs().max().item())
    # logits, then the largest error over the written keys and values (one bf16 step of slack: ~0.01)
    packed_errors, module_errors = ((e[0], max(e[1:])) for e in (errors["packed"], errors["module"]))
    for packed_error, module_error in zip(packed_errors, module_errors):
        assert packed_error <= 2 * module_error + 0.02, errors
    assert torch.equal(logits.argmax(-1), exact[0].argmax(-1))
    for cache, old in zip(pool, before):  # nothing else in the pool changed
        for s, n, c in zip(slots, lengths.tolist(), counts.tolist()):
            old[:, s, :, n : n + c] = cache[:, s, :, n : n + c]
        assert torch.equal(cache, old)


def test_the_engine_packs_bf16_on_this_cpu_and_decodes_as_the_module(tmp_path) -> None:
    from zerocheck.build import BuildOptions, build_artifacts

    options = BuildOptions(model="tiny", vocab_size=512, layers=2, hidden=64, heads=4, kv_heads=2, max_seq_len=64,
                           tokenizer_corpus_files=5)
    build_artifacts(options, tmp_path)
    packed = load_decoder(tmp_path, backend="torch", max_slots=2, dtype="bf16")
    assert isinstance(packed._step_fn, PackedTransformer) and packed.pool.keys.dtype == torch.bfloat16
    exact = load_decoder(tmp_path, backend="torch", max_slots=2, dtype="fp32")
    assert exact._step_fn is not packed._step_fn and exact.dtype == "fp32"
    prompt = list(range(3, 20))
    greedy = {}
    for name, engine in (("packed", packed), ("fp32", exact)):
        ids: list[int] = []
        for i in range(6):  # prefill, then decode through the KV cache
            step = engine.step([StepRequest("s", prompt if i == 0 else [ids[-1]], i == 0, False)])
            assert step.errors == [None]
            ids.append(int(step.logits[0].argmax()))
        greedy[name] = ids
    assert greedy["packed"] == greedy["fp32"]  # deterministic: the tiny model's top-1 margins outlast bf16


def test_int4_codes_give_back_q4_1_weights() -> None:
    """Weights made as GGUF Q4_1 makes them (blocks of 32 inputs, w = q d + m, q 0..15 spanning the block) come
    back from the packed int4 GEMM with their own codes: the error is the bf16 rounding of d and m only."""
    if not int4_supported(tiny_model("llama").config):
        pytest.skip("no CPU int4 GEMM in this torch")
    generator = torch.Generator().manual_seed(2)
    rows, inputs = 48, 4 * INT4_GROUP
    codes = torch.randint(0, 16, (rows, inputs // INT4_GROUP, INT4_GROUP), generator=generator)
    codes[..., 0], codes[..., 1] = 0, 15  # every block spans its range, as Q4_1's min/max make it
    step = torch.rand(rows, inputs // INT4_GROUP, 1, generator=generator) * 0.01 + 0.001
    low = torch.randn(rows, inputs // INT4_GROUP, 1, generator=generator) * 0.05
    weight = (codes * step + low).reshape(rows, inputs)
    dequantised = _linear_int4(torch.eye(inputs, dtype=torch.bfloat16), _pack_int4(weight)).float().t()
    slack = (16 * step + low.abs()).expand(-1, -1, INT4_GROUP).reshape(rows, inputs) * 2**-7  # bf16 d and m
    assert bool(((dequantised - weight).abs() <= slack).all())


def test_the_bf16_scale_and_zero_pair_is_the_best_of_its_neighbours() -> None:
    """Each group's bf16 (scale, zero) reproduces it at least as well as rounding both (never NaN, also for a
    zero of exactly 0 and tiny scales), and better for many groups."""
    generator = torch.Generator().manual_seed(5)
    groups = torch.randn(256, 6, INT4_GROUP, generator=generator) * 0.03
    groups[0, 0] = torch.linspace(-1e-3, 1e-3, INT4_GROUP)  # its zero rounds to exactly 0: a step below is NaN
    groups[1, 0] = 1e-30  # a flat group: the tiny scale
    low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = (high - low).clamp(min=torch.finfo(torch.float32).tiny) / 15
    centred = torch.round((groups - low) / scale).clamp_(0, 15) - 8
    zero = low + 8 * scale

    def error(s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return (centred * s.float() + z.float() - groups).square().sum(-1)

    rounded = error(scale.to(torch.bfloat16), zero.to(torch.bfloat16))
    chosen_scale, chosen_zero = _nearest_bf16_pair(groups, centred, scale, zero)
    assert chosen_scale.dtype == chosen_zero.dtype == torch.bfloat16
    assert bool(torch.isfinite(chosen_scale).all()) and bool(torch.isfinite(chosen_zero).all())
    chosen = error(chosen_scale, chosen_zero)
    assert bool((chosen <= rounded).all()) and (chosen < rounded).float().mean() > 0.3


def wide_and_single_steps(plain: PackedTransformer, other: PackedTransformer, seed: int,
                          tokens_per_row: int) -> tuple[torch.Tensor, ...]:
    """The logits of `plain` and `other` for the same step of two rows of `tokens_per_row` tokens, then for the
    same one-row, one-token step, each on its own copy of one random KV pool: (wide plain, wide other, single
    plain, single other)."""
    config = plain.config
    generator = torch.Generator().manual_seed(seed)
    shape = (config.num_layers, 4, config.num_kv_heads, 16, config.head_dim)
    pool = [torch.randn(shape, generator=generator).to(torch.bfloat16) for _ in range(2)]
    wide = (torch.randint(0, config.vocab_size, (2, tokens_per_row), generator=generator),
            torch.tensor([tokens_per_row, min(2, tokens_per_row)]), torch.tensor([4, 1]), torch.tensor([0, 1]))
    single = (torch.tensor([[7]]), torch.tensor([1]), torch.tensor([5]), torch.tensor([2]))
    return tuple(model.step(*step, *(c.clone() for c in pool)) for step in (wide, single) for model in (plain, other))


def test_int4_serves_one_row_steps_only() -> None:
    """With int4_single_row a one-row, one-token step runs on the int4 weights (close to the bf16 step, same
    top-1 on this model); any wider step is the bf16 step itself."""
    model = tiny_model("llama")
    if not int4_supported(model.config):
        pytest.skip("no CPU int4 GEMM in this torch")
    wide_bf16, wide_int4, bf16_logits, int4_logits = wide_and_single_steps(
        PackedTransformer(model), PackedTransformer(model, int4_single_row=True), 3, 3)
    assert torch.equal(wide_bf16, wide_int4)
    assert not torch.equal(bf16_logits, int4_logits)  # the int4 weights did run
    assert (int4_logits - bf16_logits).abs().max() < 0.25 * bf16_logits.std()
    assert torch.equal(int4_logits.argmax(-1), bf16_logits.argmax(-1))


def test_int4_single_row_is_refused_where_the_widths_do_not_divide() -> None:
    model = Transformer(DecoderConfig.from_hf_dict({**TINY, "model_type": "llama", "intermediate_size": 200}))
    with pytest.raises(ValueError, match="multiples of 32"):
        PackedTransformer(model.to(torch.bfloat16), int4_single_row=True)


@pytest.mark.skipif(not int8_kernel.available(), reason="numba is not installed")
def test_the_int8_lm_head_serves_compiled_one_row_steps_only() -> None:
    """With int8_lm_head_single_row a compiled one-row, one-token step's logits are lm_head's int8 copy times the
    final norm's output (close to the bf16 logits, same top-1 on this model); any wider step is the bf16 step
    itself; without the compiled kernels it is refused."""
    model = tiny_model("llama")
    wide_bf16, wide_int8, bf16_logits, int8_logits = wide_and_single_steps(
        PackedTransformer(model, compiled=True), PackedTransformer(model, compiled=True, int8_lm_head_single_row=True),
        4, 1)
    assert torch.equal(wide_bf16, wide_int8)
    assert int8_logits.shape == bf16_logits.shape and int8_logits.dtype == torch.float32
    assert not torch.equal(bf16_logits, int8_logits)  # the int8 copy did run
    assert (int8_logits - bf16_logits).abs().max() < 0.05 * bf16_logits.std()
    assert torch.equal(int8_logits.argmax(-1), bf16_logits.argmax(-1))
    with pytest.raises(ValueError, match="needs compiled=True"):
        PackedTransformer(model, int8_lm_head_single_row=True)
