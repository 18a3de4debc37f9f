"""The calibrated tolerances (ntpref.oracle.policies.calibrated): the float64 formula, where it keeps the running error
bound, and on random cases that it is never looser than the bound, that the NumPy backend passes it and that
a 1e-9 relative error fails it wherever float64 computes the array 100x more accurately; the float32 ones
scaled from it, never looser than the float32 envelope."""
import re
from pathlib import Path

import numpy as np
import pytest

from ntpref import exact
from ntpref.models import NAMES, SPECS
from ntpref.oracle.policies.calibrated import (AMPLIFIED, CALIBRATED_MULTIPLE, FLOOR, UNDETERMINED, amplified,
                                               calibrated_tolerance, undetermined,
                                              calibrated_tolerances)
from ntpref.oracle.cases import Case, random_cases, stored_cases
from ntpref.oracle.compare import compare_arrays
from ntpref.tolerance import Head
from ntpref.oracle.exactness import differences
from ntpref.oracle.kinds import compute, intermediates
from ntpref.oracle.manifest import calibrated_of, default_root, load_manifest
from ntpref.rounding import U

CASES = random_cases(None, n=4, seed=2)


def test_an_evaluation_gets_multiple_times_the_larger_of_the_error_and_the_floor():
    exact_q = np.array([[2.0, -1.0], [0.5, 0.0]])
    assert calibrated_tolerance(np.array([[1e-15, 0.0], [0.0, 0.0]]), exact_q, False).atol == CALIBRATED_MULTIPLE * 1e-15
    assert calibrated_tolerance(np.zeros((2, 2)), exact_q, False).atol == CALIBRATED_MULTIPLE * FLOOR * U * 2.0


def test_a_log_gets_the_line_above_the_running_maximum_of_its_rows():
    exact_q = np.array([1.0, 1.0, 1.0, 1.0])
    diff = np.array([1e-15, 3e-15, 2e-15, 5e-15])
    tol = calibrated_tolerance(diff, exact_q, True)
    line = tol.atol + tol.atol_per_step * np.arange(4)
    assert tol.atol == CALIBRATED_MULTIPLE * 1e-15
    assert np.all(line >= CALIBRATED_MULTIPLE * np.maximum.accumulate(diff) * (1 - 1e-12))
    assert line[1] == pytest.approx(CALIBRATED_MULTIPLE * 3e-15)         # the steepest rise from row 0 touches row 1


@pytest.fixture(scope="module")
def calibrated():
    out = []
    for case in CASES:
        values = exact.compute(case.kind, case.inputs, as_float=False)
        bound = case.tolerances("float64", "bound")
        out.append((case, values, bound, calibrated_tolerances(case.model, case.kind, case.expected, values, bound)))
    return out


def test_a_log_whose_bound_is_tighter_on_its_first_steps_keeps_it_there_as_a_head():
    """Stage 2 of the five-token run starts at W_kq = 0, so its norm log starts at an exact 0, whose bound
    (2e-321) lies below the calibrated line. The bound stays on that step as the tolerance's head, the
    calibrated line serves the rest, and a 1e-9 error of the whole log fails (the bound lets it through)."""
    (case,) = [c for c in stored_cases(["twostage"]) if c.id == "twostage_train_five_token"]
    values = exact.compute(case.kind, case.inputs, as_float=False)
    bound = case.tolerances("float64", "bound")
    tols = calibrated_tolerances(case.model, case.kind, case.expected, values, bound)
    tol = tols["stage2_norm"]
    assert tol.head == Head(1, **{k: getattr(bound["stage2_norm"], k) for k in ("rtol", "atol", "atol_max_scale",
                                                                                 "atol_per_step")})
    assert tol.reason.endswith("; the running error bound on steps 0..0")
    value = case.expected["stage2_norm"]
    mine = tol.element_bounds(value)
    theirs = bound["stage2_norm"].element_bounds(value)
    assert mine[0] == theirs[0] and np.all(mine <= theirs) and np.all(mine[1:] < theirs[1:] / 100)
    wrong = {**case.expected, "stage2_norm": value * (1.0 + 1e-9)}
    assert not compare_arrays(case.expected, wrong, tols, names=["stage2_norm"]).ok
    assert compare_arrays(case.expected, wrong, bound, names=["stage2_norm"]).ok


