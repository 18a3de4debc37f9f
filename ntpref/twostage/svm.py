"""Max-margin solutions W_ov*, W_kq* and the correlation ρ (spec/twostage.md §5).

    W_ov* = argmin ‖W‖_F  s.t. (e_{n(x)} − e_v)^T W e_x ≥ 1   for all x in C, v ≠ n(x)
    W_kq* = argmin ‖W‖_F  s.t. (e_u − e_v)^T W e_q ≥ 1        for all q, (u, v) in R_q

Every constraint has the form (e_u − e_v)^T W e_q ≥ 1 for a triple (u, v, q). With orthonormal columns of
E the problems reduce to K x K matrices M (W = E M E^T, ‖W‖ = ‖M‖): W_ov* has the closed form
M[v, x] = 1[v = n(x)] − 1/K, W_kq* separates into one small QP per query column. Otherwise the least-norm QP
min ‖w‖ s.t. A w ≥ 1 over w = vec(W) (row-major) is solved as a least-distance program through
Lawson–Hanson NNLS (:func:`least_norm`).

Every solution comes with a :class:`Certificate` computed on the returned W itself: the smallest margin,
the largest violation of dual feasibility (λ ≥ 0) and the duality gap P(W) − D(λ) with
P(W) = ½‖W‖², D(λ) = Σλ − ½‖Σ_i λ_i A_i‖². Margins ≥ 1 − 1e-9, λ ≥ 0 and |gap| ≤ 1e-10 prove W optimal up to
rounding (weak duality: ½‖W − W*‖² ≤ gap for feasible W); a solution that fails them raises
:class:`SolverError`, never returns silently. (For ‖W‖² > ~7000, which only badly conditioned E produce, the
gap bound is the float64 floor 64 eps ‖W‖² instead.)
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..checks import as_float, as_int
from ..errors import InfeasibleError, InputError, NtprefError
from .data import Dataset, check_realizable, collocation_set, observed_relations

MARGIN_TOL = 1e-9      # every margin >= 1 - MARGIN_TOL
GAP_TOL = 1e-10        # |duality gap| <= max(GAP_TOL, GAP_ROUNDING * ‖w‖²)
GAP_ROUNDING = 64 * np.finfo(np.float64).eps   # float64 floor of the gap; exceeds GAP_TOL only for ‖w‖² > ~7000
ORTHONORMAL_TOL = 1e-12  # max |E^T E - I| below which the orthonormal (closed-form / per-column) path is exact
METHODS = ("auto", "orthonormal", "qp")   # orthonormal: the K x K reduction (closed form / per-column QP)


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


def _certify(margins: np.ndarray, lam: np.ndarray, w_sq: float, stationarity_sq: float,
             iterations: int) -> Certificate:
    """Certificate from the margins A w, the multipliers λ, ‖w‖² and ‖w − A^T λ‖²; SolverError if it fails.

    The gap is evaluated as Σ λ_i (a_i^T w − 1) + ½‖w − A^T λ‖² (equal to P − D, without its cancellation).
    Its bound is GAP_TOL, raised to the rounding floor GAP_ROUNDING ‖w‖² for very large norms (badly
    conditioned E), where float64 cannot resolve 1e-10 of Σλ = ‖w‖².
    """
    gap_tol = max(GAP_TOL, GAP_ROUNDING * w_sq)
    cert = Certificate(float(margins.min()) if margins.size else float("inf"),
                       max(0.0, -float(lam.min())) if lam.size else 0.0,
                       float(lam @ (margins - 1.0) + 0.5 * stationarity_sq), int(iterations))
    if not (cert.min_margin >= 1.0 - MARGIN_TOL and cert.max_dual_violation == 0.0
            and abs(cert.duality_gap) <= gap_tol):
        raise SolverError(f"least-norm solution not certified: min margin {cert.min_margin!r} (need >= 1 - "
                          f"{MARGIN_TOL}), dual violation {cert.max_dual_violation!r}, duality gap "
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
        _givens_rows(Qt, i, c, s, 0, m)
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
def _forward_substitute(R, rhs, k, z):
    """z[:k] = R[:k, :k]^{-T} rhs[:k]."""
    for i in range(k):
        acc = rhs[i]
        for l in range(i):
            acc -= R[l, i] * z[l]
        z[i] = acc / R[i, i]


@njit(cache=True)
def _ldp_kernel(B, max_solves):
    """Lawson–Hanson NNLS min ‖B x − e_{m−1}‖ s.t. x ≥ 0 on B = [A^T; 1^T] [m = n+1, p], then λ = x / (1 − Σx).

    The passive columns live in a QR factorisation Qt B_P = R updated when a column enters (Householder) or
    leaves (Givens). A column that is numerically dependent on the passive ones, or whose first solve would
    not enter positively, is blocked until x moves (this prevents add/drop loops). Finally λ on the passive
    set P is refined with the same factor so that A_P w = 1 to rounding: R^T R = G + 1 1^T with G = A_P A_P^T
    and (G + 1 1^T) x_P = 1, so for ρ = 1 − A_P w, y = (R^T R)^{-1} ρ and δ = y + (Σy / (1 − Σx)) x_P solve
    G δ = ρ even when G is singular.
    Returns (λ [p], least-squares solves, status 0 ok | 1 solve limit | 2 infeasible).
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
    tol = 1e-13 * max(1.0, colnorm.max())
    k = 0
    solves = 0
    while k < m:
        for i in range(m):                             # res = f − B x
            res[i] = 0.0
        res[n] = 1.0
        for j in range(p):
            if x[j] != 0.0:
                for i in range(m):
                    res[i] -= B[i, j] * x[j]
        best, j = tol, -1                              # entering column: largest gradient B_j^T res > tol
        for jj in range(p):
            if passive[jj] or blocked[jj]:
                continue
            g = 0.0
            for i in range(m):
                g += B[i, jj] * res[i]
            if g > best:
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
                return x, solves, 1
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
                if x[col] <= tol:
                    x[col] = 0.0
                    passive[col] = False
                    k = _remove_position(R, Qt, qf, order, t, k)
            blocked[:] = False
    total = 0.0
    for j in range(p):
        total += x[j]
    slack = 1.0 - total
    if slack <= 1e3 * np.finfo(np.float64).eps:
        return x, solves, 2
    lam = x / slack
    w = np.zeros(n)
    y = np.zeros(m)
    last = np.inf
    for _ in range(3):
        for i in range(n):                             # w = A^T λ
            acc = 0.0
            for j in range(p):
                acc += B[i, j] * lam[j]
            w[i] = acc
        worst = 0.0
        for t in range(k):                             # ρ = 1 − A_P w (stored in res)
            acc = 1.0
            for i in range(n):
                acc -= B[i, order[t]] * w[i]
            res[t] = acc
            worst = max(worst, abs(acc))
        if worst >= last:                              # the previous step did not help: undo it
            for t in range(k):
                lam[order[t]] -= y[t]
            break
        last = worst
        _forward_substitute(R, res, k, c)
        _back_substitute(R, c, k, y)
        sy = 0.0
        for t in range(k):
            sy += y[t]
        ok = True
        for t in range(k):
            y[t] += sy / slack * x[order[t]]
            if lam[order[t]] + y[t] <= 0.0:
                ok = False
        if not ok:
            break
        for t in range(k):
            lam[order[t]] += y[t]
    return lam, solves, 0


