"""`BuildError`: a build step cannot run; the message says what is missing and how to get it."""


class BuildError(RuntimeError):
    """A build step cannot run; the message says what is missing."""
