"""ProjGD / ProjSGD and the per-head projection (docs/shallow.md §3), for the transformer and the IndRNN: the
trainer recognises the model by the type of the prepared data."""
import math

import numpy as np
import pytest

from ntpref import shallow
from ntpref.errors import InputError
from ntpref.shallow import (TrainResult, forward, iid_init, indrnn, loss_and_grad, paired_init, prepare, scale_tokens,
                            train)
from ntpref.shallow.evaluation import loss_from_outputs
from ntpref.shallow.projection import head_radii, project, project_block


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
    prepared = prepare(X, y, tau_att=0.7, activation="erf")
    res = train(prepared, theta, eta=0.3, steps=4, progress=lambda *a: calls.append(a))
    assert isinstance(res, TrainResult) and res.model == "shallow"
    c, U, W = theta
    for t in range(4):
        loss, gc, gU, gW, _ = loss_and_grad(prepared, c, U, W)
        assert res.train_loss[t] == loss
        assert res.grad_norms["W"][t] == math.sqrt(np.sum(gW * gW))
        assert res.grad_norms["c"][t] == math.sqrt(np.sum(gc * gc))
        c, U, W = c - 0.3 * gc, U - 0.3 * gU, W - 0.3 * gW
    for name, expected in zip("cUW", (c, U, W)):
        assert np.array_equal(res.params[name], expected)
    final = loss_from_outputs(forward(prepared, c, U, W).f, y, 2.0)
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
    res = train(prepare(X, y), theta0, eta=2.0, steps=6, rho=rho, val=prepare(Xv, yv), kappa=1)
    for (name, p0), r in zip(zip("cUW", theta0), rho):
        assert np.all(head_norms(res.params[name] - p0) <= r / math.sqrt(m) * (1 + 1e-14))
    assert np.any(np.isclose(head_norms(res.params["W"] - theta0[2]), 0.5 / math.sqrt(m)))  # active
    fv = forward(prepare(Xv), *res.params.values()).f
    assert res.val_loss.shape == (6,) and res.final_val_loss == loss_from_outputs(fv, yv, 1.0)
    # one step by hand: gradient step, then the projection of docs/shallow.md §3
    loss, *grads, _ = loss_and_grad(prepare(X, y), *theta0, kappa=1)
    first = project([p - 2.0 * g for p, g in zip(theta0, grads)], theta0, head_radii(rho, m, 3))
    one = train(prepare(X, y), theta0, eta=2.0, steps=1, rho=rho, kappa=1)
    assert all(np.array_equal(one.params[k], v) for k, v in zip("cUW", first)) and one.train_loss[0] == loss


def test_snapshots_and_projected_heads(rng):
    # The kept iterates are the ends of shorter runs (ProjGD is deterministic); ``projected`` counts, per
    # step and block, the heads whose value the projection changed, recounted here by hand from each step.
    X, y = data(rng)
    prepared, m, rho = prepare(X, y), 4, (0.05, None, 0.3)
    theta0 = paired_init(m, 3, seed=4)
    res = train(prepared, theta0, eta=1.0, steps=6, rho=rho, snapshots=np.array([0, 2, 6, 2]))
    assert sorted(res.snapshots) == [0, 2, 6]
    assert all(np.array_equal(res.snapshots[0][k], v) for k, v in zip("cUW", theta0))
    for t in (2, 6):
        short = train(prepared, theta0, eta=1.0, steps=t, rho=rho)
        assert all(np.array_equal(res.snapshots[t][k], short.params[k]) for k in "cUW")
    theta, radii, counts = theta0, head_radii(rho, m, 3), np.zeros((3, 6), dtype=np.int64)
    for t in range(6):
        _, *grads, _ = loss_and_grad(prepared, *theta)
        stepped = [p - 1.0 * g for p, g in zip(theta, grads)]
        theta = project(stepped, theta0, radii)
        counts[:, t] = [np.sum(head_norms(B - B0) > r) if r is not None else 0
                        for B, B0, r in zip(stepped, theta0, radii)]
    assert counts[0].any() and counts[2].any() and not counts[1].any()     # both radii act, U is free
    for b, k in enumerate("cUW"):
        np.testing.assert_array_equal(res.projected[k], counts[b])
    # radii no step reaches: nothing projected, and the run is plain GD bit for bit
    wide = train(prepared, theta0, eta=1.0, steps=6, rho=(100.0,) * 3)
    plain = train(prepared, theta0, eta=1.0, steps=6)
    assert not any(v.any() for v in wide.projected.values()) and np.array_equal(wide.train_loss, plain.train_loss)
    assert all(np.array_equal(wide.params[k], plain.params[k]) for k in "cUW")
    for bad, why in (([7], "above 6"), ([1.5], "expected integers"), (3, "expected a sequence of steps")):
        with pytest.raises(InputError, match=f"array 'snapshots'.*{why}"):
            train(prepared, theta0, eta=1.0, steps=6, snapshots=bad)


