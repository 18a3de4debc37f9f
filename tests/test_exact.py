"""The exact backend (ntpref.exact, docs/exact.md) against the oracle, and ``ntpref certify``.

1. The oracle's float64 eval outputs (both backends) lie within the float64 policy's atol of the
   multiprecision values, on every stored eval case, the random eval cases of two seeds and a few inputs
   made here for the option combinations those do not meet; err/atol is printed (``pytest -s``).
2. The exact gradients agree with multiprecision central differences of the exact losses (step 1e-20
   at 50 digits) to ~1e-30, so they are the gradients of the exact losses, independently of the closed
   forms; the exact stage-1 trajectory matches the closed form of docs/twostage.md §6.1 to 1e-40.
3. The comparisons can fail: a 1e-6 relative error in any array, an option of the input that the exact
   backend would ignore, or a transposed matrix (a query/key or output orientation mix-up) is outside
   atol.
4. One (and a few) steps of every training algorithm match the oracle's ``train`` under its train
   tolerances, with the projection active in every block.
5. ``ntpref certify``: its report, its exit statuses 0, 1 and 2.
"""
import copy
import math

import mpmath
import numpy as np
import pytest

from ntpref import exact
from ntpref.cli import main
from ntpref.exact import arith, indrnn, shallow, twostage
from ntpref.oracle import certify, contract
from ntpref.oracle.cases import Case, random_cases, stored_cases
from ntpref.oracle.compare import compare_arrays
from ntpref.oracle.tolerance import default_tolerances

U = 2.0 ** -53
BACKENDS = ("numba", "numpy")
H = mpmath.mpf("1e-20")


def made(name: str, model: str, kind: str, **arrays) -> Case:
    inputs = {"model": np.array(model), **arrays}
    return Case(name, model, kind, "random", name, lambda: (inputs, None))


def _made_eval_cases() -> list[Case]:
    """Option combinations the conformance cases do not meet."""
    rng = np.random.default_rng(20260101)
    X = rng.standard_normal((5, 3, 3)) / math.sqrt(3)
    lengths = np.array([1, 4, 3, 2, 4, 4])
    tokens = rng.integers(0, 4, size=(6, 4))
    tokens[np.arange(4)[None, :] >= lengths[:, None]] = -1
    return [
        made("made_shallow_tanh_kappa1_tau", "shallow", "eval", X=X, y=rng.standard_normal(5), c=rng.standard_normal(6),
             U=rng.standard_normal((6, 3)), W=rng.standard_normal((6, 3, 3)), kappa=np.array(1.0),
             tau_att=np.array(0.5), mask_last_key=np.array(0), activation=np.array(b"tanh")),
        made("made_shallow_erf_mask", "shallow", "eval", X=X, y=rng.standard_normal(5), c=rng.standard_normal(3),
             U=rng.standard_normal((3, 3)), W=rng.standard_normal((3, 3, 3)), mask_last_key=np.array(True),
             activation=np.array("erf")),
        made("made_twostage_wide_E_no_succ", "twostage", "eval", tokens=tokens, lengths=lengths,
             targets=rng.integers(0, 4, size=6), E=rng.standard_normal((6, 4)), W_ov=rng.standard_normal((6, 6)),
             W_kq=rng.standard_normal((6, 6))),
        made("made_indrnn_tanh_kappa1_long", "indrnn", "eval", X=rng.standard_normal((4, 7, 2)),
             y=rng.standard_normal(4), c=rng.standard_normal(3), u=1.5 * rng.standard_normal(3),
             W_in=rng.standard_normal((3, 2)), kappa=np.array(1.0)),
    ]


EVAL_CASES = ([c for c in stored_cases() if c.kind == "eval"]
              + [c for seed in (0, 1) for c in random_cases(None, 6, seed) if c.kind == "eval"]
              + _made_eval_cases())
BY_ID = {c.id: c for c in EVAL_CASES}


def regime(model: str, name: str) -> str:
    """The id of the first random eval case of ``model`` in regime ``name`` (e.g. "eval_saturated")."""
    return next(c.id for c in EVAL_CASES if c.source == "random" and c.model == model and c.id.endswith(name))


