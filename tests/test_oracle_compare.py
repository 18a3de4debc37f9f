"""ntpref.oracle.compare: tolerances, exact comparison, storage-independent verdicts, non-finite values,
missing arrays, ``ntpref compare`` exit codes and its --input (float64 policy) option."""
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.oracle.compare import compare_arrays, compare_one, load_tolerances
from ntpref.tolerance import EXACT, Tolerance
from ntpref.npzio import save_npz


def row(e, a, **tol):
    return compare_one("x", np.asarray(e), np.asarray(a), Tolerance(**tol) if tol else EXACT)


def test_tolerance_bound_is_atol_plus_scaled_max_plus_rtol():
    e = np.array([0.0, 10.0, -4.0])
    # bound per entry: 1e-3 + 1e-4*10 + 1e-2*|e| = [0.002, 0.102, 0.042]
    tol = dict(rtol=1e-2, atol=1e-3, atol_max_scale=1e-4)
    assert row(e, e + np.array([0.0019, 0.1019, -0.0419]), **tol).ok
    for k, step in enumerate([0.0021, 0.1021, 0.0421]):
        d = np.zeros(3)
        d[k] = step
        r = row(e, e + d, **tol)
        assert not r.ok and f"worst at ({k},)" in r.note
        assert r.max_abs_err == pytest.approx(step)


def test_errors_reported():
    r = row([2.0, 4.0], [2.0, 4.4], rtol=1.0)
    assert r.max_abs_err == pytest.approx(0.4) and r.max_rel_err == pytest.approx(0.1)
    r = row([0.0], [1e-3], rtol=1.0)
    assert r.max_rel_err is None and not r.ok          # relative to an expected 0: undefined, shown as "-"


def test_exact_compares_values_and_the_sign_of_zero():
    x = np.array([1.0, 2.5, 0.0])
    assert row(x, x.copy()).ok
    r = row(x, np.array([1.0, 2.5, -0.0]))
    assert not r.ok and r.note == "1 entries differ"
    assert not row([1.0], [np.nextafter(1.0, 2.0)]).ok
    assert row([1.0], [np.nextafter(1.0, 2.0)], rtol=1e-15).ok
    assert row([0.0], [-0.0], atol=1e-300).ok                    # any non-zero bound: values only


@pytest.mark.parametrize("tol", [{}, {"rtol": 1e-3}])
def test_nonfinite_values_always_fail_and_are_named(tol):
    r = row([1.0, np.nan], [1.0, np.nan], **tol)
    assert not r.ok and r.note == "non-finite: expected holds NaN at index (1,); actual holds NaN at index (1,)"
    r = row([[1.0, 2.0], [3.0, 4.0]], [[1.0, 2.0], [np.inf, -np.inf]], **tol)
    assert not r.ok and r.note == "non-finite: actual holds inf at index (1, 0) (2 non-finite entries)"
    r = row(np.array(-np.inf), np.array(-np.inf), **tol)
    assert not r.ok and r.note == "non-finite: expected holds -inf at index (); actual holds -inf at index ()"
    assert (r.max_abs_err, r.max_rel_err, r.ratio) == (None, None, None)     # no error, no err/tol: only where


def test_per_step_bound_grows_along_axis_0():
    e = np.ones((4, 2))
    # bound at row t: 1e-6 + 1e-6 t
    for t, ok in ((0, False), (1, False), (2, False), (3, True)):
        a = e.copy()
        a[t, 1] += 3.5e-6
        assert row(e, a, atol=1e-6, atol_per_step=1e-6).ok is ok, t
    assert row(np.array(1.0), np.array(1.0 + 1e-6), atol=1e-6, atol_per_step=1.0).ok   # 0-d: t = 0
    assert not row(np.array(1.0), np.array(1.0 + 2e-6), atol=1e-6, atol_per_step=1.0).ok
    assert Tolerance(atol=3e-15, atol_per_step=2e-17, rtol=1e-13).atol_per_step == 2e-17


def test_head_tolerance_on_leading_rows():
    e = np.ones(10)
    a = e.copy()
    a[7] += 1e-6
    tol = dict(rtol=1e-5, head={"n": 5, "rtol": 1e-9})
    assert row(e, a, **tol).ok
    a[3] += 1e-6                                                 # inside the head: only 1e-9 allowed
    assert not row(e, a, **tol).ok


