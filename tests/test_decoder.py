"""The zerocheck decoder against transformers on the same weights (Llama, Qwen2, Mistral)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, MistralConfig, Qwen2Config

from zerocheck.build import BuildOptions, build_artifacts
from zerocheck.decoder import DecoderConfig, StepRequest, Transformer, load_decoder, load_transformer
from zerocheck.decoder.engine import choose_backend, choose_dtype, variant_options
from zerocheck.tokenizer import stdlib_corpus_files, train_bpe_tokenizer

TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def full_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """Last-position logits [V] of `ids` recomputed from scratch (no cache: one masked dummy position)."""
    config, t = model.config, len(ids)
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    mask = torch.cat([torch.zeros(t, 1, dtype=torch.bool), causal], dim=-1)[None]
    empty = torch.zeros(config.num_layers, 1, config.num_kv_heads, 1, config.head_dim)
    with torch.no_grad():
        logits, _, _ = model(torch.tensor([ids]), torch.arange(t)[None], mask, torch.tensor([t - 1]), empty, empty)
    return logits[0]


def write_checkpoint(directory: Path, config) -> Path:
    """A seeded tiny HF checkpoint with a trained tokenizer, as a user's --hf-checkpoint would be."""
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # non-trivial biases, so a dropped q/k/v bias would show
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    model.save_pretrained(directory, safe_serialization=True)
    train_bpe_tokenizer(directory, vocab_size=config.vocab_size, files=stdlib_corpus_files(10))
    return directory


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts")
    options = BuildOptions(model="tiny", vocab_size=512, layers=2, hidden=64, heads=4, kv_heads=2, max_seq_len=64,
                           tokenizer_corpus_files=20)
    build_artifacts(options, out)
    return out


def test_logits_match_transformers_llama(artifacts: Path) -> None:
    hf = AutoModelForCausalLM.from_pretrained(artifacts / "hf_model").eval()
    ours = load_transformer(artifacts / "hf_model")
    ids = torch.randint(0, 512, (1, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = hf(ids).logits[0]
    for t in (1, 7, 23):
        torch.testing.assert_close(full_logits(ours, ids[0, :t].tolist()), expected[t - 1], atol=1e-4, rtol=0)


def test_cached_engine_matches_transformers(artifacts: Path) -> None:
    hf = AutoModelForCausalLM.from_pretrained(artifacts / "hf_model").eval()
    engine = load_decoder(artifacts, backend="torch", max_slots=2, dtype="fp32")
    ids = list(range(40, 60))
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0]
    got = [engine.step([StepRequest("s", ids[:12], start=True, end=False)]).logits[0]]
    got += [engine.step([StepRequest("s", [t], start=False, end=False)]).logits[0] for t in ids[12:]]
    torch.testing.assert_close(torch.stack(got), expected[11:], atol=1e-4, rtol=0)


def test_hf_save_load_round_trip(artifacts: Path, tmp_path: Path) -> None:
    model_dir = artifacts / "hf_model"
    config = DecoderConfig.from_pretrained(model_dir)
    assert (config.model_type, config.vocab_size, config.num_layers, config.num_kv_heads) == ("llama", 512, 2, 2)
    hf = AutoModelForCausalLM.from_pretrained(model_dir)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    first, second = load_transformer(model_dir).state_dict(), load_transformer(tmp_path).state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[name], second[name]) for name in first)