_EXACT = {}


def exact_values(case: Case) -> dict:
    """The exact outputs of a case as object arrays of mpf (computed once)."""
    if case.id not in _EXACT:
        _EXACT[case.id] = exact.evaluate(case.inputs, as_float=False)
    return _EXACT[case.id]


def error(actual: np.ndarray, values: np.ndarray) -> float:
    """max |actual − exact|, from the unrounded mpf values."""
    assert np.shape(actual) == values.shape
    return max(float(abs(mpmath.mpf(float(a)) - q)) for a, q in zip(np.ravel(actual), values.ravel()))


def ratios(case: Case, actual: dict, values: dict) -> dict[str, float]:
    """err/atol per array of the oracle's float64 policy for this case."""
    tols = default_tolerances(case.model, "eval", case.inputs, actual)
    return {name: error(actual[name], q) / tols[name]["atol"] for name, q in values.items()}


def test_the_cases_cover_every_option():
    seen = {(c.model, k, str(np.asarray(v))) for c in EVAL_CASES for k, v in c.inputs.items()
            if k in ("kappa", "tau_att", "mask_last_key", "activation")}
    present = {(c.model, k) for c in EVAL_CASES for k in c.inputs}
    for model in ("shallow", "indrnn"):
        assert (model, "kappa", "1.0") in seen and (model, "activation", "erf") in seen
        assert any(c.model == model and "kappa" not in c.inputs and "activation" not in c.inputs for c in EVAL_CASES)
    assert ("shallow", "mask_last_key", "True") in seen and ("shallow", "tau_att", "0.5") in seen
    assert {("twostage", "E"), ("twostage", "K"), ("twostage", "succ")} <= present
    assert any(c.model == "twostage" and "succ" not in c.inputs for c in EVAL_CASES)


# --- 1. the oracle within its float64 tolerance of the exact values ----------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", EVAL_CASES, ids=lambda c: c.id)
def test_oracle_is_within_its_float64_tolerance_of_the_exact_values(case, backend):
    actual = contract.evaluate(case.inputs, backend)
    values = exact_values(case)
    assert set(values) == set(actual)
    r = ratios(case, actual, values)
    print(f"{case.id} [{backend}] err/atol: " + ", ".join(f"{k} {v:.1e}" for k, v in r.items()))
    assert max(r.values()) <= 1.0, r


def test_float_outputs_are_the_nearest_float64_and_the_mpmath_context_is_left_alone():
    case = BY_ID["twostage_eval_gaussian_E"]
    with mpmath.workdps(20):
        rounded = exact.evaluate(case.inputs)
        assert mpmath.mp.dps == 20
    values = exact_values(case)
    inexact = 0
    for name, q in values.items():
        assert rounded[name].dtype == np.float64 and rounded[name].shape == q.shape
        for a, v in zip(rounded[name].ravel(), q.ravel()):
            assert float(v) == a and abs(mpmath.mpf(a) - v) <= U * abs(v)
            inexact += mpmath.mpf(a) != v
        assert all(isinstance(v, mpmath.mpf) for v in q.ravel())
    assert inexact > 100          # the values carry more than float64's 53 bits


# --- 2. the exact gradients are the gradients of the exact losses ------------------------------------
def bumped(value: list, index: tuple, delta) -> list:
    out = copy.deepcopy(value)
    inner = out
    for i in index[:-1]:
        inner = inner[i]
    inner[index[-1]] += delta
    return out


def entry(value, index):
    for i in index:
        value = value[i]
    return value


def check_central_differences(loss, params: dict, grads: dict, entries: int = 4):
    """(loss(θ + h e_k) − loss(θ − h e_k)) / 2h against each gradient at ``entries`` random entries per
    array (and its largest one): ``loss(params)`` takes the dict of mpf arrays."""
    rng = np.random.default_rng(1)
    L = loss(params)
    for name, g in grads.items():
        rounded = arith.to_numpy(g)
        picks = [rng.integers(rounded.size) for _ in range(entries)] + [np.argmax(np.abs(rounded))]
        for index in (tuple(int(i) for i in np.unravel_index(k, rounded.shape)) for k in picks):
            fd = (loss({**params, name: bumped(params[name], index, H)})
                  - loss({**params, name: bumped(params[name], index, -H)})) / (2 * H)
            exact_g = entry(g, index)
            assert abs(fd - exact_g) <= 1e-29 * (abs(exact_g) + abs(L)), (name, index, fd, exact_g)