def test_solver_outputs_exact_zeros_and_uncomputed_arrays_keep_the_bound(calibrated):
    kept = 0
    for case, values, bound, tols in calibrated:
        for name, tol in tols.items():
            zero = name in values and not np.any(differences(case.expected[name], values[name])[1])
            if name in SPECS[case.model].diagnostics or name not in values or zero:
                assert tol == bound[name], (case.id, name)
                kept += 1
    assert kept > 0


def test_a_training_run_that_amplifies_rounding_keeps_the_bound():
    """A late-stage two-stage run whose stage-2 walk multiplies an error about 30-fold a step: the oracle misses
    its final W_kq by 3e4 floors, and the NumPy backend on the input with the embedding coordinates permuted
    (a correct program, other roundings) misses it by 3e5 times what 16 times that error would allow. Such a
    run keeps the running bound for every array, which that program meets."""
    from benchmarks.symmetries import FEATURES

    make = SPECS["twostage"].regimes["train_late_stage"]        # drawn from default_rng([1, 0, 13])
    kind, inputs, description = make(np.random.default_rng([1, NAMES.index("twostage"), 13]))
    case = Case("late_stage_1_13", "twostage", kind, "random", description,
                lambda: ({"model": np.array("twostage"), **inputs}, None))
    values = exact.compute(case.kind, case.inputs, as_float=False)
    bound = case.tolerances("float64", "bound")
    assert amplified(case.model, case.expected, values) == "W_kq"
    diff, Q = differences(case.expected["W_kq"], values["W_kq"])
    assert AMPLIFIED * FLOOR * U * np.abs(Q).max() < diff.max() < 1e2 * AMPLIFIED * FLOOR * U * np.abs(Q).max()
    assert calibrated_tolerances(case.model, case.kind, case.expected, values, bound) == \
        {name: bound[name] for name in case.expected}
    moved, undo = FEATURES.apply("twostage", case.inputs, np.random.default_rng(0).permutation)
    theirs = undo(compute("train", moved, "numpy"))
    assert compare_arrays(case.expected, theirs, bound, names=list(case.expected)).ok
    one_error = calibrated_tolerance(diff, Q, trajectory=False)
    assert not compare_arrays(case.expected, theirs, {"W_kq": one_error}, names=["W_kq"]).ok


def test_a_training_run_float64_does_not_determine_keeps_the_bound_though_the_oracle_is_exact():
    """A late-stage two-stage run whose oracle lands on the exact final W_kq (within a floor, so nothing looks
    amplified), while the NumPy backend on the input with the embedding coordinates permuted (a correct
    program, other roundings) ends 5e-3 of max|W_kq| away. The running bound's rerun finds W_kq determined to
    no better than 0.87 of its largest entry: the run keeps the running bound, which that program meets, and
    16 times the oracle's error would fail it."""
    from benchmarks.symmetries import FEATURES

    make = SPECS["twostage"].regimes["train_late_stage"]
    kind, inputs, description = make(np.random.default_rng([1, NAMES.index("twostage"), 45]))
    case = Case("late_stage_1_45", "twostage", kind, "random", description,
                lambda: ({"model": np.array("twostage"), **inputs}, None))
    values = exact.compute(case.kind, case.inputs, as_float=False)
    bound = case.tolerances("float64", "bound")
    assert amplified(case.model, case.expected, values) is None
    assert undetermined(case.model, case.expected, bound) == "W_kq"
    assert bound["W_kq"].atol > 0.1 * np.abs(case.expected["W_kq"]).max() > 1e5 * UNDETERMINED
    assert calibrated_tolerances(case.model, case.kind, case.expected, values, bound) == \
        {name: bound[name] for name in case.expected}
    moved, undo = FEATURES.apply("twostage", case.inputs, np.random.default_rng(0).permutation)
    theirs = undo(compute("train", moved, "numpy"))
    assert compare_arrays(case.expected, theirs, bound, names=list(case.expected)).ok
    diff, Q = differences(case.expected["W_kq"], values["W_kq"])
    assert not compare_arrays(case.expected, theirs, {"W_kq": calibrated_tolerance(diff, Q, trajectory=False)},
                              names=["W_kq"]).ok


