"""ntpref.oracle.compare: tolerances, exact (bitwise) comparison, missing arrays, ``ntpref compare`` exit codes."""
import json

import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.oracle.compare import (EXACT, check_tolerance, compare_arrays, compare_one, load_tolerances,
                                   tolerance)
from ntpref.oracle.npzio import save_npz


def row(e, a, **tol):
    return compare_one("x", np.asarray(e), np.asarray(a), tolerance(**tol) if tol else EXACT)


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
    assert r.max_rel_err == np.inf and not r.ok


def test_exact_compares_bits():
    x = np.array([1.0, np.nan, 0.0])
    assert row(x, x.copy()).ok                                   # NaN == NaN with the same bits
    assert not row(x, np.array([1.0, np.nan, -0.0])).ok          # -0.0 has other bits than 0.0
    other_nan = np.array([1.0, 0.0, 0.0])
    other_nan.view(np.uint64)[1] = np.uint64(0x7FF8000000000001)  # a NaN with another payload
    assert np.isnan(other_nan[1]) and not row(x, other_nan).ok
    assert not row([1.0], [np.nextafter(1.0, 2.0)]).ok
    assert row([1.0], [np.nextafter(1.0, 2.0)], rtol=1e-15).ok


def test_nonfinite_with_tolerance():
    assert row([np.nan, np.inf], [np.nan, np.inf], rtol=1e-3).ok
    assert not row([np.nan], [1.0], rtol=1e-3).ok
    assert not row([1.0], [np.nan], rtol=1e-3).ok
    assert not row([np.inf], [-np.inf], rtol=1e-3).ok


def test_head_tolerance_on_leading_rows():
    e = np.ones(10)
    a = e.copy()
    a[7] += 1e-6
    tol = dict(rtol=1e-5, head={"n": 5, "rtol": 1e-9})
    assert row(e, a, **tol).ok
    a[3] += 1e-6                                                 # inside the head: only 1e-9 allowed
    assert not row(e, a, **tol).ok


def test_non_float_arrays_compare_exactly():
    assert row([1, 2], [1, 2], rtol=1.0).ok
    assert not row([1, 2], [1, 3], rtol=1.0).ok                  # ints ignore tolerances
    assert row(np.array("twostage"), np.array("twostage")).ok
    assert row(np.array("ab", dtype="<U2"), np.array("ab", dtype="<U5")).ok
    assert not row(np.array("ab"), np.array("ac")).ok
    assert not row([True], [False]).ok


def test_shape_and_dtype_mismatch_fail():
    r = row(np.zeros(3), np.zeros(4), rtol=1.0)
    assert not r.ok and "shape" in r.note
    r = row(np.zeros(3), np.zeros(3, dtype=np.float32), rtol=1.0)
    assert not r.ok and "dtype" in r.note
    r = row(np.zeros(3, dtype=np.int64), np.zeros(3, dtype=np.int32))
    assert not r.ok and "dtype" in r.note


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
    rep = compare_arrays(e, a, {"a": tolerance(rtol=1e-7)})
    assert [r.ok for r in rep.rows] == [True, False]           # b falls back to exact
    assert compare_arrays(e, a, {"a": tolerance(rtol=1e-7)}, default=tolerance(atol=1e-7)).ok


def test_bad_tolerances_rejected():
    for spec in ({"rtol": -1}, {"rtol": float("nan")}, {"rtl": 1e-3}, {"rtol": "1e-3"},
                 {"head": {"n": -1}}, {"head": {"n": 2, "x": 1}}, [1e-3]):
        with pytest.raises(InputError):
            check_tolerance("t", spec)


# --- command line -------------------------------------------------------------------------------
@pytest.fixture
def files(tmp_path):
    e = {"model": np.array("shallow"), "f": np.linspace(-1.0, 1.0, 5), "ids": np.arange(3)}
    save_npz(tmp_path / "e.npz", e)
    return tmp_path, e


def test_cli_exit_codes(files, capsys):
    d, e = files
    save_npz(d / "same.npz", e)
    assert main(["compare", str(d / "e.npz"), str(d / "same.npz"), "--rtol", "0", "--atol", "0"]) == 0
    out = capsys.readouterr().out
    assert "f" in out and "ok" in out and "exact" in out

    save_npz(d / "close.npz", {**e, "f": e["f"] * (1 + 1e-11)})
    assert main(["compare", str(d / "e.npz"), str(d / "close.npz")]) == 0          # default rtol 1e-10
    assert main(["compare", str(d / "e.npz"), str(d / "close.npz"), "--rtol", "1e-12"]) == 1
    assert "FAIL" in capsys.readouterr().out

    save_npz(d / "missing.npz", {k: v for k, v in e.items() if k != "ids"})
    assert main(["compare", str(d / "e.npz"), str(d / "missing.npz")]) == 1
    assert "missing from actual (only in expected): ids" in capsys.readouterr().out

    save_npz(d / "f32.npz", {**e, "f": e["f"].astype(np.float32)})
    assert main(["compare", str(d / "e.npz"), str(d / "f32.npz"), "--rtol", "1"]) == 1
    save_npz(d / "shape.npz", {**e, "f": e["f"][:4]})
    assert main(["compare", str(d / "e.npz"), str(d / "shape.npz"), "--rtol", "1"]) == 1


def test_cli_tolerance_file(files, capsys):
    d, e = files
    save_npz(d / "off.npz", {**e, "f": e["f"] + 1e-6})
    (d / "tol.json").write_text(json.dumps({"f": {"rtol": 0, "atol": 2e-6}}))
    assert main(["compare", str(d / "e.npz"), str(d / "off.npz"), "--tolerances", str(d / "tol.json")]) == 0
    (d / "tol.json").write_text(json.dumps({"default": {"atol": 1e-7}}))
    assert main(["compare", str(d / "e.npz"), str(d / "off.npz"), "--tolerances", str(d / "tol.json")]) == 1
    # the case.json written by `ntpref export` is accepted too
    (d / "case.json").write_text(json.dumps({"case": "x", "tolerances": {"f": {"atol": 2e-6, "reason": "r"}}}))
    assert load_tolerances(d / "case.json")[0]["f"]["atol"] == 2e-6
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
