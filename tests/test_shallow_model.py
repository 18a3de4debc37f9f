"""Shallow multi-head transformer (docs/shallow.md §1–§2): the loss convention, the paired initialisation,
closed forms (one token, head states written out), the named results, and the validation of data and
options."""
import math

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.shallow import (Batch, Forward, HeadStates, LossAndGrad, Params, forward, head_states, iid_init,
                            loss_and_grad, paired_init, prepare, scale_tokens)
from ntpref.shallow.activation import ACTIVATIONS, activation_code, dsigma, dsigma_np, sigma, sigma_np
from ntpref.shallow.evaluation import loss_from_outputs

# every option at least once, including non-defaults together
CONFIGS = [
    dict(kappa=2.0, tau_att=1.0, mask_last_key=False, activation="tanh"),
    dict(kappa=1.0, tau_att=0.6, mask_last_key=True, activation="erf"),
    dict(kappa=2.0, tau_att=2.5, mask_last_key=True, activation="tanh"),
    dict(kappa=1.0, tau_att=1.0, mask_last_key=False, activation="erf"),
]


def tokens(rng, n, T, d):
    """Tokens N(0, I) scaled into the unit ball (docs/shallow.md §5)."""
    return scale_tokens(rng.standard_normal((n, T, d)))


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


# Gradients against finite differences, NumPy against Numba (outputs and head states), thread determinism
# and the validation of c, U, W are checked for every model by tests/test_common_checks.py.

def test_kappa_convention(rng):
    X, y, c, U, W = problem(rng)
    data = prepare(X, y)
    loss2, *g2, f = loss_and_grad(data, c, U, W, kappa=2)
    loss1, *g1, _ = loss_and_grad(data, c, U, W, kappa=1)
    assert loss2 == pytest.approx(np.mean((f - y) ** 2), rel=1e-14)  # paper: mean, no 1/2
    assert loss1 == pytest.approx(loss2 / 2, rel=1e-14)
    for a, b in zip(g1, g2):
        close(2 * a, b, rtol=1e-14)
    assert loss_from_outputs(f, y, 2.0) == loss2


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("cfg", CONFIGS)
def test_forward_is_the_f_of_loss_and_grad(rng, cfg, backend):
    """forward and loss_and_grad share one evaluation of f and of the loss: bitwise the same outputs."""
    X, y, c, U, W = problem(rng)
    data = prepare(X, y, **{k: v for k, v in cfg.items() if k != "kappa"})
    result = loss_and_grad(data, c, U, W, kappa=cfg["kappa"], backend=backend)
    fw = forward(data, c, U, W, kappa=cfg["kappa"], backend=backend)
    assert np.array_equal(fw.f, result.f) and fw.loss == result.loss
    assert forward(data._replace(y=None), c, U, W, backend=backend).loss is None


def test_results_are_named_tuples_in_the_documented_order(rng):
    """loss first, then the gradients in parameter order, then the per-sample outputs."""
    X, y, c, U, W = problem(rng)
    data = prepare(X, y, tau_att=0.5, mask_last_key=True, activation="erf")
    assert Batch._fields == ("X", "y", "tau_att", "mask_last_key", "activation")
    assert (data.tau_att, data.mask_last_key, data.activation, data.n_keys) == (0.5, True, "erf", X.shape[1] - 1)
    assert Params._fields == ("c", "U", "W") and isinstance(iid_init(4, 3, 7), Params)
    assert Forward._fields == ("loss", "f") and LossAndGrad._fields == ("loss", "grad_c", "grad_U", "grad_W", "f")
    assert HeadStates._fields == ("s", "a", "MU")
    result = loss_and_grad(data, c, U, W)
    assert isinstance(result, LossAndGrad) and result.grad_U.shape == U.shape and result.f.shape == y.shape
    assert isinstance(forward(data, c, U, W), Forward) and isinstance(head_states(data, U, W), HeadStates)


def test_prepared_data_serves_new_parameters(rng):
    """One prepared batch, new parameters each call; the parameters are still checked per call."""
    X, y, *_ = problem(rng)
    data = prepare(X, y, tau_att=0.5, mask_last_key=True)
    first, second = iid_init(4, 3, seed=1), iid_init(4, 3, seed=2)
    a, b = loss_and_grad(data, *first), loss_and_grad(data, *second)
    assert not np.array_equal(a.f, b.f)
    assert np.array_equal(loss_and_grad(data, *first).f, a.f)
    with pytest.raises(InputError, match=r"^array 'W': expected shape \[4, 3, 3\], got \[4, 2, 2\]$"):
        forward(data, np.ones(4), np.ones((4, 3)), np.ones((4, 2, 2)))


