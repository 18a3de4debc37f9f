"""ntpref.oracle.gradcheck: central differences against analytic gradients; ``ntpref gradcheck``."""
import re

import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.oracle.gradcheck import gradcheck, numeric_gradient
from ntpref.npzio import load_npz, save_npz


def quartic(A, b, x):
    """L = ½‖tanh(A b)‖² + Σ x⁴ with its closed-form gradients."""
    z = np.tanh(A @ b)
    g = z * (1 - z ** 2)
    return 0.5 * float(z @ z) + float(np.sum(x ** 4)), {"A": np.outer(g, b), "b": A.T @ g, "x": 4 * x ** 3}


@pytest.fixture
def inputs(rng):
    return {"A": rng.normal(size=(3, 4)), "b": rng.normal(size=4), "x": np.array(0.7)}


def test_numeric_gradient_of_a_quadratic_is_exact_to_rounding(rng):
    Q = rng.normal(size=(4, 4))
    Q = Q + Q.T
    x = rng.normal(size=4)
    fd = numeric_gradient(lambda a: 0.5 * a["x"] @ Q @ a["x"], {"x": x}, "x")
    assert np.allclose(fd, Q @ x, rtol=1e-8, atol=1e-9)


def test_correct_gradients_pass(inputs):
    report = gradcheck(quartic, inputs)
    assert report.ok, report.table()
    assert [r.name for r in report.rows] == ["A", "b", "x"]
    assert all(r.max_abs_err < 1e-8 for r in report.rows)


def test_wrong_gradient_is_named(inputs):
    def wrong(**kw):
        loss, g = quartic(**kw)
        g["b"] = g["b"].copy()
        g["b"][2] *= 1 + 1e-5
        return loss, g

    report = gradcheck(wrong, inputs)
    assert not report.ok and report.failures == ["b"]
    assert "(2,)" in report.table()


def test_shape_mismatch_and_unknown_names(inputs):
    def transposed(**kw):
        loss, g = quartic(**kw)
        return loss, {**g, "A": g["A"].T}

    report = gradcheck(transposed, inputs)
    assert report.failures == ["A"] and "shape" in report.table()
    with pytest.raises(InputError, match="'nope'"):
        gradcheck(lambda **kw: (0.0, {"nope": np.zeros(1)}), inputs)


def test_sampled_entries(inputs):
    def wrong(**kw):
        loss, g = quartic(**kw)
        return loss, {**g, "A": g["A"] + 1e-3}

    report = gradcheck(wrong, inputs, max_entries=5)
    assert report.failures == ["A"] and report.rows[0].shape == (5,)


# --- real models -----------------------------------------------------------------------------
def test_shallow_model_gradients(rng):
    from ntpref.shallow import loss_and_grad, paired_init, prepare

    c, U, W = paired_init(4, 3, seed=1)
    X = rng.normal(size=(5, 4, 3)) / 2
    y = rng.normal(size=5)
    c, U, W = c + 0.2 * rng.normal(size=c.shape), U + 0.2 * rng.normal(size=U.shape), W + 0.2 * rng.normal(size=W.shape)

    data = prepare(X, y, tau_att=1.5, mask_last_key=True)

    def fun(c, U, W):
        loss, gc, gU, gW, _ = loss_and_grad(data, c, U, W)
        return loss, {"c": gc, "U": gU, "W": gW}

    report = gradcheck(fun, {"c": c, "U": U, "W": W})
    assert report.ok, report.table()

    def bad(c, U, W):
        loss, g = fun(c, U, W)
        return loss, {**g, "W": g["W"] * 1.001}
    assert gradcheck(bad, {"c": c, "U": U, "W": W}).failures == ["W"]


def _twostage_input(tmp_path):
    from ntpref.twostage import five_token_example

    ds = five_token_example()
    rng = np.random.default_rng(3)
    arrays = {"model": np.array("twostage"), "tokens": ds.tokens, "lengths": ds.lengths, "targets": ds.targets,
              "K": np.array(5), "succ": ds.succ, "W_ov": rng.normal(size=(5, 5)), "W_kq": rng.normal(size=(5, 5))}
    save_npz(tmp_path / "in.npz", arrays)
    return tmp_path / "in.npz"


