"""``ntpref conformance`` and its Python API (ntpref.oracle.conformance), NumPy only.

The adapters under tests/conformance_adapters/ wrap the oracle: its NumPy backend (a second float64
implementation, which must pass) and deliberately broken implementations (the fault injected into
the oracle's outputs or NumPy functions), each of which must fail with the case and array named.
The PyTorch and JAX adapters of examples/adapters/ are run by tests/test_crosscheck.py.
"""
import json
import re
import os
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

from ntpref.cli import main
from ntpref.oracle import contract
from ntpref.models import SPECS
from ntpref.oracle.cases import random_cases, stored_cases
from ntpref.oracle.conformance import OPTIONAL, AdapterError, cases, check, load_adapter, run
from ntpref.oracle.policies.calibrated import CALIBRATED_MULTIPLE
from ntpref.oracle.policies.envelope import ENVELOPE_MULTIPLE
from ntpref.npzio import load_npz, save_npz
from ntpref.oracle.manifest import default_root, load_manifest, tolerances_of

ADAPTERS = Path(__file__).resolve().parent / "conformance_adapters"


def conformance(capsys, adapter, *args):
    """(exit status, stdout, stderr) of ``ntpref conformance ADAPTER ARGS`` run in-process."""
    rc = main(["conformance", str(adapter), *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def failing_rows(out):
    """{(case, array)} of the table rows whose verdict is FAIL."""
    rows = set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) > 2 and "FAIL" in parts[2:] and not line.startswith("FAIL"):
            rows.add((parts[0], parts[1]))
    return rows


def oracle(model, inputs, **changes):
    """The oracle's eval / train outputs of a case's inputs (a helper for dict adapters)."""
    run = contract.train if "eta" in inputs else contract.evaluate
    return run({"model": model, **inputs, **changes})


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
_float32 = load_adapter(ADAPTERS / "float32_outputs.py").evaluate


def test_float32_results_fail_the_float64_policy_and_pass_the_float32_envelope(capsys):
    case = next(c for c in random_cases(["shallow"]) if c.kind == "eval")
    strict = check({"evaluate": _float32}, case)
    assert not strict.ok
    assert all(not r.ok and "less precise" in r.note for r in strict.rows)
    widened = check({"evaluate": lambda m, i: {k: v.astype(np.float64) for k, v in _float32(m, i).items()}}, case)
    assert not widened.ok                                    # the values themselves miss the float64 policy
    assert [r.name for r in widened.rows if not r.ok] == ["loss", "grad_c", "grad_U", "grad_W"]   # f = 0 exactly
    relaxed = check({"evaluate": _float32}, case, precision="float32")
    assert relaxed.ok, relaxed
    # float32 rounding is at most u|q|: within the envelope, and within the calibrated floor CALIBRATED_MULTIPLE · FLOOR · u max|Q|
    assert all(0 < r.ratio < 1 / CALIBRATED_MULTIPLE for r in relaxed.rows if r.max_abs_err)
    envelope = check({"evaluate": _float32}, case, precision="float32", policy="bound")
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


# --- adapter errors, skips and usage errors -----------------------------------------------------------
def test_adapter_exception_exit_2_with_the_adapters_traceback(capsys):
    rc, out, err = conformance(capsys, ADAPTERS / "raising.py", "--no-stored")
    assert rc == 2
    lines = err.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert f'  File "{ADAPTERS / "raising.py"}", line 9, in evaluate' in lines
    assert f'  File "{ADAPTERS / "raising.py"}", line 5, in _forward' in lines
    assert "ntpref/oracle/" not in err                     # the adapter's frames only
    assert lines[-1] == (f"ntpref: error: {ADAPTERS / 'raising.py'}: evaluate() on case "
                         "r0_twostage_0_eval_general_E raised KeyError: 'no_such_array'")


EXITS = {"sys.exit(0)": "SystemExit(0)", "sys.exit(1)": "SystemExit(1)", "sys.exit('no GPU')": "SystemExit('no GPU')",
         "raise KeyboardInterrupt": "KeyboardInterrupt()"}


@pytest.mark.parametrize("when", ["load", "evaluate"])
@pytest.mark.parametrize("statement", EXITS)
def test_adapter_exiting_or_interrupting_itself_is_an_adapter_error(capsys, tmp_path, statement, when):
    """SystemExit and KeyboardInterrupt raised by the adapter's code (no signal arrived) end the run like any
    other exception it raises: exit status 2 and a line naming the adapter and what it raised."""
    path = tmp_path / "exiting.py"
    body = f"    {statement}\n" if when == "evaluate" else "    return {}\n"
    path.write_text(f"import sys\n\n{statement if when == 'load' else ''}\n\ndef evaluate(model, inputs):\n{body}")
    rc, out, err = conformance(capsys, path, "--no-stored", "--model", "indrnn", "--random", 1)
    where = "loading the adapter" if when == "load" else "evaluate() on case r0_indrnn_0_eval_paired"
    assert rc == 2, out + err
    assert err.splitlines()[-1] == f"ntpref: error: {path}: {where} raised {EXITS[statement]}"
    assert f'  File "{path}", line {3 if when == "load" else 6}, in {"<module>" if when == "load" else "evaluate"}' \
        in err.splitlines()
    assert "interrupted" not in err and "arrays compared" not in out


def test_a_real_sigint_interrupts_the_run(capsys):
    """(SIGINT is given Python's default handler first: a test run started in the background by a
    non-interactive shell inherits SIGINT ignored, which the command rightly keeps ignoring.)"""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        rc, out, err = conformance(capsys, ADAPTERS / "signalled.py", "--no-stored", "--model", "indrnn",
                                   "--random", 1)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (rc, err) == (130, f"ntpref: interrupted by SIGINT (conformance {ADAPTERS / 'signalled.py'})\n")


def test_python_api_exit_is_an_adapter_error_and_ctrl_c_propagates():
    """From Python, under Python's default SIGINT handler, a KeyboardInterrupt may be a Ctrl-C: it stops the
    caller (e.g. pytest) instead of failing one case."""
    case = random_cases(["indrnn"])[0]
    with pytest.raises(AdapterError, match=r"^adapter: evaluate\(\) on case r0_indrnn_0_eval_paired raised "
                                           r"SystemExit\('stop'\)$") as exc:
        check({"evaluate": lambda m, i: sys.exit("stop")}, case)
    assert isinstance(exc.value.__cause__, SystemExit)

    def interrupted(model, inputs):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            check({"evaluate": interrupted}, case)
    finally:
        signal.signal(signal.SIGINT, previous)


def test_not_implemented_skips_the_case_with_its_message():
    train_case = next(c for c in random_cases(["shallow"]) if c.kind == "train")
    report = check(ADAPTERS / "raising.py", train_case)
    assert report.ok and report.status == "skip"
    assert report.summary() == f"skip  {train_case.id}: skipped: training of shallow is not written yet"
    with pytest.raises(AdapterError, match=r"evaluate\(\) on case r0_shallow_0_eval_paired_mask raised KeyError") as exc:
        check(ADAPTERS / "raising.py", random_cases(["shallow"])[0])
    assert isinstance(exc.value.__cause__, KeyError)


def test_cases_of_a_function_the_adapter_lacks_are_not_run(capsys):
    rc, out, _ = conformance(capsys, ADAPTERS / "one_over_m.py", "--no-stored", "--model", "shallow")
    assert "(evaluate)" in out.splitlines()[0]
    assert "train" not in "".join(line for line in out.splitlines() if line.startswith(("pass", "FAIL", "skip")))
    assert out.splitlines()[-1].startswith("4 cases:")                 # regimes 0, 1, 4 (overflow) and 0 again
    report = check({"train": _float32}, random_cases(["shallow"])[0])
    assert report.skipped == "the adapter defines no evaluate()"


def test_everything_skipped_is_not_a_pass(capsys):
    rc, out, _ = conformance(capsys, ADAPTERS / "one_over_m.py", "--no-stored", "--model", "twostage")
    assert rc == 1
    assert out.splitlines()[-1] == ("3 cases: 0 passed, 0 failed, 3 skipped [never checked: twostage (eval)]; 0 arrays "
                                    "compared: FAIL (nothing was compared)")


def test_unknown_or_missing_outputs(capsys):
    case = random_cases(["twostage"])[0]
    typo = check({"evaluate": lambda m, i: {**oracle(m, i), "grad_W_KQ": np.zeros((3, 3))}}, case)
    assert not typo.ok and typo.unknown == ["grad_W_KQ"]
    assert ("r0_twostage_0_eval_general_E", "grad_W_KQ", "-", "-", "-", "-",
            "FAIL (not an output of ntpref eval)") in typo.table_rows(verbose=False)
    partial = check({"evaluate": lambda m, i: {"loss": oracle(m, i)["loss"]}}, case)
    assert partial.ok and partial.not_returned == ["logits", "attn", "grad_W_ov", "grad_W_kq", "loss0", "grad0_W_ov"]
    nothing = check({"evaluate": lambda m, i: {}}, case)
    assert not nothing.ok
    assert "the adapter returned none of the outputs" in nothing.summary()


LOSS_ONLY = ("2 cases: 2 passed, 0 failed, 0 skipped; 2 arrays compared: FAIL: {} never compared "
             "(returned by no case; --skip-output NAME to accept)")


def test_required_outputs_no_case_returned_fail_the_run(capsys):
    args = (ADAPTERS / "loss_only.py", "--no-stored", "--model", "indrnn", "--random", 2)
    rc, out, err = conformance(capsys, *args)
    assert rc == 1, out + err
    assert "pass  r0_indrnn_0_eval_paired: 1/1 arrays within tolerance; not returned: f, grad_c, grad_u, grad_W_in" \
        in out.splitlines()
    assert out.splitlines()[-1] == LOSS_ONLY.format("f, grad_c, grad_u, grad_W_in")
    rc, out, _ = conformance(capsys, *args, "--skip-output", "f", "--skip-output", "grad_u")
    assert rc == 1 and out.splitlines()[-1] == LOSS_ONLY.format("grad_c, grad_W_in")
    rc, out, _ = conformance(capsys, *args, *(a for n in ("f", "grad_c", "grad_u", "grad_W_in") for a in ("--skip-output", n)))
    assert rc == 0, out
    assert out.splitlines()[-1] == "2 cases: 2 passed, 0 failed, 0 skipped; 2 arrays compared: PASS"
    rc, _, err = conformance(capsys, *args, "--skip-output", "grad_W")
    assert (rc, err) == (2, "ntpref: error: --skip-output grad_W: not an output of the cases run "
                            "(f, grad_W_in, grad_c, grad_u, loss)\n")


def test_required_outputs_in_the_python_api():
    reports = run(ADAPTERS / "loss_only.py", ["shallow"], random=2, stored=False)
    assert all(r.ok for r in reports)
    assert not reports.ok and reports.never_compared == ["f", "grad_c", "grad_U", "grad_W"]
    accepted = run(ADAPTERS / "loss_only.py", ["shallow"], random=2, stored=False,
                   skip_outputs=["f", "grad_c", "grad_U", "grad_W"])
    assert accepted.ok and accepted.total().endswith("2 arrays compared: PASS")


def test_max_margin_outputs_are_optional():
    """A training implementation without a QP solver passes: W_ov_star, W_kq_star, stage*_corr are listed only."""
    reports = run({"train": lambda m, i: {k: v for k, v in oracle(m, i).items() if k not in OPTIONAL}},
                  ["twostage"], random=3, stored=False)
    assert [r.case.id for r in reports] == ["r0_twostage_2_train_naive"]
    assert reports.ok and reports.never_compared == []
    assert reports[0].not_returned == ["W_ov_star", "W_kq_star", "stage1_corr", "stage2_corr"]
    assert reports.total() == "1 cases: 1 passed, 0 failed, 0 skipped; 7 arrays compared: PASS"


def test_adapter_returning_no_dict_of_arrays():
    case = random_cases(["indrnn"])[0]
    with pytest.raises(AdapterError, match=r"^adapter: evaluate\(\) on case r0_indrnn_0_eval_paired returned list, "
                                           r"not a dict of arrays$"):
        check({"evaluate": lambda m, i: [1, 2]}, case)
    strings = check({"evaluate": lambda m, i: {"f": np.array(["a"] * 9)}}, case)      # a failed row, not an error
    assert not strings.ok
    assert strings.rows[0].note == "adapter is string (<U1), oracle floating-point (float64)"


def test_usage_errors_exit_2(capsys, tmp_path):
    rc, _, err = conformance(capsys, tmp_path / "missing.py")
    assert (rc, err) == (2, f"ntpref: error: {tmp_path / 'missing.py'}: no such adapter file\n")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    rc, _, err = conformance(capsys, empty)
    assert (rc, err) == (2, f"ntpref: error: {empty}: defines neither evaluate(model, inputs) nor train(model, inputs)\n")
    broken = tmp_path / "broken.py"
    broken.write_text("import numpy\n\nraise RuntimeError('cannot start')\n")
    rc, _, err = conformance(capsys, broken)
    assert rc == 2
    assert f'  File "{broken}", line 3, in <module>' in err.splitlines()
    assert err.splitlines()[-1] == f"ntpref: error: {broken}: loading the adapter raised RuntimeError: cannot start"
    for args, text in ((["--model", "gpt"], "argument --model: invalid choice: 'gpt'"),
                       (["--random", "-1"], "argument --random: expected a whole number >= 0, got '-1'"),
                       (["--seed", "-3"], "argument --seed: expected a whole number >= 0, got '-3'"),
                       (["--precision", "float16"], "argument --precision: invalid choice: 'float16'")):
        rc, _, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", *args)
        assert rc == 2 and text in err, err


def test_verbose_shows_every_row_and_json_report(capsys, tmp_path):
    rc, quiet, _ = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--no-stored", "--model", "indrnn", "--random", 2)
    assert rc == 0 and "max abs err" not in quiet               # no failures: no table
    report_path = tmp_path / "report.json"
    rc, out, _ = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--no-stored", "--model", "indrnn", "--random", 2,
                             "-v", "--json", report_path)
    assert rc == 0
    rows = [line.split()[:2] for line in out.splitlines() if line.startswith("r0_indrnn")]
    assert rows == [[c, a] for c in ("r0_indrnn_0_eval_paired", "r0_indrnn_1_eval_T1_erf")
                    for a in ("f", "loss", "grad_c", "grad_u", "grad_W_in")]
    doc = json.loads(report_path.read_text())
    assert (doc["ok"], doc["precision"], doc["models"]) == (True, "float64", ["indrnn"])
    assert [c["case"] for c in doc["cases"]] == ["r0_indrnn_0_eval_paired", "r0_indrnn_1_eval_T1_erf"]
    assert all(r["ok"] and r["err/tol"] < 1 for c in doc["cases"] for r in c["rows"])


