"""ntpref's LAPACK results do not depend on the BLAS thread count (ntpref.blas): OpenBLAS splits a blocked
factorisation by its thread count, which changes the last bits of λ_min of a 400 × 400 Gram matrix and of the
Q of a 512 × 500 QR between 1 and 2 threads unless ntpref pins them to one."""
import numpy as np
from threadpoolctl import threadpool_limits

from ntpref.shallow import ntk
from ntpref.twostage.generators import random_realizable


def _under(threads, fn):
    with threadpool_limits(limits=threads, user_api="blas"):
        return fn()


def test_min_eigenvalue_is_the_same_for_any_blas_thread_count():
    A = np.random.default_rng(0).standard_normal((400, 300))
    G = A @ A.T                                                   # singular: λ_min is rounding, the most fragile
    values = [_under(t, lambda: ntk.min_eigenvalue(G)) for t in (1, 2)]
    assert values[0] == values[1] and abs(values[0]) < 1e-10 * np.max(G)


def test_orthonormal_embedding_is_the_same_for_any_blas_thread_count():
    E = [_under(t, lambda: random_realizable(K=500, N=2, seed=3, embedding="orthonormal", d=512).dataset.E)
         for t in (1, 2)]
    assert np.array_equal(E[0], E[1])
    np.testing.assert_allclose(E[0].T @ E[0], np.eye(500), atol=1e-12)   # an orthonormal frame
