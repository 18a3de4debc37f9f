"""ProjGD / ProjSGD and the per-head projection (docs/shallow.md §3), for the transformer and the IndRNN."""
import math

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.shallow.data import scale_tokens
from ntpref.shallow.model import (batch, batch_forward, batch_loss_and_grad, forward, iid_init, loss_and_grad,
                                  loss_from_outputs, paired_init)
from ntpref.shallow.projection import head_radii, project, project_block
from ntpref.shallow.indrnn import (rnn_batch, rnn_batch_forward, rnn_batch_loss_and_grad, rnn_forward,
                                rnn_loss_and_grad, rnn_paired_init)
from ntpref.shallow.train import proj_gd


def data(rng, n=12, T=4, d=3):
    X = scale_tokens(rng.standard_normal((n, T, d)))
    return X, np.sin(3 * X[:, 0, 0]) + 0.1 * rng.standard_normal(n)


def head_norms(delta):
    return np.sqrt(np.sum(delta.reshape(len(delta), -1) ** 2, axis=1))


def test_projection_holds_radius_and_keeps_inside_points(rng):
    B0 = rng.standard_normal((6, 3, 3))
    step = rng.standard_normal((6, 3, 3)) * np.array([0.01, 0.05, 1, 2, 0, 5])[:, None, None]
    B = B0 + step
    r = 0.4
    P = project_block(B, B0, r)
    norms_before, norms_after = head_norms(B - B0), head_norms(P - B0)
    inside = norms_before <= r
    assert inside.tolist() == [True, True, False, False, True, False]
    assert np.array_equal(P[inside], B[inside])  # bit for bit
    assert np.all(norms_after <= r * (1 + 1e-14))
    np.testing.assert_allclose(norms_after[~inside], r, rtol=1e-14)
    # outside heads move along the ray from B0 through B
    for i in np.flatnonzero(~inside):
        np.testing.assert_allclose(P[i] - B0[i], (B[i] - B0[i]) * r / norms_before[i], rtol=1e-13, atol=1e-15)
    assert np.array_equal(project_block(B, B0, 0.0), B0)
    assert np.array_equal(project_block(B, B0, None), B)


def test_project_blocks_and_radii(rng):
    m = 4
    centre = (rng.standard_normal(m), rng.standard_normal((m, 2)), rng.standard_normal((m, 2, 2)))
    params = tuple(p + 3 * rng.standard_normal(p.shape) for p in centre)
    radii = head_radii([0.5, None, 2.0], m, 3)
    assert radii == (0.25, None, 1.0)
    assert head_radii(None, m, 3) == (None, None, None) and head_radii([1, math.inf, 4], 16, 3) == (0.25, None, 1.0)
    out = project(params, centre, radii)
    assert np.all(np.abs(out[0] - centre[0]) <= 0.25 * (1 + 1e-14))
    assert np.array_equal(out[1], params[1])
    assert np.all(head_norms(out[2] - centre[2]) <= 1.0 * (1 + 1e-14))
    with pytest.raises(InputError, match="'rho'.*3 radii"):
        head_radii([1.0, 2.0], m, 3)
    with pytest.raises(InputError, match="'rho'.*>= 0"):
        head_radii([1.0, -2.0, 1.0], m, 3)


def test_projgd_without_projection_is_plain_gd(rng):
    X, y = data(rng)
    theta = iid_init(4, 3, seed=5)
    calls = []
    res = proj_gd("shallow", X, y, theta, eta=0.3, steps=4, tau_att=0.7, activation="erf",
                  progress=lambda *a: calls.append(a))
    c, U, W = theta
    for t in range(4):
        _, loss, gc, gU, gW = loss_and_grad(X, y, c, U, W, tau_att=0.7, activation="erf")
        assert res.train_loss[t] == loss
        assert res.grad_norms["W"][t] == math.sqrt(np.sum(gW * gW))
        assert res.grad_norms["c"][t] == math.sqrt(np.sum(gc * gc))
        c, U, W = c - 0.3 * gc, U - 0.3 * gU, W - 0.3 * gW
    for name, expected in zip("cUW", (c, U, W)):
        assert np.array_equal(res.params[name], expected)
    final = loss_from_outputs(forward(X, c, U, W, tau_att=0.7, activation="erf"), y, 2.0)
    assert res.final_train_loss == final
    assert res.min_train_loss == res.train_loss.min() and res.train_loss[-1] < res.train_loss[0]
    assert res.val_loss is None and res.final_val_loss is None
    assert calls == [("shallow ProjGD", t, 4) for t in range(1, 5)]