def test_paired_init_pairs_heads_with_opposite_output_weights():
    c, U, W = paired_init(8, 3, seed=3)
    assert np.array_equal(c[4:], -c[:4]) and np.array_equal(U[4:], U[:4]) and np.array_equal(W[4:], W[:4])
    assert set(np.abs(c)) == {1.0}


def test_paired_init_is_seeded():
    first, again, other = paired_init(8, 3, 3), paired_init(8, 3, 3), paired_init(8, 3, 4)
    assert all(np.array_equal(a, b) for a, b in zip(first, again))
    assert not np.array_equal(first[1], other[1])


def test_paired_init_needs_even_width():
    with pytest.raises(InputError, match=r"^array 'm': paired initialisation needs an even width \(the second half mirrors the first\), got 5$"):
        paired_init(5, 3, seed=0)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("opts", [dict(), dict(tau_att=0.5, mask_last_key=True, activation="erf")])
def test_paired_init_gives_zero_output(rng, backend, opts):
    c, U, W = paired_init(8, 3, seed=3)
    X = tokens(rng, 30, 5, 3)
    assert np.max(np.abs(forward(prepare(X, **opts), c, U, W, backend=backend).f)) <= 1e-15


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_paired_init_gradient_of_c_sees_sigma(rng, backend):
    """f = 0 and y = 1: loss = 1 and grad_c_i = m^{-1/2} Σ_j g_j σ(s_ji) with g_j = −2/n (docs/shallow.md §2),
    not zero although f is."""
    c, U, W = paired_init(8, 3, seed=3)
    data = prepare(tokens(rng, 30, 5, 3), np.ones(30))
    loss, gc, _, _, _ = loss_and_grad(data, c, U, W, backend=backend)
    s = head_states(data, U, W, backend=backend).s
    assert loss == pytest.approx(1.0, rel=1e-14)
    close(gc, -2.0 / 30 * sigma_np(s, "tanh").sum(axis=0) / math.sqrt(8), rtol=1e-13)
    assert np.max(np.abs(gc)) > 0


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_single_token_attends_to_itself(rng, backend):
    X = tokens(rng, 9, 1, 4)
    c, U, W = iid_init(6, 4, seed=1)
    s, a, MU = head_states(prepare(X, tau_att=0.3), U, W, backend=backend)
    assert np.allclose(a, np.broadcast_to(X[:, :1, :], a.shape), rtol=1e-15, atol=0)
    assert np.max(np.abs(MU)) <= 1e-16
    close(s, X[:, 0, :] @ U.T, rtol=1e-14)
    y = rng.standard_normal(9)
    _, gc, gU, gW, f = loss_and_grad(prepare(X, y), c, U, W, backend=backend)
    close(f, np.tanh(X[:, 0, :] @ U.T) @ c / math.sqrt(6), rtol=1e-14)
    assert np.max(np.abs(gW)) <= 1e-16
    g = (f - y) * 2 / 9
    close(gU, ((g[:, None] * c * dsigma_np(s, "tanh")).T @ X[:, 0, :]) / math.sqrt(6), rtol=1e-13)


@pytest.mark.parametrize("backend", ["numpy", "numba"])
@pytest.mark.parametrize("tau_att,mask", [(1.0, False), (0.4, True)])
def test_head_states_match_direct_computation(rng, backend, tau_att, mask):
    X = tokens(rng, 4, 5, 3)
    c, U, W = iid_init(3, 3, seed=2)
    data = prepare(X, tau_att=tau_att, mask_last_key=mask)
    s, a, MU = head_states(data, U, W, backend=backend)
    assert s.shape == (4, 3) and a.shape == MU.shape == (4, 3, 3)
    for j in range(4):
        for i in range(3):
            alpha, a_ji, s_ji, MU_ji = spec_head(X, j, U[i], W[i], tau_att, mask)
            assert alpha.sum() == pytest.approx(1.0) and (alpha[-1] == 0) == mask
            close(a[j, i], a_ji, rtol=1e-13)
            close(MU[j, i], MU_ji, rtol=1e-12)
            assert s[j, i] == pytest.approx(s_ji, rel=1e-13)
    # the output is m^{-1/2} Σ c σ(s)
    close(forward(data, c, U, W, backend=backend).f, sigma_np(s, "tanh") @ c / math.sqrt(3), rtol=1e-13)


