"""Start and stop a real tritonserver over a model repository (`TritonServer`) and the `zerocheck serve` command."""
from zerocheck.serve.binary import TritonServerNotFound, find_tritonserver
from zerocheck.serve.server import TritonServer, TritonServerError

__all__ = ["TritonServer", "TritonServerError", "TritonServerNotFound", "find_tritonserver"]
