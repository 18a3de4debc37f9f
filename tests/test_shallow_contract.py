"""The eval/train contract of models "shallow" and "indrnn" (docs/contract.md), via the dispatcher and the CLI."""
import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.oracle import contract
from ntpref.npzio import load_npz, save_npz
from ntpref.shallow.model import iid_init, loss_and_grad
from ntpref.shallow.indrnn import rnn_loss_and_grad, rnn_paired_init
from ntpref.shallow.train import proj_gd


def inputs(rng, model="shallow", n=10, T=4, d=3, m=4):
    X = rng.standard_normal((n, T, d)) / 2
    y = rng.standard_normal(n)
    if model == "shallow":
        c, U, W = iid_init(m, d, seed=4)
        return {"model": np.array("shallow"), "X": X, "y": y, "c": c, "U": U, "W": W}
    c, u, W_in = rnn_paired_init(m, d, seed=4)
    return {"model": np.array("indrnn"), "X": X, "y": y, "c": c, "u": u, "W_in": W_in}


def test_shallow_eval_outputs(rng):
    arrays = inputs(rng)
    arrays.update(kappa=np.array(1.0), tau_att=np.array(0.5), mask_last_key=np.array(True),
                  activation=np.array("erf"))
    out = contract.evaluate(arrays)
    assert sorted(out) == ["f", "grad_U", "grad_W", "grad_c", "loss"] and out["loss"].shape == ()
    ref = loss_and_grad(arrays["X"], arrays["y"], arrays["c"], arrays["U"], arrays["W"], kappa=1.0,
                        tau_att=0.5, mask_last_key=True, activation="erf")
    for name, value in zip(["f", "loss", "grad_c", "grad_U", "grad_W"], ref):
        assert np.array_equal(out[name], value), name
    numpy_out = contract.evaluate(arrays, backend="numpy")
    for name in out:
        np.testing.assert_allclose(numpy_out[name], out[name], rtol=1e-12, atol=1e-12 * np.abs(out[name]).max())


def test_shallow_train_outputs(rng):
    arrays = inputs(rng)
    Xv, yv = rng.standard_normal((3, 4, 3)) / 2, rng.standard_normal(3)
    arrays.update(eta=np.array(0.2), steps=np.array(5), rho=np.array([1.0, np.inf, 2.0]), X_val=Xv, y_val=yv,
                  batch=np.array(4), seed=np.array(9), tau_att=np.array(2.0))
    out = contract.train(arrays)
    assert sorted(out) == ["U", "W", "c", "grad_norm_W", "train_loss", "val_loss"]
    ref = proj_gd("shallow", arrays["X"], arrays["y"], (arrays["c"], arrays["U"], arrays["W"]), eta=0.2,
                  steps=5, rho=(1.0, None, 2.0), X_val=Xv, y_val=yv, batch=4, seed=9, tau_att=2.0)
    for name in "cUW":
        assert np.array_equal(out[name], ref.params[name])
    assert np.array_equal(out["train_loss"], ref.train_loss) and np.array_equal(out["val_loss"], ref.val_loss)
    assert np.array_equal(out["grad_norm_W"], ref.grad_norms["W"]) and out["grad_norm_W"].shape == (5,)


def test_indrnn_eval_and_train(rng):
    arrays = inputs(rng, "indrnn")
    out = contract.evaluate({**arrays, "activation": np.array("erf")})
    assert sorted(out) == ["f", "grad_W_in", "grad_c", "grad_u", "loss"]
    ref = rnn_loss_and_grad(arrays["X"], arrays["y"], arrays["c"], arrays["u"], arrays["W_in"], activation="erf")
    for name, value in zip(["f", "loss", "grad_c", "grad_u", "grad_W_in"], ref):
        assert np.array_equal(out[name], value), name
    trained = contract.train({**arrays, "eta": np.array(0.1), "steps": np.array(3)})
    assert sorted(trained) == ["W_in", "c", "grad_norm_u", "train_loss", "u"]
    assert trained["train_loss"][0] == rnn_loss_and_grad(arrays["X"], arrays["y"], arrays["c"], arrays["u"],
                                                         arrays["W_in"])[1]
    with pytest.raises(InputError, match="unknown array 'tau_att'"):
        contract.evaluate({**arrays, "tau_att": np.array(1.0)})


@pytest.mark.parametrize("model", ["shallow", "indrnn"])
def test_cli_eval_and_train(rng, tmp_path, model, capsys):
    arrays = inputs(rng, model)
    save_npz(tmp_path / "in.npz", arrays)
    assert main(["eval", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    got, expected = load_npz(tmp_path / "out.npz"), contract.evaluate(arrays)
    assert sorted(got) == sorted(expected) and all(np.array_equal(got[k], expected[k]) for k in got)
    save_npz(tmp_path / "tr.npz", {**arrays, "eta": np.array(0.1), "steps": np.array(2)})
    assert main(["train", str(tmp_path / "tr.npz"), "-o", str(tmp_path / "tr_out.npz"), "-q",
                 "--backend", "numpy"]) == 0
    assert load_npz(tmp_path / "tr_out.npz")["train_loss"].shape == (2,)


@pytest.mark.parametrize("model,typo,right", [("shallow", "tau_Att", "tau_att"), ("shallow", "u", "U"),
                                              ("indrnn", "W_In", "W_in"), ("indrnn", "kapa", "kappa")])
def test_cli_misspelled_array_is_exit_2(rng, tmp_path, capsys, model, typo, right):
    arrays = inputs(rng, model)
    if right in arrays:
        arrays[typo] = arrays.pop(right)
    else:
        arrays[typo] = np.array(1.0)
    save_npz(tmp_path / "in.npz", arrays)
    capsys.readouterr()
    assert main(["eval", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "in.npz" in err
    assert f"unknown array '{typo}' (did you mean '{right}'?)" in err
    assert not (tmp_path / "out.npz").exists()


def test_train_input_errors(rng):
    arrays = {**inputs(rng), "eta": np.array(0.1), "steps": np.array(2)}
    with pytest.raises(InputError, match="'rho'.*expected shape \\[3\\]"):
        contract.train({**arrays, "rho": np.array([1.0, 2.0])})
    with pytest.raises(InputError, match="'steps'.*integer"):
        contract.train({**arrays, "steps": np.array(2.0)})
    with pytest.raises(InputError, match="missing array 'eta'"):
        contract.train({k: v for k, v in arrays.items() if k != "eta"})
