"""NTK objects (docs/shallow.md §4, §5): the closed-form Gram matrix against per-sample gradients from
the model's loss_and_grad, symmetry / PSD, bitwise determinism (blocks, threads), both backends, the
linearisation, the limit kernel against the arcsine closed form, transport and the worst-case direction."""
import math

import numba
import numpy as np
import pytest

from ntpref import shallow
from ntpref.errors import InputError
from ntpref.shallow import ntk, scale_tokens

BACKENDS = ("numba", "numpy")


def _tokens(rng, n, T, d):
    """Tokens N(0, I) scaled into the unit ball (docs/shallow.md §5)."""
    return scale_tokens(rng.standard_normal((n, T, d)))


def _per_sample_gradients(X, c, U, W, **opts):
    """J [n, P]: ∇_θ f(X_j) from the model's loss_and_grad on the single sample X_j with y_j = f_j + 1
    (then ∂loss/∂f = κ r / 1 with r = f − y computed exactly like the model does, and grad / (κ r) = ∇f)."""
    rows = []
    for j in range(X.shape[0]):
        Xj = X[j:j + 1]
        f = shallow.forward(shallow.prepare(Xj, **opts), c, U, W).f
        y = f + 1.0
        _, gc, gU, gW, f2 = shallow.loss_and_grad(shallow.prepare(Xj, y, **opts), c, U, W, kappa=2.0)
        g = 2.0 * (f2 - y)[0]
        rows.append(np.concatenate([gc, gU.ravel(), gW.ravel()]) / g)
    return np.array(rows)


