"""`tensorrt_llm_bls`: the `generate` model under the name of tensorrtllm_backend's BLS model (the same
inputs and outputs as `ensemble`)."""
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "zerocheck_generate_model", pathlib.Path(__file__).resolve().parents[2] / "generate" / "1" / "model.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
TritonPythonModel = _module.TritonPythonModel
