"""`tensorrt_llm`: the `generate` model with the token interface (config parameter `interface: tokens`):
tensorrtllm_backend's token-level model, ids in and ids out, the same generation loop and samplers."""
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "zerocheck_generate_model", pathlib.Path(__file__).resolve().parents[2] / "generate" / "1" / "model.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
TritonPythonModel = _module.TritonPythonModel