@pytest.mark.parametrize(
    "config",
    [
        LlamaConfig(**TINY),
        Qwen2Config(**TINY, tie_word_embeddings=True),
        MistralConfig(**TINY, head_dim=32),
        LlamaConfig(**TINY, rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                             "original_max_position_embeddings": 16}),
    ],
    ids=["llama", "qwen2-tied", "mistral-head-dim", "llama3-rope"],
)
def test_hf_checkpoint_build(tmp_path: Path, config) -> None:
    checkpoint = write_checkpoint(tmp_path / "checkpoint", config)
    manifest = build_artifacts(BuildOptions(hf_checkpoint=str(checkpoint), max_seq_len=64), tmp_path / "out")
    assert manifest["vocab_size"] == 512 and manifest["model"]["model_type"] == config.model_type
    hf = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    engine = load_decoder(tmp_path / "out", backend="torch", dtype="fp32")
    ids = [5, 99, 300, 7, 42] * 6
    with torch.no_grad():
        expected = hf(torch.tensor([ids])).logits[0, -1]
    got = engine.step([StepRequest("a", ids, start=True, end=True)])
    assert got.messages == [None]
    torch.testing.assert_close(got.logits[0], expected, atol=1e-4, rtol=0)


def test_unsupported_configs_are_clear_errors(artifacts: Path) -> None:
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        DecoderConfig.from_hf_dict({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="rope_type 'yarn' is not supported"):
        DecoderConfig.from_hf_dict({"model_type": "llama", "rope_parameters": {"rope_type": "yarn"}})


def test_sliding_window_longer_than_max_seq_len_is_refused(tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "checkpoint", MistralConfig(**TINY, sliding_window=32))
    build_artifacts(BuildOptions(hf_checkpoint=str(checkpoint), max_seq_len=64), tmp_path / "out")
    with pytest.raises(ValueError, match="sliding_window 32"):
        load_decoder(tmp_path / "out", backend="torch")
    assert load_decoder(tmp_path / "out", backend="torch", max_seq_len=32).pool.max_seq_len == 32


@pytest.mark.parametrize("requested, backend, flags, chosen", [
    ("auto", "torch", {"avx512f", "amx_bf16"}, "bf16"), ("auto", "torch", {"avx512_bf16"}, "bf16"),
    ("auto", "torch", {"avx2"}, "fp32"), ("auto", "tensorrt", {"amx_bf16"}, "fp32"),
    ("fp32", "torch", {"amx_bf16"}, "fp32"), ("bf16", "torch", set(), "bf16"), ("auto", "openvino", {"avx2"}, "int8"),
    ("auto", "openvino", {"amx_bf16"}, "int8"), ("int4", "openvino", set(), "int4")])
def test_dtype_is_chosen_once_from_the_cpu(requested, backend, flags, chosen) -> None:
    assert choose_dtype(requested, backend, flags) == chosen


@pytest.mark.parametrize("requested, dtype, device, cuda, chosen", [
    ("auto", "auto", "auto", False, "openvino"), ("auto", "auto", "auto", True, "torch"),
    ("auto", "auto", "cpu", True, "openvino"), ("auto", "fp32", "auto", False, "openvino"),
    ("auto", "fp32", "cuda", True, "torch"), ("auto", "bf16", "auto", False, "torch"),
    ("auto", "int8", "auto", True, "openvino"), ("auto", "int4", "auto", False, "openvino"),
    ("openvino", "auto", "auto", True, "openvino"), ("torch", "fp32", "cpu", False, "torch")])
def test_backend_is_chosen_once_for_dtype_and_device(requested, dtype, device, cuda, chosen) -> None:
    assert choose_backend(requested, dtype, device, cuda) == chosen


@pytest.mark.parametrize("dtype, device, cuda, chosen", [
    ("auto", "auto", True, "tensorrt"), ("fp32", "cuda", True, "tensorrt"), ("auto", "cuda:1", True, "tensorrt"),
    ("bf16", "auto", True, "torch"),  # the engine is the fp32 export
    ("int8", "auto", True, "openvino"), ("auto", "auto", False, "openvino"), ("auto", "cpu", True, "openvino")])
def test_a_built_tensorrt_engine_is_auto_on_a_gpu(dtype, device, cuda, chosen) -> None:
    """`tensorrt_ready`: decoder.plan is built and `tensorrt` imports."""
    assert choose_backend("auto", dtype, device, cuda, tensorrt_ready=True) == chosen


def test_the_tensorrt_backend_runs_on_cuda_only(tmp_path: Path) -> None:
    from zerocheck.decoder.engine import choose_device

    assert choose_device("auto", "tensorrt", cuda_available=True) == "cuda"
    assert choose_device("cuda:1", "tensorrt", cuda_available=True) == "cuda:1"
    for requested, cuda_available, message in [("cpu", True, "backend tensorrt runs on CUDA only, got device cpu"),
                                               ("auto", False, "backend tensorrt asked for, but torch sees no CUDA"),
                                               ("cuda", False, "device cuda asked for, but torch sees no CUDA")]:
        with pytest.raises(ValueError, match=message):
            choose_device(requested, "tensorrt", cuda_available)
    with pytest.raises(ValueError, match="dtype bf16 needs backend torch, got tensorrt"):
        choose_dtype("bf16", "tensorrt", {"amx_bf16"})
    assert choose_dtype("auto", "tensorrt", {"amx_bf16"}) == "fp32"


def test_bad_dtype_requests_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="backend must be one of auto, openvino, torch, tensorrt, got 'trt'"):
        choose_backend("trt", "auto", "auto", False)
    with pytest.raises(ValueError, match="dtype must be one of auto, fp32, bf16, int8, int4, got 'fp16'"):
        choose_dtype("fp16", "torch", set())
    with pytest.raises(ValueError, match="dtype bf16 needs backend torch, got openvino"):
        choose_dtype("bf16", "openvino", {"amx_bf16"})
    with pytest.raises(ValueError, match="dtype int8 needs backend openvino, got torch"):
        choose_dtype("int8", "torch", {"amx_int8"})


