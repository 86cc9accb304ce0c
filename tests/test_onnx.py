"""ONNX export of the decoder step (the source of the TensorRT engine): parity with torch, checked in OpenVINO;
the backend and device chosen at load."""
from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
import torch

from zerocheck.build import BuildOptions, build_artifacts
from zerocheck.decoder import StepRequest, load_decoder, load_transformer
from zerocheck.decoder.onnx_export import onnx_max_abs_diff


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("artifacts")
    options = BuildOptions(model="tiny", vocab_size=512, layers=2, hidden=64, heads=4, kv_heads=2, max_seq_len=48,
                           onnx=True, tokenizer_corpus_files=20)
    build_artifacts(options, out)
    return out


def test_manifest_records_the_onnx_check(artifacts: Path) -> None:
    report = json.loads((artifacts / "manifest.json").read_text())["onnx"]
    assert report["file"] == "decoder.onnx" and 0 <= report["max_abs_diff"] < 1e-3
    assert onnx_max_abs_diff(load_transformer(artifacts / "hf_model"), artifacts / "decoder.onnx") < 1e-4


def test_onnx_graph_has_dynamic_axes(artifacts: Path) -> None:
    graph = onnx.load(str(artifacts / "decoder.onnx"), load_external_data=False).graph
    names = [value.name for value in graph.input]
    assert names == ["tokens", "positions", "attention_mask", "last_index", "past_keys", "past_values"]
    tokens_dims = graph.input[0].type.tensor_type.shape.dim
    assert all(dim.dim_param for dim in tokens_dims)  # batch and new-token axes are symbolic
    assert [value.name for value in graph.output] == ["logits", "new_keys", "new_values"]


def test_the_default_backend_on_a_cpu_is_openvino_int8(artifacts: Path) -> None:
    engine = load_decoder(artifacts, max_slots=1, device="cpu")
    assert (engine.backend, engine.dtype) == ("openvino", "int8")


def test_the_device_is_chosen_once_for_the_backend(artifacts: Path) -> None:
    from zerocheck.decoder.engine import choose_device

    assert choose_device("auto", "torch", cuda_available=True) == "cuda"
    assert choose_device("auto", "openvino", cuda_available=True) == "cpu"  # openvino runs on the CPU here
    assert choose_device("auto", "torch", cuda_available=False) == "cpu"
    assert choose_device("cuda:1", "torch", cuda_available=True) == "cuda:1"  # a KIND_GPU instance's GPU
    refused = [("cuda", "torch", False, "torch sees no CUDA device"),
               ("cuda", "openvino", True, "device cuda needs backend torch"),
               ("cuda:0", "openvino", True, "device cuda needs backend torch"),
               ("gpu", "torch", True, "device must be one of auto, cpu, cuda or cuda:N, got 'gpu'"),
               ("cuda:x", "torch", True, "or cuda:N, got 'cuda:x'"), ("cpu:1", "torch", True, "or cuda:N, got 'cpu:1'")]
    for requested, backend, cuda_available, message in refused:
        with pytest.raises(ValueError, match=message):
            choose_device(requested, backend, cuda_available)
    if not torch.cuda.is_available():  # refused before any weight loads
        with pytest.raises(ValueError, match="backend tensorrt asked for, but torch sees no CUDA device"):
            load_decoder(artifacts, backend="tensorrt", device="auto")
        with pytest.raises(ValueError, match="backend tensorrt runs on CUDA only, got device cpu"):
            load_decoder(artifacts, backend="tensorrt", device="cpu")
    engine = load_decoder(artifacts, backend="torch", max_slots=1, dtype="fp32", device="auto")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert engine.device == expected and engine.pool.keys.device.type == expected
    assert engine.step([StepRequest("s", [3, 4, 5], True, True)]).logits.device.type == expected


def test_the_export_is_opt_in_and_a_bad_backend_a_clear_error(tmp_path: Path) -> None:
    options = BuildOptions(model="tiny", vocab_size=512, layers=1, hidden=32, heads=2, kv_heads=1, tokenizer_corpus_files=5)
    manifest = build_artifacts(options, tmp_path)
    assert manifest["onnx"] is None and not (tmp_path / "decoder.onnx").exists()
    with pytest.raises(ValueError, match="backend must be one of"):
        load_decoder(tmp_path, backend="trt")
    with pytest.raises(ValueError, match="backend must be one of"):
        load_decoder(tmp_path, backend="onnxruntime")
    if torch.cuda.is_available():
        with pytest.raises(FileNotFoundError, match="decoder.plan is missing: build with --tensorrt"):
            load_decoder(tmp_path, backend="tensorrt", device="cuda")


def test_qwen2_checkpoint_exports_with_biases_and_tied_embeddings(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    from zerocheck.tokenizer import stdlib_corpus_files, train_bpe_tokenizer

    config = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    torch.manual_seed(2)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)
    model.save_pretrained(tmp_path / "qwen2")
    train_bpe_tokenizer(tmp_path / "qwen2", vocab_size=512, files=stdlib_corpus_files(10))
    manifest = build_artifacts(BuildOptions(hf_checkpoint=str(tmp_path / "qwen2"), max_seq_len=32, onnx=True),
                               tmp_path / "out")
    assert manifest["onnx"]["max_abs_diff"] < 1e-4
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    with torch.no_grad():
        expected = model.eval()(torch.tensor([ids])).logits[0, -1]
    result = load_decoder(tmp_path / "out", backend="openvino", dtype="fp32").step([StepRequest("q", ids, True, True)])
    torch.testing.assert_close(result.logits[0], expected, atol=1e-4, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_tensorrt_backend_steps_as_the_torch_module_does(artifacts: Path, tmp_path: Path) -> None:
    """decoder.plan built from the tiny decoder.onnx, loaded by backend tensorrt (auto picks it once built),
    gives the fp32 module's logits on CUDA over a prefill and decode steps of two sequences."""
    pytest.importorskip("tensorrt")
    import shutil

    from zerocheck.build.tensorrt_engines import build_tensorrt_engine
    from zerocheck.decoder import DecoderConfig

    built = tmp_path / "artifacts"
    shutil.copytree(artifacts, built)
    config = DecoderConfig.from_pretrained(built / "hf_model")
    build_tensorrt_engine(built / "decoder.onnx", config, 48, built)
    trt = load_decoder(built, max_slots=2, device="auto")
    module = load_decoder(built, backend="torch", max_slots=2, dtype="fp32", device="cuda")
    assert (trt.backend, trt.dtype, trt.device) == ("tensorrt", "fp32", "cuda")
    steps = [[StepRequest("a", [5, 9, 11], True, False), StepRequest("b", [7], True, False)],
             [StepRequest("a", [3], False, False), StepRequest("b", [4, 8], False, False)],
             [StepRequest("a", [6], False, True), StepRequest("b", [2], False, True)]]
    for requests in steps:
        got, expected = trt.step(requests).logits, module.step(requests).logits
        assert got.device.type == "cuda" and torch.allclose(got, expected, atol=1e-3, rtol=1e-3)
