"""Shallow multi-head transformer (docs/shallow.md §1–§2): gradients, backends, determinism, closed forms."""
import math

import numba
import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.shallow.activation import dsigma_np, sigma_np
from ntpref.shallow.model import (forward, head_states, iid_init, loss_and_grad, loss_from_outputs,
                                  paired_init)

# every option at least once, including non-defaults together
CONFIGS = [
    dict(kappa=2.0, tau_att=1.0, mask_last_key=False, activation="tanh"),
    dict(kappa=1.0, tau_att=0.6, mask_last_key=True, activation="erf"),
    dict(kappa=2.0, tau_att=2.5, mask_last_key=True, activation="tanh"),
    dict(kappa=1.0, tau_att=1.0, mask_last_key=False, activation="erf"),
]


def tokens(rng, n, T, d):
    """Tokens N(0, I) scaled into the unit ball (docs/shallow.md §5)."""
    X = rng.standard_normal((n, T, d))
    return X / np.maximum(1.0, np.linalg.norm(X, axis=2, keepdims=True))


def problem(rng, n=6, T=5, d=3, m=4):
    X = tokens(rng, n, T, d)
    c, U, W = iid_init(m, d, seed=7)
    c = c + 0.3 * rng.standard_normal(m)  # generic c, not only ±1
    return X, rng.standard_normal(n), c, U, W


def close(actual, expected, rtol=1e-12):
    """Elementwise rtol plus an absolute floor of rtol·max|expected| (entries that cancel to ~0)."""
    expected = np.asarray(expected)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * np.max(np.abs(expected)))


def spec_head(X, j, U_i, W_i, tau_att, mask_last_key):
    """Spec §1 for one (sample, head), literally: returns (alpha [T], a, s, MU)."""
    x, q = X[j], X[j, -1]
    z = np.array([x[t] @ W_i @ q / tau_att for t in range(len(x))])
    keys = len(x) - 1 if mask_last_key else len(x)
    alpha = np.zeros(len(x))
    alpha[:keys] = np.exp(z[:keys] - z[:keys].max()) / np.exp(z[:keys] - z[:keys].max()).sum()
    a = sum(alpha[t] * x[t] for t in range(len(x)))
    s = U_i @ a
    MU = sum(alpha[t] * x[t] * (x[t] @ U_i - s) for t in range(len(x)))
    return alpha, a, s, MU


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_gradients_match_central_differences(rng, cfg, backend):
    X, y, c, U, W = problem(rng)
    opts = dict(cfg)
    kappa = opts.pop("kappa")
    f, loss, gc, gU, gW = loss_and_grad(X, y, c, U, W, kappa=kappa, backend=backend, **opts)
    assert loss == pytest.approx(kappa / (2 * len(y)) * np.sum((f - y) ** 2), rel=1e-14)
    params = [c, U, W]
    h = 1e-5
    for b, grad in enumerate((gc, gU, gW)):
        fd = np.empty_like(grad)
        for idx in np.ndindex(grad.shape):
            vals = []
            for sign in (1.0, -1.0):
                p = [x.copy() for x in params]
                p[b][idx] += sign * h
                vals.append(loss_and_grad(X, y, *p, kappa=kappa, backend="numpy", **opts)[1])
            fd[idx] = (vals[0] - vals[1]) / (2 * h)
        assert np.max(np.abs(fd - grad)) <= 1e-7 * np.max(np.abs(grad)), ("cU W"[b], fd, grad)


def test_kappa_convention(rng):
    X, y, c, U, W = problem(rng)
    f, loss2, *g2 = loss_and_grad(X, y, c, U, W, kappa=2)
    _, loss1, *g1 = loss_and_grad(X, y, c, U, W, kappa=1)
    assert loss2 == pytest.approx(np.mean((f - y) ** 2), rel=1e-14)  # paper: mean, no 1/2
    assert loss1 == pytest.approx(loss2 / 2, rel=1e-14)
    for a, b in zip(g1, g2):
        close(2 * a, b, rtol=1e-14)
    assert loss_from_outputs(f, y, 2.0) == loss2


@pytest.mark.parametrize("cfg", CONFIGS)
def test_numba_matches_numpy(rng, cfg):
    X, y, c, U, W = problem(rng, n=40, T=7, d=4, m=6)
    opts = dict(cfg)
    kappa = opts.pop("kappa")
    got = loss_and_grad(X, y, c, U, W, kappa=kappa, backend="numba", **opts)
    ref = loss_and_grad(X, y, c, U, W, kappa=kappa, backend="numpy", **opts)
    for a, b in zip(got, ref):
        close(a, b)
    opts.pop("activation")
    for a, b in zip(head_states(X, U, W, backend="numba", **opts), head_states(X, U, W, backend="numpy", **opts)):
        close(a, b)
    assert np.array_equal(forward(X, c, U, W, activation=cfg["activation"], **opts), got[0])