def test_projsgd_reproducible_from_seed(rng):
    X, y = data(rng, n=20)
    prepared = prepare(X, y)
    theta = iid_init(4, 3, seed=1)
    kw = dict(eta=0.5, steps=5, batch_size=6, rho=(1.0, 1.0, 1.0))
    a = train(prepared, theta, seed=11, **kw)
    b = train(prepared, theta, seed=11, **kw)
    other = train(prepared, theta, seed=12, **kw)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in "cUW")
    assert np.array_equal(a.train_loss, b.train_loss)
    assert not np.array_equal(a.params["W"], other.params["W"])
    # the first step by hand: indices with replacement from default_rng(seed), minibatch gradient
    idx = np.random.default_rng(11).integers(0, 20, size=6)
    _, *grads, _ = loss_and_grad(prepare(X[idx], y[idx]), *theta)
    first = project([p - 0.5 * g for p, g in zip(theta, grads)], theta, head_radii((1.0,) * 3, 4, 3))
    one = train(prepared, theta, seed=11, **{**kw, "steps": 1})
    assert all(np.array_equal(one.params[k], v) for k, v in zip("cUW", first))
    assert one.train_loss[0] == forward(prepared, *theta).loss  # full training loss
    assert one.grad_norms["U"][0] == math.sqrt(np.sum(grads[1] ** 2))


def test_indrnn_data_trains_the_indrnn(rng):
    X, y = data(rng)
    prepared = indrnn.prepare(X, y, activation="erf")
    theta = indrnn.paired_init(4, 3, seed=3)
    res = train(prepared, theta, eta=0.4, steps=3, kappa=1)
    assert res.model == "indrnn" and list(res.params) == ["c", "u", "W_in"]
    c, u, W_in = theta
    for t in range(3):
        loss, gc, gu, gW, f = indrnn.loss_and_grad(prepared, c, u, W_in, kappa=1)
        assert res.train_loss[t] == loss and res.grad_norms["u"][t] == math.sqrt(np.sum(gu * gu))
        assert loss_from_outputs(f, y, 1.0) == pytest.approx(loss, rel=1e-14)  # same loss convention
        c, u, W_in = c - 0.4 * gc, u - 0.4 * gu, W_in - 0.4 * gW
    assert all(np.array_equal(res.params[k], v) for k, v in zip(("c", "u", "W_in"), (c, u, W_in)))
    kw = dict(eta=0.4, batch_size=4, seed=0, rho=(0.1, 0.1, 0.1))
    sgd = train(prepared, theta, steps=3, **kw)
    assert sgd.model == "indrnn"
    assert np.all(np.abs(sgd.params["u"] - theta[1]) <= 0.1 / 2 * (1 + 1e-14))
    one = train(prepared, theta, steps=1, **kw)
    assert sgd.train_loss[1] == loss_from_outputs(indrnn.forward(prepared, *one.params.values()).f, y, 2.0)


