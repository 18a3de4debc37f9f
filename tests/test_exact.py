"""The exact backend (ntpref.exact, docs/exact.md) against the oracle, and ``ntpref certify``.

1. The oracle's float64 eval outputs (both backends) lie within the float64 policy's atol of the
   multiprecision values, on every stored eval case, the random eval cases of two seeds and a few inputs
   made here for the option combinations those do not meet; err/atol is printed (``pytest -s``).
2. The exact gradients agree with multiprecision central differences of the exact losses (step 1e-20
   at 50 digits) to ~1e-30, so they are the gradients of the exact losses, independently of the closed
   forms; the exact stage-1 trajectory (loss, norm, correlation) matches the closed form of
   docs/twostage.md §6.1 to 1e-45.
3. The comparisons can fail: a 1e-6 relative error in any array, an option of the input that the exact
   backend would ignore, or a transposed matrix (a query/key or output orientation mix-up) is outside
   atol.
4. Training runs: ``ntpref certify`` passes on slices of at most 2 updates per stage of every random and
   stored train case (every model and algorithm, ProjSGD, the two-stage naive, late-stage and
   attention-cancellation regimes, the projection active in every block): every logged step within its
   per-step float64 bound, every output certified; a cut stored run logs the first steps of the whole run.
5. The NTK Gram matrix: its tangent features are central differences of f, and it certifies.
6. ``ntpref certify``: its report and result records, a trajectory moved at one step fails naming the
   array and the step, an output the exact backend lacks is listed as not certified, exit statuses 0, 1
   and 2. The whole stored runs are the slow test (``python -m pytest -m slow tests/test_exact.py``).
7. The max-margin solutions (docs/twostage.md §5) of the general active-set solver: the closed form of
   W_ov* for orthonormal E and W_kq* of relations solved by hand and of the five-token example, to 1e-45;
   for a general E the KKT conditions in 50 digits, the oracle's float64 solutions within their tolerance
   and rejected by the KKT check; a wrong float64 active set repaired in mpmath; cyclic relations
   infeasible.
"""
import copy
import json
import math
import re
import signal
import time

import mpmath
import numpy as np
import pytest

from ntpref import exact
from ntpref.cli import main
from ntpref.errors import InfeasibleError
from ntpref.exact import arith, indrnn, maxmargin, shallow, twostage
from ntpref.models import SPECS
from ntpref.oracle import certify, contract, kinds
from ntpref.oracle.cases import Case, random_cases, stored_cases
from ntpref.oracle.policies.bound import bound_tolerances
from ntpref.rounding import qp_tolerance

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
    tols = bound_tolerances(case.model, "eval", case.inputs, actual)
    return {name: error(actual[name], q) / tols[name].atol for name, q in values.items()}


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


