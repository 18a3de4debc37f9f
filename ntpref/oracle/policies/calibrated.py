"""The calibrated float64 tolerance, policy "calibrated" in float64 (docs/tolerance.md, "A calibrated
tolerance"): per output array of a conformance case, a bound a few times the rounding error that float64 arithmetic actually makes on that
input, measured against exact arithmetic, instead of the worst case the running error bound of
:mod:`ntpref.oracle.policies.bound` allows.

For an array Q with the exact value Q (the exact backend, :mod:`ntpref.exact`) and the oracle's float64
value Q̂, elementwise e = |Q̂ − Q| (:func:`ntpref.oracle.exactness.differences`):

    evaluation, final iterates:  atol = CALIBRATED_MULTIPLE · max(max e, FLOOR · u · max|Q|)
    a per-step log (row t):      the line atol + atol_per_step · t through the first of
                                 CALIBRATED_MULTIPLE · max_{s ≤ t} max(max_row e_s, FLOOR · u · max|Q|)
                                 lying above all of them (max|Q| over the whole log: a small value at
                                 one step, a gradient norm that cancels, is no scale)

(u = 2⁻⁵³). The oracle's own error measures how much rounding the problem forces on a careful float64
program (cancellation included: where the terms cancel, e is large too); FLOOR roundings of the largest
entry stand in for the orders of summation the oracle did not take. It is a calibration, not a proof: no
theorem says another correct program stays within it. What supports it is measured
(``python -m benchmarks.calibration``): the correct implementations of the mutation benchmark against it.

An array keeps the running error bound (its tolerance under :mod:`ntpref.oracle.policies.bound`) where no
calibration applies: outputs of a solver whose certificate, not rounding, sets the accuracy (the model's
``diagnostics``: the max-margin solutions and the correlations with them), arrays the exact backend does
not compute, arrays that are exactly 0 (nothing to scale from), logs the bound already splits at a step
from which float64 no longer determines the run (its ``head``), and any array where the calibrated bound
would exceed the running error bound somewhere, except a log where it does so on its first steps only (a
log that starts at an exact 0, whose bound there is all but 0): that log keeps the running bound on those
steps, as the calibrated tolerance's ``head``, and is calibrated after them.

Every array of a training run keeps the running bound when the oracle misses one of the run's final
parameter blocks by more than AMPLIFIED roundings of its largest entry (:func:`amplified`). There the run's
dynamics amplify rounding (the two-stage model's late stage can multiply an error 30-fold a step): another
program's error is then an earlier step's rounding times that amplification, and the rounding at that
step differs between correct programs by far more than CALIBRATED_MULTIPLE (one's can be 0, another's 30 units), so
the oracle's one error says nothing about theirs. The running bound measures the amplification instead
(its rerun from perturbed parameters). The regular runs measured miss their final parameters by at most
a few hundred floors.

The oracle's miss is one sample of that amplification, and it can be small by chance: a late-stage run whose
oracle lands on the exact final W_kq while a correct program with other roundings ends 5e-3 of max|W_kq|
away. So a training run also keeps the running bound when that bound's own rerun finds one of its final
parameter blocks determined by float64 to no better than UNDETERMINED of its largest entry
(:func:`undetermined`): the regular runs measured stay below 4e-8 of it, the late-stage runs that amplify
above 5e-3.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...models import spec_named
from ...rounding import U
from ...tolerance import Tolerance
from ..exactness import differences, exact_backend

#: Tolerance = CALIBRATED_MULTIPLE × the measured rounding error (float64).
CALIBRATED_MULTIPLE = 16.0
#: The smallest rounding error assumed, in units of u · max|Q|.
FLOOR = 4.0
#: A training run whose final parameters the oracle misses by more than AMPLIFIED floors keeps the bound.
AMPLIFIED = 1000.0
#: A training run whose final parameter block the running bound admits beyond UNDETERMINED of its largest entry
#: (float64 determines fewer than six digits of it) keeps the bound.
UNDETERMINED = 1e-6


def calibrated_tolerance(diff: np.ndarray, exact: np.ndarray, trajectory: bool) -> Tolerance:
    """The calibrated tolerance (module docstring) of one array from ``diff`` = |Q̂ − Q| and ``exact`` = Q
    rounded to float64 (same shape); ``trajectory``: a per-step log whose axis 0 is the step."""
    floor = FLOOR * U * float(np.abs(exact).max(initial=0.0))
    first, per_step = line_of(np.maximum(diff, floor), trajectory)
    atol, per_step = CALIBRATED_MULTIPLE * first, CALIBRATED_MULTIPLE * per_step
    if trajectory and exact.ndim >= 1 and exact.shape[0] >= 2:
        return Tolerance(atol=atol, atol_per_step=per_step,
                         reason=f"calibrated: {CALIBRATED_MULTIPLE:g} x max(the oracle's error against exact "
                                f"arithmetic up to step t, {FLOOR:g}u·max|Q| {floor:.2g}) = {atol:.2g} + {per_step:.2g}·t")
    return Tolerance(atol=atol, reason=f"calibrated: {CALIBRATED_MULTIPLE:g} x max(the oracle's error against exact "
                                       f"arithmetic {float(diff.max(initial=0.0)):.2g}, {FLOOR:g}u·max|Q| {floor:.2g})")


def amplified(model: str, expected: Mapping[str, np.ndarray], exact_values: Mapping[str, np.ndarray]) -> str | None:
    """The first trained block of a training run whose final value the oracle misses by more than AMPLIFIED
    roundings of its largest entry (AMPLIFIED · FLOOR · u · max|Q|), or None: there the run's dynamics
    amplify rounding (module docstring)."""
    for block in spec_named(model).blocks:
        if block in expected and block in exact_values:
            diff, exact = differences(expected[block], exact_values[block])
            scale = FLOOR * U * float(np.abs(exact).max(initial=0.0))
            if scale > 0 and float(diff.max(initial=0.0)) > AMPLIFIED * scale:
                return block
    return None


def undetermined(model: str, expected: Mapping[str, np.ndarray], bound: Mapping[str, Tolerance]) -> str | None:
    """The first trained block of a training run whose running-bound tolerance (``bound``: name → Tolerance)
    admits more than UNDETERMINED of its largest entry at the oracle's final value, or None (module
    docstring)."""
    for block in spec_named(model).blocks:
        if block in expected and block in bound:
            value = np.asarray(expected[block], dtype=np.float64)
            scale = float(np.abs(value).max(initial=0.0))
            with np.errstate(all="ignore"):
                admitted = float(np.max(bound[block].element_bounds(value), initial=0.0))
            if scale > 0 and admitted > UNDETERMINED * scale:
                return block
    return None


def calibrated_tolerances(model: str, kind: str, expected: Mapping[str, np.ndarray],
                          exact_values: Mapping[str, np.ndarray], bound: Mapping[str, Tolerance]) -> dict[str, Tolerance]:
    """name → tolerance of every array of ``expected`` (the oracle's float64
    outputs of a ``model`` run of ``kind``), from ``exact_values`` (name → object array of mpf, the exact
    backend's outputs of the same input) and ``bound`` (name → the running error bound's tolerance): the
    calibrated one, or the bound where no calibration applies (module docstring)."""
    spec = spec_named(model)
    if kind == "train" and (amplified(model, expected, exact_values) or undetermined(model, expected, bound)):
        return {name: bound[name] for name in expected}
    out = {}
    for name, value in expected.items():
        out[name] = bound[name]
        if name in spec.diagnostics or name not in exact_values or out[name].head is not None:
            continue
        diff, exact = differences(value, exact_values[name])
        if np.any(exact):
            trajectory = kind == "train" and name in spec.trajectories
            out[name] = within(value, calibrated_tolerance(diff, exact, trajectory), out[name], trajectory,
                                "the running error bound")
    return out


def line_of(err: np.ndarray, trajectory: bool) -> tuple[float, float]:
    """(atol, atol_per_step) above ``err``: its largest entry, or along a per-step log (axis 0 the step) the
    straight line through its first row above the running maximum of its rows
    (:meth:`ntpref.tolerance.Tolerance.line_above`)."""
    if trajectory and err.ndim >= 1 and err.shape[0] >= 2:
        return Tolerance.line_above(Tolerance.running_max(err.reshape(err.shape[0], -1).max(axis=1)))
    return float(err.max(initial=0.0)), 0.0


def within(value: np.ndarray, tol: Tolerance, kept: Tolerance, trajectory: bool, what: str) -> Tolerance:
    """``tol`` where it is nowhere looser than ``kept`` (tolerances of the array ``value``); a log looser on its
    first steps only gets ``kept`` there as its head; otherwise ``kept``. ``what`` names ``kept`` in the reason."""
    reference = np.asarray(value, dtype=np.float64)
    with np.errstate(all="ignore"):
        looser = tol.element_bounds(reference) > kept.element_bounds(reference)
    if trajectory and looser.ndim >= 1:
        rows = np.flatnonzero(looser.reshape(looser.shape[0], -1).any(axis=1))
        if rows.size and rows[-1] + 1 < looser.shape[0]:      # looser on the first steps only
            n = int(rows[-1]) + 1
            return tol.with_head(n, kept, f"{tol.reason}; {what} on steps 0..{n - 1}")
    return kept if looser.any() else tol


def for_case(case) -> dict[str, Tolerance]:
    """The calibrated float64 tolerances of a conformance case (:class:`ntpref.oracle.cases.Case`): one run of
    the exact backend on its input (:meth:`~ntpref.oracle.cases.Case.calibrate`)."""
    return case.calibrate(exact_backend().compute(case.kind, case.inputs, as_float=False))
