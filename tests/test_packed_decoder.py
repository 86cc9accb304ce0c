"""`PackedTransformer` (the CPU bf16 step with oneDNN-packed weights) against the module it packs."""
from __future__ import annotations

import pytest
import torch

from zerocheck.decoder import DecoderConfig, StepRequest, Transformer, load_decoder
from zerocheck.decoder.packed import PackedTransformer, packing_available

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


def mixed_step(config: DecoderConfig) -> tuple[torch.Tensor, ...]:
    """Three rows with 6 cached positions of which 6, 3 and 0 are theirs, and 1, 4 and 2 new tokens."""
    generator = torch.Generator().manual_seed(1)
    past, t = 6, 4
    lengths, counts = torch.tensor([6, 3, 0]), torch.tensor([1, 4, 2])
    steps = torch.arange(t)
    tokens = torch.randint(0, config.vocab_size, (3, t), generator=generator)
    positions = lengths[:, None] + steps
    past_visible = (torch.arange(past)[None, None, :] < lengths[:, None, None]).expand(-1, t, -1)
    new_visible = (steps[None, :] <= steps[:, None])[None] & (steps[None, None, :] < counts[:, None, None])
    shape = (config.num_layers, 3, config.num_kv_heads, past, config.head_dim)
    caches = [torch.randn(shape, generator=generator).to(torch.bfloat16) for _ in range(2)]
    return tokens, positions, torch.cat([past_visible, new_visible], -1), counts - 1, *caches


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])  # qwen2: q/k/v biases
def test_packed_step_is_the_module_step_within_bf16_rounding(model_type: str) -> None:
    """The packed step's distance to the same (bf16-valued) weights run in float32 is no larger than the
    bf16 module's own: same numerics, only the rounding order differs (past and new attention are summed
    apart)."""
    model = tiny_model(model_type)
    inputs = mixed_step(model.config)
    exact_model = tiny_model(model_type).float()
    with torch.no_grad():
        module = model(*inputs)
        exact = exact_model(*inputs[:4], *(cache.float() for cache in inputs[4:]))
    packed = PackedTransformer(model)(*inputs)
    assert packed[0].dtype == torch.float32 and packed[1].dtype == packed[2].dtype == torch.bfloat16
    for got, bf16, want in zip(packed, module, exact):
        assert got.shape == want.shape
        packed_error = (got.float() - want).abs().max().item()
        module_error = (bf16.float() - want).abs().max().item()
        assert packed_error <= 2 * module_error + 1e-3, (packed_error, module_error)
    assert torch.equal(packed[0].argmax(-1), exact[0].argmax(-1))


def test_the_engine_packs_bf16_on_this_cpu_and_decodes_as_the_module(tmp_path) -> None:
    from zerocheck.build import BuildOptions, build_artifacts

    options = BuildOptions(model="tiny", vocab_size=512, layers=2, hidden=64, heads=4, kv_heads=2, max_seq_len=64,
                           onnx=False, tokenizer_corpus_files=5)
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