def check_central_differences(loss, params: dict, grads: dict, entries: int = 4, scale=None):
    """(loss(θ + h e_k) − loss(θ − h e_k)) / 2h against each gradient at ``entries`` random entries per
    array (and its largest one), to 1e-29 (|gradient| + ``scale``; default |loss|): ``loss(params)`` takes
    the dict of mpf arrays."""
    rng = np.random.default_rng(1)
    L = abs(loss(params)) if scale is None else scale
    for name, g in grads.items():
        rounded = arith.to_numpy(g)
        picks = [rng.integers(rounded.size) for _ in range(entries)] + [np.argmax(np.abs(rounded))]
        for index in (tuple(int(i) for i in np.unravel_index(k, rounded.shape)) for k in picks):
            fd = (loss({**params, name: bumped(params[name], index, H)})
                  - loss({**params, name: bumped(params[name], index, -H)})) / (2 * H)
            exact_g = entry(g, index)
            assert abs(fd - exact_g) <= 1e-29 * (abs(exact_g) + L), (name, index, fd, exact_g)


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
    exp(−η0 t/√(K−1))), ‖W_ov(t)‖_F = η0 t and ρ(W_ov(t), W_ov*) = 1 for t ≥ 1 (0 at W_ov = 0)."""
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
            assert abs(out["stage1_corr"][t] - int(t > 0)) <= 1e-45
    assert out["stage2_loss"].shape == out["stage2_corr"].shape == (1,)


# --- 3. the comparisons can fail ---------------------------------------------------------------------
@pytest.mark.parametrize("case", EVAL_CASES, ids=lambda c: c.id)
def test_a_relative_error_of_1e_6_in_any_array_fails(case):
    actual = contract.evaluate(case.inputs)
    values = exact_values(case)
    tols = bound_tolerances(case.model, "eval", case.inputs, actual)
    checked = 0
    for name, q in values.items():
        top = max(float(abs(v)) for v in q.ravel())
        if top == 0:                            # f at the paired init, ∂W at T = 1: exactly 0
            continue
        if tols[name].atol >= 0.5e-6 * top:
            # the policy's bound of the two-stage attention gradient counts the magnitude of a float64
            # computation that cancels (a_l − φ·a): on saturated inputs it cannot resolve 1e-6; with logits
            # beyond exp's overflow (about 1000) it counts their rounding, u·|z|, in p and so in grad_W_ov
            overflow = case.id.endswith("eval_overflow") and name == "grad_W_ov"
            assert (case.model, name) == ("twostage", "grad_W_kq") or overflow, (name, tols[name].atol / top)
            continue
        wrong = np.array(actual[name], dtype=np.float64)
        k = np.unravel_index(np.argmax(np.abs(wrong)), wrong.shape)
        wrong[k] *= 1 + 1e-6
        assert error(wrong, q) > tols[name].atol, name
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


# --- 4. training runs: ntpref certify on short slices ---------------------------------------------------
#: Updates per stage of the train slices certified by the default suite (the whole runs: the slow test).
SLICE = 2


def _made_train_cases() -> list[Case]:
    """ProjGD with every block's projection active, for both models."""
    rng = np.random.default_rng(99)
    X, y, X_val, y_val = rng.standard_normal((6, 3, 2)) / 2, rng.standard_normal(6), rng.standard_normal((3, 3, 2)), \
        rng.standard_normal(3)
    common = dict(X=X, y=y, X_val=X_val, y_val=y_val, eta=np.array(2.0), rho=np.array([0.01, 0.02, 0.03]))
    return [made("made_shallow_projgd_active", "shallow", "train", **common, c=rng.standard_normal(4),
                 U=rng.standard_normal((4, 2)), W=rng.standard_normal((4, 2, 2)), steps=np.array(2),
                 tau_att=np.array(0.7), activation=np.array("erf")),
            made("made_indrnn_projgd_active", "indrnn", "train", **common, c=rng.standard_normal(4),
                 u=rng.standard_normal(4), W_in=rng.standard_normal((4, 2)), steps=np.array(2), kappa=np.array(1.0))]


STORED_TRAIN = [c for c in stored_cases() if c.kind == "train"]
#: Every model and algorithm: two-stage naive, late-stage and attention-cancel regimes, ProjGD and ProjSGD of
#: both shallow models, every stored train case, and ProjGD with the projection active in every block.
TRAIN_CASES = [c for c in random_cases(None, 5, 0) if c.kind == "train"] + STORED_TRAIN + _made_train_cases()


def test_the_train_cases_cover_every_algorithm_and_regime():
    ids = [c.id for c in TRAIN_CASES]
    for regime_name in ("train_naive", "train_late_stage", "train_attention_cancel"):
        assert any(i.startswith("r0_twostage") and i.endswith(regime_name) for i in ids)
    for model in ("shallow", "indrnn"):
        cases = [c for c in TRAIN_CASES if c.model == model]
        assert any("batch" in c.inputs for c in cases) and any("batch" not in c.inputs for c in cases)


@pytest.mark.parametrize("case", TRAIN_CASES, ids=lambda c: c.id)
def test_certify_passes_on_short_train_slices(case):
    """Every logged step and the final iterates within the per-step float64 bounds, every output certified
    (the two-stage max-margin solutions and correlations too); the two-stage direction the exact backend
    does not read is named."""
    result = certify.certify_case(case, steps=SLICE)
    print("\n".join(result.lines()))
    assert result.ok, "\n".join(result.lines())
    spec = SPECS[case.model]
    assert not result.not_certified and not exact.MODELS[case.model].NOT_COMPUTED
    assert {r.name for r in result.rows} == set(spec.train_outputs)
    assert {r.name for r in result.rows if r.trajectory} == set(spec.trajectories)
    assert result.steps == (SLICE if max(int(case.inputs[k]) for k in exact.MODELS[case.model].STEPS) > SLICE
                            else None)
    assert any("'direction' = naive" in n for n in result.notes) == ("direction" in case.inputs)
    assert max(r.ratio for r in result.rows) > 0


