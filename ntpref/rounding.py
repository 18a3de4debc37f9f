"""Rounding-error arithmetic of the float64 tolerance policy (docs/tolerance.md), shared by the magnitude
forms that live beside each model (``ntpref.twostage.magnitudes``, ``ntpref.shallow.magnitudes``) and by
the policy itself (:mod:`ntpref.oracle.policies.bound`).

The functions below build the four kinds of :class:`ntpref.tolerance.Tolerance` the policy gives: an
evaluated array, a per-step trajectory, a final iterate, a max-margin solution.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .tolerance import TINY, Tolerance

#: Unit roundoff of float64.
U = 2.0 ** -53
#: Multiplier on every bound (second-order terms, the estimate of the trajectory response).
SAFETY = 4.0
#: ulps counted for each level of exp, log, tanh or erf (libms differ by a few ulps).
TRANSCENDENTAL_ULPS = 8
#: Max-margin solutions W_ov*, W_kq*: a least-norm QP certified to margins >= 1 - 1e-9
#: (docs/twostage.md §5); another solver may stop anywhere within that, relative to max|W*|.
QP_REL = 1e-9


def underflow_floor(count: int) -> float:
    """``SAFETY · K · TINY``, the atol below which no bound of K operations goes. A result below the smallest
    normal number is rounded with an absolute error of up to TINY/2 instead of the relative u, so where the
    magnitudes are subnormal the relative bound γ_K·M vanishes (or underflows to 0) while two correct
    programs still differ by a few subnormal units; each of the K operations is counted at one TINY."""
    return SAFETY * count * TINY


def gamma(k: int) -> float:
    """γ_k = k u / (1 − k u): the classical bound on the relative rounding error of k operations."""
    return k * U / (1.0 - k * U)


class Scales(NamedTuple):
    """Magnitudes M per output name (arrays shaped like the outputs) and the operation count K."""

    M: dict
    count: int


def max_abs(x) -> float:
    """max |x| (0 for an empty array)."""
    return float(np.max(np.abs(x), initial=0.0))


def eval_tolerance(M: np.ndarray, count: int) -> Tolerance:
    """``atol = SAFETY · γ_K · max M`` for one evaluated array, at least :func:`underflow_floor`."""
    top = float(np.max(M, initial=0.0))
    return Tolerance.saturated(atol=max(SAFETY * gamma(count) * top, underflow_floor(count)),
                               reason=f"float64 policy, evaluation: {SAFETY:g}·γ_{count}·max M, M = {top:.3g}")


def trajectory_tolerance(q: np.ndarray, floor: float, count: int, propagated: np.ndarray, what: str) -> Tolerance:
    """A logged trajectory q [steps]: rtol SAFETY·γ_K, and the straight line atol + atol_per_step·t
    lying above SAFETY·(floor + propagated(t)) and :func:`underflow_floor`
    (:meth:`ntpref.tolerance.Tolerance.line_above`); ``floor`` is q's evaluation bound apart from γ_K |q_t|."""
    atol, slope = Tolerance.line_above(SAFETY * (floor + propagated), underflow_floor(count))
    return Tolerance.saturated(rtol=SAFETY * gamma(count), atol=atol, atol_per_step=slope,
                               reason=f"float64 policy, trajectory {what}: {SAFETY:g}·[γ_{count}·|q_t| + {floor:.3g} + "
                                      f"propagated rounding, {float(propagated[-1]):.3g} at the last step]")


def final_tolerance(propagated: float, what: str) -> Tolerance:
    """A final iterate: ``atol = SAFETY · propagated`` (the rounding carried along the run)."""
    return Tolerance.saturated(atol=max(SAFETY * propagated, TINY),
                               reason=f"float64 policy, {what}: {SAFETY:g}·propagated rounding {propagated:.3g}")


def qp_tolerance(W_star: np.ndarray) -> Tolerance:
    """A max-margin solution: :data:`QP_REL` · max|W*| (a certified least-norm QP solver)."""
    return Tolerance.saturated(atol=max(QP_REL * max_abs(W_star), TINY),
                               reason=f"max-margin solution: a certified least-norm QP solver, {QP_REL:g}·max|W*|")
