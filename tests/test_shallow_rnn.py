"""IndRNN baseline (docs/shallow.md §6): gradients vs central finite differences, NumPy vs Numba,
thread-count invariance, the paired initialisation, the T = 1 closed form, and long/large inputs."""
import math

import numba
import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.shallow.rnn import BLOCK, rnn_forward, rnn_loss_and_grad, rnn_paired_init

ACTS = ("tanh", "erf")


def _sigma(x, act):
    """σ written independently of the library (closed-form checks)."""
    return np.tanh(x) if act == "tanh" else np.vectorize(lambda v: math.erf(v / math.sqrt(2.0)))(x)


def _dsigma(x, act):
    return 1.0 / np.cosh(x) ** 2 if act == "tanh" else np.sqrt(2.0 / np.pi) * np.exp(-0.5 * x * x)


def _problem(rng, n, T, d, m):
    """Random tokens with ‖x_t‖ ≤ 1 (docs/shallow.md §1) and generic (non-paired) parameters, |u_i| up to 1.2."""
    X = rng.standard_normal((n, T, d))
    X /= np.maximum(1.0, np.linalg.norm(X, axis=2, keepdims=True))
    y = rng.standard_normal(n)
    c = rng.standard_normal(m)
    u = rng.uniform(-1.2, 1.2, m)
    W_in = rng.standard_normal((m, d))
    return X, y, c, u, W_in


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("T", [1, 7])
@pytest.mark.parametrize("kappa", [1.0, 2.0])
@pytest.mark.parametrize("act", ACTS)
def test_gradients_match_central_differences(rng, act, kappa, T, backend):
    X, y, c, u, W_in = _problem(rng, n=5, T=T, d=3, m=4)
    kw = dict(kappa=kappa, activation=act, backend=backend)
    _, _, grad_c, grad_u, grad_W_in = rnn_loss_and_grad(X, y, c, u, W_in, **kw)
    params = {"c": c, "u": u, "W_in": W_in}
    grads = {"c": grad_c, "u": grad_u, "W_in": grad_W_in}
    h = 1e-6
    for name, p in params.items():
        fd = np.zeros_like(p)
        for idx in np.ndindex(p.shape):
            losses = []
            for step in (h, -h):
                q = {k: v.copy() for k, v in params.items()}
                q[name][idx] += step
                losses.append(rnn_loss_and_grad(X, y, q["c"], q["u"], q["W_in"], **kw)[1])
            fd[idx] = (losses[0] - losses[1]) / (2 * h)
        err = np.linalg.norm(fd - grads[name])
        assert err <= 1e-7 * np.linalg.norm(grads[name]), (name, err, np.linalg.norm(grads[name]))
    if T == 1:
        assert np.all(grad_u == 0.0)      # h_0 = 0: u does not act when T = 1


@pytest.mark.parametrize("kappa", [1.0, 2.0])
def test_loss_convention(rng, kappa):
    """κ = 2: the mean squared error; κ = 1: half of it (the loss whose gradient uses g = r / n)."""
    X, y, c, u, W_in = _problem(rng, n=9, T=4, d=3, m=6)
    for backend in ("numba", "numpy"):
        f, loss, *_ = rnn_loss_and_grad(X, y, c, u, W_in, kappa=kappa, backend=backend)
        assert loss == pytest.approx(kappa / 2 * np.mean((f - y) ** 2), rel=1e-14)


@pytest.mark.parametrize("act", ACTS)
def test_numpy_and_numba_agree(rng, act):
    X, y, c, u, W_in = _problem(rng, n=7 * BLOCK + 3, T=9, d=5, m=7)   # odd m: the unpaired last unit
    a = rnn_loss_and_grad(X, y, c, u, W_in, kappa=2.0, activation=act, backend="numpy")
    b = rnn_loss_and_grad(X, y, c, u, W_in, kappa=2.0, activation=act, backend="numba")
    for name, p, q in zip(("f", "loss", "grad_c", "grad_u", "grad_W_in"), a, b):
        np.testing.assert_allclose(q, p, rtol=1e-12, atol=0, err_msg=name)
    for backend in ("numpy", "numba"):
        np.testing.assert_allclose(rnn_forward(X, c, u, W_in, activation=act, backend=backend), a[0],
                                   rtol=1e-12, atol=0)


def test_numba_bitwise_identical_for_one_and_two_threads(rng):
    X, y, c, u, W_in = _problem(rng, n=9 * BLOCK + 5, T=11, d=4, m=8)
    before = numba.get_num_threads()
    runs = []
    try:
        for threads in (1, 2, 1):
            numba.set_num_threads(threads)
            for act in ACTS:
                runs.append((threads, act, rnn_loss_and_grad(X, y, c, u, W_in, activation=act),
                             rnn_forward(X, c, u, W_in, activation=act)))
    finally:
        numba.set_num_threads(before)
    by_act = {}
    for threads, act, out, f in runs:
        ref = by_act.setdefault(act, (out, f))
        assert all(np.array_equal(p, q) for p, q in zip(ref[0], out)), (act, threads)
        assert np.array_equal(ref[1], f) and np.array_equal(f, out[0]), (act, threads)


