"""zerocheck: a one-pass zero-check sampler and the Triton model repository that serves it."""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it (tool.setuptools.dynamic)
