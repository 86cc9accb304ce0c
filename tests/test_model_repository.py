"""The model repository's configs agree with the package's tables and with each other (no server)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from zerocheck.api.request import ENGINE_INPUTS, GENERATE_INPUTS, TOKEN_INPUTS
from zerocheck.triton.config import (ConfigError, DecoderParameters, ForwardParameters, GenerateParameters,
                                     ModelConfig, SamplerParameters, parameters)
from zerocheck.wire.sampling import SAMPLER_INPUTS, TensorSpec
from zerocheck.wire.step import CHECKED_STEP_INPUTS, DECODER_INPUTS, DECODER_OUTPUTS

REPOSITORY = Path(__file__).resolve().parents[1] / "model_repository"
SAMPLER_MODELS = ("zero_check_sampler", "penalties", "softmax", "top_k_top_p", "multinomial", "checked_sampler")
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


@pytest.mark.parametrize("model, table", [("generate", ENGINE_INPUTS), ("ensemble", GENERATE_INPUTS),
                                          ("tensorrt_llm_bls", GENERATE_INPUTS), ("tensorrt_llm", TOKEN_INPUTS)])
def test_generation_inputs_follow_the_table(model, table):
    declared = tensors(config(model), "input")
    assert list(declared) == [spec.name for spec in table]
    for spec in table:
        assert declared[spec.name] == (spec.dtype, ",".join(str(d) for d in spec.dims)), spec.name


def test_the_text_doors_are_the_same_model():
    strip = lambda text: [line for line in text.splitlines() if not line.startswith("#") and "name:" not in line[:6]]  # noqa: E731
    assert strip(config("ensemble")) == strip(config("tensorrt_llm_bls"))


@pytest.mark.parametrize("door", ["ensemble", "tensorrt_llm_bls", "tensorrt_llm"])
def test_generate_takes_every_doors_inputs_and_gives_its_outputs(door):
    """A door forwards its request as it came to `generate`, asking for its own outputs: `generate` declares
    them all, with the same types."""
    engine = config("generate")
    for section in ("input", "output"):
        declared = tensors(engine, section)
        for name, (dtype, _) in tensors(config(door), section).items():
            assert name in declared and declared[name][0] == dtype, (door, section, name)


def test_one_admission_uses_every_kv_slot_by_default():
    """`generate` admits as many sequences as the decoder has KV-cache slots (max_concurrent_sequences 0)."""
    assert parameters(GenerateParameters, model_config("generate")).max_concurrent_sequences == 0
    engine = ModelConfig({"model_config": json.dumps({"name": "generate"}),
                          "model_repository": str(REPOSITORY / "generate")})
    assert engine.sibling_parameter("decoder", "max_slots") == str(parameters(DecoderParameters,
                                                                              model_config("decoder")).max_slots)
    with pytest.raises(ConfigError, match="expected parameter max_slot once"):
        engine.sibling_parameter("decoder", "max_slot")


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


def specs(text: str, section: str) -> list[TensorSpec]:
    """The tensors of a config section as the wire's TensorSpecs."""
    start = text.index(f"{section} [")
    end = text.index("\n]", start)
    return [TensorSpec(m[0], m[1], tuple(int(d) for d in m[2].split(",")), "optional: true" in m[3],
                       "allow_ragged_batch: true" in m[3]) for m in TENSOR.findall(text[start:end])]


@pytest.mark.parametrize("model", SAMPLER_MODELS)
def test_sampler_models_declare_the_wires_sampling_inputs(model):
    """zerocheck.wire.sampling.SAMPLER_INPUTS is the one table: names, dtypes, dims, optional, ragged."""
    assert [spec for spec in specs(config(model), "input") if spec.optional] == list(SAMPLER_INPUTS)


@pytest.mark.parametrize("model", ["decoder", "checked_step", "zero_check_step"])
def test_step_models_declare_the_step_wire(model):
    assert specs(config(model), "input") == list(CHECKED_STEP_INPUTS if model == "checked_step" else DECODER_INPUTS)
    if model == "decoder":
        assert specs(config(model), "output") == list(DECODER_OUTPUTS)


def test_the_checked_chain_reads_the_decoders_registered_rows():
    """In checked_step every sampler input of every chain model comes from the decoder's outputs."""
    text = config("checked_step")
    for name, body in re.findall(r'model_name: "(\w+)"(.*?)\n    \}', text, re.S):
        if name == "decoder":
            continue
        mapped = dict(re.findall(r'input_map \{ key: "(\w+)" value: "(\w+)"', body))
        assert {spec.name: "_" + spec.name for spec in SAMPLER_INPUTS}.items() <= mapped.items(), name


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


