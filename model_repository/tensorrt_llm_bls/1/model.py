"""`tensorrt_llm_bls`: the text door under the name of tensorrtllm_backend's BLS model (the same inputs and
outputs as `ensemble`); forwards every request to `generate` (zerocheck.triton.forward)."""
import triton_python_backend_utils as pb_utils

from zerocheck.triton.forward import forwarding_model

TritonPythonModel = forwarding_model(pb_utils)
