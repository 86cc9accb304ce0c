"""numba for the package's compiled CPU kernels (`zerocheck.sampling.cpu_kernel`,
`zerocheck.decoder.attention_kernel`), with one threading layer for all of them, chosen here at import.

OpenMP ("omp", numba's build against the system libgomp) when it loads: its two threads run a parallel
loop in half the time on 2 cores, where numba's own "workqueue" layer measured 0.7-1.7x the serial time
(a 96-item loop: serial 361 us, workqueue 339-606 us, omp 184 us). Its threads spin between calls as long
as GOMP_SPINCOUNT / OMP_WAIT_POLICY allow (`zerocheck serve` bounds both for every stub). Without
libgomp, workqueue, logged. `numba` is None when numba is not installed (the kernels' callers then run
their torch paths).
"""
from __future__ import annotations

import logging

log = logging.getLogger("zerocheck")

try:
    import numba
except ImportError:
    numba = None

if numba is not None:
    try:
        from numba.np.ufunc import omppool  # noqa: F401  (loads only where libgomp is installed)

        numba.config.THREADING_LAYER = "omp"
    except (ImportError, OSError) as error:
        log.warning("numba's OpenMP threading layer is unavailable (%s): compiled kernels use workqueue", error)
        numba.config.THREADING_LAYER = "workqueue"


def available() -> bool:
    return numba is not None
