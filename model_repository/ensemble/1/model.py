"""`ensemble`: the `generate` model under the name tensorrtllm_backend clients call.

A Python copy rather than a Triton ensemble over `generate`: Triton 2.51 does not pass a client's
cancellation through an ensemble to a decoupled step, and the KV slot must be freed at once.
"""
import importlib.util
import pathlib

_spec = importlib.util.spec_from_file_location(
    "zerocheck_generate_model", pathlib.Path(__file__).resolve().parents[2] / "generate" / "1" / "model.py")
_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_module)
TritonPythonModel = _module.TritonPythonModel
