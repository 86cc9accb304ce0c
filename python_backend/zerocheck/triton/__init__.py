"""What the `model.py` adapters share: config parsing, tensor conversion, metrics, watchdogs; the only
layer that deals with Triton's `pb_utils` (passed in, never imported)."""
