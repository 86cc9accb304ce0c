"""`tensorrt_llm`: tensorrtllm_backend's token-level door (ids in, ids out; config parameter `interface:
tokens`); forwards every request to `generate`, which answers it in that interface
(zerocheck.triton.forward)."""
import triton_python_backend_utils as pb_utils

from zerocheck.triton.forward import forwarding_model

TritonPythonModel = forwarding_model(pb_utils)
