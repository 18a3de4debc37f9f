"""What a conformance verdict claims: an array whose tolerance admits every value is unchecked (never "within
tolerance") and an output unchecked on every case fails the run unless accepted by name; an output returned
on some cases and left out of others fails those; models whose cases were all skipped are named; the rows of
a non-finite array, of an error within the guaranteed bound and of a wrong scalar say what is true."""
import numpy as np
import pytest

from ntpref.cli import main
from ntpref.oracle.cases import random_cases, stored_cases
from ntpref.oracle.conformance import RunReport, check, run

from conformance_support import oracle


def flipped_correlations(model, inputs):
    """The oracle's training with stage1_corr's sign flipped and stage2_corr 0 at every step."""
    out = oracle(model, inputs)
    return {**out, "stage1_corr": -out["stage1_corr"], "stage2_corr": np.zeros_like(out["stage2_corr"])}


@pytest.fixture(scope="module")
def five_token():
    (case,) = [c for c in stored_cases(["twostage"], kinds=("train",)) if c.id == "twostage_train_five_token"]
    return case


def test_float32_correlations_that_admit_every_value_are_unchecked_and_fail_the_run_unless_accepted(five_token):
    report = check({"train": flipped_correlations}, five_token, precision="float32")
    assert report.unchecked == ["stage1_corr", "stage2_corr"], report
    assert "9/11 arrays within tolerance, 2 unchecked (stage1_corr, stage2_corr" in report.summary()
    tols = five_token.tolerances("float32")
    for name in report.unchecked:            # the rule: every entry's bound at or above max|q| (here above 1)
        value = five_token.expected[name]
        assert np.all(tols[name].element_bounds(value) >= np.abs(value).max()) and tols[name].atol > 1.0
    reports = RunReport([report])
    assert not reports.ok
    assert reports.total() == ("1 cases: 1 passed, 0 failed, 0 skipped; 11 arrays compared, 2 of them unchecked "
                               "(stage1_corr, stage2_corr): FAIL: stage1_corr, stage2_corr never checked (on every "
                               "case its tolerance admits every value; --accept-unchecked NAME to accept)")
    accepted = RunReport(reports, accept_unchecked=["stage1_corr", "stage2_corr"])
    assert accepted.ok and accepted.total().endswith("PASS: accepted unchecked: stage1_corr, stage2_corr")
    assert not RunReport(reports, accept_unchecked=["stage1_corr"]).ok
    assert check({"train": flipped_correlations}, five_token).unchecked == []      # float64 checks them (and fails)


def test_accept_unchecked_is_an_option_of_the_command_and_a_misspelt_name_is_refused(tmp_path, capsys):
    adapter = tmp_path / "a.py"
    adapter.write_text("def evaluate(model, inputs):\n    raise NotImplementedError\n")
    assert main(["conformance", str(adapter), "--no-stored", "--random", "1", "--model", "shallow",
                 "--accept-unchecked", "grad_Wx"]) == 2
    assert "--accept-unchecked grad_Wx: not an output of the cases run" in capsys.readouterr().err


def test_an_output_returned_on_the_first_case_only_fails_the_cases_that_leave_it_out():
    """The shallow gradients returned at the paired initialisation only (f = 0 exactly there): every later
    eval case that has them fails, naming them and the case that returned them."""
    seen = []

    def evaluate(model, inputs):
        out = oracle(model, inputs)
        seen.append(1)
        return out if len(seen) == 1 else {k: v for k, v in out.items() if not k.startswith("grad_")}

    reports = run({"evaluate": evaluate}, ["shallow"], random=5, stored=False, kind="eval")
    first, *others = reports
    assert first.ok and first.case.id == "r0_shallow_0_eval_paired_mask"
    assert others and all(not r.ok and set(r.left_out) == {"grad_c", "grad_U", "grad_W"} for r in others)
    assert all(set(r.left_out.values()) == {first.case.id} for r in others)
    assert f"left out here, returned on another case: grad_c (case {first.case.id})" in others[0].summary()
    assert not reports.ok and f"{len(others)} failed" in reports.total()


def test_a_case_the_adapter_cannot_do_is_skipped_not_failed_for_what_it_leaves_out():
    seen = []

    def evaluate(model, inputs):
        if seen:
            raise NotImplementedError("the first case only")
        seen.append(1)
        return oracle(model, inputs)

    reports = run({"evaluate": evaluate}, ["shallow"], random=3, stored=False, kind="eval")
    assert len(reports) > 1 and [r.status for r in reports] == ["pass"] + ["skip"] * (len(reports) - 1)
    assert reports.ok, reports.total()


def test_the_verdict_names_the_models_whose_cases_were_all_skipped():
    def evaluate(model, inputs):
        if model != "shallow":
            raise NotImplementedError(f"no {model}")
        return oracle(model, inputs)

    def train(model, inputs):
        raise NotImplementedError("no training")

    reports = run({"evaluate": evaluate, "train": train}, random=5, stored=False)
    assert reports.ok, reports.total()
    assert reports.total().startswith("15 cases: 3 passed, 0 failed, 12 skipped [never checked: twostage (eval, "
                                      "train), shallow (train), indrnn (eval, train)]; "), reports.total()
    assert reports.total().endswith(": PASS")


# --- rows that say what is true --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def erf_case():
    (case,) = [c for c in random_cases(["shallow"]) if c.id == "r0_shallow_1_eval_T1_erf"]
    return case


def test_a_non_finite_row_says_so_and_nothing_about_bounds(erf_case):
    def evaluate(model, inputs):
        out = oracle(model, inputs)
        return {**out, "f": np.full_like(out["f"], np.nan)}

    report = check({"evaluate": evaluate}, erf_case)
    (row,) = [r for r in report.rows if r.name == "f"]
    n = erf_case.expected["f"].size
    assert not row.ok and (row.max_abs_err, row.max_rel_err, row.ratio) == (None, None, None)
    assert row.note == "non-finite: adapter holds NaN at index (0,)" + (f" ({n} non-finite entries)" if n > 1 else "")
    assert "bound" not in row.note and "err/" not in row.note


def test_an_error_within_the_guaranteed_bound_names_every_cause_it_is_consistent_with(erf_case):
    """A constant 2/√π of erf's derivative 2/√π exp(−s²) wrong by a relative 3e-14 (π with too few digits)
    scales σ' by 1 + 3e-14, and every gradient that goes through σ' (those of U and W) with it: beyond the
    calibrated tolerance, within the bound."""
    wrong_pi = 1.0 + 3e-14

    def evaluate(model, inputs):
        out = oracle(model, inputs)
        return {**out, "grad_U": out["grad_U"] * wrong_pi, "grad_W": out["grad_W"] * wrong_pi}

    report = check({"evaluate": evaluate}, erf_case)
    failing = [r for r in report.rows if not r.ok]
    assert failing, report
    for r in failing:
        assert r.note.endswith("within the guaranteed bound: consistent with a correct program that sums in another "
                               "order, and with a slightly wrong constant (an error of a few rounding units)"), r.note


def test_a_failing_scalar_gives_adapter_over_oracle(erf_case):
    """A loss summed over the n samples instead of averaged: the row gives the ratio n."""
    def evaluate(model, inputs):
        out = oracle(model, inputs)
        return {**out, "loss": out["loss"] * len(inputs["y"])}

    report = check({"evaluate": evaluate}, erf_case)
    (row,) = [r for r in report.rows if r.name == "loss"]
    count = len(erf_case.inputs["y"])
    assert count > 1
    assert not row.ok and f"adapter/oracle = {count:g}" in row.note, row.note
