"""``ntpref conformance`` and its Python API (ntpref.oracle.conformance) judging implementations, NumPy only.

The adapters under tests/conformance_adapters/ wrap the oracle: its NumPy backend (a second float64
implementation, which must pass) and deliberately broken implementations (the fault injected into
the oracle's outputs or NumPy functions), each of which must fail with the case and array named; float32
results are judged against the float64 policy and in float32 mode; a report names the first wrong quantity
in the order of computation. The PyTorch and JAX adapters of examples/adapters/ are run by
tests/test_crosscheck.py.
"""
import numpy as np
import pytest

from ntpref.oracle import contract
from ntpref.oracle.cases import random_cases, stored_cases
from ntpref.oracle.conformance import cases, check
from ntpref.oracle.policies.calibrated import CALIBRATED_MULTIPLE
from ntpref.oracle.policies.envelope import ENVELOPE_MULTIPLE

from conformance_support import ADAPTERS, conformance, float32_outputs, oracle


def failing_rows(out):
    """{(case, array)} of the table rows whose verdict is FAIL."""
    rows = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 2 and "FAIL" in parts[2:] and not line.startswith("FAIL"):
            rows.add((parts[0], parts[1]))
    return rows


# --- passing implementations ---------------------------------------------------------------------
def test_numpy_backend_passes_every_random_case(capsys):
    rc, out, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--no-stored")
    assert rc == 0, out + err
    ids = [c.id for c in random_cases()]
    assert len(ids) == 18
    for case in ids:
        assert f"pass  {case}:" in out
    assert out.splitlines()[-1] == "18 cases: 18 passed, 0 failed, 0 skipped; 118 arrays compared: PASS"
    assert "FAIL" not in out


def test_numpy_backend_passes_every_stored_case(capsys):
    rc, out, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--random", 0)
    assert rc == 0, out + err
    for case in stored_cases():
        assert f"pass  {case.id}:" in out


@pytest.mark.parametrize("case", cases(stored=False), ids=lambda c: c.id)
def test_python_api_in_a_pytest_suite(case):
    """The pattern of docs/conformance.md: one test per case, the report as the assertion message."""
    report = check(ADAPTERS / "oracle_numpy.py", case)
    assert report.ok, report
    assert report.rows and all(r.ok for r in report.rows)


# --- broken implementations fail, naming the case and the array ------------------------------------
BROKEN = {
    "detached_attention": ({("r0_twostage_0_eval_general_E", "grad_W_kq"), ("r0_shallow_0_eval_paired_mask", "grad_W"),
                            ("r0_twostage_2_train_naive", "W_kq"), ("r0_shallow_2_train_projgd", "W"),
                            ("r0_twostage_4_train_attention_cancel", "W_kq")},
                           "FAIL  r0_twostage_2_train_naive: 7/11 arrays within tolerance; failing: W_kq, stage2_loss, "
                           "stage2_norm, stage2_corr; leaves tolerance first at step 1 of stage2_loss"),
    "one_over_m": ({("r0_shallow_1_eval_T1_erf", "f"), ("r0_shallow_1_eval_T1_erf", "grad_U"),
                    ("r0_indrnn_1_eval_T1_erf", "f"), ("r0_indrnn_0_eval_paired", "grad_W_in")},
                   "FAIL  r0_shallow_1_eval_T1_erf: 1/5 arrays within tolerance; failing: f, loss, grad_c, grad_U; first "
                   "wrong in the order of computation: f"),
    "softmax_over_padding": ({("r0_twostage_0_eval_general_E", "attn"), ("r0_twostage_0_eval_general_E", "loss"),
                              ("r0_twostage_1_eval_saturated", "attn")},
                             "FAIL  r0_twostage_0_eval_general_E: 2/7 arrays within tolerance; failing: loss, logits, "
                             "attn, grad_W_ov, grad_W_kq; first wrong in the order of computation: attn"),
    "gradient_error": ({("r0_twostage_0_eval_general_E", "grad_W_kq"), ("r0_shallow_0_eval_paired_mask", "grad_W"),
                        ("r0_indrnn_1_eval_T1_erf", "grad_W_in"), ("r0_shallow_2_train_projgd", "grad_norm_W")},
                       "FAIL  r0_shallow_0_eval_paired_mask: 4/5 arrays within tolerance; failing: grad_W"),
}