@pytest.mark.parametrize("case_id", ["twostage_eval_gaussian_E", regime("twostage", "eval_saturated"),
                                     "made_twostage_wide_E_no_succ"])
def test_twostage_gradients_are_central_differences_of_the_exact_losses(case_id):
    inputs = BY_ID[case_id].inputs
    with arith.precision():
        S = twostage.sentences(inputs)
        params = {k: arith.to_mp(inputs[k]) for k in ("W_ov", "W_kq")}
        ev = twostage.loss_and_grad(S, params["W_ov"], params["W_kq"])
        check_central_differences(lambda p: twostage.loss_and_grad(S, p["W_ov"], p["W_kq"]).loss, params,
                                  {"W_ov": ev.grad_W_ov, "W_kq": ev.grad_W_kq})
        if "succ" in inputs:
            S0 = twostage.collocations(S.columns, inputs["succ"])
            check_central_differences(lambda p: twostage.loss_and_grad(S0, p["W_ov"], None).loss, params,
                                      {"W_ov": twostage.loss_and_grad(S0, params["W_ov"], None).grad_W_ov})


@pytest.mark.parametrize("model, case_id", [(shallow.MODEL, "shallow_eval_mask_tau"),
                                            (shallow.MODEL, "made_shallow_tanh_kappa1_tau"),
                                            (indrnn.MODEL, "indrnn_eval"),
                                            (indrnn.MODEL, "made_indrnn_tanh_kappa1_long"),
                                            (indrnn.MODEL, regime("indrnn", "eval_T1_erf"))],
                         ids=lambda x: getattr(x, "name", x))
def test_shallow_and_indrnn_gradients_are_central_differences_of_the_exact_losses(model, case_id):
    inputs = BY_ID[case_id].inputs
    with arith.precision():
        data = model.samples(inputs)
        params = dict(zip(model.blocks, shallow.params_of(model, inputs)))
        ev = model.loss_and_grad(data, tuple(params.values()))
        check_central_differences(lambda p: model.loss_and_grad(data, tuple(p[b] for b in model.blocks)).loss,
                                  params, dict(zip(model.blocks, ev.grads)))


def test_exact_stage1_follows_the_closed_form():
    """docs/twostage.md §6.1: from W_ov = 0 with E = I, C = V, uniform weights, L0(t) = log(1 + (K−1)
    exp(−η0 t/√(K−1))) and ‖W_ov(t)‖_F = η0 t."""
    K, T0 = 5, 4
    inputs = {"model": np.array("twostage"), "tokens": np.array([[0, 1], [2, 3]]), "lengths": np.array([2, 2]),
              "targets": np.array([2, 4]), "K": np.array(K), "succ": np.roll(np.arange(K), -1),
              "W_ov": np.zeros((K, K)), "W_kq": np.zeros((K, K)), "eta0": np.array(0.2 / math.sqrt(K)),
              "eta": np.array(0.05 / math.sqrt(K)), "T0": np.array(T0), "T": np.array(0)}
    out = exact.train(inputs, as_float=False)
    with arith.precision():
        eta0 = mpmath.mpf(0.2 / math.sqrt(K))
        for t in range(T0 + 1):
            closed = mpmath.log(1 + (K - 1) * mpmath.exp(-eta0 * t / mpmath.sqrt(K - 1)))
            assert abs(out["stage1_loss"][t] - closed) <= 1e-45 * closed
            assert abs(out["stage1_norm"][t] - eta0 * t) <= 1e-45
    assert out["stage2_loss"].shape == (1,)