OPTS = [dict(), dict(tau_att=0.7, mask_last_key=True), dict(activation="erf")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("opts", OPTS)
def test_gram_equals_inner_products_of_gradients(rng, backend, opts):
    X = _tokens(rng, 5, 4, 3)
    c, U, W = shallow.iid_init(6, 3, 7)
    c = c * rng.uniform(0.5, 1.5, 6)              # c_i² ≠ 1: the U and W blocks carry c_i², the c block not
    J = _per_sample_gradients(X, c, U, W, **opts)
    K = ntk.ntk_gram(X, c, U, W, backend=backend, block=4, **opts)
    ref = J @ J.T
    assert np.max(np.abs(K - ref)) <= 1e-12 * np.max(np.abs(ref))
    X2 = _tokens(rng, 3, 6, 3)
    J2 = _per_sample_gradients(X2, c, U, W, **opts)
    K12 = ntk.ntk_gram(X, c, U, W, X2, backend=backend, **opts)
    assert np.max(np.abs(K12 - J @ J2.T)) <= 1e-12 * np.max(np.abs(ref))
    tf = ntk.tangent_features(X, c, U, W, backend=backend, **opts)
    flat = np.concatenate([tf.c, tf.U.reshape(5, -1), tf.W().reshape(5, -1)], axis=1)
    assert np.max(np.abs(flat - J)) <= 1e-12 * np.max(np.abs(J))


@pytest.mark.parametrize("backend", BACKENDS)
def test_gram_symmetric_psd(rng, backend):
    X = _tokens(rng, 40, 5, 4)
    c, U, W = shallow.paired_init(8, 4, 3)
    K = ntk.ntk_gram(X, c, U, W, backend=backend, block=3)
    assert np.array_equal(K, K.T)
    assert ntk.min_eigenvalue(K) >= -1e-12 * np.max(np.abs(K))
    assert np.max(np.abs(ntk.ntk_gram(X, c, U, W, X2=X, backend=backend) - K)) <= 1e-14 * np.max(np.abs(K))


def test_blocked_equals_unblocked_bitwise_and_thread_independent(rng):
    X = _tokens(rng, 45, 5, 4)                      # 45 rows: several Gram tiles, one partial
    c, U, W = shallow.iid_init(7, 4, 5)
    dc, dU, dW = shallow.iid_init(7, 4, 6)

    def run():
        return [ntk.ntk_gram(X, c, U, W, block=b) for b in (1, 3, 7)] + \
               [ntk.ntk_gram(X, c, U, W, X2=X[:17], block=b) for b in (2, 7)] + \
               [ntk.jvp(X, c, U, W, dc, dU, dW, block=b) for b in (1, 4, 7)] + \
               [np.concatenate([a.ravel() for a in ntk.worst_case_delta(X, U, W, block=b)]) for b in (2, 7)]

    res = run()
    for group in (res[0:3], res[3:5], res[5:8], res[8:10]):
        for r in group[1:]:
            assert np.array_equal(r, group[0])
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("needs 2 Numba threads")
    old = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        res1 = run()
        numba.set_num_threads(2)
        res2 = run()
    finally:
        numba.set_num_threads(old)
    for a, b, r in zip(res1, res2, res):
        assert np.array_equal(a, b) and np.array_equal(a, r)


def test_backends_agree(rng):
    X, X2 = _tokens(rng, 9, 5, 3), _tokens(rng, 4, 3, 3)
    c, U, W = shallow.iid_init(6, 3, 2)
    dc, dU, dW = shallow.iid_init(6, 3, 9)
    opts = dict(tau_att=1.3, activation="erf")
    for fn in (lambda b: ntk.ntk_gram(X, c, U, W, backend=b, **opts),
               lambda b: ntk.ntk_gram(X, c, U, W, X2, backend=b, block=4, **opts),
               lambda b: ntk.jvp(X, c, U, W, dc, dU, dW, backend=b, block=5, **opts),
               lambda b: ntk.limit_kernel(X, X2, draws=50, seed=3, backend=b, block=16),
               lambda b: ntk.worst_case_delta(X, U, W, (1.0, 2.0, 3.0), backend=b, **opts)[2],
               lambda b: ntk.transport_map(U, W, X[:3], [0.5, -0.2, 0.3], attention="diagonal", backend=b)[2]):
        np.testing.assert_allclose(fn("numba"), fn("numpy"), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linearized_f_first_order(rng, backend):
    X = _tokens(rng, 6, 4, 3)
    theta0 = shallow.iid_init(8, 3, 11)               # f(θ0) ≠ 0: the increment is what is linearised
    delta = shallow.iid_init(8, 3, 12)
    data = shallow.prepare(X)
    f0 = shallow.forward(data, *theta0).f
    errs = []
    for eps in (1e-2, 1e-3):
        theta = tuple(p + eps * q for p, q in zip(theta0, delta))
        lin = ntk.linearized_f(X, theta0, theta, backend=backend)
        np.testing.assert_allclose(lin, eps * ntk.jvp(X, *theta0, *delta, backend=backend), rtol=1e-9)
        errs.append(np.max(np.abs(shallow.forward(data, *theta).f - f0 - lin)))
    assert 0.005 < errs[1] / errs[0] < 0.02        # O(ε²)
    theta = tuple(p + 1e-3 * q for p, q in zip(theta0, delta))
    assert errs[1] < 1e-3 * np.max(np.abs(shallow.forward(data, *theta).f - f0))


def test_limit_kernel_matches_arcsine_closed_form():
    """Constant sequences (x_t = x for all t): a = x, MU = 0, so for σ = erf(·/√2), with Σ = [[‖x‖², ⟨x, x'⟩], ..]
    K_∞ = (2/π) arcsin(b/√((1+a)(1+c))) + (2/π) ⟨x, x'⟩ / √((1+a)(1+c) − b²)."""
    x = np.array([[0.6, 0.0, 0.3], [0.2, -0.5, 0.4], [-0.7, 0.1, 0.0]])
    X = np.repeat(x[:, None, :], 3, axis=1)
    G = x @ x.T
    dg = np.diag(G)
    prod = (1.0 + dg)[:, None] * (1.0 + dg)[None, :]
    exact = 2.0 / math.pi * (np.arcsin(G / np.sqrt(prod)) + G / np.sqrt(prod - G * G))
    K = ntk.limit_kernel(X, draws=40000, seed=1, activation="erf")
    assert np.max(np.abs(K - exact)) < 0.02
    assert np.array_equal(K, ntk.limit_kernel(X, draws=40000, seed=1, activation="erf"))
    rng = np.random.default_rng(1)                 # the documented draw order
    U = rng.standard_normal((40000, 3))
    W = rng.standard_normal((40000, 3, 3))
    assert np.array_equal(K, ntk.ntk_gram(X, np.ones(40000), U, W, activation="erf", block=256))


def test_min_eigenvalue():
    Q = np.linalg.qr(np.random.default_rng(0).standard_normal((5, 5)))[0]
    G = Q @ np.diag([3.0, 2.0, 1.0, 0.5, -0.25]) @ Q.T
    G = 0.5 * (G + G.T)
    assert abs(ntk.min_eigenvalue(G) + 0.25) < 1e-13
    G[0, 1] += 1e-3
    with pytest.raises(InputError, match="symmetric"):
        ntk.min_eigenvalue(G)


@pytest.mark.parametrize("backend", BACKENDS)
def test_worst_case_delta(rng, backend):
    X = _tokens(rng, 7, 4, 3)
    c, U, W = shallow.paired_init(6, 3, 4)
    rho = (1.0, 2.0, 3.0)
    dc, dU, dW = ntk.worst_case_delta(X, U, W, rho, backend=backend, tau_att=0.8)
    r = 1.0 / math.sqrt(6)
    np.testing.assert_array_equal(dc, np.full(6, rho[0] * r))
    np.testing.assert_allclose(np.linalg.norm(dU, axis=1), rho[1] * r, rtol=1e-14)
    np.testing.assert_allclose(np.linalg.norm(dW.reshape(6, -1), axis=1), rho[2] * r, rtol=1e-14)
    # direction: the loss gradient with every residual 1 is (κ/n) c_i/√m ∇_{θ_i} Σ_j σ(s_ji)
    c1 = np.ones(6)
    f = shallow.forward(shallow.prepare(X, tau_att=0.8), c1, U, W).f
    _, _, gU, gW, _ = shallow.loss_and_grad(shallow.prepare(X, f - 1.0, tau_att=0.8), c1, U, W)
    np.testing.assert_allclose(dU, rho[1] * r * gU / np.linalg.norm(gU, axis=1, keepdims=True), rtol=1e-11)
    gWn = np.linalg.norm(gW.reshape(6, -1), axis=1)[:, None, None]
    np.testing.assert_allclose(dW, rho[2] * r * gW / gWn, rtol=1e-11)
    # zero tokens: zero gradient, first basis direction
    dc0, dU0, dW0 = ntk.worst_case_delta(np.zeros((2, 3, 3)), U, W, 2.0, backend=backend)
    e = np.zeros((6, 3))
    e[:, 0] = 2.0 * r
    np.testing.assert_array_equal(dU0, e)
    E = np.zeros((6, 3, 3))
    E[:, 0, 0] = 2.0 * r
    np.testing.assert_array_equal(dW0, E)


@pytest.mark.parametrize("backend", BACKENDS)
def test_transport(rng, backend):
    X, anchors = _tokens(rng, 5, 4, 3), _tokens(rng, 4, 4, 3)
    alpha = rng.standard_normal(4)
    alpha /= np.abs(alpha).sum()
    c, U, W = shallow.paired_init(8, 3, 2)
    nu = (0.5, 1.5, 0.05)                           # small ν_w: the clipping is active
    v_c, v_u, v_w = ntk.transport_map(U, W, anchors, alpha, nu, backend=backend)
    assert np.all(np.abs(v_c) <= nu[0]) and np.all(np.linalg.norm(v_u, axis=1) <= nu[1])
    assert np.all(np.linalg.norm(v_w.reshape(8, -1), axis=1) <= nu[2] * (1 + 1e-12))
    cb, Ub, Wb = ntk.transport(c, U, W, v_c, v_u, v_w)
    r = 1.0 / math.sqrt(8)
    np.testing.assert_array_equal(cb, c + v_c * r)
    np.testing.assert_array_equal(Ub, U + c[:, None] * v_u * r)
    np.testing.assert_array_equal(Wb, W + c[:, None, None] * v_w * r)
    # paired heads: f_lin(transported) is the (1/K) Σ_k ⟨φ(θ_k), v(θ_k)⟩ average over the K = m/2 draws,
    # i.e. the kernel machine Σ_r α_r [ν_c K_c + ν_u K_u + clipped K_w] with those draws
    lin = ntk.linearized_f(X, (c, U, W), (cb, Ub, Wb), backend=backend)
    tf = ntk.tangent_features(X, np.ones(4), U[:4], W[:4], backend=backend)
    ta = ntk.tangent_features(anchors, np.ones(4), U[:4], W[:4], backend=backend)
    qa_norm = np.linalg.norm(anchors[:, -1], axis=1)
    clip = np.minimum(1.0, nu[2] / (2.0 * np.linalg.norm(ta.W_left, axis=2) * qa_norm[:, None]))
    expect = (nu[0] * np.einsum("ji,ri,r->j", tf.c, ta.c, alpha)
                    + nu[1] * np.einsum("jik,rik,r->j", tf.U, ta.U, alpha)
                    + np.einsum("jik,rik,jl,rl,ri,r->j", tf.W_left, ta.W_left, tf.q, ta.q, clip, alpha))
    np.testing.assert_allclose(lin, expect, rtol=1e-12, atol=1e-15)


def test_input_errors(rng):
    X = _tokens(rng, 3, 4, 3)
    c, U, W = shallow.iid_init(4, 3, 0)
    with pytest.raises(InputError, match="'W'"):
        ntk.ntk_gram(X, c, U, W[:, :2])
    with pytest.raises(InputError, match="'X2'"):
        ntk.ntk_gram(X, c, U, W, X2=np.zeros((2, 4, 5)))
    with pytest.raises(InputError, match="block"):
        ntk.ntk_gram(X, c, U, W, block=0)
    with pytest.raises(InputError, match="'dc'"):
        ntk.jvp(X, c, U, W, c[:3], U, W)
    with pytest.raises(InputError, match="attention"):
        ntk.transport_map(U, W, X, np.ones(3), attention="diag")
    with pytest.raises(InputError, match="rho"):
        ntk.worst_case_delta(X, U, W, (1.0, 2.0))
