"""The eval/train contract of models "shallow" and "indrnn" (docs/contract.md), via the dispatcher and the CLI."""
import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.oracle import contract
from ntpref.npzio import load_npz, save_npz
from ntpref import shallow
from ntpref.shallow import indrnn
from ntpref.shallow.contract import input_data, input_kappa, input_options


def inputs(rng, model="shallow", n=10, T=4, d=3, m=4):
    X = rng.standard_normal((n, T, d)) / 2
    y = rng.standard_normal(n)
    if model == "shallow":
        c, U, W = shallow.iid_init(m, d, seed=4)
        return {"model": np.array("shallow"), "X": X, "y": y, "c": c, "U": U, "W": W}
    c, u, W_in = indrnn.paired_init(m, d, seed=4)
    return {"model": np.array("indrnn"), "X": X, "y": y, "c": c, "u": u, "W_in": W_in}


def test_shallow_eval_outputs(rng):
    arrays = inputs(rng)
    arrays.update(kappa=np.array(1.0), tau_att=np.array(0.5), mask_last_key=np.array(True),
                  activation=np.array("erf"))
    out = contract.evaluate(arrays)
    assert sorted(out) == ["f", "grad_U", "grad_W", "grad_c", "loss"] and out["loss"].shape == ()
    data = shallow.prepare(arrays["X"], arrays["y"], tau_att=0.5, mask_last_key=True, activation="erf")
    ref = shallow.loss_and_grad(data, arrays["c"], arrays["U"], arrays["W"], kappa=1.0)
    for name, value in zip(["loss", "grad_c", "grad_U", "grad_W", "f"], ref):
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
    ref = shallow.train(shallow.prepare(arrays["X"], arrays["y"], tau_att=2.0), (arrays["c"], arrays["U"], arrays["W"]),
                        eta=0.2, steps=5, rho=(1.0, None, 2.0), val=shallow.prepare(Xv, yv, tau_att=2.0), batch_size=4,
                        seed=9)
    for name in "cUW":
        assert np.array_equal(out[name], ref.params[name])
    assert np.array_equal(out["train_loss"], ref.train_loss) and np.array_equal(out["val_loss"], ref.val_loss)
    assert np.array_equal(out["grad_norm_W"], ref.grad_norms["W"]) and out["grad_norm_W"].shape == (5,)


def test_indrnn_eval_and_train(rng):
    arrays = inputs(rng, "indrnn")
    out = contract.evaluate({**arrays, "activation": np.array("erf")})
    assert sorted(out) == ["f", "grad_W_in", "grad_c", "grad_u", "loss"]
    data = indrnn.prepare(arrays["X"], arrays["y"], activation="erf")
    ref = indrnn.loss_and_grad(data, arrays["c"], arrays["u"], arrays["W_in"])
    for name, value in zip(["loss", "grad_c", "grad_u", "grad_W_in", "f"], ref):
        assert np.array_equal(out[name], value), name
    trained = contract.train({**arrays, "eta": np.array(0.1), "steps": np.array(3)})
    assert sorted(trained) == ["W_in", "c", "grad_norm_u", "train_loss", "u"]
    assert trained["train_loss"][0] == indrnn.loss_and_grad(indrnn.prepare(arrays["X"], arrays["y"]), arrays["c"],
                                                            arrays["u"], arrays["W_in"]).loss
    with pytest.raises(InputError, match="unknown array 'tau_att'"):
        contract.evaluate({**arrays, "tau_att": np.array(1.0)})


@pytest.mark.parametrize("model", ["shallow", "indrnn"])
def test_cli_eval_and_train(rng, tmp_path, model, capsys):
    arrays = inputs(rng, model)
    save_npz(tmp_path / "in.npz", arrays)
    assert main(["eval", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    got, expected = load_npz(tmp_path / "out.npz"), contract.evaluate(arrays, "auto")   # the command's default
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


def test_input_readers():
    """The oracle reads a shallow input's data and options with these (reference cases, tolerances)."""
    X = np.ones((3, 2, 2))
    arrays = {"X": X, "y": np.zeros(3), "tau_att": np.array(0.5), "mask_last_key": np.array(1),
              "activation": np.array(b"erf"), "kappa": np.array(1.0)}
    assert input_options("shallow", arrays) == {"tau_att": 0.5, "mask_last_key": True, "activation": "erf"}
    assert input_options("indrnn", arrays) == {"activation": "erf"} and input_options("indrnn", {"X": X}) == {}
    assert input_kappa(arrays) == 1.0 and input_kappa({}) == 2.0
    data = input_data("shallow", arrays)
    assert isinstance(data, shallow.Batch) and data[2:] == (0.5, True, "erf") and np.array_equal(data.y, np.zeros(3))
    rnn = input_data("indrnn", {"X": X})
    assert isinstance(rnn, indrnn.Batch) and rnn.y is None and rnn.activation == "tanh"
    with pytest.raises(InputError, match=r"^array 'tau_att': must be > 0\.0, got -1\.0$"):
        input_data("shallow", {**arrays, "tau_att": np.array(-1.0)})


@pytest.mark.parametrize("model", ["shallow", "indrnn"])
def test_train_input_names_the_arrays_of_the_file(rng, model):
    """Errors of a train input name its arrays ('batch', 'X_val'), not the Python arguments."""
    arrays = {**inputs(rng, model), "eta": np.array(0.1), "steps": np.array(2)}
    cases = [({"batch": np.array(11), "seed": np.array(0)},
              r"^array 'batch': must be between 1 and n = 10 \(the number of training samples\), got 11$"),
             ({"seed": np.array(0)}, r"^array 'seed': only used by ProjSGD \(give 'batch' too, or drop 'seed'\)$"),
             ({"batch": np.array(2)}, r"^ProjSGD \('batch' given\) needs 'seed'$"),
             ({"X_val": arrays["X"]}, r"^validation data needs both 'X_val' and 'y_val'$"),
             ({"X_val": arrays["X"][:, :, :2], "y_val": arrays["y"]},
              r"^array 'X_val': token dimension 2 differs from X's d = 3$"),
             ({"X_val": arrays["X"], "y_val": arrays["y"][:3]}, r"^array 'y_val': expected shape \[10\], got \[3\]$")]
    for change, pattern in cases:
        with pytest.raises(InputError, match=pattern):
            contract.train({**arrays, **change})