# --- 3. the comparisons can fail ---------------------------------------------------------------------
@pytest.mark.parametrize("case", EVAL_CASES, ids=lambda c: c.id)
def test_a_relative_error_of_1e_6_in_any_array_fails(case):
    actual = contract.evaluate(case.inputs)
    values = exact_values(case)
    tols = default_tolerances(case.model, "eval", case.inputs, actual)
    checked = 0
    for name, q in values.items():
        top = max(float(abs(v)) for v in q.ravel())
        if top == 0:                            # f at the paired init, ∂W at T = 1: exactly 0
            continue
        if tols[name]["atol"] >= 0.5e-6 * top:
            # the policy's bound of the two-stage attention gradient counts the magnitude of a float64
            # computation that cancels (a_l − φ·a): on saturated inputs it cannot resolve 1e-6
            assert (case.model, name) == ("twostage", "grad_W_kq"), (name, tols[name]["atol"] / top)
            continue
        wrong = np.array(actual[name], dtype=np.float64)
        k = np.unravel_index(np.argmax(np.abs(wrong)), wrong.shape)
        wrong[k] *= 1 + 1e-6
        assert error(wrong, q) > tols[name]["atol"], name
        checked += 1
    assert checked >= 3


FLIPS = [  # (case, input changed for the exact backend only): each must move some array beyond atol
    ("shallow_eval_mask_tau", {"kappa": np.array(2.0)}),
    ("shallow_eval_mask_tau", {"activation": np.array("tanh")}),
    ("shallow_eval_mask_tau", {"mask_last_key": np.array(False)}),
    ("shallow_eval_mask_tau", {"tau_att": np.array(1.0)}),
    ("made_shallow_tanh_kappa1_tau", {"activation": np.array("erf")}),
    ("shallow_eval_perturbed", {"W": "transpose"}),
    ("indrnn_eval", {"kappa": np.array(1.0)}),
    ("indrnn_eval", {"activation": np.array("erf")}),
    ("twostage_eval_gaussian_E", {"W_ov": "transpose"}),
    ("twostage_eval_gaussian_E", {"W_kq": "transpose"}),
    ("twostage_eval_onehot_succ", {"W_kq": "transpose"}),
]


@pytest.mark.parametrize("case_id, change", FLIPS, ids=lambda x: x if isinstance(x, str) else "-".join(x))
def test_a_changed_option_or_a_transposed_matrix_fails(case_id, change):
    case = BY_ID[case_id]
    changed = {k: (np.swapaxes(case.inputs[k], -1, -2) if isinstance(v, str) else v) for k, v in change.items()}
    actual = contract.evaluate(case.inputs)
    r = ratios(case, actual, exact.evaluate({**case.inputs, **changed}, as_float=False))
    assert max(r.values()) > 1e3, r


# --- 4. training steps ---------------------------------------------------------------------------------
def _short(case: Case, **steps) -> Case:
    inputs = {**{k: v for k, v in case.inputs.items() if k != "model"}, **{k: np.array(v) for k, v in steps.items()}}
    return made(f"{case.id}_{'_'.join(f'{k}{v}' for k, v in steps.items())}", case.model, "train", **inputs)


def _made_train_cases() -> list[Case]:
    """ProjGD with every block's projection active, and ProjSGD, for both models."""
    rng = np.random.default_rng(99)
    X, y, X_val, y_val = rng.standard_normal((6, 3, 2)) / 2, rng.standard_normal(6), rng.standard_normal((3, 3, 2)), \
        rng.standard_normal(3)
    common = dict(X=X, y=y, X_val=X_val, y_val=y_val, eta=np.array(2.0), rho=np.array([0.01, 0.02, 0.03]))
    return [made("made_shallow_projgd_active", "shallow", "train", **common, c=rng.standard_normal(4),
                 U=rng.standard_normal((4, 2)), W=rng.standard_normal((4, 2, 2)), steps=np.array(2),
                 tau_att=np.array(0.7), activation=np.array("erf")),
            made("made_indrnn_projgd_active", "indrnn", "train", **common, c=rng.standard_normal(4),
                 u=rng.standard_normal(4), W_in=rng.standard_normal((4, 2)), steps=np.array(2), kappa=np.array(1.0))]