def test_bitwise_identical_for_one_and_two_threads(rng):
    X, y, c, U, W = problem(rng, n=101, T=6, d=3, m=5)  # n > the gradient kernel's 32 sample blocks
    before = numba.get_num_threads()
    runs = []
    try:
        for threads in (1, 2):
            numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
            runs.append([*loss_and_grad(X, y, c, U, W, tau_att=0.8, mask_last_key=True),
                         forward(X, c, U, W), *head_states(X, U, W)])
    finally:
        numba.set_num_threads(before)
    for a, b in zip(*runs):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_paired_init_gives_zero_output(rng, backend):
    c, U, W = paired_init(8, 3, seed=3)
    assert np.array_equal(c[4:], -c[:4]) and np.array_equal(U[4:], U[:4]) and np.array_equal(W[4:], W[:4])
    assert set(np.abs(c)) == {1.0}
    X = tokens(rng, 30, 5, 3)
    for kw in (dict(), dict(tau_att=0.5, mask_last_key=True, activation="erf")):
        assert np.max(np.abs(forward(X, c, U, W, backend=backend, **kw))) <= 1e-15
    # the gradient is not zero: c's gradient sees σ(s) (docs/shallow.md §2)
    _, loss, gc, _, _ = loss_and_grad(X, np.ones(30), c, U, W, backend=backend)
    assert loss == pytest.approx(1.0) and np.max(np.abs(gc)) > 0
    with pytest.raises(InputError, match="even"):
        paired_init(5, 3, seed=0)
    assert all(np.array_equal(a, b) for a, b in zip(paired_init(8, 3, 3), (c, U, W)))  # seeded


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_single_token_attends_to_itself(rng, backend):
    X = tokens(rng, 9, 1, 4)
    c, U, W = iid_init(6, 4, seed=1)
    s, a, MU = head_states(X, U, W, tau_att=0.3, backend=backend)
    assert np.allclose(a, np.broadcast_to(X[:, :1, :], a.shape), rtol=1e-15, atol=0)
    assert np.max(np.abs(MU)) <= 1e-16
    close(s, X[:, 0, :] @ U.T, rtol=1e-14)
    y = rng.standard_normal(9)
    f, _, gc, gU, gW = loss_and_grad(X, y, c, U, W, backend=backend)
    close(f, np.tanh(X[:, 0, :] @ U.T) @ c / math.sqrt(6), rtol=1e-14)
    assert np.max(np.abs(gW)) <= 1e-16
    g = (f - y) * 2 / 9
    close(gU, ((g[:, None] * c * dsigma_np(s, "tanh")).T @ X[:, 0, :]) / math.sqrt(6), rtol=1e-13)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("tau_att,mask", [(1.0, False), (0.4, True)])
def test_head_states_match_direct_computation(rng, backend, tau_att, mask):
    X = tokens(rng, 4, 5, 3)
    c, U, W = iid_init(3, 3, seed=2)
    s, a, MU = head_states(X, U, W, tau_att=tau_att, mask_last_key=mask, backend=backend)
    assert s.shape == (4, 3) and a.shape == MU.shape == (4, 3, 3)
    for j in range(4):
        for i in range(3):
            alpha, a_ji, s_ji, MU_ji = spec_head(X, j, U[i], W[i], tau_att, mask)
            assert alpha.sum() == pytest.approx(1.0) and (alpha[-1] == 0) == mask
            close(a[j, i], a_ji, rtol=1e-13)
            close(MU[j, i], MU_ji, rtol=1e-12)
            assert s[j, i] == pytest.approx(s_ji, rel=1e-13)
    # the output is m^{-1/2} Σ c σ(s)
    close(forward(X, c, U, W, tau_att=tau_att, mask_last_key=mask, backend=backend),
          sigma_np(s, "tanh") @ c / math.sqrt(3), rtol=1e-13)


def test_validation_names_the_array(rng):
    X, y, c, U, W = problem(rng)
    bad = [
        (dict(X=X[0]), "'X'.*shape"),
        (dict(U=U[:, :2]), r"'U'.*shape \[\*, 3\]"),
        (dict(W=W[:3]), r"'W'.*shape \[4, 3, 3\]"),
        (dict(c=c[:3]), r"'c'.*shape \[4\]"),
        (dict(y=y[:2]), r"'y'.*shape \[6\]"),
        (dict(c=np.where(np.arange(4) == 2, np.nan, c)), "'c'.*non-finite"),
        (dict(X=np.where(X > 0.5, np.inf, X)), "'X'.*non-finite"),
        (dict(kappa=3.0), "'kappa'.*1 or 2"),
        (dict(tau_att=0.0), "'tau_att'.*> 0"),
        (dict(activation="relu"), "activation.*relu"),
        (dict(backend="torch"), "backend"),
        (dict(X=X[:, :1], mask_last_key=True), "mask_last_key.*T >= 2"),
    ]
    base = dict(X=X, y=y, c=c, U=U, W=W)
    for change, pattern in bad:
        kw = {**base, **change}
        with pytest.raises(InputError, match=pattern):
            loss_and_grad(kw.pop("X"), kw.pop("y"), kw.pop("c"), kw.pop("U"), kw.pop("W"), **kw)


@pytest.mark.slow
def test_paper_scale_backends_agree(rng):
    """Teacher–student scale of docs/shallow.md §5 (n = 4000, T = 16, d = 8, m = 64): one full-batch evaluation."""
    X = tokens(rng, 4000, 16, 8)
    c, U, W = paired_init(64, 8, seed=1)
    c = c + 0.1 * rng.standard_normal(64)
    y = rng.standard_normal(4000)
    for a, b in zip(loss_and_grad(X, y, c, U, W), loss_and_grad(X, y, c, U, W, backend="numpy")):
        close(a, b)
