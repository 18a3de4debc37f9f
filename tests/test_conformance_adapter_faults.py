"""Adapters that misbehave, under ``ntpref conformance`` and its Python API: one that raises (exit status 2
with the adapter's own traceback), exits or interrupts itself, or is interrupted by a real SIGINT; a case
skipped with the adapter's NotImplementedError, cases of a function the adapter lacks not run, and a run
with everything skipped no pass; unknown, missing, optional and never-returned outputs, and results that
are no dict of arrays.
"""
import signal
import sys

import numpy as np
import pytest

from ntpref.oracle.cases import random_cases
from ntpref.oracle.conformance import OPTIONAL, AdapterError, check, run

from conformance_support import ADAPTERS, conformance, float32_outputs, oracle


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
    report = check({"train": float32_outputs}, random_cases(["shallow"])[0])
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