@pytest.mark.parametrize("name", BROKEN)
def test_broken_adapter_fails_named(capsys, name):
    named, summary = BROKEN[name]
    rc, out, err = conformance(capsys, ADAPTERS / f"{name}.py", "--no-stored")
    assert rc == 1, out + err
    assert named <= failing_rows(out), out
    assert summary in out.splitlines()
    assert out.splitlines()[-1].endswith(": FAIL")


def test_a_scale_error_is_named_with_its_factor():
    """1/m for 1/√m at m = 8 heads: every output of the paired-initialisation case is the oracle's over √8,
    and the report says so with the factor."""
    (case,) = [c for c in random_cases(["shallow"]) if c.id == "r0_shallow_0_eval_paired_mask"]
    assert case.inputs["c"].shape == (8,)
    report = check(ADAPTERS / "one_over_m.py", case)
    notes = {r.name: r.note for r in report.rows if not r.ok}
    assert set(notes) == {"grad_c", "grad_U", "grad_W"}, notes
    assert all("; adapter = 0.353553 × oracle = oracle / 2.82843 (a scale); err/bound " in n and n.endswith(
               ": beyond the guaranteed bound: no correct program makes this error") for n in notes.values()), notes


def test_arrays_whose_tolerance_admits_every_value_are_unchecked_not_within_tolerance(capsys):
    """float32 mode on the saturated two-stage evaluation: the envelope of grad_W_kq is above its largest
    entry everywhere, so the case calls it unchecked (never "within tolerance"), and so does the verdict. The
    same case in float64, and under the calibrated float32 tolerance, have nothing unchecked. Under the
    envelope, grad_W_kq is unchecked on both random eval cases: the run fails unless that is accepted."""
    every = {c.id: c for c in random_cases(["twostage"])}
    saturated, benign = every["r0_twostage_1_eval_saturated"], every["r0_twostage_0_eval_general_E"]
    report = check(ADAPTERS / "oracle_numpy.py", saturated, precision="float32", policy="bound")
    tol, value = saturated.tolerances("float32", "bound")["grad_W_kq"], saturated.expected["grad_W_kq"]
    assert np.all(tol.element_bounds(value) >= np.abs(value).max())      # the rule, restated
    assert report.ok and "grad_W_kq" in report.unchecked, report
    n = len(report.rows) - len(report.unchecked)
    assert f"{n}/{len(report.rows)} arrays within tolerance, {len(report.unchecked)} unchecked (" in report.summary()
    assert "unchecked (its tolerance admits every value)" in report.table(verbose=False)
    assert report.to_dict()["unchecked"] == report.unchecked
    assert not check(ADAPTERS / "oracle_numpy.py", saturated).unchecked
    assert not check(ADAPTERS / "oracle_numpy.py", saturated, precision="float32").unchecked
    assert not check(ADAPTERS / "oracle_numpy.py", benign, precision="float32").unchecked
    args = (ADAPTERS / "oracle_numpy.py", "--no-stored", "--precision", "float32", "--model", "twostage",
            "--policy", "bound", "--kind", "eval")
    rc, out, err = conformance(capsys, *args)
    assert rc == 1 and out.splitlines()[-1] == (
        "3 cases: 3 passed, 0 failed, 0 skipped; 21 arrays compared, 4 of them unchecked (grad_W_kq on 3 cases, "
        "grad_W_ov): "
        "FAIL: grad_W_kq never checked (on every case its tolerance admits every value; --accept-unchecked NAME "
        "to accept)"), out
    rc, out, err = conformance(capsys, *args, "--accept-unchecked", "grad_W_kq")
    assert rc == 0 and out.splitlines()[-1].endswith("PASS: accepted unchecked: grad_W_kq"), out


