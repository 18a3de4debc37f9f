"""One BLAS thread for the LAPACK calls whose results ntpref returns, so that they do not depend on the
thread count.

OpenBLAS splits the blocked factorisations behind ``np.linalg`` (the tridiagonal reduction of ``eigvalsh``,
Householder QR) by its thread count, and the split changes the rounding: λ_min of a 400 × 400 Gram matrix, or
the Q of a 512 × 500 QR, differs in its last bits between 1 and 2 threads. ntpref's own kernels are
bitwise deterministic for any Numba thread count; this makes its few LAPACK calls match them.

threadpoolctl is imported at the first call, not with ntpref, and the ``KMP_DUPLICATE_LIB_OK`` it sets in
``os.environ`` when imported (switching off an OpenMP safety check) is put back as it was: using ntpref
changes nothing in the caller's environment.
"""
from __future__ import annotations

import os

_FLAG = "KMP_DUPLICATE_LIB_OK"


def _threadpool_limits():
    before = os.environ.get(_FLAG)
    try:
        from threadpoolctl import threadpool_limits
    finally:
        if before is None:
            os.environ.pop(_FLAG, None)
        else:
            os.environ[_FLAG] = before
    return threadpool_limits


def one_blas_thread():
    """Context manager: NumPy's BLAS / LAPACK runs on one thread inside it (the previous limits return on
    exit)."""
    return _threadpool_limits()(limits=1, user_api="blas")