def test_a_regular_training_run_is_determined(calibrated):
    """The stored and random regular training runs are far from UNDETERMINED: their calibrated tolerances stand."""
    trains = [(case, bound) for case, _, bound, _ in calibrated if case.kind == "train" and "late_stage" not in case.id]
    assert trains
    for case, bound in trains:
        assert undetermined(case.model, case.expected, bound) is None, case.id


def test_never_looser_than_the_bound_and_tighter_somewhere(calibrated):
    tighter = 0
    for case, _, bound, tols in calibrated:
        for name, value in case.expected.items():
            if value.dtype.kind != "f":
                continue
            mine = tols[name].element_bounds(value)
            theirs = bound[name].element_bounds(value)
            assert np.all(mine <= theirs), (case.id, name)
            tighter += bool(np.all(mine < theirs / 10))
    assert tighter > 20


def test_the_numpy_backend_passes(calibrated):
    for case, _, _, tols in calibrated:
        numpy = {**compute(case.kind, case.inputs, "numpy"), **intermediates(case.model, case.kind, case.inputs, "numpy")}
        report = compare_arrays(case.expected, numpy, tols, names=list(case.expected))
        assert report.ok, (case.id, [r.name for r in report.rows if not r.ok])


def test_a_relative_1e_9_fails_where_float64_is_100_times_more_accurate(calibrated):
    checked = 0
    for case, values, _, tols in calibrated:
        for name, value in case.expected.items():
            if name not in values or name in SPECS[case.model].diagnostics or not np.any(value):
                continue
            if differences(value, values[name])[0].max() > 1e-11 * np.max(np.abs(value)):
                continue
            sign = np.where(np.arange(value.size).reshape(value.shape) % 2 == 0, 1.0, -1.0)
            wrong = {**case.expected, name: value * (1.0 + 1e-9 * sign)}
            assert not compare_arrays(case.expected, wrong, tols, names=[name]).ok, (case.id, name)
            checked += 1
    assert checked > 30


