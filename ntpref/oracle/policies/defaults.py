"""The tolerances of the commands that take no policy: ``ntpref compare`` without ``--input`` and
``ntpref gradcheck`` (docs/tolerance.md, "Which option changes what")."""
from __future__ import annotations

from ...tolerance import Tolerance

#: ``ntpref compare`` when neither tolerances nor an input file are given: another float64 framework on one
#: evaluation (docs/contract.md, "Tolerances"). It scales with the array's own values, so an output that is
#: exactly zero in exact arithmetic needs ``--input`` (the running error bound).
FRAMEWORK_FLOAT64 = Tolerance(rtol=1e-10, atol_max_scale=1e-12,
                              reason="another float64 framework on one evaluation (default without --input)")
#: ``ntpref gradcheck``'s relative and absolute tolerance: central differences with eps = 1e-6 have a
#: truncation error O(eps² |L'''|) ~ 1e-12 and a rounding error about ulp(L)/eps ~ 2e-10 |L| (losses of order
#: one or less).
GRADCHECK_RTOL, GRADCHECK_ATOL = 1e-7, 1e-8


def given_bounds(rtol: float = 0.0, atol: float = 0.0, atol_max_scale: float = 0.0, reason: str = "") -> Tolerance:
    """The tolerance of bounds given on a command line (``ntpref compare --rtol R ...``, ``ntpref gradcheck``);
    InputError for a negative or non-finite one."""
    return Tolerance(rtol=rtol, atol=atol, atol_max_scale=atol_max_scale, reason=reason)


def gradcheck_tolerance(rtol: float = GRADCHECK_RTOL, atol: float = GRADCHECK_ATOL) -> Tolerance:
    """The tolerance of a gradient against its finite differences: ``|grad − fd| ≤ atol + rtol · |fd|``."""
    return given_bounds(rtol=rtol, atol=atol, reason="finite differences (ntpref gradcheck)")