def test_projgd_stays_in_the_balls_and_logs_validation(rng):
    X, y = data(rng)
    Xv, yv = data(rng, n=5)
    m = 4
    theta0 = paired_init(m, 3, seed=2)
    rho = (0.2, 0.3, 0.5)
    res = proj_gd("shallow", X, y, theta0, eta=2.0, steps=6, rho=rho, X_val=Xv, y_val=yv, kappa=1)
    for (name, p0), r in zip(zip("cUW", theta0), rho):
        assert np.all(head_norms(res.params[name] - p0) <= r / math.sqrt(m) * (1 + 1e-14))
    assert np.any(np.isclose(head_norms(res.params["W"] - theta0[2]), 0.5 / math.sqrt(m)))  # active
    fv = forward(Xv, res.params["c"], res.params["U"], res.params["W"])
    assert res.val_loss.shape == (6,) and res.final_val_loss == loss_from_outputs(fv, yv, 1.0)
    # one step by hand: gradient step, then the projection of docs/shallow.md §3
    _, loss, *grads = loss_and_grad(X, y, *theta0, kappa=1)
    first = project([p - 2.0 * g for p, g in zip(theta0, grads)], theta0, head_radii(rho, m, 3))
    one = proj_gd("shallow", X, y, theta0, eta=2.0, steps=1, rho=rho, kappa=1)
    assert all(np.array_equal(one.params[k], v) for k, v in zip("cUW", first)) and one.train_loss[0] == loss


def test_projsgd_reproducible_from_seed(rng):
    X, y = data(rng, n=20)
    theta = iid_init(4, 3, seed=1)
    kw = dict(eta=0.5, steps=5, batch=6, rho=(1.0, 1.0, 1.0))
    a = proj_gd("shallow", X, y, theta, seed=11, **kw)
    b = proj_gd("shallow", X, y, theta, seed=11, **kw)
    other = proj_gd("shallow", X, y, theta, seed=12, **kw)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in "cUW")
    assert np.array_equal(a.train_loss, b.train_loss)
    assert not np.array_equal(a.params["W"], other.params["W"])
    # the first step by hand: indices with replacement from default_rng(seed), minibatch gradient
    idx = np.random.default_rng(11).integers(0, 20, size=6)
    _, _, *grads = loss_and_grad(X[idx], y[idx], *theta)
    first = project([p - 0.5 * g for p, g in zip(theta, grads)], theta, head_radii((1.0,) * 3, 4, 3))
    one = proj_gd("shallow", X, y, theta, seed=11, **{**kw, "steps": 1})
    assert all(np.array_equal(one.params[k], v) for k, v in zip("cUW", first))
    assert one.train_loss[0] == loss_from_outputs(forward(X, *theta), y, 2.0)  # full training loss
    assert one.grad_norms["U"][0] == math.sqrt(np.sum(grads[1] ** 2))


def test_indrnn_adapter_is_plain_gd(rng):
    X, y = data(rng)
    theta = rnn_paired_init(4, 3, seed=3)
    res = proj_gd("indrnn", X, y, theta, eta=0.4, steps=3, activation="erf", kappa=1)
    c, u, W_in = theta
    for t in range(3):
        f, loss, gc, gu, gW = rnn_loss_and_grad(X, y, c, u, W_in, activation="erf", kappa=1)
        assert res.train_loss[t] == loss and res.grad_norms["u"][t] == math.sqrt(np.sum(gu * gu))
        assert loss_from_outputs(f, y, 1.0) == pytest.approx(loss, rel=1e-14)  # same loss convention
        c, u, W_in = c - 0.4 * gc, u - 0.4 * gu, W_in - 0.4 * gW
    assert all(np.array_equal(res.params[k], v) for k, v in zip(("c", "u", "W_in"), (c, u, W_in)))
    kw = dict(eta=0.4, batch=4, seed=0, rho=(0.1, 0.1, 0.1))
    sgd = proj_gd("indrnn", X, y, theta, steps=3, **kw)
    assert np.all(np.abs(sgd.params["u"] - theta[1]) <= 0.1 / 2 * (1 + 1e-14))
    one = proj_gd("indrnn", X, y, theta, steps=1, **kw)
    assert sgd.train_loss[1] == loss_from_outputs(rnn_forward(X, *one.params.values()), y, 2.0)


