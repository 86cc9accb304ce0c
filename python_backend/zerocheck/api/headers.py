"""Header names of the serving contract, shared by the server launcher and the clients."""
from __future__ import annotations

API_KEY_HEADER = "admin-key"  # the restricted APIs' key (Triton's --http-restricted-api)
# gRPC clients send the key as metadata `triton-grpc-protocol-<header>` (Triton adds the prefix).
GRPC_API_KEY_HEADER = f"triton-grpc-protocol-{API_KEY_HEADER}"

# The sampler path, per request and per answer. A request asks for the zero-check path with header
# `zerocheck: on|off`, or by listing ZERO_CHECK_BETA in `anthropic-beta` (a comma-separated list, as
# Anthropic's SDK sends it); every answer of the HTTP front end says which path served it.
SWITCH_HEADER = "zerocheck"
BETA_HEADER = "anthropic-beta"
ZERO_CHECK_BETA = "zero-check-layer-2024-06"
BYPASS_HEADER = "X-ZeroCheck-Bypass"  # true: the check layer was skipped (the zero-check path served it)
ANTHROPIC_BYPASS_HEADER = "X-Anthropic-ZeroCheck-Bypass"  # the same value, under the name Anthropic's clients read
SAMPLER_HEADER = "X-ZeroCheck-Sampler"  # zero_check | checked
