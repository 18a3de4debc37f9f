"""The "twostage" eval/train contract (docs/contract.md) through the dispatcher and the ntpref command."""
import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.oracle import contract
from ntpref.npzio import load_npz, save_npz
from ntpref import twostage
from ntpref.twostage import Dataset, five_token_example

from test_twostage_model import l0_and_grad


def _inputs(ds: Dataset, W_ov, W_kq, *, onehot=True, succ=True):
    arrays = {"model": np.array("twostage"), "tokens": ds.tokens, "lengths": ds.lengths, "targets": ds.targets,
              "W_ov": W_ov, "W_kq": W_kq}
    arrays.update({"K": np.array(ds.K)} if onehot else {"E": ds.E})
    if succ:
        arrays["succ"] = ds.succ
    return arrays


@pytest.fixture
def gaussian_case(rng):
    """Sentences of the 5-token example with Gaussian embeddings (d = 4) and random weights."""
    five = five_token_example()
    E = rng.standard_normal((4, 5))
    ds = Dataset(five.tokens, five.lengths, five.targets, E, five.succ)
    return ds, rng.standard_normal((4, 4)), rng.standard_normal((4, 4))


def _expected(ds, W_ov, W_kq, backend="numba"):
    fw = twostage.forward(ds, W_ov, W_kq, backend=backend)
    loss, g_ov, g_kq = twostage.loss_and_grad(ds, W_ov, W_kq, backend=backend)
    loss0, g0 = l0_and_grad(ds, W_ov, backend=backend)
    return {"loss": loss, "logits": fw.logits, "attn": fw.attn, "grad_W_ov": g_ov, "grad_W_kq": g_kq,
            "loss0": loss0, "grad0_W_ov": g0}


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_eval_matches_model(gaussian_case, backend, tmp_path):
    ds, W_ov, W_kq = gaussian_case
    arrays = _inputs(ds, W_ov, W_kq, onehot=False)
    expected = _expected(ds, W_ov, W_kq, backend)
    out = contract.evaluate(arrays, backend)
    assert set(out) == set(expected)
    for name, value in expected.items():
        assert out[name].dtype == np.float64 and out[name].shape == np.shape(value)
        np.testing.assert_array_equal(out[name], value)
    assert out["loss"].ndim == 0 and out["attn"].shape == (6, 3)
    save_npz(tmp_path / "in.npz", arrays)
    assert main(["eval", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"), "--backend", backend, "-q"]) == 0
    back = load_npz(tmp_path / "out.npz")
    assert set(back) == set(expected)
    for name, value in expected.items():
        np.testing.assert_array_equal(back[name], value)


def test_eval_onehot_without_succ_and_padding():
    ds = Dataset.from_sentences([[1, 2, 0], [4, 0], [3]], [2, 0, 4], K=5)
    W_ov, W_kq = np.arange(25.0).reshape(5, 5) / 10, np.eye(5)
    out = contract.evaluate(_inputs(ds, W_ov, W_kq, succ=False))
    assert set(out) == {"loss", "logits", "attn", "grad_W_ov", "grad_W_kq"}
    assert out["attn"][1, 2] == 0.0 and out["attn"][2, 1:].tolist() == [0.0, 0.0] and out["attn"][2, 0] == 1.0
    np.testing.assert_allclose(out["attn"].sum(axis=1), 1.0, rtol=1e-15)
    loss, _, g_kq = twostage.loss_and_grad(ds, W_ov, W_kq)
    assert float(out["loss"]) == loss
    np.testing.assert_array_equal(out["grad_W_kq"], g_kq)


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_bad_names_exit_2_one_line(kind, tmp_path, capsys):
    five = five_token_example()
    good = _inputs(five, np.zeros((5, 5)), np.zeros((5, 5)))
    if kind == "train":
        good.update(eta0=np.array(0.1), eta=np.array(0.02), T0=np.array(3), T=np.array(4))
    cases = {"typo": ({**{k: v for k, v in good.items() if k != "W_kq"}, "W_KQ": good["W_kq"]}, "'W_KQ'"),
             "missing": ({k: v for k, v in good.items() if k != "targets"}, "'targets'"),
             "both": ({**good, "E": np.eye(5)}, "'E'")}
    if kind == "train":
        cases["no_succ"] = ({k: v for k, v in good.items() if k != "succ"}, "'succ'")
        cases["direction"] = ({**good, "direction": np.array("fast")}, "'direction'")
    for label, (arrays, name) in cases.items():
        path = tmp_path / f"{label}.npz"
        save_npz(path, arrays)
        assert main([kind, str(path), "-o", str(tmp_path / "out.npz"), "-q"]) == 2, label
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and name in err and str(path) in err, (label, err)
    assert not (tmp_path / "out.npz").exists()
    run = contract.evaluate if kind == "eval" else contract.train
    with pytest.raises(InputError, match=r"'W_ov'.*expected shape \[5, 5\]"):
        run({**good, "W_ov": np.zeros((4, 4))})


def test_train_cli_shapes_and_values(tmp_path):
    five = five_token_example()
    T0, T = 40, 60
    arrays = _inputs(five, np.zeros((5, 5)), np.zeros((5, 5)))
    arrays.update(eta0=np.array(0.2 / np.sqrt(5)), eta=np.array(0.05 / np.sqrt(5)), T0=np.array(T0),
                  T=np.array(T), direction=np.array("naive"))
    save_npz(tmp_path / "in.npz", arrays)
    assert main(["train", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"), "-q",
                 "--backend", "numba"]) == 0   # the library default, as ref below
    out = load_npz(tmp_path / "out.npz")
    shapes = {"W_ov": (5, 5), "W_kq": (5, 5), "W_ov_star": (5, 5), "W_kq_star": (5, 5), "loss_floor": (),
              **{f"stage1_{k}": (T0 + 1,) for k in ("loss", "norm", "corr")},
              **{f"stage2_{k}": (T + 1,) for k in ("loss", "norm", "corr")}}
    assert {k: v.shape for k, v in out.items()} == shapes
    assert all(v.dtype == np.float64 for v in out.values())
    ref = twostage.train(five, eta0=0.2 / np.sqrt(5), eta=0.05 / np.sqrt(5), T0=T0, T=T, direction="naive")
    np.testing.assert_array_equal(out["W_kq"], ref.W_kq)
    np.testing.assert_array_equal(out["stage2_corr"], ref.stage2["corr"])
    np.testing.assert_array_equal(out["stage1_loss"], ref.stage1["loss"])
    assert float(out["loss_floor"]) == ref.loss_floor
    # the given W_ov / W_kq are the initial values
    W0 = np.full((5, 5), 0.01)
    res = contract.train({**arrays, "W_ov": W0, "W_kq": W0, "T0": np.array(0), "T": np.array(0)})
    np.testing.assert_array_equal(res["W_ov"], W0)
    assert res["stage1_norm"].tolist() == [np.linalg.norm(W0)]


@pytest.mark.parametrize("kind", ["eval", "train"])
def test_a_succ_without_any_successor_is_refused(kind, tmp_path, capsys):
    """succ all -1: the collocation set of L0 is empty (docs/contract.md), for eval (loss0) as for train."""
    five = five_token_example()
    arrays = {**_inputs(five, np.zeros((5, 5)), np.zeros((5, 5))), "succ": np.full(5, -1)}
    if kind == "train":
        arrays.update(eta0=np.array(0.1), eta=np.array(0.02), T0=np.array(3), T=np.array(4))
    path = tmp_path / "in.npz"
    save_npz(path, arrays)
    assert main([kind, str(path), "-o", str(tmp_path / "out.npz"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err
    assert "array 'succ': no token has a successor, the collocation set C is empty" in err
    assert not (tmp_path / "out.npz").exists()