@pytest.mark.parametrize("case", STORED_TRAIN, ids=lambda c: c.id)
def test_a_cut_stored_run_logs_the_first_steps_of_the_whole_run(case):
    """What a cut certifies: the first rows of the stored trajectories, bit for bit (for the two-stage model
    those of stage 1; its stage 2 starts from W_ov after the cut stage 1)."""
    out, whole = contract.train(certify.truncated(case, SLICE).inputs), contract.train(case.inputs)
    names = [n for n in SPECS[case.model].trajectories if case.model != "twostage" or n.startswith("stage1_")]
    for name in names:
        assert len(out[name]) <= SLICE + 1
        np.testing.assert_array_equal(out[name], whole[name][:len(out[name])], err_msg=name)


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


# --- 5. the NTK Gram matrix --------------------------------------------------------------------------
def test_ntk_features_are_central_differences_of_f_and_the_gram_matrix_certifies():
    case = certify.stored()["shallow_ntk_gram"]
    result = certify.certify_case(case)
    assert result.ok and not result.not_certified, "\n".join(result.lines())
    assert [r.name for r in result.rows] == ["gram", "head_s", "head_a", "head_MU"]
    gram = exact.compute("ntk", case.inputs, as_float=False)["gram"]
    assert all(gram[j, l] == gram[l, j] for j in range(len(gram)) for l in range(j))
    with arith.precision():
        data = shallow.samples(case.inputs)
        params = dict(zip(shallow.MODEL.blocks, shallow.params_of(shallow.MODEL, case.inputs)))
        sigma = data.sigma[0]
        j = 3

        def f_j(p):
            states = shallow.head_states(data, p["U"], p["W"])
            return shallow.readout(p["c"], [[sigma(s) for s, _, _ in sj] for sj in states])[j]

        features = shallow.f_gradients(data, tuple(params.values()))
        # f is 0 at the paired initialisation: compare at the scale of its terms, |c_i σ(s_i)|/√m ≤ 1
        check_central_differences(f_j, params, dict(zip(shallow.MODEL.blocks, features[j])), scale=1)
        flat = [arith.flatten(list(g)) for g in features]
        assert gram[j, 5] == mpmath.fdot(flat[j], flat[5])


# --- 6. ntpref certify ---------------------------------------------------------------------------------
def test_certify_reports_every_array_in_units_of_u_and_of_the_tolerance():
    cases = [BY_ID["shallow_eval_paired_init"], BY_ID["made_twostage_wide_E_no_succ"]]
    report = certify.certify(cases)
    assert [(r.case, r.name) for r in report.rows] == [(c.id, n) for c in cases
                                                       for n in exact.compute("eval", c.inputs, as_float=False)]
    assert report.ok and not any(result.not_certified for result in report)
    f = next(r for r in report.rows if r.name == "f")
    assert f.err == 0 and f.units == 0 and f.scale == 0 and f.where == ""   # paired init: f = 0 exactly, in both
    for row in report.rows:
        tols = BY_ID[row.case].tolerances("float64", "bound")
        if row.name in tols:
            assert row.bound == tols[row.name].atol            # an eval bound is the atol of every entry
        assert row.ratio <= 1e-2 and row.units < 100 and not row.trajectory
    assert {r.name for r in report.rows if r.case == cases[0].id} >= {"head_s", "head_a", "head_MU"}
    assert any(row.units > 0.1 for row in report.rows)
    assert "every error within its float64 tolerance" in str(report)
    records = report.records()
    json.dumps(records, allow_nan=False)
    assert records[cases[1].id]["arrays"]["grad_W_kq"]["ratio"] == next(
        r.ratio for r in report.rows if r.case == cases[1].id and r.name == "grad_W_kq")


