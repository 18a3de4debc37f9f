"""ntpref.tolerance: the Tolerance type, validated when made, and its operations against hand-computed values;
its JSON form against the stored manifest's records."""
import json
import math
from pathlib import Path

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.oracle.manifest import KEEPS_BOUND, RECORD_FIELDS, array_records
from ntpref.tolerance import EXACT, HUGE, OVERFLOW, TINY, Head, Tolerance

MANIFEST = Path(__file__).resolve().parents[1] / "reference_runs" / "manifest.json"


@pytest.mark.parametrize("bounds, message", [
    ({"atol": -1.0}, "'atol' must be a finite number >= 0, got -1.0"),
    ({"rtol": math.inf}, "'rtol' must be a finite number >= 0, got inf"),
    ({"atol_per_step": True}, "'atol_per_step' must be a finite number >= 0, got True"),
    ({"reason": 3}, "'reason' must be a string"),
    ({"head": {"n": 2, "rtol": -1e-9}}, "head: 'rtol' must be a finite number >= 0, got -1e-09"),
    ({"head": {"n": 1.5}}, "head 'n' must be an integer >= 0, got 1.5"),
])
def test_a_tolerance_is_validated_when_it_is_made(bounds, message):
    with pytest.raises(InputError, match="^" + message.replace("(", r"\(").replace(")", r"\)") + "$"):
        Tolerance(**bounds)


def test_a_tolerance_is_a_value_and_cannot_be_changed():
    a = Tolerance(atol=1e-9, head={"n": 2, "rtol": 1e-3})
    assert a == Tolerance(atol=1e-9, head=Head(2, rtol=1e-3)) and isinstance(a.head, Head) and a.atol_max_scale == 0.0
    with pytest.raises(AttributeError):
        a.atol = 1.0
    assert EXACT.exact and not Tolerance(atol=TINY).exact and not Tolerance(head={"n": 0}).exact


def test_the_sum_adds_bounds_and_covers_both_heads_by_hand():
    a = Tolerance(rtol=1.0, atol=2.0, head={"n": 3, "rtol": 5.0, "atol": 0.5})
    b = Tolerance(atol=10.0, atol_per_step=1.0, head={"n": 5, "atol_max_scale": 7.0})
    total = a.plus(b, "a + b")
    assert total == Tolerance(rtol=1.0, atol=12.0, atol_per_step=1.0, reason="a + b",
                              head=Head(5, rtol=5.0, atol=12.0, atol_max_scale=7.0, atol_per_step=1.0))
    e = np.array([1.0, -2.0, 4.0, 0.0, 3.0, 1.0])       # max|e| = 4, rows t = 0..5
    # a: rows 0..2 0.5 + 5|e|, rows 3.. 2 + |e|; b: rows 0..4 (its head alone) 7·4, row 5 10 + 5
    expected_a = np.array([5.5, 10.5, 20.5, 2.0, 5.0, 3.0])
    expected_b = np.array([28.0, 28.0, 28.0, 28.0, 28.0, 15.0])
    np.testing.assert_array_equal(a.element_bounds(e), expected_a)
    np.testing.assert_array_equal(b.element_bounds(e), expected_b)
    assert np.all(total.element_bounds(e) >= expected_a + expected_b)
    np.testing.assert_array_equal(total.element_bounds(e)[5:], (expected_a + expected_b)[5:])


def test_the_line_above_a_running_maximum_by_hand():
    values = np.array([1.0, 0.5, 4.0, 3.0, 5.0])
    np.testing.assert_array_equal(Tolerance.running_max(values), [1.0, 1.0, 4.0, 4.0, 5.0])
    np.testing.assert_array_equal(Tolerance.running_max(values, first=1), [0.0, 0.5, 4.0, 4.0, 5.0])
    # through 1 at t = 0; the steepest rise is to 4 at t = 2: slope 1.5 (line 1, 2.5, 4, 5.5, 7)
    assert Tolerance.line_above(Tolerance.running_max(values)) == (1.0, 1.5)
    assert Tolerance.line_above(np.array([1.0, 0.5]), floor=2.0) == (2.0, 0.0)     # raised to the floor
    assert Tolerance.line_above(np.array([3.0])) == (3.0, 0.0)
    two_d = np.array([[1.0, 0.0], [0.0, 2.0], [0.0, 0.0]])
    np.testing.assert_array_equal(Tolerance.running_max(two_d, first=1), [[0.0, 0.0], [0.0, 2.0], [0.0, 2.0]])


def test_an_overflowed_bound_saturates_and_says_so():
    tol = Tolerance.saturated(atol=math.inf, rtol=1e-3, reason="r")
    assert tol.atol == HUGE and tol.rtol == 1e-3 and tol.reason == OVERFLOW + "r"
    assert Tolerance.saturated(atol=1.0, reason="r") == Tolerance(atol=1.0, reason="r")


def test_the_short_text():
    assert EXACT.text() == "exact" == Tolerance(atol=TINY).text()
    assert Tolerance(atol=3e-15, atol_per_step=2e-17).text() == "atol 3e-15 +2e-17·t"
    assert Tolerance(rtol=1e-10, atol_max_scale=1e-12).text() == "rtol 1e-10 atol 1e-12·max"
    assert Tolerance(rtol=1e-5, head={"n": 4, "atol": 1e-9}).text() == "[:4] atol 1e-09; rest rtol 1e-05"


def test_unchecked_means_every_bound_at_or_above_the_arrays_own_scale():
    corr = np.array([0.5, -0.25, 0.0])
    assert Tolerance(atol=0.5).admits_every_value(corr)
    assert not Tolerance(atol=0.49).admits_every_value(corr)
    assert not Tolerance(atol=0.4, atol_per_step=1.0).admits_every_value(corr)    # row 0 is still checked
    assert Tolerance(rtol=1.0, atol=0.5).admits_every_value(corr)
    zero = np.zeros(4)          # exactly 0: checked unless only a non-finite value can fail
    assert not Tolerance(atol=1e-3).admits_every_value(zero)
    assert Tolerance(atol=HUGE).admits_every_value(zero)
    assert not Tolerance(atol=1.0).admits_every_value(np.zeros(0))
    assert not Tolerance(atol=1.0).admits_every_value(np.array([1, 2]))          # integers: compared exactly


def _records():
    manifest = json.loads(MANIFEST.read_text())
    for case, entry in manifest["cases"].items():
        for name, rec in array_records(entry).items():
            yield case, name, rec


def test_the_json_form_round_trips_the_stored_manifests_records():
    n = 0
    for case, name, rec in _records():
        part = {k: v for k, v in rec.items() if k not in RECORD_FIELDS}
        assert Tolerance.from_json(name, part).to_json() == part, (case, name)
        calibrated = rec.get("calibrated", KEEPS_BOUND)
        if calibrated != KEEPS_BOUND:        # stored with the bounds it uses: the others are 0
            full = Tolerance.from_json(name, calibrated).to_json()
            assert full == {"rtol": 0.0, "atol": 0.0, "atol_max_scale": 0.0, "atol_per_step": 0.0, **calibrated}
            assert list(json.dumps(full)) and Tolerance.from_json(name, full) == Tolerance.from_json(name, calibrated)
        n += 1
    assert n > 50