@pytest.mark.parametrize("variant, options", [
    ("torch:bf16", {"backend": "torch", "dtype": "bf16", "int4_single_row": False, "int8_lm_head_single_row": False}),
    ("torch:bf16+int4", {"backend": "torch", "dtype": "bf16", "int4_single_row": True,
                         "int8_lm_head_single_row": False}),
    ("torch:bf16+int4+int8head", {"backend": "torch", "dtype": "bf16", "int4_single_row": True,
                                  "int8_lm_head_single_row": True}),
    ("openvino:fp32", {"backend": "openvino", "dtype": "fp32", "int4_single_row": False,
                       "int8_lm_head_single_row": False}),
])
def test_benchmark_variants_name_load_options(variant: str, options: dict) -> None:
    assert variant_options(variant) == options


@pytest.mark.parametrize("variant", ["torch", "torch:bf16+int8", "torch:+int4", "torch:bf16+int4+"])
def test_bad_benchmark_variants_are_refused(variant: str) -> None:
    with pytest.raises(ValueError, match="backend:dtype"):
        variant_options(variant)


def test_bf16_engine_follows_fp32_through_its_cache(artifacts: Path) -> None:
    """bf16 weights, activations and KV cache (its gather copies bf16 bits); float32 logits close to fp32's,
    the same top-1 at every cached step."""
    engines = {dtype: load_decoder(artifacts, backend="torch", max_slots=2, dtype=dtype) for dtype in ("fp32", "bf16")}
    assert engines["bf16"].pool.keys.dtype == torch.bfloat16 and engines["bf16"].dtype == "bf16"
    ids = list(range(40, 60))
    got = {}
    for dtype, engine in engines.items():
        rows = [engine.step([StepRequest("s", ids[:12], start=True, end=False)]).logits[0]]
        rows += [engine.step([StepRequest("s", [t], start=False, end=False)]).logits[0] for t in ids[12:]]
        got[dtype] = torch.stack(rows)
    assert got["bf16"].dtype == torch.float32
    scale = got["fp32"].abs().max()
    assert (got["bf16"] - got["fp32"]).abs().max() < 0.05 * scale
    assert torch.equal(got["bf16"].argmax(-1), got["fp32"].argmax(-1))
