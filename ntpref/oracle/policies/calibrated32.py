"""The calibrated float32 tolerance, policy "calibrated" in float32 (docs/conformance.md, "float32 mode").

For an array that float64 calibrates (:mod:`ntpref.oracle.policies.calibrated`) it scales the rounding error
measured in float64 to float32 rounding and adds the response to the rounding of the inputs, which a float32
program starts from (the float32 envelope's first measured term, :mod:`ntpref.oracle.policies.envelope`):

    CALIBRATED32_MULTIPLE · (TO_FLOAT32 · max(e, FLOOR · u · max|Q|) + |q(fl32(inputs)) − q|)

(TO_FLOAT32 = u32 / u = 2²⁹; the first term is the calibrated float64 tolerance over CALIBRATED_MULTIPLE;
along a per-step log both terms are lines in t). It assumes that float32 rounding acts on the problem as
float64's does, u32 / u times larger: a response linear in the rounding, measured
(``python -m benchmarks.mutations``), not proven. The other arrays keep the envelope, and so does an array
where this would exceed the envelope somewhere (a log that does so on its first steps only keeps the envelope
there, as its head).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...models import spec_named
from ...rounding import U
from ...tolerance import Tolerance
from .calibrated import CALIBRATED_MULTIPLE, line_of, within
from .envelope import U32

#: CALIBRATED_MULTIPLE's counterpart in float32.
CALIBRATED32_MULTIPLE = 12.0
#: float32's unit roundoff over float64's (2^29): what scales a float64 rounding error to float32.
TO_FLOAT32 = U32 / U


def calibrated32_tolerances(model: str, kind: str, expected: Mapping[str, np.ndarray],
                            calibrated: Mapping[str, Tolerance], bound: Mapping[str, Tolerance],
                            envelope: Mapping[str, Tolerance], rounded: Mapping[str, np.ndarray]) -> dict[str, Tolerance]:
    """name → the calibrated float32 tolerance (module docstring) of every array of ``expected`` (the oracle's
    float64 outputs of a ``model`` run of ``kind``), from its calibrated float64 tolerance (``calibrated``),
    the running error bound (``bound``), the float32 envelope's tolerance (``envelope``) and ``rounded`` =
    |q(fl32(inputs)) − q| (elementwise, :func:`ntpref.oracle.policies.envelope.measured`): TO_FLOAT32 × the
    float64 tolerance + CALIBRATED32_MULTIPLE × the response to the rounded inputs where float64 is
    calibrated, the envelope elsewhere."""
    spec = spec_named(model)
    out = {}
    for name, value in expected.items():
        out[name] = envelope[name]
        own = calibrated[name]
        if own == bound[name]:      # float64 keeps its bound: no calibration
            continue
        trajectory = kind == "train" and name in spec.trajectories
        first, per_step = line_of(np.asarray(rounded[name], dtype=np.float64), trajectory)
        scale = TO_FLOAT32 * CALIBRATED32_MULTIPLE / CALIBRATED_MULTIPLE
        tol = Tolerance(atol=scale * own.atol + CALIBRATED32_MULTIPLE * first,
                        atol_per_step=scale * own.atol_per_step + CALIBRATED32_MULTIPLE * per_step,
                        reason=f"calibrated float32: {CALIBRATED32_MULTIPLE:g} x (2^29 x the float64 rounding error "
                               f"{own.atol / CALIBRATED_MULTIPLE:.2g} + the response to the inputs rounded to float32 "
                               f"{first:.2g})" + (" along the log" if per_step or own.atol_per_step else ""))
        out[name] = within(value, tol, out[name], trajectory, "the float32 envelope")
    return out


def for_case(case) -> dict[str, Tolerance]:
    """The calibrated float32 tolerances of a conformance case (:class:`ntpref.oracle.cases.Case`), from its
    float64 ones and its float32 envelope."""
    return calibrated32_tolerances(case.model, case.kind, case.expected, case.tolerances("float64", "calibrated"),
                                   case.tolerances("float64", "bound"), case.tolerances("float32", "bound"),
                                   case.float32_terms[0])
