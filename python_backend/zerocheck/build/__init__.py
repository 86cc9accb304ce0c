"""Build the artifacts the model repository serves (`build_engines.py`, `zerocheck build`)."""
from zerocheck.build.options import BuildOptions
from zerocheck.build.pipeline import build_artifacts
from zerocheck.build.errors import BuildError

__all__ = ["BuildError", "BuildOptions", "build_artifacts"]