def test_trainer_rejects_bad_arguments(rng):
    X, y = data(rng)
    prepared = prepare(X, y)
    theta = iid_init(2, 3, seed=0)
    cases = [
        (dict(seed=3), r"^array 'seed': only used by ProjSGD \(give 'batch_size' too, or drop 'seed'\)$"),
        (dict(batch_size=3), r"^ProjSGD \('batch_size' given\) needs 'seed'$"),
        (dict(batch_size=13, seed=0), r"^array 'batch_size': must be between 1 and n = 12 \(the number of training "
                                      r"samples\), got 13$"),
        (dict(val=prepare(X[:, :, :2], y)), r"^val: token dimension 2 differs from data's d = 3$"),
        (dict(val=prepare(X)), r"^val: the validation loss needs targets y$"),
        (dict(val=prepare(X, y, tau_att=2.0)), r"^val: prepared with tau_att = 2\.0, data with tau_att = 1\.0$"),
        (dict(eta=0.0), r"^array 'eta': must be > 0\.0, got 0\.0$"),
        (dict(steps=0), r"^array 'steps': must be >= 1, got 0$"),
        (dict(rho=(1.0, 1.0)), r"^array 'rho': expected 3 radii \(one per parameter block\), got 2$"),
        (dict(kappa=3), r"^array 'kappa': must be 1 or 2, got 3\.0$"),
        (dict(backend="torch"), r"^backend must be one of numba, numpy, got 'torch'$"),
        (dict(eta=1e6, steps=50, kappa=2), r"^training diverged at step \d+: non-finite loss or parameters"),
    ]
    for change, pattern in cases:
        kw = {"eta": 0.1, "steps": 2, **change}
        with pytest.raises(InputError, match=pattern):
            train(prepared, theta, **kw)
    with pytest.raises(InputError, match=r"^array 'y': training needs targets y \[n\]$"):
        train(prepare(X), theta, eta=0.1, steps=2)
    with pytest.raises(InputError, match=r"^model 'shallow': expected 3 parameter blocks \(c, U, W\), got 2$"):
        train(prepared, theta[:2], eta=0.1, steps=2)
    with pytest.raises(InputError, match=r"^array 'W': expected shape \[2, 3, 3\], got \[2, 3\]$"):
        train(prepared, (theta.c, theta.U, theta.U), eta=0.1, steps=2)


@pytest.mark.parametrize("model, val, got", [
    ("shallow", lambda X, y: indrnn.prepare(X, y), "ntpref.shallow.indrnn.Batch"),
    ("indrnn", lambda X, y: prepare(X, y), "ntpref.shallow.model.Batch"),
    ("shallow", lambda X, y: (X, y), "builtins.tuple"),
])
def test_validation_data_of_another_model_is_refused(rng, model, val, got):
    X, y = data(rng)
    api = shallow if model == "shallow" else indrnn
    message = rf"^val: expected prepared data of the same model as data \({model}\), got {got}$"
    with pytest.raises(InputError, match=message):
        train(api.prepare(X, y), api.paired_init(2, 3, 0), eta=0.1, steps=2, val=val(X, y))


@pytest.mark.parametrize("wrong, got", [(lambda X, y: X, "numpy.ndarray"), (lambda X, y: (X, y), "builtins.tuple")])
def test_unprepared_data_is_refused(rng, wrong, got):
    X, y = data(rng)
    message = (r"^data: expected prepared data \(ntpref.shallow.prepare or ntpref.shallow.indrnn.prepare\), "
               rf"got {got}$")
    with pytest.raises(InputError, match=message):
        train(wrong(X, y), iid_init(2, 3, 0), eta=0.1, steps=2)


@pytest.mark.parametrize("model", ["shallow", "indrnn"])
def test_trajectories_agree_across_backends(rng, model):
    """docs/contract.md: per-step losses of the two backends agree to rtol 1e-9 over 50 steps."""
    X, y = data(rng, n=40, T=6, d=3)
    api = shallow if model == "shallow" else indrnn
    prepared, theta = api.prepare(X, y), api.paired_init(8, 3, seed=4)
    kw = dict(eta=0.2, steps=50, rho=(3.0, 3.0, 3.0))
    a, b = (train(prepared, theta, backend=backend, **kw) for backend in ("numba", "numpy"))
    assert a.model == b.model == model
    np.testing.assert_allclose(a.train_loss, b.train_loss, rtol=1e-9)
    assert np.all(np.diff(a.train_loss) < 0)  # a smooth (non-chaotic) trajectory