def _moved(monkeypatch, name: str, step: int, factor: float) -> None:
    """Let the oracle runs that certify measures return ``name`` with entry ``step`` times ``factor``."""
    compute = kinds.compute

    def moved(kind, inputs, backend="numba"):
        out = compute(kind, inputs, backend)
        if name in out:
            out[name] = out[name].copy()
            out[name][step] *= factor
        return out

    monkeypatch.setattr(certify, "compute", moved)


def test_a_moved_step_of_a_trajectory_fails_naming_the_array_and_the_step(monkeypatch):
    case = next(c for c in TRAIN_CASES if c.id.endswith("train_naive"))
    _moved(monkeypatch, "stage2_loss", 5, 1 + 1e-6)
    result = certify.certify_case(case)
    assert [(r.name, r.where) for r in result.rows if not r.ok] == [("stage2_loss", "step 5")]
    assert "stage2_loss  " in "\n".join(result.lines()) and "at step 5  FAIL" in "\n".join(result.lines())


def test_an_output_the_exact_backend_lacks_is_listed_not_dropped(monkeypatch):
    compute = kinds.compute
    monkeypatch.setattr(certify, "compute", lambda kind, inputs, backend="numba":
                        {**compute(kind, inputs, backend), "extra": np.zeros(3)})
    report = certify.certify([BY_ID["indrnn_eval"]])
    assert report.ok and report[0].not_certified == {"extra": "not computed by the exact backend"}
    text = str(report)
    assert "indrnn_eval  not certified: extra (not computed by the exact backend)" in text
    assert "not certified (indrnn): extra" in text


def test_certify_command_exit_statuses(capsys, monkeypatch):
    assert main(["certify", "indrnn_eval", "--random", "2", "--seed", "3", "--kind", "eval"]) == 0
    out = capsys.readouterr().out
    assert out.count("indrnn_eval  ") == 6 and "FAIL" not in out and "largest per model and array" in out
    assert "r3_indrnn_0_" in out and "r3_indrnn_1_" in out and "[train" not in out

    _moved(monkeypatch, "grad_norm_W", 1, 1 + 1e-6)
    assert main(["certify", "shallow_train_projsgd", "--steps", "2"]) == 1
    out = capsys.readouterr().out
    assert "[train, at most 2 updates per stage, numba;" in out
    assert "grad_norm_W" in out and "at step 1  FAIL" in out
    assert "1 beyond their float64 tolerance: shallow_train_projsgd grad_norm_W step 1" in out
    monkeypatch.undo()

    assert main(["certify", "indrnn_evl"]) == 2
    assert "did you mean 'indrnn_eval'" in capsys.readouterr().err


def _stalled_once(monkeypatch) -> list:
    """Let the first exact run of certify stall (a Python loop, as a long mpmath run is) and the later ones
    run; the list collects the cases whose exact run finished."""
    exact, finished = certify.exact_backend(), []
    compute = exact.compute

    def stalling(kind, arrays, as_float=True):
        if not finished and not getattr(stalling, "stalled", False):
            stalling.stalled = True
            while True:
                time.sleep(0.01)
        finished.append(kind)
        return compute(kind, arrays, as_float=as_float)

    monkeypatch.setattr(exact, "compute", stalling)
    return finished


def test_certify_timeout_stops_a_case_names_it_and_certifies_the_rest(capsys, monkeypatch):
    certify.certify_case(BY_ID["shallow_eval_mask_tau"])     # compiled and loaded: the bound is for the stall
    finished = _stalled_once(monkeypatch)
    monkeypatch.setattr(certify, "HEARTBEAT", 0.2)
    assert main(["certify", "indrnn_eval", "shallow_eval_mask_tau", "--random", "0", "--timeout", "4"]) == 1
    captured = capsys.readouterr()
    out, err = captured.out, captured.err
    assert "indrnn_eval            [eval, numba] not certified: stopped at the time bound of 4 s (--timeout)\n" in out
    assert "shallow_eval_mask_tau  [eval, numba; exact backend" in out and "FAIL" not in out and finished == ["eval"]
    assert "\nnot certified, stopped at the time bound of 4 s: indrnn_eval\n" in out
    assert re.search(r"\n\d+ arrays of 1 cases: every error within its float64 tolerance\n$", out), out
    assert re.search(r"^certify: 0/2 \(0\.0 s elapsed\)\n(certify: indrnn_eval running for \d s \(case 1 of 2\)\n)+"
                     r"certify: 1/2 ", err), err
    assert re.search(r"\ncertify: 2/2 \([\d.]+ s elapsed\)\n$", err) and "Traceback" not in err
    assert signal.getsignal(signal.SIGALRM) == signal.SIG_DFL and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_certify_quiet_prints_no_progress_and_refuses_a_timeout_that_is_no_positive_number(capsys):
    assert main(["certify", "indrnn_eval", "--random", "0", "-q", "--timeout", "600"]) == 0
    assert capsys.readouterr().err == ""
    for value in ("0", "-1", "nan", "inf", "abc"):
        assert main(["certify", "indrnn_eval", "--timeout", value]) == 2
        assert f"expected a positive number, got '{value}'" in capsys.readouterr().err