@pytest.mark.parametrize("change,pattern", [
    (lambda X, y: dict(X=X[0]), r"^array 'X': expected shape \[\*, \*, \*\], got \[5, 3\]$"),
    (lambda X, y: dict(y=y[:2]), r"^array 'y': expected shape \[6\], got \[2\]$"),
    (lambda X, y: dict(X=np.where(X > 0.5, np.inf, X)), "^array 'X': non-finite value inf at index"),
    (lambda X, y: dict(kappa=3.0), r"^array 'kappa': must be 1 or 2, got 3\.0$"),
    (lambda X, y: dict(tau_att=0.0), r"^array 'tau_att': must be > 0\.0, got 0\.0$"),
    (lambda X, y: dict(activation="relu"), "^activation must be one of tanh, erf, got 'relu'$"),
    (lambda X, y: dict(backend="torch"), "^backend must be one of numba, numpy, got 'torch'$"),
    (lambda X, y: dict(X=X[:, :1], mask_last_key=True), "^mask_last_key needs T >= 2 tokens"),
], ids=["X-rank", "y-length", "X-inf", "kappa", "tau_att", "activation", "backend", "mask-one-token"])
def test_bad_data_or_option_is_an_input_error_naming_it(rng, change, pattern):
    X, y, c, U, W = problem(rng)
    kw = dict(X=X, y=y, c=c, U=U, W=W) | change(X, y)
    params = [kw.pop(k) for k in ("c", "U", "W")]
    call = {k: kw.pop(k) for k in ("kappa", "backend") if k in kw}
    with pytest.raises(InputError, match=pattern):
        loss_and_grad(prepare(kw.pop("X"), kw.pop("y"), **kw), *params, **call)


@pytest.mark.slow
def test_paper_scale_backends_agree(rng):
    """Teacher–student scale of docs/shallow.md §5 (n = 4000, T = 16, d = 8, m = 64): one full-batch evaluation."""
    X = tokens(rng, 4000, 16, 8)
    c, U, W = paired_init(64, 8, seed=1)
    c = c + 0.1 * rng.standard_normal(64)
    data = prepare(X, rng.standard_normal(4000))
    for a, b in zip(loss_and_grad(data, c, U, W), loss_and_grad(data, c, U, W, backend="numpy")):
        close(a, b)


# --- the activation table ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_every_activation_has_kernel_forms_equal_to_its_numpy_forms_and_a_true_d2_bound(name):
    """Each entry of the table: the Numba σ, σ' of its code agree with its NumPy σ, σ'; σ' is the derivative
    of σ (central differences); |σ''| stays below the entry's d2_bound on a fine grid."""
    entry = ACTIVATIONS[name]
    x = np.linspace(-8.0, 8.0, 4001)
    kernel_sigma = np.array([sigma(v, entry.code) for v in x])
    kernel_dsigma = np.array([dsigma(v, entry.code) for v in x])
    np.testing.assert_allclose(kernel_sigma, entry.sigma_np(x), rtol=4e-16, atol=1e-300)
    np.testing.assert_allclose(kernel_dsigma, entry.dsigma_np(x), rtol=4e-15, atol=4.5e-16)   # 1 − tanh²: absolute
    h = 1e-5
    np.testing.assert_allclose((entry.sigma_np(x + h) - entry.sigma_np(x - h)) / (2 * h), entry.dsigma_np(x),
                               rtol=0, atol=1e-9)
    d2 = (entry.dsigma_np(x + h) - entry.dsigma_np(x - h)) / (2 * h)
    assert np.max(np.abs(d2)) <= entry.d2_bound
    assert np.max(np.abs(d2)) > 0.4      # the bound is of the right size, not vacuous


def test_a_code_without_a_kernel_branch_gives_nan_and_an_unknown_name_is_an_error():
    code = max(a.code for a in ACTIVATIONS.values()) + 1
    assert math.isnan(sigma(0.3, code)) and math.isnan(dsigma(0.3, code))
    with pytest.raises(InputError, match="activation must be one of tanh, erf, got 'relu'"):
        activation_code("relu")
    with pytest.raises(InputError, match="activation must be one of"):
        sigma_np(np.zeros(2), "relu")
