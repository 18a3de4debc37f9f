"""The tolerance policies a user chooses from (docs/tolerance.md), one module each, behind one entry point,
:func:`case_tolerances`, which gives a conformance case's tolerances for a (precision, policy):

========== ============ ==================================================================================
precision  policy       module
========== ============ ==================================================================================
float64    bound        :mod:`~ntpref.oracle.policies.bound`: the running error bound every correct float64
                        program meets (``ntpref compare --input``, the tolerances stored with every case)
float64    calibrated   :mod:`~ntpref.oracle.policies.calibrated`: a multiple of the oracle's own error
                        against exact arithmetic (the default)
float32    bound        :mod:`~ntpref.oracle.policies.envelope`: the float32 envelope
float32    calibrated   :mod:`~ntpref.oracle.policies.calibrated32`: the calibrated float64 tolerance scaled
                        to float32, plus the response to the inputs rounded to float32 (the default)
========== ============ ==================================================================================

The commands that take no policy, ``ntpref compare`` without ``--input`` and ``ntpref gradcheck``, use
:mod:`~ntpref.oracle.policies.defaults`. Every tolerance is a :class:`ntpref.tolerance.Tolerance`.
"""
from __future__ import annotations

from ...errors import InputError
from ...tolerance import Tolerance
from . import bound, calibrated, calibrated32, envelope

PRECISIONS = ("float64", "float32")
#: The tolerance policies: "bound", the running error bound in float64 and the float32 envelope in float32;
#: "calibrated", the calibrated tolerances of either precision.
POLICIES = ("bound", "calibrated")
#: The policy of a check that names none.
DEFAULT_POLICY = "calibrated"
#: (precision, policy) → the module that makes a case's tolerances (its ``for_case``).
MODULES = {("float64", "bound"): bound, ("float64", "calibrated"): calibrated,
           ("float32", "bound"): envelope, ("float32", "calibrated"): calibrated32}
#: (precision, policy) → what it is, as the header of ``ntpref conformance`` names it.
DESCRIPTIONS = {("float64", "calibrated"): "calibrated float64 tolerances (docs/tolerance.md)",
                ("float64", "bound"): "float64 running error bound (docs/tolerance.md)",
                ("float32", "calibrated"): "calibrated float32 tolerances (docs/conformance.md)",
                ("float32", "bound"): "float32 envelope (docs/conformance.md)"}


def check_policy(precision: str, policy: str | None = None) -> str:
    """The tolerance policy ``policy`` stands for at ``precision`` (one of :data:`PRECISIONS`): None is the
    default, :data:`DEFAULT_POLICY`. InputError for another precision or a policy not in :data:`POLICIES`."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if policy is None:
        return DEFAULT_POLICY
    if policy not in POLICIES:
        raise InputError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


def case_tolerances(case, precision: str = "float64", policy: str | None = None) -> dict[str, Tolerance]:
    """name → tolerance of every expected array of a conformance case (:class:`ntpref.oracle.cases.Case`,
    which keeps what this returns: call it through :meth:`~ntpref.oracle.cases.Case.tolerances`) under
    ``policy`` at ``precision`` (:func:`check_policy`). A policy that builds on another (the float32 ones on
    float64's) asks the case for that one."""
    return MODULES[precision, check_policy(precision, policy)].for_case(case)