@pytest.mark.slow
def test_certify_every_stored_case_in_full():
    """Every stored case, the train runs whole (about 5 minutes, most of it twostage_train_K20); the calibrated
    tolerances measured on the way are those the manifest records."""
    from ntpref.oracle.manifest import calibrated_of, default_root, load_manifest

    report = certify.certify(certify.stored().values())
    print(report)
    assert report.ok, report.summary()
    manifest = load_manifest(default_root())["cases"]
    assert all(r.calibrated == calibrated_of(manifest[r.case]) for r in report if r.calibrated is not None)


def test_certify_record_stores_the_ratios_that_verify_prints_and_regen_keeps_while_they_hold(tmp_path, capsys):
    """--record writes each certified array's err/tol and its calibrated tolerance into the manifest (the
    calibrated ones are those the exact run gives and what conformance judges the stored case by); verify
    shows the largest err/tol per case; a regen keeps both for arrays whose values and tolerance stay and
    drops them for the others; --record refuses a cut or numpy run."""
    import shutil

    from ntpref.cli import main
    from ntpref.oracle.policies.calibrated import calibrated_tolerances
    from ntpref.oracle.cases import stored_cases
    from ntpref.oracle.manifest import calibrated_of, default_root, load_manifest, save_manifest

    root = tmp_path / "runs"
    shutil.copytree(default_root(), root)
    case = "twostage_eval_onehot_succ"
    for rec in load_manifest(root)["cases"][case]["arrays"].values():
        rec.pop("calibrated", None)
    assert main(["certify", case, "--record", "--root", str(root)]) == 0
    assert ("recorded the err/tol of 7 arrays of 1 stored cases (ntpref verify shows them) and the calibrated "
            "tolerances of 1 cases") in capsys.readouterr().out
    records = load_manifest(root)["cases"][case]["arrays"]
    assert all(0.0 <= rec["certified"] < 1.0 for rec in records.values())
    stored = next(c for c in stored_cases(["twostage"], root) if c.id == case)
    measured = calibrated_tolerances(stored.model, stored.kind, stored.expected,
                                     exact.compute(stored.kind, stored.inputs, as_float=False),
                                     stored.tolerances("float64", "bound"))
    assert stored.tolerances() == measured
    assert any(rec["calibrated"] != "bound" for rec in records.values())
    assert main(["verify", case, "--root", str(root)]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith(case))
    assert f"{max(r['certified'] for r in records.values()):.1e}" in line.split()
    manifest = load_manifest(root)
    arrays = manifest["cases"][case]["arrays"]
    arrays["logits"]["sha256"] = "0" * 64                   # stored values that regen changes
    arrays["loss"]["atol"] = 2 * arrays["loss"]["atol"]     # a tolerance that regen changes
    save_manifest(root, manifest)
    assert main(["regen", case, "--force", "--root", str(root)]) == 0
    kept = {n for n, r in load_manifest(root)["cases"][case]["arrays"].items() if "certified" in r}
    assert kept == set(records) - {"logits", "loss"}
    assert kept == {n for n, r in load_manifest(root)["cases"][case]["arrays"].items() if "calibrated" in r}
    assert calibrated_of(load_manifest(root)["cases"][case]) is None   # conformance measures
    assert main(["regen", case, "--tolerances-only", "--root", str(root)]) == 0     # nothing moves: all stay
    assert kept == {n for n, r in load_manifest(root)["cases"][case]["arrays"].items() if "certified" in r}
    capsys.readouterr()
    capsys.readouterr()
    assert main(["certify", case, "--record", "--steps", "3", "--root", str(root)]) == 2
    assert "--record stores what certifies the stored files" in capsys.readouterr().err