def test_trainer_rejects_bad_options(rng):
    X, y = data(rng)
    theta = iid_init(2, 3, seed=0)
    cases = [
        (dict(model="indrnn", tau_att=0.5), "unknown option 'tau_att'"),
        (dict(seed=3), "'seed'.*only used by ProjSGD"),
        (dict(batch=3), "needs 'seed'"),
        (dict(X_val=X), "both 'X_val' and 'y_val'"),
        (dict(X_val=X[:, :, :2], y_val=y), "'X_val'.*dimension 2"),
        (dict(eta=0.0), "'eta'.*> 0"),
        (dict(steps=0), "'steps'.*>= 1"),
        (dict(model="rnn"), "unknown model"),
        (dict(eta=1e6, steps=50, kappa=2), "diverged|non-finite"),
    ]
    for change, pattern in cases:
        kw = {"model": "shallow", "eta": 0.1, "steps": 2, **change}
        params = rnn_paired_init(2, 3, 0) if kw["model"] == "indrnn" else theta
        with pytest.raises(InputError, match=pattern):
            proj_gd(kw.pop("model"), X, y, params, **kw)


@pytest.mark.parametrize("model", ["shallow", "indrnn"])
def test_trajectories_agree_across_backends(rng, model):
    """docs/contract.md: per-step losses of the two backends agree to rtol 1e-9 over 50 steps."""
    X, y = data(rng, n=40, T=6, d=3)
    theta = paired_init(8, 3, seed=4) if model == "shallow" else rnn_paired_init(8, 3, seed=4)
    kw = dict(eta=0.2, steps=50, rho=(3.0, 3.0, 3.0))
    a, b = (proj_gd(model, X, y, theta, backend=backend, **kw) for backend in ("numba", "numpy"))
    np.testing.assert_allclose(a.train_loss, b.train_loss, rtol=1e-9)
    assert np.all(np.diff(a.train_loss) < 0)  # a smooth (non-chaotic) trajectory


def test_validated_batches_serve_new_parameters_and_need_targets_for_the_loss(rng):
    X, y = data(rng)
    b = batch(X, y, tau_att=0.5, mask_last_key=True)
    rb = rnn_batch(X, y, activation="erf")
    for seed in (1, 2):                                     # one validated batch, new parameters each time
        params = iid_init(4, 3, seed=seed)
        expected = loss_and_grad(X, y, *params, kappa=1.0, tau_att=0.5, mask_last_key=True)
        for got, want in zip(batch_loss_and_grad(b, *params, kappa=1.0), expected):
            assert np.array_equal(got, want)
        assert np.array_equal(batch_forward(b, *params), forward(X, *params, tau_att=0.5, mask_last_key=True))
        c, u, W_in = rnn_paired_init(4, 3, seed=seed)
        for got, want in zip(rnn_batch_loss_and_grad(rb, c, u, W_in), rnn_loss_and_grad(X, y, c, u, W_in,
                                                                                        activation="erf")):
            assert np.array_equal(got, want)
        assert np.array_equal(rnn_batch_forward(rb, c, u, W_in), rnn_forward(X, c, u, W_in, activation="erf"))
    with pytest.raises(InputError, match="'y'"):
        batch_loss_and_grad(batch(X), *iid_init(4, 3, seed=1))
    with pytest.raises(InputError, match="'y'"):
        rnn_batch_loss_and_grad(rnn_batch(X), *rnn_paired_init(4, 3, seed=1))
    with pytest.raises(InputError, match="'W'"):                 # parameters are still checked per call
        batch_forward(b, np.ones(4), np.ones((4, 3)), np.ones((4, 2, 2)))