def test_json_report_of_a_failing_run(capsys, tmp_path):
    path = tmp_path / "report.json"
    rc, _, _ = conformance(capsys, ADAPTERS / "detached_attention.py", "--no-stored", "--model", "twostage",
                           "--json", path)
    assert rc == 1
    doc = json.loads(path.read_text())
    assert doc["ok"] is False
    naive = next(c for c in doc["cases"] if c["case"] == "r0_twostage_2_train_naive")
    assert naive["status"] == "FAIL"
    assert naive["departure"] == {"array": "stage2_loss", "step": 1}
    assert {r["array"] for r in naive["rows"] if not r["ok"]} == {"W_kq", "stage2_loss", "stage2_norm", "stage2_corr"}


def test_damaged_stored_case_exit_2(capsys, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(default_root(), root)
    expected = load_npz(root / "indrnn_eval" / "expected.npz")
    expected["f"] = expected["f"] * (1 + 1e-6)
    save_npz(root / "indrnn_eval" / "expected.npz", expected)
    rc, _, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--model", "indrnn", "--random", 0, "--root", root)
    assert rc == 2
    assert err == (f"ntpref: error: reference case indrnn_eval/expected.npz: array 'f' bytes differ from the manifest "
                   f"(sha256) ({root})\n")


def test_missing_reference_directory_exit_2(capsys, tmp_path, monkeypatch):
    """A --root (or NTPREF_REFERENCE_RUNS) without cases is refused as by ntpref verify, not run on the random
    cases alone."""
    missing = tmp_path / "missing"
    line = f"ntpref: error: {missing}: no reference cases (manifest.json missing or empty)\n"
    rc, out, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--model", "indrnn", "--random", 1, "--root", missing)
    assert (rc, err) == (2, line)
    assert (main(["verify", "--root", str(missing)]), capsys.readouterr().err) == (2, line)
    assert (main(["verify", "--list", "--root", str(missing)]), capsys.readouterr().err) == (2, line)
    assert (main(["export", "indrnn_eval", "-o", str(tmp_path / "out"), "--root", str(missing)]),
            capsys.readouterr().err) == (2, line)
    monkeypatch.setenv("NTPREF_REFERENCE_RUNS", str(missing))
    rc, out, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--model", "indrnn", "--random", 1)
    assert (rc, err) == (2, line)


# --- the cases ----------------------------------------------------------------------------------------
def test_random_cases_are_reproducible_and_independent_of_the_selection():
    every = {c.id: c for c in random_cases(n=6, seed=3)}
    assert len(every) == 18
    some = random_cases(["indrnn"], n=2, seed=3)
    assert [c.id for c in some] == ["r3_indrnn_0_eval_paired", "r3_indrnn_1_eval_T1_erf"]
    for case in some:
        assert case.inputs.keys() == every[case.id].inputs.keys()
        for k, v in case.inputs.items():
            np.testing.assert_array_equal(v, every[case.id].inputs[k])
    other = random_cases(["indrnn"], n=1, seed=4)[0]
    assert not np.array_equal(other.inputs["X"], some[0].inputs["X"]) or other.inputs["X"].shape != some[0].inputs["X"].shape
    assert [c.id.split("_", 3)[3] for c in every.values() if c.model == "shallow"] == [
        "eval_paired_mask", "eval_T1_erf", "train_projgd", "train_projsgd", "eval_overflow", "eval_paired_mask"]


def test_random_cases_cover_the_regimes():
    by_name = {c.id.split("_", 3)[3] + ":" + c.model: c for c in random_cases(seed=0)}
    assert len(by_name) == sum(len(spec.regimes) for spec in SPECS.values())
    general = by_name["eval_general_E:twostage"].inputs
    assert general["E"].shape[0] != general["E"].shape[1]
    assert 1 in general["lengths"] and np.any(general["tokens"] == -1) and np.any(general["succ"] == -1)
    assert len(np.unique(general["tokens"][2])) == 1                                       # repeated tokens
    assert np.max(by_name["eval_saturated:twostage"].expected["attn"]) > 1 - 1e-9            # saturated softmax
    overflow = np.log(np.finfo(np.float64).max)                                   # beyond exp's overflow
    assert by_name["eval_overflow:twostage"].expected["logits"].min() > overflow
    heads = by_name["eval_overflow:shallow"].inputs
    scores = np.einsum("ntd,mde,ne->nmt", heads["X"], heads["W"], heads["X"][:, -1]) / float(heads["tau_att"])
    assert np.abs(scores).max() == pytest.approx(1500.0)                          # above 709.8
    assert str(by_name["train_naive:twostage"].inputs["direction"]) == "naive"
    for model in ("shallow", "indrnn"):
        np.testing.assert_array_equal(by_name[f"eval_paired{'_mask' if model == 'shallow' else ''}:{model}"].expected["f"], 0.0)
        t1 = by_name[f"eval_T1_erf:{model}"].inputs
        assert t1["X"].shape[1] == 1 and str(t1["activation"]) == "erf" and float(t1["kappa"]) == 1.0
        sgd = by_name[f"train_projsgd:{model}"].inputs
        assert {"batch", "seed", "X_val", "y_val"} <= set(sgd)
    mask = by_name["eval_paired_mask:shallow"].inputs
    assert bool(mask["mask_last_key"]) and float(mask["tau_att"]) == pytest.approx(np.sqrt(mask["X"].shape[2]))
    projgd = by_name["train_projgd:shallow"]
    np.testing.assert_array_equal(projgd.inputs["rho"], [np.inf, 0.0, 0.05])
    np.testing.assert_array_equal(projgd.expected["U"], projgd.inputs["U"])                   # rho_U = 0: frozen
    m = len(projgd.inputs["c"])
    radius = np.linalg.norm((projgd.expected["W"] - projgd.inputs["W"]).reshape(m, -1), axis=1)
    np.testing.assert_allclose(radius, 0.05 / np.sqrt(m), rtol=1e-12)                         # W's ball active


def test_stored_cases_are_the_eval_and_train_cases_of_the_manifest():
    stored = stored_cases()
    assert {c.kind for c in stored} == {"eval", "train"}
    assert "shallow_ntk_gram" not in {c.id for c in stored}
    assert [c.id for c in stored_cases(["indrnn"])] == ["indrnn_eval", "indrnn_train"]
    case = stored_cases(["indrnn"])[0]
    np.testing.assert_array_equal(case.expected["f"], load_npz(default_root() / "indrnn_eval" / "expected.npz")["f"])
    assert case.tolerances("float64", "bound") == tolerances_of(load_manifest()["cases"]["indrnn_eval"])     # as ntpref verify


def test_a_failing_report_reads_as_its_table_in_an_assert(tmp_path):
    """pytest shows repr() of an assert's message: the docs' ``assert report.ok, report`` shows the table."""
    from ntpref.oracle.conformance import cases, check

    case = next(c for c in cases(models=["shallow"], stored=False) if c.kind == "eval")
    report = check({"evaluate": lambda model, inputs: {"loss": np.array(1e9)}}, case)
    assert not report.ok and repr(report) == str(report)
    assert "loss" in repr(report) and "object at 0x" not in repr(report)


def test_an_unwritable_json_report_is_refused_before_any_case_runs(capsys, tmp_path):
    (tmp_path / "afile").write_text("")
    os.mkfifo(tmp_path / "fifo.json")
    for path, why in ((tmp_path / "afile" / "r.json", "afile' is a regular file, not a directory"),
                      (tmp_path / "fifo.json", "it is a FIFO, not a regular file")):
        rc, out, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--no-stored", "--json", path)
        assert rc == 2 and out == "" and why in err and err.count("\n") == 1, err


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