def _solve_ldp(A: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """min ½‖w‖² s.t. A w ≥ 1 as a least-distance program (Lawson & Hanson 1974, ch. 23).

    NNLS on B = [A^T; 1^T], f = e_{n+1} gives u ≥ 0 with residual r = B u − f; the constraints are infeasible
    iff r = 0, else λ = u / (1 − Σu) are the optimal multipliers and w = A^T λ. Returns (w, λ, solves).
    """
    p, n = A.shape
    if p == 0:
        return np.zeros(n), np.zeros(0), 0
    B = np.ascontiguousarray(np.vstack([A.T, np.ones((1, p))]))
    max_solves = 10 * (p + n) + 100
    lam, solves, status = _ldp_kernel(B, max_solves)
    if status == 1:
        raise SolverError(f"NNLS did not converge within {max_solves} least-squares solves")
    if status == 2:
        raise InfeasibleError(f"the constraints A w >= 1 are infeasible (a convex combination of the {p} rows "
                              "of A vanishes)")
    return A.T @ lam, lam, solves


def least_norm(A) -> tuple[np.ndarray, Certificate]:
    """w [n] = argmin ‖w‖ s.t. A w ≥ 1 for A [p, n], with its certificate.

    InfeasibleError when no w satisfies the constraints, SolverError when the optimum cannot be certified.
    """
    A = as_float("A", A, (None, None))
    w, lam, solves = _solve_ldp(A)
    return w, _certify(A @ w, lam, float(w @ w), 0.0, solves)


# ---- the matrix problems -----------------------------------------------------------------------

def _orthonormal(E: np.ndarray) -> bool:
    d, K = E.shape
    return d >= K and float(np.abs(E.T @ E - np.eye(K)).max()) <= ORTHONORMAL_TOL


def _matrix_rows(E: np.ndarray, U: np.ndarray, V: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """[p, d*d]: row i is vec((e_{U_i} − e_{V_i}) e_{Q_i}^T) in row-major order, so A vec(W) = margins."""
    D = (E[:, U] - E[:, V]).T
    return (D[:, :, None] * E[:, Q].T[:, None, :]).reshape(U.size, -1)


def _certify_matrix(E, W, U, V, Q, lam, iterations) -> Certificate:
    """_certify for W [d, d] and triples (U, V, Q): margins (e_U − e_V)^T W e_Q, dual E (Σ λ (e_U − e_V) e_Q^T) E^T."""
    EWE = E.T @ W @ E
    M_lam = np.zeros((E.shape[1], E.shape[1]))
    np.add.at(M_lam, (U, Q), lam)
    np.add.at(M_lam, (V, Q), -lam)
    residual = W - E @ M_lam @ E.T
    return _certify(EWE[U, Q] - EWE[V, Q], lam, float(np.sum(W * W)), float(np.sum(residual * residual)), iterations)


def _qp_matrix(E, U, V, Q) -> tuple[np.ndarray, Certificate]:
    """General E: the least-norm QP over vec(W), certified on the returned W."""
    d = E.shape[0]
    w, lam, solves = _solve_ldp(_matrix_rows(E, U, V, Q))
    W = w.reshape(d, d)
    return W, _certify_matrix(E, W, U, V, Q, lam, solves)


def _use_orthonormal(E: np.ndarray, method: str) -> bool:
    if method not in METHODS:
        raise InputError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    if method == "qp":
        return False
    orthonormal = _orthonormal(E)
    if method == "orthonormal" and not orthonormal:
        raise InputError(f"method 'orthonormal' needs E with orthonormal columns (max |E^T E - I| <= {ORTHONORMAL_TOL})")
    return orthonormal


def W_ov_star(E, succ, C=None, *, method: str = "auto") -> tuple[np.ndarray, Certificate]:
    """W_ov* [d, d] = argmin ‖W‖_F s.t. (e_{n(x)} − e_v)^T W e_x ≥ 1 for x in C, v ≠ n(x); with certificate.

    E [d, K]; succ [K] (n, −1 = none); C: distinct tokens with a successor (default: every x with succ[x] ≥ 0).
    method "auto" uses the closed form E M E^T, M[v, x] = 1[v = n(x)] − 1/K (x in C, else 0; multipliers all
    1/K, ‖W_ov*‖² = |C|(K−1)/K) when E has orthonormal columns, the QP otherwise; "orthonormal" / "qp" force one.
    """
    E = as_float("E", E, (None, None))
    K = E.shape[1]
    succ = as_int("succ", succ, (K,), low=-1, high=K - 1)
    C = collocation_set(succ, C)
    X = np.repeat(C, K)
    Vall = np.tile(np.arange(K), C.size)
    keep = Vall != succ[X]
    U, V, Q = succ[X][keep], Vall[keep], X[keep]
    if not _use_orthonormal(E, method):
        return _qp_matrix(E, U, V, Q)
    M = np.zeros((K, K))
    M[:, C] = -1.0 / K
    M[succ[C], C] += 1.0
    W = E @ M @ E.T
    return W, _certify_matrix(E, W, U, V, Q, np.full(U.size, 1.0 / K), 0)


def W_kq_star(ds: Dataset, *, method: str = "auto") -> tuple[np.ndarray, Certificate]:
    """W_kq* [d, d] = argmin ‖W‖_F s.t. (e_u − e_v)^T W e_q ≥ 1 for every query q and (u, v) in R_q.

    The dataset must be realizable (InfeasibleError naming the offending sentence, or the cycle of R_q).
    method "auto": with orthonormal E, W = E M E^T where column q of M is m_q = argmin ‖m‖² s.t.
    m_u − m_v ≥ 1 for (u, v) in R_q (tokens in no pair get 0, columns of queries without relations are 0),
    each solved by :func:`least_norm`'s solver; the full QP over vec(W) otherwise. "orthonormal" / "qp" force one.
    """
    check_realizable(ds)
    R = observed_relations(ds)
    triples = np.array(sorted((q, u, v) for q, pairs in R.items() for u, v in pairs), dtype=np.int64).reshape(-1, 3)
    Q, U, V = triples.T
    E, K = ds.E, ds.K
    if not _use_orthonormal(E, method):
        return _qp_matrix(E, U, V, Q)
    M = np.zeros((K, K))
    lam = np.zeros(U.size)
    solves = 0
    for q in np.unique(Q):
        rows = np.flatnonzero(Q == q)
        A = np.zeros((rows.size, K))
        A[np.arange(rows.size), U[rows]] = 1.0
        A[np.arange(rows.size), V[rows]] -= 1.0
        M[:, q], lam[rows], s = _solve_ldp(A)
        solves += s
    W = E @ M @ E.T
    return W, _certify_matrix(E, W, U, V, Q, lam, solves)


def rho(W, W_star) -> float:
    """Correlation ρ(W, W*) = ⟨W, W*⟩ / (‖W‖_F ‖W*‖_F), 0 when either matrix is zero.

    (The distance of the normalised matrices is √(2 − 2ρ).)
    """
    W = as_float("W", W)
    W_star = as_float("W_star", W_star)
    if W.shape != W_star.shape:
        raise InputError(f"arrays 'W' and 'W_star': shapes differ, {list(W.shape)} vs {list(W_star.shape)}")
    nw, ns = float(np.linalg.norm(W)), float(np.linalg.norm(W_star))
    if nw == 0.0 or ns == 0.0:
        return 0.0
    return float(np.vdot(W, W_star)) / (nw * ns)