def test_gradient_error_fails_the_float32_envelope(capsys):
    """A 1e-3 relative error in one gradient is outside what float32 arithmetic allows."""
    rc, out, err = conformance(capsys, ADAPTERS / "gradient_error.py", "--no-stored", "--precision", "float32")
    assert rc == 1, out + err
    assert {("r0_indrnn_0_eval_paired", "grad_W_in"), ("r0_indrnn_1_eval_T1_erf", "grad_W_in"),
            ("r0_shallow_2_train_projgd", "grad_norm_W")} <= failing_rows(out), out
    assert "err/tol" in out


def test_naive_direction_fails_the_late_stage_case():
    """Late in Algorithm 1 every p_v (v ≠ y) underflows: the float64 gradient is 0, so a naive NGD stops while
    the stable direction keeps moving W_kq."""
    late = next(c for c in random_cases(["twostage"]) if c.id.endswith("train_late_stage"))
    naive = {"train": lambda model, inputs: oracle(model, inputs, direction=np.array("naive"))}
    report = check(naive, late)
    assert not report.ok
    assert {"W_kq", "stage2_norm"} <= {r.name for r in report.rows if not r.ok}
    assert report.departure == ("stage1_norm", 1)                  # stage 1 stops as well, and comes first
    assert "leaves tolerance first at step 1 of stage1_norm" in report.summary()
    stable = {"train": lambda model, inputs: oracle(model, inputs)}
    assert check(stable, late).ok
    # what makes it the late stage: the naive stage 2 does not move at all
    stalled = oracle("twostage", {k: v for k, v in late.inputs.items() if k != "model"}, direction=np.array("naive"))
    np.testing.assert_array_equal(stalled["W_kq"], late.inputs["W_kq"])
    assert np.any(late.expected["W_kq"] != late.inputs["W_kq"])


def test_attention_cancellation_case_fails_a_wrong_direction_and_passes_the_stable_one(monkeypatch):
    """Attention margins >= 40 on x*: the float64 gradient has lost its direction (a_l − φ·a cancels) but is
    not 0. The float64 policy must still see a naive NGD and a 1e-3 error in one entry of the direction."""
    from ntpref.twostage import model

    case = next(c for c in random_cases(["twostage"]) if c.id.endswith("train_attention_cancel"))
    assert check(ADAPTERS / "oracle_numpy.py", case).ok                     # the NumPy backend's stable direction
    naive = check({"train": lambda model, inputs: oracle(model, inputs, direction=np.array("naive"))}, case)
    assert {"W_kq", "stage2_norm"} <= {r.name for r in naive.rows if not r.ok}, naive
    assert naive.departure[0] == "stage2_norm"
    unit = model.unit_direction

    def one_entry(G, log_scale, *, backend):
        G = np.array(G)
        G.flat[int(np.argmax(np.abs(G)))] *= 1 + 1e-3
        return unit(G, log_scale, backend=backend)

    monkeypatch.setattr(model, "unit_direction", one_entry)
    wrong = check({"train": lambda model, inputs: contract.train({"model": model, **inputs}, "numpy")}, case)
    assert {"W_kq", "stage2_norm"} <= {r.name for r in wrong.rows if not r.ok}, wrong


