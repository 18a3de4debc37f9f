"""Property-based tests over random shapes and scales, for all three models.

For every drawn problem: the closed-form gradient matches a central finite difference along a random
direction, the numba and numpy backends agree (rtol 1e-10), and the numba backend is bitwise identical
with 1 and 2 threads.
"""
import numba
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ntpref.shallow.model import loss_and_grad
from ntpref.shallow.rnn import rnn_loss_and_grad
from ntpref.twostage import model as tm
from ntpref.twostage.data import Dataset

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)
THREADS = [t for t in (1, 2) if t <= numba.config.NUMBA_NUM_THREADS]


def problem(kind, seed, n, T, d, m, scale):
    """(loss(params) -> float, grads(params, backend) -> list, params): one random problem of ``kind``."""
    rng = np.random.default_rng(seed)
    if kind == "twostage":
        K = d
        lengths = rng.integers(1, T + 1, n)
        tokens = np.where(np.arange(T)[None, :] < lengths[:, None], rng.integers(0, K, (n, T)), -1)
        ds = Dataset(tokens, lengths, rng.integers(0, K, n), rng.standard_normal((d, K)))
        params = [scale * rng.standard_normal((d, d)) for _ in range(2)]

        def run(p, backend="numba"):
            loss, g1, g2 = tm.loss_and_grad(ds, *p, backend)
            return loss, [g1, g2]
    else:
        X, y = rng.standard_normal((n, T, d)), rng.standard_normal(n)
        if kind == "shallow":
            params = [rng.choice([-1.0, 1.0], m), rng.standard_normal((m, d)), scale * rng.standard_normal((m, d, d))]
            fn = loss_and_grad
        else:
            params = [rng.choice([-1.0, 1.0], m), scale * rng.uniform(-1.5, 1.5, m), scale * rng.standard_normal((m, d))]
            fn = rnn_loss_and_grad

        def run(p, backend="numba"):
            _, loss, *grads = fn(X, y, *p, backend=backend)
            return loss, grads
    return run, params


PROBLEMS = st.tuples(st.sampled_from(["twostage", "shallow", "indrnn"]), st.integers(0, 2 ** 31),
                     st.integers(1, 7), st.integers(1, 9), st.integers(1, 5), st.integers(1, 9),
                     st.sampled_from([0.1, 0.5, 1.0, 3.0]))


@SETTINGS
@given(PROBLEMS)
def test_finite_differences(args):
    run, params = problem(*args)
    loss, grads = run(params)
    rng = np.random.default_rng(args[1] + 1)
    v = [rng.standard_normal(p.shape) for p in params]
    h = 1e-5
    plus = run([p + h * u for p, u in zip(params, v)])[0]
    minus = run([p - h * u for p, u in zip(params, v)])[0]
    fd = (plus - minus) / (2 * h)
    exact = sum(float(np.sum(g * u)) for g, u in zip(grads, v))
    scale = max(abs(exact), sum(float(np.abs(g * u).sum()) for g, u in zip(grads, v)), 1e-8)
    assert abs(fd - exact) <= 1e-6 * scale + 1e-9, (fd, exact)


@SETTINGS
@given(PROBLEMS)
def test_backends_agree(args):
    run, params = problem(*args)
    (la, ga), (lb, gb) = run(params, "numba"), run(params, "numpy")
    assert np.isfinite(la) and la == pytest.approx(lb, rel=1e-10, abs=1e-14)
    for a, b in zip(ga, gb):
        assert np.isfinite(a).all()
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-10 * max(np.abs(b).max(initial=0.0), 1e-300))


@pytest.mark.skipif(len(THREADS) < 2, reason="Numba was started with a single thread")
@settings(max_examples=15, deadline=None, derandomize=True)
@given(st.sampled_from(["twostage", "shallow", "indrnn"]), st.integers(0, 2 ** 31), st.integers(33, 80))
def test_bitwise_identical_across_thread_counts(kind, seed, n):
    """n > 32 samples so every parallel kernel has several work items (the two-stage kernels are forced
    onto their parallel path)."""
    run, params = problem(kind, seed, n, 6, 4, 6, 1.0)
    old = tm.PARALLEL_MIN_WORK
    tm.PARALLEL_MIN_WORK = 0
    results = []
    try:
        for t in THREADS:
            numba.set_num_threads(t)
            results.append(run(params))
    finally:
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        tm.PARALLEL_MIN_WORK = old
    (l1, g1), (l2, g2) = results
    assert l1 == l2
    for a, b in zip(g1, g2):
        assert np.array_equal(a, b)