def test_cli_checks_our_own_and_a_users_gradients(tmp_path, capsys):
    inp = _twostage_input(tmp_path)
    assert main(["gradcheck", str(inp)]) == 0                       # the oracle's own gradients
    out = capsys.readouterr().out
    assert "grad_W_kq" in out and "grad0_W_ov" in out
    assert main(["eval", str(inp), "-o", str(tmp_path / "out.npz"), "-q"]) == 0
    grads = load_npz(tmp_path / "out.npz")
    assert main(["gradcheck", str(inp), str(tmp_path / "out.npz")]) == 0   # a whole eval output is accepted
    assert "ignored: " in capsys.readouterr().out

    grads["grad_W_kq"] = grads["grad_W_kq"].copy()
    grads["grad_W_kq"][1, 0] += 1e-4
    save_npz(tmp_path / "bad.npz", {"grad_W_kq": grads["grad_W_kq"], "grad_W_ov": grads["grad_W_ov"]})
    assert main(["gradcheck", str(inp), str(tmp_path / "bad.npz")]) == 1
    out = capsys.readouterr().out
    assert "grad_W_kq" in out and "FAIL" in out and "(1, 0)" in out


def test_cli_names_the_models_gradients_it_was_not_given(tmp_path, capsys):
    """A verdict never claims more than was checked: the model's gradients GRADS.npz lacks are named in it."""
    inp = _twostage_input(tmp_path)
    assert main(["eval", str(inp), "-o", str(tmp_path / "out.npz"), "-q"]) == 0
    grads = load_npz(tmp_path / "out.npz")
    save_npz(tmp_path / "one.npz", {"grad_W_ov": grads["grad_W_ov"], "note": np.zeros(1)})
    assert main(["gradcheck", str(inp), str(tmp_path / "one.npz")]) == 0
    out = capsys.readouterr().out
    assert out.endswith("(not gradients, ignored: note)\nok: 1 arrays agree; not given, so not checked: grad_W_kq, "
                        "grad0_W_ov\n"), out
    wrong = grads["grad_W_ov"].copy()
    wrong[0, 0] += 1.0
    save_npz(tmp_path / "wrong.npz", {"grad_W_ov": wrong, "grad0_W_ov": grads["grad0_W_ov"]})
    assert main(["gradcheck", str(inp), str(tmp_path / "wrong.npz")]) == 1
    assert capsys.readouterr().out.endswith("FAIL: 1/2 arrays agree; failing: grad_W_ov; not given, so not checked: "
                                            "grad_W_kq\n")
    assert main(["gradcheck", str(inp), str(tmp_path / "out.npz")]) == 0                 # every one given
    assert capsys.readouterr().out.endswith("\nok: 3 arrays agree\n")


def test_cli_bad_gradient_names(tmp_path, capsys):
    inp = _twostage_input(tmp_path)
    save_npz(tmp_path / "g.npz", {"grad_W_qk": np.zeros((5, 5))})
    assert main(["gradcheck", str(inp), str(tmp_path / "g.npz")]) == 2
    assert "grad_W_qk" in capsys.readouterr().err
    save_npz(tmp_path / "none.npz", {"f": np.zeros(2)})
    assert main(["gradcheck", str(inp), str(tmp_path / "none.npz")]) == 2


def test_every_array_gets_at_least_one_entry_checked(inputs):
    report = gradcheck(quartic, inputs, max_entries=1)
    assert report.ok and report.counts == {"A": (1, 12), "b": (1, 4), "x": (1, 1)}
    assert "entries checked: A 1 of 12; b 1 of 4; x 1 of 1" in report.table()
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match=r"max_entries must be an integer >= 1 \(or None for all entries\), got "):
            gradcheck(quartic, inputs, max_entries=bad)


