"""The Triton-free, torch-free serving contract: error codes and request-level types shared by the
models, the clients and the front end."""
