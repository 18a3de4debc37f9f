"""Max-margin solutions W_ov*, W_kq* and the correlation ρ (docs/twostage.md §5).

    W_ov* = argmin ‖W‖_F  s.t. (e_{n(x)} − e_v)^T W e_x ≥ 1   for all x in C, v ≠ n(x)
    W_kq* = argmin ‖W‖_F  s.t. (e_u − e_v)^T W e_q ≥ 1        for all q, (u, v) in R_q

Every constraint has the form (e_u − e_v)^T W e_q ≥ 1 for a triple (u, v, q). With orthonormal columns of
E the problems reduce to K x K matrices M (W = E M E^T, ‖W‖ = ‖M‖): W_ov* has the closed form
M[v, x] = 1[v = n(x)] − 1/K, W_kq* separates into one small QP per query column. Otherwise the least-norm QP
min ‖w‖ s.t. A w ≥ 1 over w = vec(W) (row-major) is solved by :func:`least_norm.solve_ldp`, which rescales
A so that neither the scale of E (W* of s·E is W* of E over s²) nor a large ‖W*‖ from badly conditioned E
reaches the NNLS.

Every solution comes with a :class:`~ntpref.twostage.least_norm.Certificate` computed on the returned W
and the original E (:func:`least_norm.certify`): margins ≥ 1 − 1e-9, λ ≥ 0 and |duality gap| ≤ 1e-12 ‖W‖²,
bounds relaxed only to the float64 resolution of the margins of W for badly conditioned E; otherwise
SolverError. Every failure of the general path names the array E.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from ..checks import as_float, as_int
from ..errors import InfeasibleError, InputError
from .dataset import Dataset, collocation_set
from .orders import check_realizable, observed_relations
from .least_norm import Certificate, SolverError, certify, solve_ldp

ORTHONORMAL_TOL = 1e-12  # max |E^T E - I| below which the orthonormal (closed-form / per-column) path is exact
METHODS = ("auto", "orthonormal", "qp")   # orthonormal: the K x K reduction (closed form / per-column QP)


# ---- the matrix problems -----------------------------------------------------------------------

def _orthonormal(E: np.ndarray) -> bool:
    d, K = E.shape
    return d >= K and float(np.abs(E.T @ E - np.eye(K)).max()) <= ORTHONORMAL_TOL


def _matrix_rows(E: np.ndarray, U: np.ndarray, V: np.ndarray, Q: np.ndarray) -> np.ndarray:
    """[p, d*d]: row i is vec((e_{U_i} − e_{V_i}) e_{Q_i}^T) in row-major order, so A vec(W) = margins."""
    D = (E[:, U] - E[:, V]).T
    return (D[:, :, None] * E[:, Q].T[:, None, :]).reshape(U.size, -1)


def _certify_matrix(E, W, U, V, Q, lam, iterations) -> Certificate:
    """certify for W [d, d] and triples (U, V, Q): margins (e_U − e_V)^T W e_Q with their magnitudes
    |e_U − e_V|^T |W| |e_Q|, dual E (Σ λ (e_U − e_V) e_Q^T) E^T."""
    D = E[:, U] - E[:, V]
    margins = np.einsum("dp,dp->p", D, (W @ E)[:, Q])
    magnitude = np.einsum("dp,dp->p", np.abs(D), (np.abs(W) @ np.abs(E))[:, Q])
    M_lam = np.zeros((E.shape[1], E.shape[1]))
    np.add.at(M_lam, (U, Q), lam)
    np.add.at(M_lam, (V, Q), -lam)
    residual = W - E @ M_lam @ E.T
    return certify(margins, lam, float(np.sum(W * W)), float(np.sum(residual * residual)),
                   float(magnitude.max()) if magnitude.size else 0.0, iterations)


def _check_separable(name: str, E: np.ndarray, U, V, Q) -> None:
    """InfeasibleError naming E when a constraint (e_u − e_v)^T W e_q ≥ 1 of `name` fails for every W because
    column q of E is zero or columns u and v are equal."""
    zero = ~E[:, Q].any(axis=0)
    same = ~(E[:, U] != E[:, V]).any(axis=0)
    for bad, what in ((zero, "column {q} is zero"), (same, "columns {u} and {v} are equal")):
        if bad.any():
            i = int(np.argmax(bad))
            u, v, q = U[i], V[i], Q[i]
            raise InfeasibleError(f"array 'E': {what.format(u=u, v=v, q=q)}, so (e_{u} - e_{v})^T W e_{q} = 0 < 1 "
                                  f"for every W ({name} does not exist)")


@contextmanager
def _failures_name_E(name: str, E: np.ndarray):
    """Re-raise a solver failure of problem `name` (InfeasibleError, SolverError) as one naming the array E."""
    try:
        yield
    except InfeasibleError:
        d, K = E.shape
        raise InfeasibleError(f"array 'E': {name} does not exist for these embeddings (E [{d}, {K}] has rank "
                              f"{np.linalg.matrix_rank(E)}): no W gives every margin (e_u - e_v)^T W e_q >= 1"
                              ) from None
    except SolverError as exc:
        sv = np.linalg.svd(E, compute_uv=False)
        cond = sv[0] / sv[-1] if sv[-1] > 0 else np.inf
        raise SolverError(f"array 'E' (condition number {cond:.3g}): {name}: {exc}") from None


def _qp_matrix(name: str, E, U, V, Q) -> tuple[np.ndarray, Certificate]:
    """General E: the least-norm QP over vec(W) for the triples (U, V, Q) of problem `name`, certified on the
    returned W."""
    _check_separable(name, E, U, V, Q)
    with _failures_name_E(name, E):
        w, lam, solves = solve_ldp(_matrix_rows(E, U, V, Q))
        W = w.reshape(E.shape[0], E.shape[0])
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
        return _qp_matrix("W_ov*", E, U, V, Q)
    M = np.zeros((K, K))
    M[:, C] = -1.0 / K
    M[succ[C], C] += 1.0
    W = E @ M @ E.T
    with _failures_name_E("W_ov*", E):
        return W, _certify_matrix(E, W, U, V, Q, np.full(U.size, 1.0 / K), 0)


def W_kq_star(ds: Dataset, *, method: str = "auto") -> tuple[np.ndarray, Certificate]:
    """W_kq* [d, d] = argmin ‖W‖_F s.t. (e_u − e_v)^T W e_q ≥ 1 for every query q and (u, v) in R_q.

    The dataset must be realizable (InfeasibleError naming the offending sentence, or the cycle of R_q).
    method "auto": with orthonormal E, W = E M E^T where column q of M is m_q = argmin ‖m‖² s.t.
    m_u − m_v ≥ 1 for (u, v) in R_q (tokens in no pair get 0, columns of queries without relations are 0),
    each solved by :func:`least_norm.solve_ldp`; the full QP over vec(W) otherwise. "orthonormal" / "qp" force one.
    """
    check_realizable(ds)
    R = observed_relations(ds)
    triples = np.array(sorted((q, u, v) for q, pairs in R.items() for u, v in pairs), dtype=np.int64).reshape(-1, 3)
    Q, U, V = triples.T
    E, K = ds.E, ds.K
    if not _use_orthonormal(E, method):
        return _qp_matrix("W_kq*", E, U, V, Q)
    M = np.zeros((K, K))
    lam = np.zeros(U.size)
    solves = 0
    with _failures_name_E("W_kq*", E):
        for q in np.unique(Q):
            rows = np.flatnonzero(Q == q)
            A = np.zeros((rows.size, K))
            A[np.arange(rows.size), U[rows]] = 1.0
            A[np.arange(rows.size), V[rows]] -= 1.0
            M[:, q], lam[rows], s = solve_ldp(A)
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
