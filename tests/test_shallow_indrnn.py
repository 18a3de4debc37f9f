"""IndRNN baseline (docs/shallow.md §6): the loss convention, the paired initialisation, the T = 1 closed
form, the hidden states, long sequences and large weights, the named results, and the validation of data
and options. Gradients against finite
differences, NumPy against Numba, thread determinism and the validation of c, u, W_in are checked for every
model by tests/test_common_checks.py."""
import math

import numpy as np
import pytest

from common_checks import check_backends_agree, indrnn_case
from ntpref import shallow
from ntpref.errors import InputError
from ntpref.shallow import scale_tokens
from ntpref.shallow.activation import ACTIVATIONS
from ntpref.shallow.indrnn import (Batch, Forward, LossAndGrad, Params, forward, hidden_states, loss_and_grad,
                                   paired_init, prepare)
from ntpref.shallow.indrnn_kernels import BLOCK

#: σ and σ' of every activation of the models (ntpref.shallow.activation.ACTIVATIONS), written independently
#: of the library, each by its own formula (closed-form checks).
SIGMA = {"tanh": np.tanh, "erf": np.vectorize(lambda v: math.erf(v / math.sqrt(2.0)))}
DSIGMA = {"tanh": lambda x: 1.0 / np.cosh(x) ** 2, "erf": lambda x: np.sqrt(2.0 / np.pi) * np.exp(-0.5 * x * x)}
ACTS = tuple(ACTIVATIONS)


def test_the_closed_forms_follow_the_models_activations():
    assert set(SIGMA) == set(DSIGMA) == set(ACTIVATIONS)


def _sigma(x, act):
    return SIGMA[act](x)


def _dsigma(x, act):
    return DSIGMA[act](x)


def _problem(rng, n, T, d, m):
    """Random tokens with ‖x_t‖ ≤ 1 (docs/shallow.md §1) and generic (non-paired) parameters, |u_i| up to 1.2."""
    X = scale_tokens(rng.standard_normal((n, T, d)))
    y = rng.standard_normal(n)
    c = rng.standard_normal(m)
    u = rng.uniform(-1.2, 1.2, m)
    W_in = rng.standard_normal((m, d))
    return X, y, c, u, W_in


@pytest.mark.parametrize("kappa", [1.0, 2.0])
def test_loss_convention(rng, kappa):
    """κ = 2: the mean squared error; κ = 1: half of it (the loss whose gradient uses g = r / n)."""
    X, y, c, u, W_in = _problem(rng, n=9, T=4, d=3, m=6)
    for backend in ("numba", "numpy"):
        loss, *_, f = loss_and_grad(prepare(X, y), c, u, W_in, kappa=kappa, backend=backend)
        assert loss == pytest.approx(kappa / 2 * np.mean((f - y) ** 2), rel=1e-14)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("act", ACTS)
def test_forward_is_the_f_of_loss_and_grad(rng, act, backend):
    """forward and loss_and_grad share one recurrence and one loss: bitwise the same f and loss."""
    X, y, c, u, W_in = _problem(rng, n=2 * BLOCK + 3, T=9, d=5, m=7)
    data = prepare(X, y, activation=act)
    result = loss_and_grad(data, c, u, W_in, kappa=1, backend=backend)
    fw = forward(data, c, u, W_in, kappa=1, backend=backend)
    assert np.array_equal(fw.f, result.f) and fw.loss == result.loss
    assert forward(prepare(X, activation=act), c, u, W_in, backend=backend).loss is None


