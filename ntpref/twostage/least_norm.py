"""Certified least-norm solutions w* = argmin ‖w‖ s.t. A w ≥ 1 (docs/twostage.md §5).

:func:`solve_ldp` solves the problem as a least-distance program through Lawson–Hanson NNLS on the rows
2^−k A, k chosen so that the NNLS sees entries and a solution of order 1 whatever the units and the
conditioning of A, and maps the solution and multipliers back exactly (w = 2^−k w', λ = 2^−2k λ').
:func:`least_norm` adds the certificate.

A :class:`Certificate` is computed on the original problem (:func:`certify`): the smallest margin, the largest
violation of dual feasibility (λ ≥ 0) and the duality gap P(w) − D(λ) with P(w) = ½‖w‖²,
D(λ) = Σλ − ½‖A^T λ‖². Margins ≥ 1 − 1e-9, λ ≥ 0 and |gap| ≤ 1e-12 ‖w‖² prove w optimal up to rounding (weak
duality: ½‖w − w*‖² ≤ gap for feasible w); the margin and gap bounds are relaxed only to the float64
resolution of the margins of w (badly conditioned A). A solution that fails them raises
:class:`SolverError`, never returns silently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit

from ..checks import as_float
from ..errors import InfeasibleError, NtprefError

MARGIN_TOL = 1e-9      # every margin >= 1 - max(MARGIN_TOL, floor)
GAP_TOL = 1e-12        # |duality gap| <= max(GAP_TOL, floor) ‖w‖²
ROUNDING = 64 * np.finfo(np.float64).eps   # floor = ROUNDING max_i Σ_j |a_ij w_j|, float64 resolution of a margin
RESCALE_NORM = 2.0 ** 8   # the rescaled problem is solved again while its ‖w'‖ >= RESCALE_NORM
MAX_PASSES = 4            # NNLS runs (first scaling, then rescalings) before giving up
INFEASIBLE_RESIDUAL = 1e3 * np.finfo(np.float64).eps   # NNLS residual of a vanishing convex combination


class SolverError(NtprefError):
    """The least-norm solver did not reach a certified optimum (margins, dual feasibility or duality gap)."""


@dataclass(frozen=True)
class Certificate:
    """Optimality certificate of a least-norm solution w of min ‖w‖ s.t. A w ≥ 1.

    min_margin          min_i a_i^T w (+inf without constraints)
    max_dual_violation  max(0, −min λ)
    duality_gap         ½‖w‖² − (Σλ − ½‖A^T λ‖²)  (primal minus dual objective)
    iterations          NNLS least-squares solves (0 for a closed form)
    """

    min_margin: float
    max_dual_violation: float
    duality_gap: float
    iterations: int


def certify(margins: np.ndarray, lam: np.ndarray, w_sq: float, stationarity_sq: float, magnitude: float,
            iterations: int) -> Certificate:
    """Certificate from the margins A w, the multipliers λ, ‖w‖², ‖w − A^T λ‖² and the largest margin magnitude
    max_i Σ_j |a_ij w_j|; SolverError if it fails.

    The gap is evaluated as Σ λ_i (a_i^T w − 1) + ½‖w − A^T λ‖² (equal to P − D, without its cancellation).
    Every bound is invariant to the scale of A: margins ≥ 1 − MARGIN_TOL and |gap| ≤ GAP_TOL ‖w‖² (Σλ = ‖w‖²
    at the optimum), both relaxed to the float64 floor ROUNDING · magnitude, the rounding of a margin of w
    stored in float64 (it exceeds the tolerances only for badly conditioned A).
    """
    floor = ROUNDING * magnitude
    margin_tol, gap_tol = max(MARGIN_TOL, floor), max(GAP_TOL, floor) * w_sq
    cert = Certificate(float(margins.min()) if margins.size else float("inf"),
                       max(0.0, -float(lam.min())) if lam.size else 0.0,
                       float(lam @ (margins - 1.0) + 0.5 * stationarity_sq), int(iterations))
    if not (cert.min_margin >= 1.0 - margin_tol and cert.max_dual_violation == 0.0
            and abs(cert.duality_gap) <= gap_tol):
        raise SolverError(f"least-norm solution not certified: min margin {cert.min_margin!r} (need >= 1 - "
                          f"{margin_tol:.3g}), dual violation {cert.max_dual_violation!r}, duality gap "
                          f"{cert.duality_gap!r} (need |gap| <= {gap_tol:.3g}) after {iterations} iterations")
    return cert


@njit(cache=True)
def _givens_rows(M, i, c, s, lo, hi):
    """Rotate rows i, i+1 of M over columns lo..hi-1 by [c s; −s c]."""
    for col in range(lo, hi):
        a, b = M[i, col], M[i + 1, col]
        M[i, col] = c * a + s * b
        M[i + 1, col] = -s * a + c * b


@njit(cache=True)
def _remove_position(R, Qt, qf, order, t, k):
    """Drop passive position t of k from the factorisation Qt B_P = R, restore triangularity; returns k − 1."""
    m = Qt.shape[0]
    for col in range(t, k - 1):
        order[col] = order[col + 1]
        for i in range(m):
            R[i, col] = R[i, col + 1]
    for i in range(m):
        R[i, k - 1] = 0.0
    for i in range(t, k - 1):
        a, b = R[i, i], R[i + 1, i]
        r = np.sqrt(a * a + b * b)
        if r == 0.0:
            continue
        c, s = a / r, b / r
        _givens_rows(R, i, c, s, i, k - 1)
        R[i + 1, i] = 0.0
        _givens_rows(Qt, i, c, s, np.int64(0), m)        # np.int64: as k in nnls_kernel
        a, b = qf[i], qf[i + 1]
        qf[i] = c * a + s * b
        qf[i + 1] = -s * a + c * b
    return k - 1


@njit(cache=True)
def _add_column(B, j, R, Qt, qf, order, k, c, dep_tol):
    """Append column j of B to Qt B_P = R with one Householder reflection on rows k..; returns the new k,
    or k unchanged when the column is numerically dependent on the passive ones (‖(Qt B_j)[k:]‖ <= dep_tol)."""
    m = Qt.shape[0]
    for i in range(m):
        acc = 0.0
        for l in range(m):
            acc += Qt[i, l] * B[l, j]
        c[i] = acc
    tail = 0.0
    for i in range(k, m):
        tail += c[i] * c[i]
    tail = np.sqrt(tail)
    if tail <= dep_tol:
        return k
    alpha = -tail if c[k] >= 0.0 else tail            # H = I − β v v^T, v = (c_k − α, c_{k+1}, ...)
    v0 = c[k] - alpha
    beta = -1.0 / (alpha * v0)
    for col in range(m):
        acc = v0 * Qt[k, col]
        for i in range(k + 1, m):
            acc += c[i] * Qt[i, col]
        acc *= beta
        Qt[k, col] -= acc * v0
        for i in range(k + 1, m):
            Qt[i, col] -= acc * c[i]
    acc = v0 * qf[k]
    for i in range(k + 1, m):
        acc += c[i] * qf[i]
    acc *= beta
    qf[k] -= acc * v0
    for i in range(k + 1, m):
        qf[i] -= acc * c[i]
    for i in range(k):
        R[i, k] = c[i]
    R[k, k] = alpha
    order[k] = j
    return k + 1


@njit(cache=True)
def _back_substitute(R, rhs, k, z):
    """z[:k] = R[:k, :k]^{-1} rhs[:k] (R upper triangular)."""
    for i in range(k - 1, -1, -1):
        acc = rhs[i]
        for j in range(i + 1, k):
            acc -= R[i, j] * z[j]
        z[i] = acc / R[i, i]


@njit(cache=True)
def nnls_kernel(B, max_solves):
    """Lawson–Hanson NNLS min ‖B x − f‖ s.t. x ≥ 0 for B [m, p] and f = e_{m−1}.

    The passive columns live in a QR factorisation Qt B_P = R updated when a column enters (Householder) or
    leaves (Givens). A column that is numerically dependent on the passive ones, or whose first solve would
    not enter positively, is blocked until x moves (this prevents add/drop loops). A column enters when its
    gradient B_j^T (f − B x) exceeds 1e-13 ‖B_j‖ and leaves when its share x_j ‖B_j‖ of B x falls to 1e-13:
    both tests are relative to the column, so columns of any size are treated alike. The residual is taken from
    the factorisation, r = Qt^T [0; (Qt f)[k:]] (k passive columns), not as f − B x: it is then the exact
    residual of a matrix within rounding of B, column by column, however ill-conditioned B_P is.
    Returns (x [p], r [m], least-squares solves, converged within max_solves).
    """
    m, p = B.shape
    n = m - 1
    Qt = np.eye(m)
    R = np.zeros((m, m))
    qf = np.zeros(m)                                   # Qt f
    qf[n] = 1.0
    order = np.zeros(m, dtype=np.int64)                # passive columns in factor order
    x = np.zeros(p)
    z = np.zeros(m)
    res = np.zeros(m)
    c = np.zeros(m)
    passive = np.zeros(p, dtype=np.bool_)
    blocked = np.zeros(p, dtype=np.bool_)
    colnorm = np.zeros(p)
    for j in range(p):
        acc = 0.0
        for i in range(m):
            acc += B[i, j] * B[i, j]
        colnorm[j] = np.sqrt(acc)
    k = np.int64(0)       # not a literal: Numba would compile _add_column once more for a literal argument
    solves = 0
    while k < m:
        for i in range(m):                             # res = f − B x
            res[i] = 0.0
        res[n] = 1.0
        for j in range(p):
            if x[j] != 0.0:
                for i in range(m):
                    res[i] -= B[i, j] * x[j]
        best, j = 0.0, np.int64(-1)                    # entering column: largest gradient B_j^T res > tol_j
        for jj in range(p):
            if passive[jj] or blocked[jj]:
                continue
            g = 0.0
            for i in range(m):
                g += B[i, jj] * res[i]
            if g > 1e-13 * colnorm[jj] and g > best:
                best, j = g, jj
        if j < 0:
            break
        k_new = _add_column(B, j, R, Qt, qf, order, k, c, 1e-12 * colnorm[j])
        if k_new == k:
            blocked[j] = True
            continue
        k = k_new
        passive[j] = True
        first = True
        while True:
            if solves >= max_solves:
                return x, res, solves, False
            solves += 1
            _back_substitute(R, qf, k, z)
            if first and z[k - 1] <= 0.0:
                k -= 1                                 # the new column is last: dropping it keeps Qt B_P = R
                for i in range(m):
                    R[i, k] = 0.0
                passive[j] = False
                blocked[j] = True
                break
            first = False
            allpos = True
            for t in range(k):
                if z[t] <= 0.0:
                    allpos = False
            if allpos:
                for t in range(k):
                    x[order[t]] = z[t]
                blocked[:] = False
                break
            step, tstep = np.inf, -1                   # move towards z until the first coordinate hits 0
            for t in range(k):
                if z[t] <= 0.0:
                    xt = x[order[t]]
                    if xt / (xt - z[t]) < step:
                        step, tstep = xt / (xt - z[t]), t
            for t in range(k):
                xt = x[order[t]]
                x[order[t]] = xt + step * (z[t] - xt)
            x[order[tstep]] = 0.0
            for t in range(k - 1, -1, -1):
                col = order[t]
                if x[col] * colnorm[col] <= 1e-13:     # its share of B x (‖f‖ = 1) is rounding
                    x[col] = 0.0
                    passive[col] = False
                    k = _remove_position(R, Qt, qf, order, t, k)
            blocked[:] = False
    r = np.zeros(m)                                    # r = f − B x = Qt^T [0; (Qt f)[k:]]
    for i in range(m):
        acc = 0.0
        for l in range(k, m):
            acc += Qt[l, i] * qf[l]
        r[i] = acc
    return x, r, solves, True


def solve_ldp(A: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """min ½‖w‖² s.t. A w ≥ 1 for A [p, n] as a least-distance program (Lawson & Hanson 1974, ch. 23).

    NNLS on B = [A'^T; 1^T], f = e_{n+1} for the rows A' = 2^−k A gives u ≥ 0 with residual r = f − B u; the
    constraints are infeasible iff r = 0, else w' = −r[:n] / r[n] is the solution of A' w' ≥ 1 and
    λ' = u / r[n] its multipliers. Since ‖r‖² = r[n] = 1 / (1 + ‖w'‖²), r[n] is resolved to full precision
    only for ‖w'‖ of order 1: k is chosen to put the largest |A'| in [1, 2), then, while ‖w'‖ ≥ RESCALE_NORM,
    lowered by log2(1/‖r‖) ≈ log2 ‖w'‖ and the problem solved again. Mapping back is exact:
    w = 2^−k w', λ = 2^−2k λ'. InfeasibleError when ‖r‖ ≤ INFEASIBLE_RESIDUAL (a convex combination of the
    rows of A' vanishes to rounding), SolverError when the NNLS does not converge.
    Returns (w [n], λ [p], NNLS least-squares solves over all passes).
    """
    p, n = A.shape
    if p == 0:
        return np.zeros(n), np.zeros(0), 0
    peak = float(np.abs(A).max()) if A.size else 0.0
    if peak == 0.0:
        raise InfeasibleError(f"the constraints A w >= 1 are infeasible: all {p} rows of A are zero")
    k = math.frexp(peak)[1] - 1
    max_solves = 10 * (p + n) + 100
    solves = 0
    for _ in range(MAX_PASSES):
        B = np.ascontiguousarray(np.vstack([np.ldexp(A, -k).T, np.ones((1, p))]))
        u, r, s, converged = nnls_kernel(B, max_solves)
        solves += s
        if not converged:
            raise SolverError(f"NNLS did not converge within {max_solves} least-squares solves")
        size = float(np.linalg.norm(r))
        if size <= INFEASIBLE_RESIDUAL:
            raise InfeasibleError(f"the constraints A w >= 1 are infeasible (a convex combination of the {p} rows "
                                  "of A vanishes)")
        if r[n] * RESCALE_NORM ** 2 > 1.0:
            return np.ldexp(-r[:n] / r[n], -k), np.ldexp(u / r[n], -2 * k), solves
        k += math.frexp(size)[1] - 1
    raise SolverError(f"NNLS did not reach a solution of norm below {RESCALE_NORM:g} after {MAX_PASSES} rescalings "
                      "of A")


def least_norm(A) -> tuple[np.ndarray, Certificate]:
    """w [n] = argmin ‖w‖ s.t. A w ≥ 1 for A [p, n], with its certificate.

    InfeasibleError when no w satisfies the constraints, SolverError when the optimum cannot be certified.
    """
    A = as_float("A", A, (None, None))
    w, lam, solves = solve_ldp(A)
    residual = w - A.T @ lam
    magnitude = float((np.abs(A) @ np.abs(w)).max()) if A.size else 0.0
    return w, certify(A @ w, lam, float(w @ w), float(residual @ residual), magnitude, solves)
