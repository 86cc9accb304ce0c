"""Header names of the serving contract, shared by the server launcher and the clients."""
from __future__ import annotations

API_KEY_HEADER = "admin-key"  # the restricted APIs' key (Triton's --http-restricted-api)
# gRPC clients send the key as metadata `triton-grpc-protocol-<header>` (Triton adds the prefix).
GRPC_API_KEY_HEADER = f"triton-grpc-protocol-{API_KEY_HEADER}"