@pytest.mark.parametrize("act", ACTS)
def test_paired_init_gives_zero_output(rng, act):
    m, d = 64, 17
    c, u, W_in = rnn_paired_init(m, d, seed=3)
    half = m // 2
    assert c.shape == u.shape == (m,) and W_in.shape == (m, d)
    assert np.array_equal(W_in[half:], W_in[:half]) and np.array_equal(u[half:], u[:half])
    assert np.array_equal(c[half:], -c[:half]) and set(np.abs(c)) == {1.0} and set(np.abs(u)) == {1.5}
    assert len(set(c[:half])) == 2 and len(set(u[:half])) == 2        # both signs occur at m = 64
    assert np.array_equal(rnn_paired_init(m, d, seed=3)[2], W_in)
    assert not np.array_equal(rnn_paired_init(m, d, seed=4)[2], W_in)
    X = rng.standard_normal((40, 20, d))
    for backend in ("numba", "numpy"):
        assert np.abs(rnn_forward(X, c, u, W_in, activation=act, backend=backend)).max() <= 1e-15


def test_paired_init_needs_even_width():
    with pytest.raises(InputError, match="even"):
        rnn_paired_init(5, 3, 0)
    with pytest.raises(InputError, match="'d'"):
        rnn_paired_init(4, 0, 0)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("act", ACTS)
def test_single_step_closed_form(rng, act, backend):
    """T = 1: f = m^{-1/2} Σ_i c_i σ(w_i·x_1), and the gradients of a one-hidden-layer network."""
    X, y, c, u, W_in = _problem(rng, n=6, T=1, d=4, m=5)
    n, m = 6, 5
    s = X[:, 0] @ W_in.T                                         # [n, m]
    f_expected = _sigma(s, act) @ c / np.sqrt(m)
    f, loss, grad_c, grad_u, grad_W_in = rnn_loss_and_grad(X, y, c, u, W_in, activation=act, backend=backend)
    np.testing.assert_allclose(f, f_expected, rtol=1e-12, atol=1e-15)
    g = 2.0 * (f_expected - y) / n
    np.testing.assert_allclose(grad_c, _sigma(s, act).T @ g / np.sqrt(m), rtol=1e-12)
    np.testing.assert_allclose(grad_W_in, (g[:, None] * c * _dsigma(s, act)).T @ X[:, 0] / np.sqrt(m), rtol=1e-11)
    assert np.all(grad_u == 0.0)


@pytest.mark.parametrize("act", ACTS)
def test_long_sequence_and_large_weights_are_finite(rng, act):
    n, T, d, m = 6, 1024, 3, 8
    X = rng.standard_normal((n, T, d))
    y = rng.standard_normal(n)
    c = rng.choice([-1.0, 1.0], m)
    cases = {"large": (50.0 * rng.standard_normal((m, d)), 20.0 * rng.choice([-1.0, 1.0], m)),
             "marginal": (0.1 * rng.standard_normal((m, d)), np.ones(m))}   # |u| = 1: no decay over time
    for W_in, u in cases.values():
        outs = [rnn_loss_and_grad(X, y, c, u, W_in, activation=act, backend=b) for b in ("numba", "numpy")]
        for out in outs:
            assert all(np.all(np.isfinite(a)) for a in out)
            assert np.abs(out[0]).max() <= np.abs(c).sum() / np.sqrt(m)     # |h| ≤ 1
        np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-9, atol=1e-12)


def test_validation_names_the_array(rng):
    X, y, c, u, W_in = _problem(rng, n=4, T=3, d=2, m=4)
    bad = [
        (dict(X=X[:, :, 0]), "'X'"),
        (dict(X=np.where(X > 0.5, np.inf, X)), "'X'.*non-finite"),
        (dict(y=y[:3]), "'y'"),
        (dict(c=np.array([1.0, np.nan, 0.0, 0.0])), "'c'.*non-finite"),
        (dict(u=u[:3]), "'u'"),
        (dict(W_in=W_in.T), "'W_in'"),
        (dict(W_in=np.zeros((4, 2), dtype=complex)), "'W_in'"),
        (dict(kappa=3.0), "'kappa'"),
        (dict(activation="relu"), "activation"),
        (dict(backend="torch"), "backend"),
    ]
    for change, match in bad:
        args = dict(X=X, y=y, c=c, u=u, W_in=W_in) | change
        with pytest.raises(InputError, match=match):
            rnn_loss_and_grad(**args)
    with pytest.raises(InputError, match="'u'"):
        rnn_forward(X, c, u[:3], W_in)
    with pytest.raises(InputError, match="'X'"):
        rnn_forward(np.zeros((0, 3, 2)), c, u, W_in)
    np.testing.assert_array_equal(rnn_forward(X, c, u, W_in, activation=np.array("erf")),
                                  rnn_forward(X, c, u, W_in, activation="erf"))