def model_config(model: str, **extra: str) -> ModelConfig:
    """The ModelConfig Triton would hand `model`'s initialize (its string parameters), plus `extra`."""
    found = dict(re.findall(r'parameters \{ key: "(\w+)" value: \{ string_value: "([^"]*)" \} \}', config(model)))
    return ModelConfig({"model_config": json.dumps({"name": model, "parameters": {
        key: {"string_value": value} for key, value in {**found, **extra}.items()}})})


@pytest.mark.parametrize("model, kind", [("decoder", DecoderParameters), ("generate", GenerateParameters),
                                         ("ensemble", ForwardParameters), ("tensorrt_llm_bls", ForwardParameters),
                                         ("tensorrt_llm", ForwardParameters), ("zero_check_sampler", SamplerParameters)])
def test_shipped_parameters_parse_into_their_dataclass_without_test_knobs(model, kind):
    assert isinstance(parameters(kind, model_config(model)), kind)
    assert not [key for key in model_config(model).parameters if key.startswith("test_")]


def test_a_step_fits_the_step_models_batch():
    step_batch = parameters(GenerateParameters, model_config("generate")).max_step_batch
    for step_model in ("decoder", "checked_step"):
        assert step_batch <= int(re.search(r"max_batch_size: (\d+)", config(step_model))[1]), step_model


def test_a_bad_parameter_is_named():
    with pytest.raises(ConfigError, match="model decoder: unknown parameter.s. max_slot;"):
        parameters(DecoderParameters, model_config("decoder", max_slot="8"))
    with pytest.raises(ConfigError, match="model generate: parameter exit_on_dead_instance must be true or false, got 'yes'"):
        parameters(GenerateParameters, model_config("generate", exit_on_dead_instance="yes"))
    with pytest.raises(ConfigError, match="model decoder: parameter max_slots must be >= 1, got 0"):
        parameters(DecoderParameters, model_config("decoder", max_slots="0"))
    with pytest.raises(ConfigError, match="model decoder: parameter max_slots must be an int, got 'many'"):
        parameters(DecoderParameters, model_config("decoder", max_slots="many"))
    incomplete = model_config("zero_check_sampler")
    del incomplete.parameters["device"]
    with pytest.raises(ConfigError, match="model zero_check_sampler: parameter device is required"):
        parameters(SamplerParameters, incomplete)


def test_gpu_instances_are_placed_by_triton_and_run_where_they_are_placed(tmp_path):
    """`zerocheck serve` on a GPU machine: the decoder and the zero-check sampler get KIND_GPU instance
    groups in a copy of the repository, and an instance runs on the GPU Triton hands it."""
    from zerocheck.serve.cli import place_on_gpus
    from zerocheck.serve.repository import GPU_MODELS, copy_repository

    copied = copy_repository(tmp_path / "repository", gpu_models=GPU_MODELS)
    for model in ("decoder", "zero_check_sampler", "generate", "preprocessing"):
        text = (copied / model / "config.pbtxt").read_text()
        kind = re.search(r"instance_group \[ \{ count: 1 kind: (KIND_\w+) \} \]", text)[1]
        assert kind == ("KIND_GPU" if model in GPU_MODELS else "KIND_CPU"), model
    assert "KIND_GPU" not in config("decoder")  # the shipped repository is untouched
    args = {"model_config": json.dumps({"name": "decoder", "parameters": {}}),
            "model_instance_kind": "GPU", "model_instance_device_id": "1"}
    assert ModelConfig(args).instance_device("auto") == ModelConfig(args).instance_device("cuda") == "cuda:1"
    with pytest.raises(ConfigError, match="model decoder: parameter device is cpu, but the instance is KIND_GPU .GPU 1."):
        ModelConfig(args).instance_device("cpu")
    cpu = {**args, "model_instance_kind": "CPU", "model_instance_device_id": "0"}
    assert [ModelConfig(cpu).instance_device(d) for d in ("auto", "cpu", "cuda")] == ["auto", "cpu", "cuda"]
    assert (place_on_gpus("gpu"), place_on_gpus("cpu")) == (True, False)
    import torch

    assert place_on_gpus("auto") == torch.cuda.is_available()
