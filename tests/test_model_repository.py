"""The model repository's configs agree with the package's tables and with each other (no server)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from zerocheck.sampling import SAMPLING_PARAMETERS
from zerocheck.serving.inputs import GENERATE_INPUTS, TOKEN_INPUTS
from zerocheck.serving.sampler_inputs import SCALARS

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
SAMPLER_MODELS = ("decoder", "zero_check_sampler", "penalties", "softmax", "top_k_top_p", "multinomial")
TENSOR = re.compile(r'\{\s*name:\s*"(\w+)"\s*data_type:\s*(\w+)\s*dims:\s*\[([^\]]*)\]([^}]*)\}')


def config(model: str) -> str:
    return (REPOSITORY / model / "config.pbtxt").read_text()


def tensors(text: str, section: str) -> dict[str, tuple[str, str]]:
    start = text.index(f"{section} [")
    end = text.index("\n]", start)
    return {m[0]: (m[1], m[2].replace(" ", "")) for m in TENSOR.findall(text[start:end])}


def test_every_model_has_a_config_and_a_version():
    models = [p for p in REPOSITORY.iterdir() if p.is_dir()]
    assert len(models) == 15
    for model in models:
        text = config(model.name)
        assert f'name: "{model.name}"' in text
        assert (model / "1").is_dir()
        if 'backend: "python"' in text:
            assert (model / "1" / "model.py").is_file()


@pytest.mark.parametrize("model, table", [("generate", GENERATE_INPUTS), ("ensemble", GENERATE_INPUTS),
                                          ("tensorrt_llm_bls", GENERATE_INPUTS), ("tensorrt_llm", TOKEN_INPUTS)])
def test_generation_inputs_follow_the_table(model, table):
    declared = tensors(config(model), "input")
    assert list(declared) == [spec.name for spec in table]
    for spec in table:
        assert declared[spec.name] == (spec.dtype, ",".join(str(d) for d in spec.dims)), spec.name


def test_generate_ensemble_and_bls_are_the_same_model():
    strip = lambda text: [line for line in text.splitlines() if not line.startswith("#") and "name:" not in line[:6]]  # noqa: E731
    assert strip(config("generate")) == strip(config("ensemble")) == strip(config("tensorrt_llm_bls"))


def test_tensorrtllm_backend_outputs_exist():
    """Every output of tensorrtllm_backend's ensemble and tensorrt_llm models (May 2025) is declared."""
    ensemble = {"text_output", "cum_log_probs", "output_log_probs", "context_logits", "generation_logits",
                "batch_index", "sequence_index", "kv_cache_alloc_new_blocks", "kv_cache_reused_blocks",
                "kv_cache_alloc_total_blocks", "arrival_time_ns", "first_scheduled_time_ns", "first_token_time_ns",
                "last_token_time_ns", "acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens",
                "num_input_tokens", "num_output_tokens"}
    tokens = ensemble - {"text_output"} | {"output_ids", "sequence_length"}
    assert ensemble <= set(tensors(config("ensemble"), "output"))
    assert tokens <= set(tensors(config("tensorrt_llm"), "output"))


@pytest.mark.parametrize("model", SAMPLER_MODELS)
def test_sampler_models_take_every_sampling_input(model):
    declared = tensors(config(model), "input")
    assert set(SCALARS) | {"history", "bad_words", "logit_bias_ids", "logit_bias_values"} <= set(declared)
    for spec in SAMPLING_PARAMETERS:
        assert declared[spec.name][0] == {float: "TYPE_FP32", int: "TYPE_INT32"}[spec.kind]


def test_ensembles_connect_existing_models_and_tensors():
    for model in ("checked_sampler", "checked_step", "zero_check_step"):
        text = config(model)
        for step in re.findall(r'model_name: "(\w+)"(.*?)\n    \}', text, re.S):
            name, body = step
            inputs, outputs = tensors(config(name), "input"), tensors(config(name), "output")
            assert set(re.findall(r'input_map \{ key: "(\w+)"', body)) <= set(inputs), (model, name)
            assert set(re.findall(r'output_map \{ key: "(\w+)"', body)) <= set(outputs), (model, name)


def test_streaming_models_do_not_batch_postprocessing():
    """Dynamic batching in postprocessing makes streams arrive in bursts; generate detokenizes in-process."""
    assert "dynamic_batching" not in config("postprocessing")
    assert "decoupled: true" in config("generate")


def test_decoder_batches_steps():
    text = config("decoder")
    assert "dynamic_batching" in text and "allow_ragged_batch: true" in text