@pytest.mark.parametrize("heads", [(None, None), (3, None), (None, 6), (3, 6)])
def test_a_tolerance_sum_bounds_every_element_by_at_least_the_sum_of_the_two(heads):
    rng = np.random.default_rng(5)
    e = rng.standard_normal((10, 3))
    def random_tol(n):
        bounds = lambda: dict(zip(("rtol", "atol", "atol_max_scale", "atol_per_step"), rng.uniform(0, 1, 4)))
        return Tolerance(**bounds(), head=None if n is None else {"n": n, **bounds()})
    a, b = random_tol(heads[0]), random_tol(heads[1])
    total = a.plus(b, "both")
    assert total.reason == "both"
    summed, bound = a.element_bounds(e) + b.element_bounds(e), total.element_bounds(e)
    assert np.all(bound >= summed * (1 - 1e-15))
    n = max([h for h in heads if h is not None], default=0)
    np.testing.assert_allclose(bound[n:], summed[n:], rtol=1e-15)   # exact past the heads


def test_non_float_arrays_compare_exactly():
    assert row([1, 2], [1, 2], rtol=1.0).ok
    assert not row([1, 2], [1, 3], rtol=1.0).ok                  # ints ignore tolerances
    assert row(np.array("twostage"), np.array("twostage")).ok
    assert row(np.array("ab", dtype="<U2"), np.array("ab", dtype="<U5")).ok
    assert not row(np.array("ab"), np.array("ac")).ok
    assert not row([True], [False]).ok


def test_integer_errors_are_the_exact_differences_of_the_integers():
    r = row(np.array([2**62, 7]), np.array([2**62 + 1, 7]))         # float64 copies of both are 2**62
    assert (r.ok, r.max_abs_err, r.max_rel_err, r.note) == (False, 1.0, 2.0**-62, "1 entries differ")
    r = row(np.array([2**63 + 5], dtype=np.uint64), np.array([-3]))  # int64 - uint64 would wrap around
    assert (r.ok, r.max_abs_err, r.max_rel_err) == (False, float(2**63 + 8), (2**63 + 8) / (2**63 + 5))
    r = row(np.array([3, -2**53 - 1]), np.array([5, 2**53 + 1]))     # one entry each side of 2^53
    assert (r.max_abs_err, r.max_rel_err) == (float(2**54 + 2), 2.0) and r.note == "2 entries differ"


def test_strings_compare_by_their_text_whether_stored_as_text_or_utf8_bytes():
    assert row(np.array("max_steps"), np.array(b"max_steps")).ok
    assert row(np.array(["a", "bé"]), np.array(["a".encode(), "bé".encode()])).ok
    assert row(np.array([b"ab", b"c"]), np.array(["ab", "c"], dtype="<U7")).ok
    r = row(np.array(["ab", "c"]), np.array([b"ab", b"d"]))
    assert (r.ok, r.note) == (False, "1 entries differ")
    r = row(np.array("ab"), np.array(b"a\xff"))
    assert (r.ok, r.note) == (False, "actual holds bytes that are not UTF-8 text (invalid start byte at byte 1)")


def test_structured_and_raw_arrays_compare_exactly_against_their_own_dtype_only():
    fields = np.zeros(2, dtype=[("a", "<f8"), ("n", "<i4")])
    assert row(fields, fields.copy()).ok
    changed = fields.copy()
    changed["n"][1] = 1
    assert (row(fields, changed).ok, row(fields, changed).note) == (False, "1 entries differ")
    r = row(fields, np.zeros(2, dtype=[("b", "<f8"), ("n", "<i4")]))
    assert (r.ok, r.note) == (False, "actual is [('b', '<f8'), ('n', '<i4')], expected [('a', '<f8'), ('n', '<i4')]: "
                                     "values of different dtypes")
    assert row(np.zeros(2, dtype="V4"), np.zeros(2, dtype="V4")).ok
    r = row(np.zeros(2, dtype="V4"), np.zeros(2, dtype="V8"))
    assert (r.ok, r.note) == (False, "actual is |V8, expected |V4: values of different dtypes")


def test_storage_never_decides_a_verdict():
    x = np.array([1.5, -2.25, 0.0])
    assert row(x, x.astype(">f8")).ok                              # big-endian, same values
    assert row(x.astype(">f8"), x, rtol=1e-12).ok
    assert row(np.arange(3), np.arange(3, dtype=">i4")).ok         # integer widths and byte order
    assert row(np.arange(3, dtype=np.uint16), np.arange(3)).ok
    assert row(x, x.astype(np.longdouble)).ok                      # more precise actual: by value
    assert not row(x, x.astype(np.longdouble) + np.longdouble(2.0) ** -70).ok
    assert row(x, x.astype(np.longdouble) + np.longdouble(2.0) ** -70, rtol=1e-15, atol=1e-20).ok