@pytest.mark.parametrize("value", ["0", "-1", "many"])
def test_cli_refuses_max_entries_below_one(tmp_path, capsys, value):
    inp = _twostage_input(tmp_path)
    assert main(["gradcheck", str(inp), "--max-entries", value]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert re.fullmatch(r"ntpref gradcheck: error: argument --max-entries: expected a whole number >= 1.*, got "
                        rf"'?{value}'? \(see 'ntpref gradcheck --help'\)\n", err)


def test_cli_says_how_many_entries_it_checked(tmp_path, capsys):
    inp = _twostage_input(tmp_path)
    assert main(["gradcheck", str(inp), "--max-entries", "3"]) == 0
    assert "entries checked: grad_W_ov 3 of 25; grad_W_kq 3 of 25; grad0_W_ov 3 of 25" in capsys.readouterr().out
    assert main(["gradcheck", str(inp)]) == 0
    assert "entries checked: grad_W_ov 25 of 25; grad_W_kq 25 of 25; grad0_W_ov 25 of 25" in capsys.readouterr().out


def test_cli_input_errors_name_the_file(tmp_path, capsys):
    inp = _twostage_input(tmp_path)
    arrays = load_npz(inp)
    save_npz(tmp_path / "bad_in.npz", {**arrays, "W_ov": arrays["W_ov"][:, :4]})
    assert main(["gradcheck", str(tmp_path / "bad_in.npz")]) == 2
    assert re.match(rf"ntpref: error: {re.escape(str(tmp_path / 'bad_in.npz'))}: array 'W_ov'", capsys.readouterr().err)
    save_npz(tmp_path / "g.npz", {"grad_tokens": np.zeros((6, 3))})
    assert main(["gradcheck", str(inp), str(tmp_path / "g.npz")]) == 2
    assert re.match(rf"ntpref: error: {re.escape(str(tmp_path / 'g.npz'))}: array 'grad_tokens': input array 'tokens' "
                    rf"of {re.escape(str(inp))} is int64, not a float array", capsys.readouterr().err)
    assert main(["gradcheck", str(tmp_path / "missing.npz")]) == 2
    assert "missing.npz: no such file" in capsys.readouterr().err


def test_cli_nan_gradient_fails_by_name(tmp_path, capsys):
    inp = _twostage_input(tmp_path)
    assert main(["eval", str(inp), "-o", str(tmp_path / "out.npz"), "-q"]) == 0
    grads = load_npz(tmp_path / "out.npz")
    g = grads["grad_W_ov"].copy()
    g[2, 3] = np.nan
    save_npz(tmp_path / "nan.npz", {"grad_W_ov": g})
    assert main(["gradcheck", str(inp), str(tmp_path / "nan.npz")]) == 1
    assert re.search(r"grad_W_ov .* FAIL \(non-finite: given holds NaN at index \(2, 3\)\)", capsys.readouterr().out)


def test_sampled_check_sees_every_non_finite_entry(inputs, tmp_path, capsys):
    def poisoned(**kw):
        loss, g = quartic(**kw)
        A = g["A"].copy()
        A.flat[[3, 11]] = (np.nan, np.inf)
        return loss, {**g, "A": A}

    report = gradcheck(poisoned, inputs, max_entries=1, seed=4)
    assert report.failures == ["A"] and report.counts["A"] == (3, 12)    # the sample and both bad entries
    inp = _twostage_input(tmp_path)
    assert main(["eval", str(inp), "-o", str(tmp_path / "out.npz"), "-q"]) == 0
    g = load_npz(tmp_path / "out.npz")["grad_W_ov"].copy()
    g[4, 4], g[0, 1] = np.inf, np.nan
    save_npz(tmp_path / "bad.npz", {"grad_W_ov": g})
    for seed in ("0", "1", "2"):
        assert main(["gradcheck", str(inp), str(tmp_path / "bad.npz"), "--max-entries", "1", "--seed", seed]) == 1
        assert re.search(r"grad_W_ov .* FAIL \(non-finite: given holds (NaN|inf)", capsys.readouterr().out)


def test_seed_must_be_a_whole_number_at_least_zero(inputs, tmp_path, capsys):
    for bad in (-1, 1.5, True):
        with pytest.raises(InputError, match=r"seed must be an integer >= 0, got "):
            gradcheck(quartic, inputs, max_entries=2, seed=bad)
    inp = _twostage_input(tmp_path)
    assert main(["gradcheck", str(inp), "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert err == ("ntpref gradcheck: error: argument --seed: expected a whole number >= 0, got '-1' "
                   "(see 'ntpref gradcheck --help')\n")


def test_eps_must_be_a_positive_number(inputs, tmp_path, capsys):
    """The library names its argument ``eps``, the command its option ``--eps``."""
    with pytest.raises(InputError, match=r"eps must be a positive number, got -1.0"):
        gradcheck(quartic, inputs, eps=-1.0)
    inp = _twostage_input(tmp_path)
    for bad in ("-1", "0", "nan", "inf", "small"):
        assert main(["gradcheck", str(inp), "--eps", bad]) == 2
        assert capsys.readouterr().err == (f"ntpref gradcheck: error: argument --eps: expected a positive number, "
                                           f"got '{bad}' (see 'ntpref gradcheck --help')\n")