def test_the_benchmark_slice_has_no_false_failures(capsys):
    from benchmarks import calibration

    assert calibration.main(["--random", "1", "--no-stored", "--numpy-only", "-q"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^\| float64 calibrated +\| +0 \| +1e-09 +\| 0 of \d+ ", out, re.M), out
    # without PyTorch the float32 members are the exact backend's loops in float32 (benchmarks/rounded.py)
    assert re.search(r"^\| float32 calibrated +\| +0 \| +0.0001 +\| 0 of \d+ ", out, re.M), out


def test_the_benchmark_judges_float32_members_in_float32():
    """A float32 member (the oracle's outputs rounded to float32) is judged under both float32 tolerances and
    passes; under the calibrated one 1e-4 fails every pair the member computes 30x more accurately, but where
    the report says the array is checked only coarsely (the rounding of a float32 program's inputs moves a
    cancelling gradient by that much, though not the rounding of the outputs)."""
    from benchmarks import calibration
    from benchmarks.sweeps import _recording

    member = ("rounded oracle", "float32", *_recording(Path(__file__).parent / "conformance_adapters" / "float32_outputs.py"))
    records = []
    for case in CASES[:6]:
        records += calibration.measure_case(case, [member])
    s = calibration.summary(records)
    for policy in ("bound", "calibrated"):
        assert s[("float32", policy)]["false"] == 0 and s[("float32", policy)]["slack"]
    assert s[("float32", "calibrated")]["accurate"] > 5 and not s[("float32", "calibrated")]["missed"]
    assert not s[("float64", "calibrated")]["slack"]     # no float64 member


def test_conformance_under_the_calibrated_policy_catches_what_the_bound_lets_through():
    from benchmarks.sweeps import perturbed
    from ntpref.oracle.conformance import check

    case = random_cases(["twostage"], n=1, seed=0)[0]          # general E: grad_W_kq cancels
    assert case.id == "r0_twostage_0_eval_general_E"
    wrong = perturbed(case, "grad_W_kq", 9)
    assert check(wrong, case, policy="bound").ok                # 1e-9 sits inside the running error bound
    report = check(wrong, case)                                 # the default: calibrated
    assert not report.ok and report.departure[0] == "grad_W_kq"
    row = next(r for r in report.rows if r.name == "grad_W_kq")
    under_bound = check(wrong, case, policy="bound").rows
    ratio = next(r.ratio for r in under_bound if r.name == "grad_W_kq")
    assert row.note.endswith(f"; err/bound {ratio:.1e}: within the guaranteed bound: consistent with a correct "
                             "program that sums in another order, and with a slightly wrong constant (an error of a "
                             "few rounding units)"), row.note
    assert all("err/bound" not in r.note for r in report.rows if r.ok)
    far = next(r for r in check(perturbed(case, "grad_W_kq", 3), case).rows if r.name == "grad_W_kq")
    assert far.note.endswith("beyond the guaranteed bound: no correct program makes this error"), far.note
    assert check(perturbed(case, "grad_W_kq", 15), case).ok     # below 64 u


def test_float32_calibrated_catches_what_the_envelope_lets_through_and_says_where_it_lies():
    from benchmarks.sweeps import perturbed
    from ntpref.oracle.conformance import check
    from ntpref.oracle.policies.envelope import ENVELOPE_MULTIPLE as ENVELOPE

    case = random_cases(["shallow"], n=1, seed=0)[0]            # paired init: the envelope is wide
    assert case.id == "r0_shallow_0_eval_paired_mask"
    wrong = perturbed(case, "grad_U", 4)
    assert check(wrong, case, precision="float32", policy="bound").ok
    report = check(wrong, case, precision="float32")
    assert not report.ok and report.departure[0] == "grad_U"
    ratio = next(r.ratio for r in check(wrong, case, precision="float32", policy="bound").rows if r.name == "grad_U")
    row = next(r for r in report.rows if r.name == "grad_U")
    assert row.note.endswith(f"; err/({ENVELOPE:g} envelopes) {ratio:.1e}: within the float32 envelope's tolerance: consistent with float32 rounding in another order, and with a slightly wrong constant"), row.note
    far = next(r for r in check(perturbed(case, "grad_U", 2), case, precision="float32").rows if r.name == "grad_U")
    assert far.note.endswith("beyond the float32 envelope's tolerance: no correct program makes this error"), far.note


def test_the_default_policy_is_calibrated_in_both_precisions():
    from ntpref.oracle.policies import check_policy

    assert check_policy("float64") == "calibrated" == check_policy("float32")
    assert check_policy("float64", "bound") == "bound" == check_policy("float32", "bound")
    case = CASES[1]
    assert case.tolerances() is case.tolerances("float64", "calibrated")
    assert case.tolerances("float32") is case.tolerances("float32", "calibrated")
    assert case.tolerances("float32") != case.tolerances("float32", "bound") != case.tolerances("float64", "bound")


def test_an_unknown_policy_or_precision_is_refused_in_one_line():
    from ntpref.errors import InputError

    with pytest.raises(InputError, match=r"^policy must be one of bound, calibrated, got 'sharp'$"):
        CASES[0].tolerances("float32", "sharp")
    with pytest.raises(InputError, match=r"^precision must be one of float64, float32, got 'float16'$"):
        CASES[0].tolerances("float16")


def test_every_stored_case_carries_calibrated_tolerances_and_the_cheap_ones_are_what_the_exact_backend_gives():
    """The manifest's calibrated tolerances (``ntpref certify --record``) cover every stored eval/train case,
    so conformance runs no exact backend for them; recomputed from an exact run of the evaluations they are
    the same numbers (the training runs' exact runs take minutes: the slow certification test compares them)."""
    manifest = load_manifest(default_root())["cases"]
    recomputed = 0
    for case in stored_cases():
        recorded = calibrated_of(manifest[case.id])
        assert recorded is not None, case.id
        assert recorded.keys() == case.expected.keys()
        assert any(recorded[n] != case.tolerances("float64", "bound")[n] for n in recorded), case.id
        if case.kind == "train":
            continue
        values = exact.compute(case.kind, case.inputs, as_float=False)
        assert calibrated_tolerances(case.model, case.kind, case.expected, values,
                                     case.tolerances("float64", "bound")) == recorded, case.id
        recomputed += 1
    assert recomputed == 9


def test_the_command_names_its_policy_in_the_header_and_the_json(tmp_path, capsys):
    import json

    from ntpref.cli import main

    adapter = str(Path(__file__).resolve().parent / "conformance_adapters" / "oracle_numpy.py")
    for args, header, policy in (([], "under the calibrated float64 tolerances", "calibrated"),
                                 (["--policy", "bound"], "under the float64 running error bound", "bound"),
                                 (["--precision", "float32"], "under the calibrated float32 tolerances", "calibrated"),
                                 (["--precision", "float32", "--policy", "bound"], "under the float32 envelope", "bound")):
        path = tmp_path / f"{policy}{len(args)}.json"
        rc = main(["conformance", adapter, "--model", "indrnn", "--random", "1", "--no-stored", *args,
                   "--json", str(path)])
        out = capsys.readouterr().out
        assert rc == 0 and header in out.splitlines()[0], out
        assert json.loads(path.read_text())["policy"] == policy


# --- float32 -----------------------------------------------------------------------------------------
def test_float32_scales_the_float64_calibration_and_adds_the_rounded_inputs():
    """Where float64 is calibrated, the float32 tolerance is CALIBRATED32_MULTIPLE times (2^29 times the float64
    rounding error, the float64 tolerance over CALIBRATED_MULTIPLE, plus the response to the inputs rounded to
    float32), a line along a per-step log; elsewhere the envelope. It is
    never looser than the envelope, and on the arrays it scales the median of its largest ratio to the
    envelope is below 1/5."""
    from ntpref.oracle.policies.calibrated32 import CALIBRATED32_MULTIPLE, TO_FLOAT32
    from ntpref.oracle.policies.envelope import U32, measured
    from ntpref.oracle.contract import model_of

    assert TO_FLOAT32 == 2.0 ** 29 == U32 / U
    ratios = []
    for case in CASES:
        rounded, _ = measured(model_of(case.inputs), case.kind, case.inputs, case.expected, case.backend)
        own, bound = case.tolerances("float64"), case.tolerances("float64", "bound")
        envelope, tols = case.tolerances("float32", "bound"), case.tolerances("float32")
        for name, value in case.expected.items():
            tol = tols[name]
            if value.dtype.kind != "f":
                continue
            mine = tol.element_bounds(value)
            theirs = envelope[name].element_bounds(value)
            assert np.all(mine <= theirs), (case.id, name)
            if not tol.reason.startswith("calibrated float32"):
                assert tol == envelope[name], (case.id, name)
                continue
            assert own[name] != bound[name], (case.id, name)
            trajectory = case.kind == "train" and name in SPECS[case.model].trajectories and value.shape[:1] > (1,)
            r = rounded[name].reshape(value.shape[0], -1).max(axis=1) if trajectory else rounded[name].reshape(1, -1).max(axis=1)
            e64 = own[name].atol / CALIBRATED_MULTIPLE
            assert tol.atol == pytest.approx(CALIBRATED32_MULTIPLE * (TO_FLOAT32 * e64 + r[0]), rel=1e-12)
            line = tol.atol + tol.atol_per_step * np.arange(r.size)
            assert np.all(line >= CALIBRATED32_MULTIPLE * (TO_FLOAT32 * e64 + np.maximum.accumulate(r)) * (1 - 1e-12))
            ratios.append(np.max(mine / theirs))
    assert len(ratios) > 30 and np.median(ratios) < 0.2, ratios


def test_float32_results_pass_the_calibrated_float32_tolerances():
    """The oracle's own outputs rounded to float32 pass every random case: one rounding of each output lies
    within CALIBRATED32_MULTIPLE · FLOOR · u32 max|Q| of the exact value's rounding."""
    from ntpref.oracle.conformance import check

    adapter = Path(__file__).resolve().parent / "conformance_adapters" / "float32_outputs.py"
    for case in CASES:
        report = check(adapter, case, precision="float32")
        assert report.ok, report