def test_value_category_and_precision_mismatch_fail():
    r = row(np.zeros(3), np.zeros(3, dtype=np.float32), rtol=1.0)
    assert not r.ok and r.note == "actual is float32, less precise than expected float64"
    r = row(np.zeros(3), np.zeros(3, dtype=np.int64), rtol=1.0)
    assert not r.ok and r.note == "actual is integer (int64), expected floating-point (float64)"
    r = row(np.zeros(3, dtype=np.longdouble), np.zeros(3))
    assert not r.ok and "actual is float64, less precise than expected" in r.note
    r = row(np.zeros(3), np.zeros(4), rtol=1.0)
    assert not r.ok and r.note == "shape [4] != expected [3]"


def test_missing_arrays_named_per_side():
    rep = compare_arrays({"a": np.ones(2), "b": np.ones(1)}, {"a": np.ones(2), "c": np.ones(1)})
    assert not rep.ok and [r.name for r in rep.rows] == ["a"]
    assert {(m.name, m.side) for m in rep.missing} == {("b", "expected"), ("c", "actual")}
    text = rep.table()
    assert "missing from actual (only in expected): b" in text
    assert "missing from expected (only in actual): c" in text
    assert set(rep.failures) == {"b", "c"}


def test_per_array_tolerances_and_default():
    e = {"a": np.ones(3), "b": np.ones(3)}
    a = {"a": np.ones(3) + 1e-8, "b": np.ones(3) + 1e-8}
    rep = compare_arrays(e, a, {"a": Tolerance(rtol=1e-7)})
    assert [r.ok for r in rep.rows] == [True, False]           # b falls back to exact
    assert compare_arrays(e, a, {"a": Tolerance(rtol=1e-7)}, default=Tolerance(atol=1e-7)).ok


@pytest.mark.parametrize("spec,message", [
    ({"rtol": -1}, "'rtol' must be a finite number >= 0, got -1"),
    ({"rtol": float("nan")}, "'rtol' must be a finite number >= 0, got nan"),
    ({"rtl": 1e-3}, "unknown tolerance key 'rtl'; allowed: rtol, atol, atol_max_scale, atol_per_step, reason, head"),
    ({"rtol": "1e-3"}, "'rtol' must be a finite number >= 0, got '1e-3'"),
    ({"head": {"n": -1}}, "head 'n' must be an integer >= 0, got -1"),
    ({"head": {"n": 2, "x": 1}}, "'head' must be an object with keys n, rtol, atol, atol_max_scale, atol_per_step"),
    ([1e-3], "a tolerance must be an object with keys rtol, atol, atol_max_scale, atol_per_step, reason, head, "
             "got [0.001]"),
], ids=["negative", "nan", "unknown-key", "string", "negative-head-n", "unknown-head-key", "not-a-mapping"])
def test_bad_tolerance_is_an_input_error_naming_it(spec, message):
    with pytest.raises(InputError, match="^" + re.escape(f"t: {message}") + "$"):
        Tolerance.from_json("t", spec)


# --- command line -------------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    e = {"model": np.array("shallow"), "f": np.linspace(-1.0, 1.0, 5), "ids": np.arange(3)}
    save_npz(tmp_path / "e.npz", e)
    return tmp_path, e


def _compare(d, actual: dict, *options) -> int:
    save_npz(d / "actual.npz", actual)
    return main(["compare", str(d / "e.npz"), str(d / "actual.npz"), *options])


def test_cli_identical_files_exit_0_with_one_exact_row_per_array(files, capsys):
    d, e = files
    assert _compare(d, e, "--rtol", "0", "--atol", "0") == 0
    out = capsys.readouterr().out
    for name, shape in (("model", r"\[\]"), ("f", r"\[5\]"), ("ids", r"\[3\]")):
        assert re.search(rf"\n{name} +{shape} .* exact +- +ok\n", out), name
    assert out.endswith("ok: 3 arrays agree\n")


def test_cli_default_rtol_accepts_1e_11(files):
    d, e = files
    assert _compare(d, {**e, "f": e["f"] * (1 + 1e-11)}) == 0          # default rtol 1e-10