# --- float32 ----------------------------------------------------------------------------------------
def test_float32_results_fail_the_float64_policy_and_pass_the_float32_envelope(capsys):
    case = next(c for c in random_cases(["shallow"]) if c.kind == "eval")
    strict = check({"evaluate": float32_outputs}, case)
    assert not strict.ok
    assert all(not r.ok and "less precise" in r.note for r in strict.rows)
    widened = check({"evaluate": lambda m, i: {k: v.astype(np.float64) for k, v in float32_outputs(m, i).items()}}, case)
    assert not widened.ok                                    # the values themselves miss the float64 policy
    assert [r.name for r in widened.rows if not r.ok] == ["loss", "grad_c", "grad_U", "grad_W"]   # f = 0 exactly
    relaxed = check({"evaluate": float32_outputs}, case, precision="float32")
    assert relaxed.ok, relaxed
    # float32 rounding is at most u|q|: within the envelope, and within the calibrated floor CALIBRATED_MULTIPLE · FLOOR · u max|Q|
    assert all(0 < r.ratio < 1 / CALIBRATED_MULTIPLE for r in relaxed.rows if r.max_abs_err)
    envelope = check({"evaluate": float32_outputs}, case, precision="float32", policy="bound")
    assert envelope.ok and all(r.ratio < 1 / ENVELOPE_MULTIPLE for r in envelope.rows)


def test_float32_mode_allows_the_oracles_own_max_margin_error():
    """The max-margin solutions are certified to 1e-9 of max|W*|, not to float32's rounding of each entry:
    the exact solution, which the oracle misses by 8e-17 where it is 0, passes in float32 mode; 1e-4 does not."""
    from ntpref import exact

    case = random_cases(["twostage"])[3]
    assert case.id == "r0_twostage_3_train_late_stage"
    solution = {k: exact.train(dict(case.inputs))[k] for k in ("W_ov_star", "W_kq_star")}
    miss = np.abs(solution["W_kq_star"] - case.expected["W_kq_star"])
    assert np.any(miss > 1e-6 * np.abs(solution["W_kq_star"]))     # beyond any relative float32 bound there
    for policy in ("calibrated", "bound"):
        assert check({"train": lambda m, i: {**oracle(m, i), **solution}}, case, "float32", policy).ok
        wrong = {"W_kq_star": solution["W_kq_star"] * (1 + 1e-4)}
        report = check({"train": lambda m, i: {**oracle(m, i), **wrong}}, case, "float32", policy)
        assert [r.name for r in report.rows if not r.ok] == ["W_kq_star"]


@pytest.mark.parametrize("sums", ["separate", "fused"])
def test_float32_mode_allows_the_rounding_of_a_correlations_three_sums(sums):
    """ρ(W_ov, W_ov*) = 1 at every step of this case: a float32 program's ρ misses it only by the rounding
    of ⟨W, W*⟩, ‖W‖² and ‖W*‖² (d² terms each), several u32. The exact backend's loops in float32 pass with
    room to spare (against one rounding of ρ alone their err/tol would be 0.69); 1e-4 does not."""
    from ntpref import exact
    from ntpref.exact.arith import rounded

    case = random_cases(["twostage"])[3]
    assert case.id == "r0_twostage_3_train_late_stage" and np.all(np.abs(case.expected["stage1_corr"] - 1) < 1e-12)
    with rounded(24, sums):
        outputs = {k: np.asarray(v, dtype=np.float64) for k, v in exact.train(dict(case.inputs)).items()}
    assert 2 * 2.0 ** -24 < np.max(np.abs(outputs["stage1_corr"] - 1))      # more than one rounding of ρ
    for policy in ("calibrated", "bound"):
        report = check({"train": lambda m, i: outputs}, case, "float32", policy)
        assert report.ok and next(r for r in report.rows if r.name == "stage1_corr").ratio < 0.5
        wrong = {**outputs, "stage1_corr": outputs["stage1_corr"] * (1 - 1e-4)}
        report = check({"train": lambda m, i: wrong}, case, "float32", policy)
        assert [r.name for r in report.rows if not r.ok] == ["stage1_corr"]


