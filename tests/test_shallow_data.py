"""Data of docs/shallow.md §5: the teacher against a direct evaluation of its formula (both attention
modes), reproducibility, the autoregressive windows' lag structure, positional channels and splits."""
import math

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref import shallow

SMALL = dict(n=7, d=3, T=4, R=3, K=5, nu=0.4, n_train=5)


def _states(Xs, U, W, diagonal):
    """(s, a, MU, q) of one sequence Xs [T, d] and one draw, with M = Σ_t α_t x_t x_t^T − a a^T."""
    q = Xs[-1]
    z = Xs @ (np.diag(np.diag(W)) if diagonal else W) @ q
    al = np.exp(z - z.max())
    al /= al.sum()
    a = al @ Xs
    M = (Xs * al[:, None]).T @ Xs - np.outer(a, a)
    return U @ a, a, M @ U, q


def _teacher_direct(X, anchors, alpha, U, W, nu, diagonal):
    """y(X) = (1/K) Σ_k Σ_r α_r [ν φ_c φ_c(X_r) + ν ⟨φ_u, φ_u(X_r)⟩ + ⟨φ_w, φ_w(X_r)⟩_F s_rk], tanh."""
    y = np.zeros(X.shape[0])
    for k in range(U.shape[0]):
        for j in range(X.shape[0]):
            s, a, MU, q = _states(X[j], U[k], W[k], diagonal)
            ds = 1.0 - np.tanh(s) ** 2
            for r in range(anchors.shape[0]):
                sr, ar, MUr, qr = _states(anchors[r], U[k], W[k], diagonal)
                dsr = 1.0 - np.tanh(sr) ** 2
                phi_w, phi_wr = ds * np.outer(MU, q), dsr * np.outer(MUr, qr)
                clip = min(1.0, nu / (np.linalg.norm(dsr * MUr) * np.linalg.norm(qr)))
                y[j] += alpha[r] * (nu * np.tanh(s) * np.tanh(sr) + nu * ds * dsr * (a @ ar)
                                    + np.sum(phi_w * phi_wr) * clip)
    return y / U.shape[0]


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("attention", ["full", "diagonal"])
def test_teacher_matches_spec_formula(attention, backend):
    ts = shallow.teacher_student(**SMALL, teacher_attention=attention, seed=4, backend=backend, block=2)
    rng = np.random.default_rng(4)                  # the documented draw order
    X = shallow.scale_tokens(rng.standard_normal((7, 4, 3)))
    idx = rng.choice(7, size=3, replace=False)
    g = rng.standard_normal(3)
    U = rng.standard_normal((5, 3))
    W = rng.standard_normal((5, 3, 3))
    np.testing.assert_allclose(ts.X_train, X[:5], rtol=1e-15, atol=1e-16)
    np.testing.assert_allclose(ts.X_val, X[5:], rtol=1e-15, atol=1e-16)
    np.testing.assert_allclose(ts.anchors, X[idx], rtol=1e-15, atol=1e-16)
    np.testing.assert_array_equal(ts.anchor_index, idx)
    np.testing.assert_allclose(ts.alpha, g / np.abs(g).sum(), rtol=1e-15)
    y = _teacher_direct(X, X[idx], ts.alpha, U, W, SMALL["nu"], attention == "diagonal")
    np.testing.assert_allclose(np.concatenate([ts.y_train, ts.y_val]), y, rtol=1e-12, atol=1e-15)


def test_scale_tokens_projects_long_tokens_onto_the_unit_sphere():
    """x_t ↦ x_t / max(1, ‖x_t‖) token by token (docs/shallow.md §1, §5)."""
    X = np.array([[[3.0, 4.0], [0.3, 0.4]], [[0.0, 0.0], [-6.0, 8.0]]])
    expected = np.array([[[0.6, 0.8], [0.3, 0.4]], [[0.0, 0.0], [-0.6, 0.8]]])
    np.testing.assert_allclose(shallow.scale_tokens(X), expected, rtol=1e-15, atol=0)


TEACHER = dict(n=40, d=4, T=6, R=4, K=64, n_train=30)


def test_teacher_modes_share_tokens_and_differ_in_labels():
    full = shallow.teacher_student(**TEACHER, seed=2)
    diag = shallow.teacher_student(**TEACHER, teacher_attention="diagonal", seed=2)
    np.testing.assert_array_equal(full.X_train, diag.X_train)
    assert np.max(np.abs(full.y_train - diag.y_train)) > 1e-3 * np.max(np.abs(full.y_train))


@pytest.mark.parametrize("attention", ["full", "diagonal"])
def test_teacher_is_reproducible_from_config_and_seed(attention):
    ts = shallow.teacher_student(**TEACHER, teacher_attention=attention, seed=2)
    again = shallow.teacher_student(**TEACHER, teacher_attention=attention, seed=2)
    for name in ("X_train", "y_train", "X_val", "y_val", "anchors", "alpha"):
        np.testing.assert_array_equal(getattr(ts, name), getattr(again, name))
    assert ts.config.teacher_attention == attention and ts.config.seed == 2