# --- 7. the max-margin solutions -------------------------------------------------------------------
def columns_of(E: np.ndarray) -> list:
    """The columns e_v of E [d, K] as lists of mpf (exact)."""
    return [list(arith.to_mp(E[:, v])) for v in range(E.shape[1])]


HADAMARD = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]) / 2.0


@pytest.mark.parametrize("E, succ", [(np.eye(5), np.array([1, 2, -1, 0, 3])),     # C = {0, 1, 3, 4} ≠ V
                                     (HADAMARD[:, :3], np.array([2, 0, 1])),      # orthonormal, d = 4 > K = 3
                                     (HADAMARD, np.array([1, 0, 3, -1]))],
                         ids=["onehot_C_not_V", "hadamard_d4_K3", "hadamard_K4"])
def test_W_ov_star_is_the_closed_form_of_orthonormal_E(E, succ):
    """docs/twostage.md §5: with orthonormal columns W_ov* = E M Eᵀ, M[v, x] = 1[v = n(x)] − 1/K for x ∈ C
    (0 elsewhere), every multiplier 1/K, ‖W_ov*‖_F² = |C|(K−1)/K; from the general solver, to 1e-45."""
    K, C = E.shape[1], [x for x in range(len(succ)) if succ[x] >= 0]
    columns = columns_of(E)
    constraints = twostage.collocation_constraints(succ)
    with arith.precision():
        solution = maxmargin.least_norm(columns, constraints)
        M = [[(int(v == succ[x]) - mpmath.mpf(1) / K) if x in C else 0 for x in range(K)] for v in range(K)]
        closed = [[mpmath.fsum(columns[v][i] * M[v][x] * columns[x][j] for v in range(K) for x in range(K))
                   for j in range(E.shape[0])] for i in range(E.shape[0])]
        assert max(abs(a - b) for a, b in zip(arith.flatten(solution.W), arith.flatten(closed))) <= 1e-45
        assert max(abs(x - mpmath.mpf(1) / K) for x in solution.lam) <= 1e-45
        assert abs(arith.norm(solution.W) ** 2 - mpmath.mpf(len(C) * (K - 1)) / K) <= 1e-45
        assert maxmargin.kkt(columns, constraints, solution.W, solution.lam).ok


def test_W_kq_star_of_relations_solved_by_hand():
    """One-hot E, K = 4. Column 3, the chain 0 > 1 > 2 observed as (0, 1), (1, 2) and (0, 2): min ‖m‖² s.t.
    m_0 − m_1 ≥ 1, m_1 − m_2 ≥ 1 (the third is their sum, margin 2, inactive) gives m = (1, 0, −1, 0), λ = 1, 1, 0
    (m = λ_01 (e_0 − e_1) + λ_12 (e_1 − e_2)). Column 2, 0 > 1 and 0 > 3: by symmetry m_1 = m_3 = s, m_0 = 1 + s,
    minimal at s = −1/3: m = (2/3, −1/3, 0, −1/3), λ = 1/3, 1/3. Columns 0 and 1: no relation, 0."""
    constraints = [(0, 1, 3), (1, 2, 3), (0, 2, 3), (0, 1, 2), (0, 3, 2)]
    with arith.precision():
        third = mpmath.mpf(1) / 3
        solution = maxmargin.least_norm(columns_of(np.eye(4)), constraints)
        expected = [[0, 0, 2 * third, 1], [0, 0, -third, 0], [0, 0, 0, -1], [0, 0, -third, 0]]
        assert max(abs(a - b) for a, b in zip(arith.flatten(solution.W), arith.flatten(expected))) <= 1e-45
        assert max(abs(a - b) for a, b in zip(solution.lam, [1, 1, 0, third, third])) <= 1e-45
        check = maxmargin.kkt(columns_of(np.eye(4)), constraints, solution.W, solution.lam)
        assert check.ok and abs(check.margins[2] - 2) <= 1e-45