def test_results_are_named_tuples_in_the_documented_order(rng):
    """loss first, then the gradients in parameter order, then the per-sample outputs."""
    X, y, c, u, W_in = _problem(rng, n=5, T=3, d=2, m=4)
    assert Batch._fields == ("X", "y", "activation") and Params._fields == ("c", "u", "W_in")
    assert Forward is shallow.Forward and Forward._fields == ("loss", "f")
    assert LossAndGrad._fields == ("loss", "grad_c", "grad_u", "grad_W_in", "f")
    assert isinstance(paired_init(4, 2, 0), Params)
    result = loss_and_grad(prepare(X, y), c, u, W_in)
    assert isinstance(result, LossAndGrad) and result.grad_W_in.shape == W_in.shape and result.f.shape == y.shape


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_hidden_states_give_the_output(rng, backend):
    """h_t = σ(W_in x_t + u ⊙ h_{t−1}) written out; f = m^{-1/2} Σ_i c_i h_{T,i}."""
    X, y, c, u, W_in = _problem(rng, n=5, T=4, d=3, m=6)
    data = prepare(X, y, activation="erf")
    H = hidden_states(data, u, W_in)
    assert H.shape == (5, 5, 6) and not np.any(H[0])
    h = np.zeros((5, 6))
    for t in range(4):
        h = _sigma(X[:, t] @ W_in.T + u * h, "erf")
        np.testing.assert_allclose(H[t + 1], h, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(forward(data, c, u, W_in, backend=backend).f, H[4] @ c / np.sqrt(6), rtol=1e-12)


def test_paired_init_pairs_units_with_opposite_readout():
    m, d = 64, 17
    c, u, W_in = paired_init(m, d, seed=3)
    half = m // 2
    assert c.shape == u.shape == (m,) and W_in.shape == (m, d)
    assert np.array_equal(W_in[half:], W_in[:half]) and np.array_equal(u[half:], u[:half])
    assert np.array_equal(c[half:], -c[:half]) and set(np.abs(c)) == {1.0} and set(np.abs(u)) == {1.5}
    assert len(set(c[:half])) == 2 and len(set(u[:half])) == 2        # both signs occur at m = 64


def test_paired_init_is_seeded():
    W_in = paired_init(64, 17, seed=3).W_in
    assert np.array_equal(paired_init(64, 17, seed=3).W_in, W_in)
    assert not np.array_equal(paired_init(64, 17, seed=4).W_in, W_in)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("act", ACTS)
def test_paired_init_gives_zero_output(rng, act, backend):
    c, u, W_in = paired_init(64, 17, seed=3)
    data = prepare(rng.standard_normal((40, 20, 17)), activation=act)
    assert np.abs(forward(data, c, u, W_in, backend=backend).f).max() <= 1e-15


def test_paired_init_needs_even_width():
    with pytest.raises(InputError, match=r"^array 'm': paired initialisation needs an even width \(the second half mirrors the first\), got 5$"):
        paired_init(5, 3, 0)


def test_paired_init_needs_a_token_dimension():
    with pytest.raises(InputError, match="^array 'd': must be >= 1, got 0$"):
        paired_init(4, 0, 0)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("act", ACTS)
def test_single_step_closed_form(rng, act, backend):
    """T = 1: f = m^{-1/2} Σ_i c_i σ(w_i·x_1), and the gradients of a one-hidden-layer network."""
    X, y, c, u, W_in = _problem(rng, n=6, T=1, d=4, m=5)
    n, m = 6, 5
    s = X[:, 0] @ W_in.T                                         # [n, m]
    f_expected = _sigma(s, act) @ c / np.sqrt(m)
    loss, grad_c, grad_u, grad_W_in, f = loss_and_grad(prepare(X, y, activation=act), c, u, W_in, backend=backend)
    np.testing.assert_allclose(f, f_expected, rtol=1e-12, atol=1e-15)
    g = 2.0 * (f_expected - y) / n
    np.testing.assert_allclose(grad_c, _sigma(s, act).T @ g / np.sqrt(m), rtol=1e-12)
    np.testing.assert_allclose(grad_W_in, (g[:, None] * c * _dsigma(s, act)).T @ X[:, 0] / np.sqrt(m), rtol=1e-11)
    assert np.all(grad_u == 0.0)


def _long_sequence_input(regime: str, act: str) -> dict:
    """T = 1024 steps of unscaled Gaussian tokens; "large": |u| = 20 and W_in ~ 50 N(0, 1) (saturated units),
    "marginal": |u| = 1 and W_in ~ 0.1 N(0, 1) (no decay over time)."""
    rng = np.random.default_rng(5)
    n, T, d, m = 6, 1024, 3, 8
    inputs = {"model": np.array("indrnn"), "X": rng.standard_normal((n, T, d)), "y": rng.standard_normal(n),
              "c": rng.choice([-1.0, 1.0], m), "activation": np.array(act)}
    if regime == "large":
        inputs.update(W_in=50.0 * rng.standard_normal((m, d)), u=20.0 * rng.choice([-1.0, 1.0], m))
    else:
        inputs.update(W_in=0.1 * rng.standard_normal((m, d)), u=np.ones(m))
    return inputs


@pytest.mark.parametrize("regime", ["large", "marginal"])
@pytest.mark.parametrize("act", ACTS)
def test_long_sequence_backends_agree(act, regime):
    check_backends_agree(indrnn_case("indrnn", activation=act), _long_sequence_input(regime, act))


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("regime", ["large", "marginal"])
@pytest.mark.parametrize("act", ACTS)
def test_long_sequence_output_is_bounded_by_the_readout(act, regime, backend):
    """|h_{T,i}| <= 1, so |f| <= m^{-1/2} Σ_i |c_i|."""
    p = _long_sequence_input(regime, act)
    f = forward(prepare(p["X"], activation=act), p["c"], p["u"], p["W_in"], backend=backend).f
    assert np.abs(f).max() <= np.abs(p["c"]).sum() / np.sqrt(p["c"].size)


@pytest.mark.parametrize("change,pattern", [
    (lambda X, y: dict(X=X[:, :, 0]), r"^array 'X': expected shape \[\*, \*, \*\], got \[4, 3\]$"),
    (lambda X, y: dict(X=np.where(X > 0.5, np.inf, X)), "^array 'X': non-finite value inf at index"),
    (lambda X, y: dict(y=y[:3]), r"^array 'y': expected shape \[4\], got \[3\]$"),
    (lambda X, y: dict(kappa=3.0), r"^array 'kappa': must be 1 or 2, got 3\.0$"),
    (lambda X, y: dict(activation="relu"), "^activation must be one of tanh, erf, got 'relu'$"),
    (lambda X, y: dict(backend="torch"), "^backend must be one of numba, numpy, got 'torch'$"),
], ids=["X-rank", "X-inf", "y-length", "kappa", "activation", "backend"])
def test_bad_data_or_option_is_an_input_error_naming_it(rng, change, pattern):
    X, y, c, u, W_in = _problem(rng, n=4, T=3, d=2, m=4)
    kw = dict(X=X, y=y, activation="tanh") | change(X, y)
    call = {k: kw.pop(k) for k in ("kappa", "backend") if k in kw}
    with pytest.raises(InputError, match=pattern):
        loss_and_grad(prepare(**kw), c, u, W_in, **call)


def test_forward_checks_parameters_against_c(rng):
    X, _, c, u, W_in = _problem(rng, n=4, T=3, d=2, m=4)
    with pytest.raises(InputError, match=r"^array 'u': expected shape \[4\], got \[3\]$"):
        forward(prepare(X), c, u[:3], W_in)


def test_prepare_refuses_an_empty_batch():
    with pytest.raises(InputError, match=r"^array 'X': expected shape \[n, T, d\] with n, T, d >= 1, got \[0, 3, 2\]$"):
        prepare(np.zeros((0, 3, 2)))


def test_activation_may_be_a_0d_array(rng):
    X, _, c, u, W_in = _problem(rng, n=4, T=3, d=2, m=4)
    data = prepare(X, activation=np.array("erf"))
    assert data.activation == "erf" and type(data.activation) is str
    for backend in ("numba", "numpy"):
        np.testing.assert_array_equal(forward(data, c, u, W_in, backend=backend).f,
                                      forward(prepare(X, activation="erf"), c, u, W_in, backend=backend).f)
