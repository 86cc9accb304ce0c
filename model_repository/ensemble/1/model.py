"""`ensemble`: the text door under the name tensorrtllm_backend clients call; forwards every request to
`generate`, which runs every door's sequences in one batch (zerocheck.triton.forward).

A Python model rather than a Triton ensemble over `generate`: Triton 2.51 does not pass a client's
cancellation through an ensemble to a decoupled step, and the KV slot must be freed at once.
"""
import triton_python_backend_utils as pb_utils

from zerocheck.triton.forward import forwarding_model

TritonPythonModel = forwarding_model(pb_utils)
