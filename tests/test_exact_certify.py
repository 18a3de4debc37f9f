"""``ntpref certify``: the oracle's outputs against the exact backend's (ntpref.exact, docs/exact.md), each
within its float64 bound.

1. Training runs: ``ntpref certify`` passes on slices of at most 2 updates per stage of every random and
   stored train case (every model and algorithm, ProjSGD, the two-stage naive, late-stage and
   attention-cancellation regimes, the projection active in every block): every logged step within its
   per-step float64 bound, every output certified; a cut stored run logs the first steps of the whole run.
2. ``ntpref certify``: its report and result records, a trajectory moved at one step fails naming the
   array and the step, an output the exact backend lacks is listed as not certified, exit statuses 0, 1
   and 2. The whole stored runs are the slow test (``python -m pytest -m slow tests/test_exact_certify.py``).
"""
import json
import re
import signal
import time

import mpmath
import numpy as np
import pytest

from ntpref import exact
from ntpref.cli import main
from ntpref.exact import arith, indrnn, shallow
from ntpref.models import SPECS
from ntpref.oracle import certify, contract, kinds

from exact_support import BY_ID, STORED_TRAIN, TRAIN_CASES


# --- 1. training runs: ntpref certify on short slices ---------------------------------------------------
#: Updates per stage of the train slices certified by the default suite (the whole runs: the slow test).
SLICE = 2


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


# --- 2. ntpref certify ---------------------------------------------------------------------------------
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
