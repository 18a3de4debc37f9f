"""The calibrated float64 tolerance (docs/tolerance.md, "A calibrated tolerance"): per output array of a
conformance case, a bound a few times the rounding error that float64 arithmetic actually makes on that
input, measured against exact arithmetic, instead of the worst case the running error bound of
:mod:`ntpref.oracle.tolerance` allows.

For an array Q with the exact value Q (the exact backend, :mod:`ntpref.exact`) and the oracle's float64
value Q̂, elementwise e = |Q̂ − Q| (:func:`ntpref.oracle.exactness.differences`):

    evaluation, final iterates:  atol = MULTIPLE · max(max e, FLOOR · u · max|Q|)
    a per-step log (row t):      the line atol + atol_per_step · t through the first of
                                 MULTIPLE · max_{s ≤ t} max(max_row e_s, FLOOR · u · max|Q|)
                                 lying above all of them (max|Q| over the whole log: a small value at
                                 one step, a gradient norm that cancels, is no scale)

(u = 2⁻⁵³). The oracle's own error measures how much rounding the problem forces on a careful float64
program (cancellation included: where the terms cancel, e is large too); FLOOR roundings of the largest
entry stand in for the orders of summation the oracle did not take. It is a calibration, not a proof: no
theorem says another correct program stays within it. What supports it is measured
(``python -m benchmarks.calibration``): the correct implementations of the mutation benchmark against it.

An array keeps the running error bound (its tolerance under :mod:`ntpref.oracle.tolerance`) where no
calibration applies: outputs of a solver whose certificate, not rounding, sets the accuracy (the model's
``diagnostics``: the max-margin solutions and the correlations with them), arrays the exact backend does
not compute, arrays that are exactly 0 (nothing to scale from), logs the bound already splits at a step
from which float64 no longer determines the run (its ``head``), and any array where the calibrated bound
would exceed the running error bound somewhere, except a log where it does so on its first steps only (a
log that starts at an exact 0, whose bound there is all but 0): that log keeps the running bound on those
steps, as the calibrated tolerance's ``head``, and is calibrated after them.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..models import spec_named
from ..rounding import U
from .compare import check_tolerance, element_bounds
from .envelope import line_above
from .exactness import differences

#: Tolerance = MULTIPLE × the measured rounding error.
MULTIPLE = 16.0
#: The smallest rounding error assumed, in units of u · max|Q|.
FLOOR = 4.0
#: The bounds of a tolerance's ``head`` (:mod:`ntpref.oracle.compare`): on its rows, the running bound's.
HEAD_KEYS = ("rtol", "atol", "atol_max_scale", "atol_per_step")


def calibrated_tolerance(diff: np.ndarray, exact: np.ndarray, trajectory: bool) -> dict:
    """The calibrated tolerance (module docstring) of one array from ``diff`` = |Q̂ − Q| and ``exact`` = Q
    rounded to float64 (same shape); ``trajectory``: a per-step log whose axis 0 is the step."""
    floor = FLOOR * U * float(np.abs(exact).max(initial=0.0))
    if trajectory and exact.ndim >= 1 and exact.shape[0] >= 2:
        per_row = np.maximum(diff.reshape(exact.shape[0], -1).max(axis=1), floor)
        atol, per_step = line_above(MULTIPLE * np.maximum.accumulate(per_row))
        return {"rtol": 0.0, "atol": atol, "atol_per_step": per_step,
                "reason": f"calibrated: {MULTIPLE:g} x max(the oracle's error against exact arithmetic up to "
                          f"step t, {FLOOR:g}u·max|Q| {floor:.2g}) = {atol:.2g} + {per_step:.2g}·t"}
    err = float(diff.max(initial=0.0))
    return {"rtol": 0.0, "atol": MULTIPLE * max(err, floor),
            "reason": f"calibrated: {MULTIPLE:g} x max(the oracle's error against exact arithmetic {err:.2g}, "
                      f"{FLOOR:g}u·max|Q| {floor:.2g})"}


def calibrated_tolerances(model: str, kind: str, expected: Mapping[str, np.ndarray],
                          exact_values: Mapping[str, np.ndarray], bound: Mapping[str, Mapping]) -> dict[str, dict]:
    """name → tolerance (:mod:`ntpref.oracle.compare` form) of every array of ``expected`` (the oracle's float64
    outputs of a ``model`` run of ``kind``), from ``exact_values`` (name → object array of mpf, the exact
    backend's outputs of the same input) and ``bound`` (name → the running error bound's tolerance): the
    calibrated one, or the bound where no calibration applies (module docstring)."""
    spec = spec_named(model)
    out = {}
    for name, value in expected.items():
        kept = check_tolerance(f"tolerance of '{name}'", bound[name])
        out[name] = kept
        if name in spec.diagnostics or name not in exact_values or "head" in kept:
            continue
        diff, exact = differences(value, exact_values[name])
        if not np.any(exact):
            continue
        trajectory = kind == "train" and name in spec.trajectories
        tol = calibrated_tolerance(diff, exact, trajectory)
        reference = np.asarray(value, dtype=np.float64)
        with np.errstate(all="ignore"):
            looser = element_bounds(reference, check_tolerance(name, tol)) > element_bounds(reference, kept)
        if trajectory and looser.ndim >= 1:
            rows = np.flatnonzero(looser.reshape(looser.shape[0], -1).any(axis=1))
            if rows.size and rows[-1] + 1 < looser.shape[0]:      # looser on the first steps only
                n = int(rows[-1]) + 1
                tol = {**tol, "head": {"n": n, **{k: kept[k] for k in HEAD_KEYS}},
                       "reason": f"{tol['reason']}; the running error bound on steps 0..{n - 1}"}
                looser = np.zeros_like(looser)
        if not looser.any():
            out[name] = tol
    return out
