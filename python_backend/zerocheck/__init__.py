"""zerocheck: a one-pass zero-check sampler and the Triton model repository that serves it."""
from pathlib import Path

__version__ = "0.1.0"
REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: model_repository/, artifacts/ (editable install)