def test_W_kq_star_of_the_five_token_example():
    """docs/twostage.md §8: the observed relations of the six sentences give W_kq*[:, 0] = (−0.8, 0.2, −0.8,
    1.2, 0.2), W_kq*[:, 2] = (0.2, 1.2, −0.8, 0.2, −0.8), the other columns 0."""
    inputs = certify.stored()["twostage_train_five_token"].inputs
    with arith.precision():
        S = twostage.sentences(inputs)
        constraints = twostage.relation_constraints(S, inputs["succ"])
        assert {q for _, _, q in constraints} == {0, 2} and (3, 0, 0) in constraints   # the query is a token
        W = maxmargin.least_norm(S.columns, constraints).W
        fifth = mpmath.mpf(1) / 5
        expected = {0: [-4, 1, -4, 6, 1], 2: [1, 6, -4, 1, -4]}
        for q in range(5):
            column = [fifth * x for x in expected.get(q, [0] * 5)]
            assert max(abs(W[i][q] - column[i]) for i in range(5)) <= 1e-45, q


def test_the_max_margin_solutions_of_a_general_E_are_certified_and_the_oracle_is_within_its_tolerance():
    """Gaussian E [K+1, K] (no closed form, one block): the KKT conditions hold in 50 digits, the oracle's
    float64 W_ov_star, W_kq_star (its QP solver) are within their tolerance QP_REL·max|W*|, and the KKT check
    rejects them (float64 margins miss 1 by ~1e-16) as it does a relative 1e-30 change of W*."""
    case = next(c for c in TRAIN_CASES if c.id.endswith("train_naive"))
    oracle = contract.train(case.inputs)
    with arith.precision():
        S = twostage.sentences(case.inputs)
        for name, constraints in (("W_ov_star", twostage.collocation_constraints(case.inputs["succ"])),
                                  ("W_kq_star", twostage.relation_constraints(S, case.inputs["succ"]))):
            solution = maxmargin.least_norm(S.columns, constraints)
            check = maxmargin.kkt(S.columns, constraints, solution.W, solution.lam)
            assert check.ok and max(check[:4]) <= 1e-45, (name, check[:4])
            assert 0 < sum(1 for x in solution.lam if x) < len(constraints), name     # some constraints inactive
            W = arith.to_numpy(solution.W, as_float=False)
            err = error(oracle[name], W)
            assert 0 < err <= qp_tolerance(arith.to_numpy(solution.W)).atol, (name, err)
            assert not maxmargin.kkt(S.columns, constraints, arith.to_mp(oracle[name]), solution.lam).ok
            moved = arith.combine(solution.W, solution.W, mpmath.mpf("1e-30"))
            assert not maxmargin.kkt(S.columns, constraints, moved, solution.lam).ok


@pytest.mark.parametrize("wrong", [[], "all"], ids=["empty", "every_row"])
def test_a_wrong_float64_active_set_is_repaired_in_mpmath(monkeypatch, wrong):
    """From an empty candidate set, or one holding every row (dependent and inactive ones too), the mpmath
    active-set changes reach the same certified W* (K20: 423 relations in 20 blocks of about 21 rows in
    the 19 dimensions of a column's differences e_u − e_v, so dependent rows in each)."""
    inputs = certify.stored()["twostage_train_K20"].inputs
    with arith.precision():
        S = twostage.sentences(inputs)
        constraints = twostage.relation_constraints(S, inputs["succ"])
        right = maxmargin.least_norm(S.columns, constraints).W
        monkeypatch.setattr(maxmargin, "candidate", lambda A: [] if wrong == [] else list(range(len(A))))
        repaired = maxmargin.least_norm(S.columns, constraints).W
        assert max(abs(a - b) for a, b in zip(arith.flatten(repaired), arith.flatten(right))) <= 1e-45


def test_cyclic_relations_are_infeasible():
    with arith.precision(), pytest.raises(InfeasibleError, match="infeasible"):
        maxmargin.least_norm(columns_of(np.eye(3)), [(0, 1, 2), (1, 0, 2)])