def test_cli_tighter_rtol_fails_exit_1(files, capsys):
    d, e = files
    assert _compare(d, {**e, "f": e["f"] * (1 + 1e-11)}, "--rtol", "1e-12") == 1
    assert capsys.readouterr().out.endswith("FAIL: 2/3 arrays agree; failing: f\n")


def test_cli_missing_array_fails_exit_1(files, capsys):
    d, e = files
    assert _compare(d, {k: v for k, v in e.items() if k != "ids"}) == 1
    assert "missing from actual (only in expected): ids" in capsys.readouterr().out


def test_cli_float32_against_float64_fails_exit_1(files, capsys):
    d, e = files
    assert _compare(d, {**e, "f": e["f"].astype(np.float32)}, "--rtol", "1") == 1
    assert "FAIL (actual is float32, less precise than expected float64)" in capsys.readouterr().out


def test_cli_shape_mismatch_fails_exit_1(files, capsys):
    d, e = files
    assert _compare(d, {**e, "f": e["f"][:4]}, "--rtol", "1") == 1
    assert "FAIL (shape [4] != expected [5])" in capsys.readouterr().out


def test_cli_tolerance_file(files, capsys):
    d, e = files
    save_npz(d / "off.npz", {**e, "f": e["f"] + 1e-6})
    (d / "tol.json").write_text(json.dumps({"f": {"rtol": 0, "atol": 2e-6}}))
    assert main(["compare", str(d / "e.npz"), str(d / "off.npz"), "--tolerances", str(d / "tol.json")]) == 0
    (d / "tol.json").write_text(json.dumps({"default": {"atol": 1e-7}}))
    assert main(["compare", str(d / "e.npz"), str(d / "off.npz"), "--tolerances", str(d / "tol.json")]) == 1
    # the case.json written by `ntpref export` is accepted too
    (d / "case.json").write_text(json.dumps({"case": "x", "tolerances": {"f": {"atol": 2e-6, "reason": "r"}}}))
    assert load_tolerances(d / "case.json")[0]["f"].atol == 2e-6
    assert main(["compare", str(d / "e.npz"), str(d / "off.npz"), "--tolerances", str(d / "case.json")]) == 0


def test_cli_bad_input_is_exit_2(files, capsys):
    d, e = files
    assert main(["compare", str(d / "e.npz"), str(d / "nope.npz")]) == 2
    assert "nope.npz" in capsys.readouterr().err
    (d / "bad.json").write_text("{not json")
    assert main(["compare", str(d / "e.npz"), str(d / "e.npz"), "--tolerances", str(d / "bad.json")]) == 2
    (d / "neg.json").write_text(json.dumps({"f": {"rtol": -1}}))
    assert main(["compare", str(d / "e.npz"), str(d / "e.npz"), "--tolerances", str(d / "neg.json")]) == 2
    assert "'f'" in capsys.readouterr().err
    (d / "ok.json").write_text("{}")
    assert main(["compare", str(d / "e.npz"), str(d / "e.npz"), "--tolerances", str(d / "ok.json"),
                 "--rtol", "1e-3"]) == 2
    (d / "junk.npz").write_bytes(b"not a zip file")
    assert main(["compare", str(d / "junk.npz"), str(d / "e.npz")]) == 2