def test_teacher_seed_changes_the_labels():
    full = shallow.teacher_student(**TEACHER, seed=2)
    assert not np.array_equal(shallow.teacher_student(**TEACHER, seed=3).y_train, full.y_train)


def test_teacher_shapes_token_norms_and_anchor_weights():
    full = shallow.teacher_student(**TEACHER, seed=2)
    assert full.X_train.shape == (30, 6, 4) and full.y_val.shape == (10,)
    assert np.max(np.linalg.norm(full.X_train, axis=2)) <= 1.0 + 1e-15
    assert abs(np.abs(full.alpha).sum() - 1.0) < 1e-15


def test_teacher_arrays_are_read_only():
    full = shallow.teacher_student(**TEACHER, seed=2)
    with pytest.raises(ValueError, match="read-only"):
        full.y_train[0] = 1.0


@pytest.mark.parametrize("lag", [1, 4, 16])
def test_autoregressive_lag_structure(lag):
    ar = shallow.autoregressive(lag, n=300, n_train=240, burn_in=50, seed=5)
    T, L = lag + 1, lag
    assert ar.config.T == T and ar.config.d == 17
    assert ar.X_train.shape == (240, T, 17) and ar.X_val.shape == (60, T, 17) and ar.y_val.shape == (60,)
    assert ar.series.shape == (50 + 300 + T,)
    x, e = ar.series, ar.innovations
    np.testing.assert_array_equal(x[:L], e[:L])
    np.testing.assert_array_equal(x[L:], 0.9 * x[:-L] + e[L:])  # the recursion, bitwise
    np.testing.assert_array_equal(np.sort(np.concatenate([ar.train_index, ar.val_index])), np.arange(300))
    for X, y, idx in ((ar.X_train, ar.y_train, ar.train_index), (ar.X_val, ar.y_val, ar.val_index)):
        s = 50 + idx                                 # window starts
        np.testing.assert_array_equal(X[:, :, 0], x[s[:, None] + np.arange(T)])
        target = x[s + T]
        # the informative token is the second one, lag L before the target
        np.testing.assert_array_equal(target, 0.9 * X[:, 1, 0] + e[s + T])
        np.testing.assert_allclose(y, (target - ar.y_mean) / ar.y_std, rtol=1e-15, atol=1e-15)
        t = np.arange(T)[:, None]
        omega = 2 * math.pi / (32 * 2.0 ** np.arange(8))
        np.testing.assert_allclose(X[:, :, 1:9], np.broadcast_to(np.sin(t * omega), (len(idx), T, 8)), atol=1e-15)
        np.testing.assert_allclose(X[:, :, 9:], np.broadcast_to(np.cos(t * omega), (len(idx), T, 8)), atol=1e-15)
    assert abs(ar.y_train.mean()) < 1e-12 and abs(ar.y_train.std() - 1.0) < 1e-12


def test_autoregressive_noise_seed_and_normalisation():
    ar = shallow.autoregressive(4, seed=1)
    assert ar.X_train.shape == (4000, 5, 17) and ar.X_val.shape == (1000, 5, 17)
    inn = ar.innovations[4:]                         # ε ~ N(0, 0.1): variance 0.1
    assert abs(inn.var() - 0.1) < 0.01 and abs(inn.mean()) < 0.02
    again = shallow.autoregressive(4, seed=1)
    np.testing.assert_array_equal(ar.X_val, again.X_val)
    np.testing.assert_array_equal(ar.y_train, again.y_train)
    assert not np.array_equal(shallow.autoregressive(4, seed=2).series, ar.series)
    scaled = shallow.autoregressive(4, n=50, n_train=40, burn_in=10, normalize_tokens=True, seed=1)
    raw = shallow.autoregressive(4, n=50, n_train=40, burn_in=10, seed=1)
    norms = np.linalg.norm(raw.X_train, axis=2)
    assert np.min(norms) > 1.0                       # sin² + cos² channels alone give √8
    np.testing.assert_allclose(scaled.X_train, raw.X_train / norms[..., None], rtol=1e-15)
    np.testing.assert_array_equal(scaled.y_train, raw.y_train)


def test_data_input_errors():
    with pytest.raises(InputError, match="teacher_attention"):
        shallow.teacher_student(**SMALL, teacher_attention="diag")
    with pytest.raises(InputError, match="n_train"):
        shallow.teacher_student(**{**SMALL, "n_train": 7})
    with pytest.raises(InputError, match="lag"):
        shallow.autoregressive(0)
    with pytest.raises(InputError, match="noise_var"):
        shallow.autoregressive(3, noise_var=-1.0)