TRAIN_CASES = ([_short(c, T0=1, T=1) for c in random_cases(["twostage"], 5, 0) if c.kind == "train"]
               + [_short(c, T0=1, T=1) for c in stored_cases(["twostage"]) if c.id == "twostage_train_five_token"]
               + [_short(c, steps=s) for c in random_cases(["shallow", "indrnn"], 4, 0) if c.kind == "train"
                  for s in (1, 3)]
               + _made_train_cases())


@pytest.mark.parametrize("case", TRAIN_CASES, ids=lambda c: c.id)
def test_training_steps_match_the_oracle(case):
    actual = contract.train(case.inputs)
    values = exact.train(case.inputs)
    assert set(values) <= set(actual)
    tols = default_tolerances(case.model, "train", case.inputs, actual)
    report = compare_arrays({k: actual[k] for k in values}, values, tols, labels=("oracle", "exact"))
    print(case.id, ", ".join(f"{row.name} {row.ratio:.1e}" for row in report.rows if row.ratio is not None))
    assert report.ok, report
    moved = [k for k in ("W_ov", "W_kq", "c", "U", "W", "u", "W_in") if k in values
             and not np.array_equal(values[k], np.asarray(case.inputs[k], dtype=np.float64))]
    assert moved


@pytest.mark.parametrize("case", [c for c in TRAIN_CASES if c.id.startswith("made_")], ids=lambda c: c.id)
def test_the_projection_is_active_in_every_block(case):
    """Every block has a head on the sphere of radius ρ_b/√m around θ(0) after the steps, none outside."""
    model = shallow.MODEL if case.model == "shallow" else indrnn.MODEL
    out = exact.train(case.inputs, as_float=False)
    m = len(case.inputs["c"])
    with arith.precision():
        for b, rho in zip(model.blocks, case.inputs["rho"]):
            radius = mpmath.mpf(float(rho)) / mpmath.sqrt(m)
            start = arith.to_mp(case.inputs[b])
            moved = [arith.norm(arith.combine(list(np.ravel(out[b][i])), arith.flatten(start[i]), -1))
                     for i in range(m)]
            assert max(moved) <= radius * (1 + mpmath.mpf("1e-45"))
            assert any(abs(r - radius) <= 1e-45 * radius for r in moved), b


# --- 5. ntpref certify ---------------------------------------------------------------------------------
def test_certify_reports_every_array_in_units_of_u_and_of_atol():
    cases = [BY_ID["shallow_eval_paired_init"], BY_ID["made_twostage_wide_E_no_succ"]]
    report = certify.certify(cases)
    assert [(r.case, r.name) for r in report] == [(c.id, n) for c in cases for n in exact_values(c)]
    assert report.ok
    f = next(r for r in report if r.name == "f")
    assert f.err == 0 and f.units == 0 and f.scale == 0          # paired init: f = 0 exactly, in both
    for row in report:
        assert row.atol == cases[0 if row.case == cases[0].id else 1].tolerances("float64")[row.name]["atol"]
        assert row.ratio <= 1e-2 and row.units < 100
    assert any(row.units > 0.1 for row in report)
    assert "every error within the float64 tolerance" in str(report)


def test_certify_command_exit_statuses(capsys, monkeypatch):
    assert main(["certify", "indrnn_eval"]) == 0
    out = capsys.readouterr().out
    assert out.count("indrnn_eval  ") == 5 and "FAIL" not in out and "largest per model and array" in out

    evaluate = contract.evaluate
    def moved(arrays, backend="numba"):
        return {k: v * (1 + 1e-6) for k, v in evaluate(arrays, backend).items()}

    monkeypatch.setattr(contract, "evaluate", moved)
    assert main(["certify", "indrnn_eval", "--random", "2", "--seed", "3"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "r3_indrnn_" in out and "beyond atol" in out
    monkeypatch.undo()

    assert main(["certify", "shallow_train_projgd"]) == 2
    assert "is a train case; certify takes eval cases" in capsys.readouterr().err
    assert main(["certify", "indrnn_evl"]) == 2
    assert "did you mean 'indrnn_eval'" in capsys.readouterr().err