def test_cli_storage_details_and_nonfinite(files, capsys):
    d, e = files
    save_npz(d / "big.npz", {k: v.astype(v.dtype.newbyteorder(">")) if v.dtype.kind in "fi" else v
                             for k, v in e.items()})
    assert main(["compare", str(d / "e.npz"), str(d / "big.npz"), "--rtol", "0", "--atol", "0"]) == 0
    save_npz(d / "nan.npz", {**e, "f": np.where(np.arange(5) == 2, np.nan, e["f"])})
    assert main(["compare", str(d / "nan.npz"), str(d / "nan.npz"), "--rtol", "1"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"FAIL \(non-finite: expected holds NaN at index \(2,\); actual holds NaN at index \(2,\)\)", out)
    save_npz(d / "f32.npz", {**e, "f": e["f"].astype(np.float32)})
    assert main(["compare", str(d / "e.npz"), str(d / "f32.npz"), "--input", str(d / "e.npz")]) == 2
    assert main(["compare", str(d / "e.npz"), str(d / "f32.npz"), "--rtol", "1"]) == 1
    assert "actual is float32, less precise than expected float64" in capsys.readouterr().out


def test_cli_arrays_of_no_common_dtype_are_a_fail_row_and_exit_1(files, capsys):
    d, e = files
    actual = {**e, "model": np.array(b"shallow"), "ids": np.array([0, 1, 2**62 + 1]),
              "rec": np.zeros(2, dtype=[("b", "<f8")]), "raw": np.zeros(3, dtype="V8")}
    save_npz(d / "e.npz", {**e, "ids": np.array([0, 1, 2**62]), "rec": np.zeros(2, dtype=[("a", "<f8")]),
                           "raw": np.zeros(3, dtype="V4")})
    assert _compare(d, actual) == 1
    out = capsys.readouterr().out
    assert re.search(r"\nmodel +\[\] .* exact +- +ok\n", out)                  # bytes and text: the same text
    assert re.search(r"\nids +\[3\] +1\.000e\+00 .* FAIL \(1 entries differ\)\n", out)
    assert "FAIL (actual is [('b', '<f8')], expected [('a', '<f8')]: values of different dtypes)" in out
    assert "FAIL (actual is |V8, expected |V4: values of different dtypes)" in out
    assert "\nFAIL: 2/5 arrays agree; failing: ids, rec, raw\n" in out


def test_cli_longdouble_exact_is_a_verdict(files, capsys):
    d, e = files
    save_npz(d / "ld.npz", {**e, "f": e["f"].astype(np.longdouble)})
    assert main(["compare", str(d / "ld.npz"), str(d / "ld.npz"), "--rtol", "0", "--atol", "0"]) == 0
    assert main(["compare", str(d / "e.npz"), str(d / "ld.npz"), "--rtol", "0", "--atol", "0"]) == 0
    save_npz(d / "ld2.npz", {**e, "f": e["f"].astype(np.longdouble) + np.longdouble(2.0) ** -70})
    assert main(["compare", str(d / "ld.npz"), str(d / "ld2.npz"), "--rtol", "0", "--atol", "0"]) == 1
    assert main(["compare", str(d / "ld.npz"), str(d / "e.npz"), "--rtol", "0", "--atol", "0"]) == 1
    out = capsys.readouterr().out
    assert re.search(r"f .* FAIL \(1 entries differ\)", out)
    assert re.search(r"FAIL \(actual is float64, less precise than expected float(96|128)\)", out)


@pytest.fixture
def paired_case(tmp_path):
    """The stored paired-initialisation case, and an f summed over heads in plain index order
    (f ≈ 1e-16 where the oracle's pair order gives exactly 0)."""
    from ntpref.npzio import load_npz
    from ntpref.oracle.kinds import intermediates
    from ntpref.oracle.reference import export

    export(None, "shallow_eval_paired_init", tmp_path)
    inputs, expected = load_npz(tmp_path / "input.npz"), load_npz(tmp_path / "expected.npz")
    h = inputs["c"] * np.tanh(intermediates("shallow", "eval", inputs)["head_s"])
    f = np.zeros(h.shape[0])
    for i in range(h.shape[1]):
        f = f + h[:, i]
    save_npz(tmp_path / "plain.npz", {**expected, "f": f / np.sqrt(h.shape[1])})
    assert not np.any(expected["f"]) and np.any(f)
    return tmp_path, expected


def test_cli_input_uses_the_float64_policy(paired_case, capsys):
    d, expected = paired_case
    args = ["compare", str(d / "expected.npz"), str(d / "plain.npz")]
    assert main(args) == 1                                                 # rtol 1e-10 of 0 is 0
    out = capsys.readouterr().out
    assert re.search(r"\nf +\[12\] .* inf .* FAIL", out) and "--input INPUT.npz uses the float64 policy" in out
    assert main(args + ["--input", str(d / "input.npz")]) == 0
    out = capsys.readouterr().out
    assert f"tolerances: float64 policy for {d / 'input.npz'}" in out and re.search(r"\nf +\[12\] .* ok", out)
    assert "its bounds from a run on numpy (auto: NumPy run estimated at" in out     # a small input
    assert main(args + ["--tolerances", str(d / "case.json")]) == 0          # export writes the same policy
    save_npz(d / "off.npz", {**expected, "grad_W": expected["grad_W"] * (1 + 1e-6)})
    assert main(["compare", str(d / "expected.npz"), str(d / "off.npz"), "--input", str(d / "input.npz")]) == 1
    assert re.search(r"\ngrad_W +\[8, 4, 4\] .* FAIL", capsys.readouterr().out)


def test_cli_input_backend_is_named_and_sizes_the_same_bounds(paired_case, capsys):
    """--backend chooses what runs the input of --input; the two backends' bounds agree to rounding (they
    are sized from magnitudes of the same quantities), and --backend without --input is refused."""
    from ntpref.oracle.compare import policy_tolerances
    from ntpref.tolerance import BOUND_KEYS

    d, expected = paired_case
    args = ["compare", str(d / "expected.npz"), str(d / "plain.npz"), "--input", str(d / "input.npz")]
    assert main(args + ["--backend", "numba"]) == 0
    assert "its bounds from a run on numba\n" in capsys.readouterr().out
    by = {b: policy_tolerances(d / "input.npz", expected, b) for b in ("numba", "numpy")}
    assert by["numba"][1] == "numba" and by["numpy"][1] == "numpy"
    assert set(by["numba"][0]) == set(by["numpy"][0]) == set(expected)
    for name, tol in by["numba"][0].items():
        for key in BOUND_KEYS:
            assert getattr(by["numpy"][0][name], key) == pytest.approx(getattr(tol, key), rel=1e-12, abs=0), (name, key)
    assert main(["compare", str(d / "expected.npz"), str(d / "plain.npz"), "--backend", "numpy"]) == 2
    assert "give it only with --input" in capsys.readouterr().err


def test_cli_input_runs_the_input_on_the_backend_it_names(paired_case, capsys, monkeypatch):
    from ntpref.oracle import compare

    ran = []
    bound = compare.bound_tolerances
    monkeypatch.setattr(compare, "bound_tolerances",
                        lambda *a, backend: ran.append(backend) or bound(*a, backend=backend))
    d, _ = paired_case
    args = ["compare", str(d / "expected.npz"), str(d / "plain.npz"), "--input", str(d / "input.npz")]
    for given, expect in ((None, "numpy"), ("numba", "numba"), ("numpy", "numpy")):
        assert main(args + (["--backend", given] if given else [])) == 0
        assert ran[-1] == expect and f"from a run on {expect}" in capsys.readouterr().out


def test_cli_input_for_a_training_run(tmp_path, capsys):
    from ntpref.oracle.reference import export

    export(None, "indrnn_train", tmp_path)
    assert main(["train", str(tmp_path / "input.npz"), "-o", str(tmp_path / "mine.npz"), "-q",
                 "--backend", "numpy"]) == 0
    assert main(["compare", str(tmp_path / "expected.npz"), str(tmp_path / "mine.npz"),
                 "--input", str(tmp_path / "input.npz")]) == 0
    assert re.search(r"\ntrain_loss +\[150\] +.* rtol \S+ atol \S+ \+\S+·t .* ok", capsys.readouterr().out)


def test_cli_input_errors_name_the_file(paired_case, capsys):
    d, expected = paired_case
    inputs = dict(np.load(d / "input.npz"))
    base = ["compare", str(d / "expected.npz"), str(d / "plain.npz")]
    save_npz(d / "nomodel.npz", {k: v for k, v in inputs.items() if k != "model"})
    assert main(base + ["--input", str(d / "nomodel.npz")]) == 2
    assert re.search(r"nomodel\.npz: missing array 'model'", capsys.readouterr().err)
    save_npz(d / "badshape.npz", {**inputs, "c": inputs["c"][:3]})
    assert main(base + ["--input", str(d / "badshape.npz")]) == 2
    assert re.search(r"badshape\.npz: .*array 'c'", capsys.readouterr().err)
    save_npz(d / "extra.npz", {**expected, "logits": np.zeros(2)})
    assert main(["compare", str(d / "extra.npz"), str(d / "plain.npz"), "--input", str(d / "input.npz")]) == 2
    assert re.search(r"input\.npz: array 'logits': not an output of a shallow eval run", capsys.readouterr().err)
    assert main(base + ["--input", str(d / "input.npz"), "--rtol", "1e-3"]) == 2
    assert "give one of --tolerances, --input or --rtol/--atol/--atol-max-scale" in capsys.readouterr().err


@pytest.mark.parametrize("text, message", [
    ("[" * 100000 + "]" * 100000, r"not a JSON tolerance file \(nested deeper than 64 levels\)"),
    ('{"f": {"atol": ' + "9" * 400 + "}}", r"not a JSON tolerance file \(an integer of 400 digits \(at most 30\)\)"),
    ('{"f": {"atol": 1e-3}, "f": {"atol": 1}}', r"not a JSON tolerance file \(key 'f' appears 2 times"),
    ('{"f": {"atol": 1e-3, "atol": 2e-3}}', r"key 'atol' appears 2 times"),
    ("\xff", r"not a JSON tolerance file \(not UTF-8 text"),
])
def test_hostile_tolerance_files_are_one_line_errors(tmp_path, capsys, text, message):
    save_npz(tmp_path / "e.npz", {"f": np.ones(2)})
    (tmp_path / "t.json").write_bytes(text.encode("latin-1") if text == "\xff" else text.encode())
    assert main(["compare", str(tmp_path / "e.npz"), str(tmp_path / "e.npz"), "--tolerances", str(tmp_path / "t.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(message, err), err


def test_tolerance_file_must_be_a_bounded_regular_file(tmp_path, capsys):
    save_npz(tmp_path / "e.npz", {"f": np.ones(2)})
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for path, message in ((fifo, "is a FIFO, not a JSON tolerance file"),
                          (Path("/dev/zero"), "is a character device, not a JSON tolerance file")):
        assert main(["compare", str(tmp_path / "e.npz"), str(tmp_path / "e.npz"), "--tolerances", str(path)]) == 2
        assert capsys.readouterr().err == f"ntpref: error: {path}: {message}\n"
    from ntpref import jsonio
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (jsonio.MAX_JSON_BYTES + 1))
    with pytest.raises(InputError, match="larger than 16 MiB, not a JSON tolerance file"):
        load_tolerances(big)


def test_tolerance_for_an_array_the_files_do_not_hold_is_refused(tmp_path, capsys):
    save_npz(tmp_path / "e.npz", {"grad_W": np.ones(2), "f": np.ones(3)})
    (tmp_path / "t.json").write_text(json.dumps({"grad_w": {"atol": 1.0}}))
    assert main(["compare", str(tmp_path / "e.npz"), str(tmp_path / "e.npz"), "--tolerances", str(tmp_path / "t.json")]) == 2
    assert capsys.readouterr().err == (f"ntpref: error: {tmp_path / 't.json'}: a tolerance for array 'grad_w', which "
                                       "neither result file holds (did you mean 'grad_W'?)\n")


def test_relative_error_leaves_out_entries_expected_to_be_zero():
    row = compare_one("g", np.array([0.0, 2.0, 0.0]), np.array([1e-17, 2.0 + 2.0 ** -51, 0.0]), Tolerance(atol=1e-15))
    assert row.ok and row.max_abs_err == 2.0 ** -51 and row.max_rel_err == 2.0 ** -52   # not inf from the 0 entry
    assert compare_one("k", np.array([0, 3]), np.array([1, 3]), EXACT).max_rel_err == 0.0


def _chunk_cases(rng):
    """(expected, actual, tolerance) pairs whose verdicts draw on every part of a chunked comparison: the
    worst entry, the first non-finite entry of each side, counts, head and per-step bounds, exact floats
    and signed zeros, integers beyond 2^53."""
    clean = rng.standard_normal((300, 7, 5))
    e = clean.copy()
    a = e + 1e-9 * rng.standard_normal(e.shape)
    a[250, 3, 1] += 1e-3                      # the worst entry, in a late chunk
    a[10, 0, 0] += 1e-5
    a[200, 6, 4], a[290, 1, 1], e[120, 2, 2] = np.nan, -np.inf, np.inf
    bounds = Tolerance(rtol=1e-8, atol=1e-9, atol_per_step=1e-10, atol_max_scale=1e-12,
                       head={"n": 20, "rtol": 1e-12, "atol": 0.0, "atol_max_scale": 0.0, "atol_per_step": 0.0})
    zeros = np.zeros(5000)
    signed = zeros.copy()
    signed[4321] = -0.0
    big = np.arange(2 ** 60, 2 ** 60 + 3000, dtype=np.int64)
    moved = big.copy()
    moved[2999] += 1                           # equal as float64, not as integers
    return [(e, a, bounds), (e, e.copy(), bounds), (zeros, signed, EXACT), (big, moved, EXACT),
            (clean.astype(np.float32), clean, Tolerance(rtol=1e-6)), (np.array(3.0), np.array(3.5), Tolerance(atol=0.1))]


def test_a_comparison_in_chunks_reports_what_one_pass_does(monkeypatch, rng):
    """Every field of every row (errors, ratio, counts, the worst and the first non-finite index) is the
    same whatever the chunk size, down to chunks of 7 entries."""
    from ntpref.oracle import compare

    cases = _chunk_cases(rng)
    whole = [compare_one("x", *case) for case in cases]
    assert [r.ok for r in whole] == [False, False, False, False, True, False]
    assert "expected holds inf at index (120, 2, 2)" in whole[0].note and "(250, 3, 1)" not in whole[0].note
    assert whole[1].note == "non-finite: expected holds inf at index (120, 2, 2); actual holds inf at index (120, 2, 2)"
    assert whole[2].note == "1 entries differ" and whole[3].note == "1 entries differ"
    e, a, bounds = np.nan_to_num(cases[0][0], posinf=0.0), np.nan_to_num(cases[0][1], nan=0.0, neginf=0.0), cases[0][2]
    finite = compare_one("x", e, a, bounds)
    t = np.arange(300)[:, None, None]
    allowed = np.where(t < 20, 1e-12 * np.abs(e), 1e-9 + 1e-10 * t + 1e-12 * np.abs(e).max() + 1e-8 * np.abs(e))
    outside = ~(np.abs(a - e) <= allowed)                            # the bound as docs/contract.md states it
    worst = np.unravel_index(np.argmax(np.where(outside, np.abs(a - e), -1)), e.shape)
    assert finite.note == f"{outside.sum()} entries outside; worst at {tuple(int(i) for i in worst)}", finite
    assert finite.ratio == pytest.approx(np.max(np.abs(a - e) / allowed), rel=1e-15)
    for size in (7, 4096):
        monkeypatch.setattr(compare, "CHUNK", size)
        assert [compare_one("x", *case) for case in cases] == whole
        assert compare_one("x", e, a, bounds) == finite


def test_a_comparison_takes_memory_of_one_chunk_not_of_the_arrays(monkeypatch):
    """Two arrays of 2^21 entries (16 MiB each) compared in chunks of 2^14 entries: the comparison allocates
    about 1 MiB, not the several copies of the arrays a whole-array pass would."""
    import tracemalloc

    from ntpref.oracle import compare

    monkeypatch.setattr(compare, "CHUNK", 1 << 14)
    e = np.linspace(-1.0, 1.0, 1 << 21)
    for expected, a, tol in ((e, e + 1e-12, Tolerance(rtol=1e-9, atol_per_step=1e-15)), (e, e.copy(), EXACT),
                             (e.astype(np.float32), e, Tolerance(rtol=1e-6))):
        tracemalloc.start()
        row = compare_one("x", expected, a, tol)
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert row.ok and peak < 2 ** 21, (row, peak)


@pytest.mark.parametrize("make, text", [
    (lambda e: -e, "actual = −expected (a sign)"),
    (lambda e: e / np.sqrt(8.0), "actual = 0.353553 × expected = expected / 2.82843 (a scale)"),
    (lambda e: 3.0 * e, "actual = 3 × expected (a scale)"),
    (lambda e: np.swapaxes(e, -1, -2), "actual = expected with its last two axes swapped (a transpose)"),
    (np.zeros_like, "actual is 0 everywhere"),
])
def test_a_failing_array_names_the_shape_of_its_error(make, text, rng):
    e = rng.standard_normal((3, 4, 4))
    r = compare_one("g", e, make(e), Tolerance(rtol=1e-10, atol_max_scale=1e-12))
    assert not r.ok and r.note.endswith(f"; {text}"), r.note


def test_an_error_without_a_shape_names_none(rng):
    """Noise, a scale on part of the array and a symmetric array (its own transpose) get no shape; one number
    (a multiple of any other) gets the ratio, unless it is the sign."""
    e = rng.standard_normal((3, 4, 4))
    tol = Tolerance(rtol=1e-10, atol_max_scale=1e-12)
    half = e.copy()
    half[0] *= 2.0
    symmetric = e + np.swapaxes(e, -1, -2)
    for expected, actual in ((e, e + 1e-3 * rng.standard_normal(e.shape)), (e, half), (symmetric, symmetric + 1e-3)):
        r = compare_one("g", expected, actual, tol)
        assert not r.ok and r.note.count(";") == 1, r.note          # "N entries outside; worst at (...)"
    assert compare_one("g", np.array(2.0), np.array(-2.0), tol).note.endswith("; actual = −expected (a sign)")
    assert compare_one("g", np.array(2.0), np.array(3.0), tol).note.endswith("; actual/expected = 1.5")
    assert compare_one("g", np.array([2.0]), np.array([24.0]), tol).note.endswith("; actual/expected = 12")