def test_cli_hints_at_float32_mode(capsys):
    rc, out, _ = conformance(capsys, ADAPTERS / "float32_outputs.py", "--no-stored", "--model", "indrnn", "--random", 2)
    assert rc == 1
    assert "(float32 results cannot meet the float64 policy: judge them with --precision float32)" in out
    rc, out, _ = conformance(capsys, ADAPTERS / "float32_outputs.py", "--no-stored", "--model", "indrnn", "--random", 2,
                             "--precision", "float32")
    assert rc == 0, out
    assert out.splitlines()[-1] == "2 cases: 2 passed, 0 failed, 0 skipped; 10 arrays compared: PASS"


# --- the first wrong quantity, in the order of computation ------------------------------------------
def _oracle_with(case, changes):
    """A dict adapter returning the oracle's outputs of ``case`` with ``changes`` (name → f(array)) applied."""
    def run(model, inputs):
        out = {k: np.array(v, dtype=np.float64) for k, v in case.expected.items()}
        for name, change in changes.items():
            out[name] = change(out[name])
        return out
    return {"evaluate" if case.kind == "eval" else "train": run}


def _bump(index=None, rel=1e-3):
    def change(a):
        a = a.copy()
        if index is None:
            a *= 1.0 + rel
        else:
            a[index] += rel * (1.0 + abs(a[index]))
        return a
    return change


@pytest.mark.parametrize("changes, departure", [
    ({"W_ov": _bump(), "stage2_loss": _bump(0)}, ("W_ov", None)),           # the stage-1 result before stage 2
    ({"stage1_loss": _bump(3), "stage2_loss": _bump(0)}, ("stage1_loss", 3)),
    ({"stage2_norm": _bump(2), "stage2_loss": _bump(2), "W_kq": _bump()}, ("stage2_loss", 2)),  # loss before norm
    ({"W_kq_star": _bump(), "stage1_loss": _bump(0)}, ("W_kq_star", None)),  # from the data, before training
])
def test_the_report_names_the_first_wrong_two_stage_quantity(changes, departure):
    case = next(c for c in random_cases(["twostage"], 3, 0) if c.kind == "train")
    report = check(_oracle_with(case, changes), case)
    assert not report.ok and report.departure == departure
    assert {r.name for r in report.rows if not r.ok} == set(changes)


def test_the_report_names_the_gradient_norm_before_the_validation_loss():
    """grad_norm_W[t] is computed at θ(t), before the update that val_loss[t] (at θ(t+1)) follows."""
    case = next(c for c in random_cases(["shallow"], 3, 0) if c.kind == "train")
    report = check(_oracle_with(case, {"grad_norm_W": _bump(0), "val_loss": _bump(0)}), case)
    assert report.departure == ("grad_norm_W", 0)
    assert "leaves tolerance first at step 0 of grad_norm_W" in report.summary()
    report = check(_oracle_with(case, {"train_loss": _bump(1), "grad_norm_W": _bump(1)}), case)
    assert report.departure == ("train_loss", 1)


def test_head_states_returned_by_an_adapter_are_compared_and_may_be_left_out():
    """The shallow transformer's head states (stored beside its eval cases to locate a mismatch) are judged
    when an adapter returns them, come first in the order of computation, and are never required."""
    case = next(c for c in random_cases(["shallow"], 1, 0) if c.kind == "eval")
    assert {"head_s", "head_a", "head_MU"} <= set(case.expected)
    right = check(_oracle_with(case, {}), case)
    assert right.ok and {"head_s", "head_a", "head_MU"} <= {r.name for r in right.rows}
    wrong = check(_oracle_with(case, {"head_a": _bump(), "f": _bump()}), case)
    assert not wrong.ok and wrong.departure == ("head_a", None)
    def without_heads(model, inputs):
        return {k: v for k, v in _oracle_with(case, {})["evaluate"](model, inputs).items() if not k.startswith("head_")}
    plain = check({"evaluate": without_heads}, case)
    assert plain.ok and not plain.not_returned
    stored = next(c for c in stored_cases(["shallow"]) if c.kind == "eval")
    assert {"head_s", "head_a", "head_MU"} <= set(stored.expected) <= set(stored.tolerances())
