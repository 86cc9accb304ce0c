"""A model process's OpenMP spin count, set before torch and numba load their OpenMP runtimes.

libgomp reads GOMP_SPINCOUNT once, when it loads: torch's copy at `import torch`, numba's (the system
libgomp, `zerocheck.jit`) at its first parallel kernel. `zerocheck serve` gives every model process the
same bounded spin (`zerocheck.serve.binary.THREAD_ENVIRONMENT`); a model whose own threads must stay
awake longer sets its count here, in `initialize`, before importing anything that loads torch.
"""
from __future__ import annotations

import os
import sys


def set_spin_count(count: int) -> None:
    """GOMP_SPINCOUNT=count for this process's OpenMP runtimes (0: leave the server's setting). Raises if
    torch or numba is already imported: the count would not reach the runtime it loaded."""
    if count == 0:
        return
    loaded = [name for name in ("torch", "numba") if name in sys.modules]
    if loaded:
        raise RuntimeError(f"GOMP_SPINCOUNT must be set before {' and '.join(loaded)} is imported "
                           "(libgomp reads it once, when it loads)")
    os.environ["GOMP_SPINCOUNT"] = str(count)
