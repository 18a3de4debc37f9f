"""The max-margin solutions of docs/twostage.md §5 in multiprecision: the least-norm QP

    W* = argmin ‖W‖_F  s.t.  (e_u − e_v)ᵀ W e_q ≥ 1   for every constraint (u, v, q)

over W [d][d] (e_v the columns of E), solved exactly on an active set and certified by its KKT conditions.

With w = vec(W) (row-major) constraint i is a_iᵀ w ≥ 1, a_i = vec((e_u − e_v) e_qᵀ), and the Gram matrix of
the rows is ⟨a_i, a_j⟩ = (e_u − e_v)ᵀ(e_u' − e_v') · e_qᵀ e_q', read off the column Gram matrix EᵀE. The
problem is convex with linear constraints, so the KKT conditions are necessary and sufficient: W is the
optimum if and only if, for some λ [p],

    W = Σ_i λ_i (e_u − e_v) e_qᵀ   (stationarity),   λ ≥ 0,   m_i = (e_u − e_v)ᵀ W e_q ≥ 1,
    λ_i (m_i − 1) = 0              (complementarity).

W* is unique (a strictly convex objective); λ need not be, when the active rows are linearly dependent.
The method:

1. Blocks. Rows whose queries have e_qᵀ e_q' = 0 (exactly, in mpmath) are orthogonal, so the QP separates
   into the blocks of queries connected by a nonzero e_qᵀ e_q' (E = I_K: one block per query column of W;
   a general E: one block).
2. A candidate active set per block: Goldfarb and Idnani's dual active-set method in float64 (numpy) on the
   block's rows (:func:`candidate`), which ends with linearly independent active rows and multipliers ≥ 0.
3. In mpmath, on the candidate set S: the least-norm solution of the equalities a_iᵀ w = 1, i ∈ S
   (:func:`least_norm_on`: a pivoted Cholesky factorisation of the Gram matrix G_SS keeps an independent
   subset B of S, the rows in the span of the others being dropped, and λ_B = G_BB⁻¹ 1), and the margins of
   every row of the block, G λ. If some λ_i < 0 the most negative row leaves the set; otherwise if some
   margin is below 1 the most violated row joins it; then step 3 repeats (at most REPAIRS times per row of
   the block, then UncertifiedError). Otherwise the block is solved.
4. W* = Σ λ_i (e_u − e_v) e_qᵀ over all blocks, and :func:`kkt` checks every condition on that W, its margins
   formed from W itself, to TOL; an uncertified solution raises UncertifiedError.

The functions other than :func:`candidate` and :func:`least_norm` (which sets it) run inside the exact
arithmetic, ``arith.exact()``.
"""
from __future__ import annotations

from typing import NamedTuple

import mpmath
import numpy as np

from ..errors import InfeasibleError, NtprefError
from .arith import exact, flatten, norm, zeros

#: The KKT conditions hold to TOL: margins ≥ 1 − TOL, λ ≥ −TOL·max|λ|, |λ_i (m_i − 1)| ≤ TOL·max|λ|,
#: ‖W − Σ λ_i a_i‖_F ≤ TOL·‖W‖_F (50-digit rounding leaves them near 1e-49).
TOL = mpmath.mpf("1e-40")
#: A row of the candidate set whose Cholesky pivot (its squared distance from the span of the rows kept
#: before it) is below DEPENDENT times its squared norm lies in that span: sin² of its angle ≤ 1e-30, far
#: beyond what float64 data resolve and far above the 1e-49 of 50-digit rounding of an exact dependence.
DEPENDENT = mpmath.mpf("1e-30")
#: Changes of the active set in mpmath allowed per row of a block before UncertifiedError.
REPAIRS = 4
_FLOAT_TOL = 1e-12          # float64 candidate: margins ≥ 1 − 1e-12 end it
_FLOAT_DEPENDENT = 1e-10    # float64 candidate: a row with |z| ≤ 1e-10 |a| is in the span of the active rows


class UncertifiedError(NtprefError):
    """No active set whose least-norm solution satisfies the KKT conditions to TOL was found."""


class Solution(NamedTuple):
    """W* [d][d] and the multipliers λ [p] of the constraints (0 off the active set)."""

    W: list
    lam: list


class KKT(NamedTuple):
    """The violations of the KKT conditions by (W, λ) (module docstring), each ≤ TOL for a certified optimum:
    ``primal`` = max(0, max_i 1 − m_i), ``dual`` = max(0, −min λ)/max|λ|, ``complementarity`` =
    max_i |λ_i (m_i − 1)|/max|λ|, ``stationarity`` = ‖W − Σ λ_i (e_u − e_v) e_qᵀ‖_F / ‖W‖_F (absolute when
    W = 0); ``margins`` [p] the m_i."""

    primal: mpmath.mpf
    dual: mpmath.mpf
    complementarity: mpmath.mpf
    stationarity: mpmath.mpf
    margins: list

    @property
    def ok(self) -> bool:
        return max(self.primal, self.dual, self.complementarity, self.stationarity) <= TOL


def least_norm(columns: list, constraints: list) -> Solution:
    """W* = argmin ‖W‖_F s.t. (e_u − e_v)ᵀ W e_q ≥ 1 for every (u, v, q) of ``constraints``, ``columns[v]``
    = e_v [d] (mpf); certified by :func:`kkt` (module docstring), else UncertifiedError; InfeasibleError when
    no W satisfies the constraints. No constraint gives W* = 0. Solved in the exact arithmetic whatever
    arithmetic the caller runs in (:func:`ntpref.exact.arith.exact`)."""
    with exact():
        return _least_norm(columns, constraints)


def _least_norm(columns: list, constraints: list) -> Solution:
    C = [[mpmath.fdot(a, b) for b in columns] for a in columns]          # EᵀE
    E64 = np.array([[float(x) for x in e] for e in columns]).T           # E [d, K], exact
    lam, G = [mpmath.mpf(0)] * len(constraints), _Gram(C, constraints)
    for rows in blocks(C, constraints):
        A = np.array([np.outer(E64[:, u] - E64[:, v], E64[:, q]).ravel() for u, v, q in
                      (constraints[i] for i in rows)])
        A = A[:, A.any(axis=0)]                                          # the block's coordinates of vec(W)
        solved = _solve_block(rows, G, [rows[k] for k in candidate(A)])
        for i, value in solved.items():
            lam[i] = value
    W = combination(columns, constraints, lam)
    check = kkt(columns, constraints, W, lam)
    if not check.ok:
        raise UncertifiedError(f"least-norm solution not certified: primal {check.primal}, dual {check.dual}, "
                               f"complementarity {check.complementarity}, stationarity {check.stationarity} "
                               f"(need <= {TOL})")
    return Solution(W, lam)


def blocks(C: list, constraints: list) -> list[list[int]]:
    """The constraint indices grouped by the connected components of their queries under C[q][q'] ≠ 0 (C =
    EᵀE [K][K]): rows of different groups are orthogonal. In order of each group's first constraint."""
    queries = sorted({q for _, _, q in constraints})
    group = {}
    for q in queries:                                     # depth-first search over the queries
        if q in group:
            continue
        stack, group[q] = [q], q
        while stack:
            a = stack.pop()
            for b in queries:
                if b not in group and C[a][b] != 0:
                    group[b] = q
                    stack.append(b)
    out: dict[int, list[int]] = {}
    for i, (_, _, q) in enumerate(constraints):
        out.setdefault(group[q], []).append(i)
    return list(out.values())


class _Gram:
    """The Gram entries ⟨a_i, a_j⟩ = (C_uu' − C_uv' − C_vu' + C_vv') C_qq' of the constraints (C = EᵀE), each
    formed once."""

    def __init__(self, C: list, constraints: list):
        self.C, self.constraints, self.cache = C, constraints, {}

    def __call__(self, i: int, j: int) -> mpmath.mpf:
        key = (i, j) if i <= j else (j, i)
        if key not in self.cache:
            (u, v, q), (u2, v2, q2), C = self.constraints[i], self.constraints[j], self.C
            self.cache[key] = (C[u][u2] - C[u][v2] - C[v][u2] + C[v][v2]) * C[q][q2]
        return self.cache[key]


def candidate(A: np.ndarray) -> list[int]:
    """The active rows of min ½‖w‖² s.t. A w ≥ 1 (A [p, n] float64) by Goldfarb and Idnani's dual method:
    from w = 0 and no active row, take the most violated row a; move w along z, the part of a orthogonal to
    the active rows N (z = a − N r, r = N⁺a), and the multipliers along −r (u ← u − t r, u_a ← u_a + t), by
    the full step t = (1 − aᵀw)/‖z‖² that makes a active, or by the partial step at which an active
    multiplier reaches 0 first (that row leaves; a dependent a, z = 0, takes only partial steps); until every
    margin is ≥ 1 − 1e-12, or REPAIRS·p rows have been added (the mpmath step repairs a set that is not the
    final one). The active rows are independent and their multipliers ≥ 0. InfeasibleError when a violated
    row is a nonpositive combination of the active ones (no w satisfies A w ≥ 1)."""
    w, active, u = np.zeros(A.shape[1]), [], np.zeros(0)
    for _ in range(REPAIRS * len(A)):
        k = int(np.argmin(A @ w))
        if A[k] @ w >= 1.0 - _FLOAT_TOL:
            break
        a, u_k = A[k], 0.0
        while True:
            if active:
                Q, R = np.linalg.qr(A[active].T)
                r = np.linalg.solve(R, Q.T @ a)
                z = a - Q @ (Q.T @ a)
            else:
                r, z = np.zeros(0), a
            full = (1.0 - a @ w) / (z @ z) if np.linalg.norm(z) > _FLOAT_DEPENDENT * np.linalg.norm(a) else np.inf
            blocking = np.flatnonzero(r > _FLOAT_TOL * np.abs(r).max(initial=0.0))
            ratios = u[blocking] / r[blocking]
            partial = ratios.min(initial=np.inf)
            if full == np.inf == partial:
                raise InfeasibleError("the constraints are infeasible: one is a nonpositive combination of "
                                      "constraints it must exceed (for W_kq*: a cycle of observed relations)")
            t = min(full, partial)
            if full < np.inf:
                w = w + t * z
            u, u_k = u - t * r, u_k + t
            if full <= partial:
                active.append(k)
                u = np.append(u, u_k)
                break
            leaving = int(blocking[np.argmin(ratios)])
            del active[leaving]
            u = np.delete(u, leaving)
    return active


def _solve_block(rows: list[int], G: _Gram, S: list[int]) -> dict[int, mpmath.mpf]:
    """λ of one block's independent active rows (index → λ_i), from the candidate set S: step 3 of the module
    docstring."""
    for _ in range(REPAIRS * len(rows) + 1):
        basis, lam = least_norm_on(S, G)
        negative = min(range(len(lam)), key=lam.__getitem__, default=None)
        if negative is not None and lam[negative] < -TOL * max(map(abs, lam)):
            S = basis[:negative] + basis[negative + 1:]
            continue
        margins = {i: mpmath.fdot([G(i, j) for j in basis], lam) for i in rows}
        worst = min(rows, key=margins.__getitem__)
        if margins[worst] < 1 - TOL:
            S = [worst] + basis                  # first: a row in the span of B then replaces one of B
            continue
        return dict(zip(basis, lam))
    raise UncertifiedError(f"no certified active set for the block of constraints {rows[:8]}"
                           f"{' ...' if len(rows) > 8 else ''} after {REPAIRS * len(rows) + 1} tries")


def least_norm_on(S: list[int], G) -> tuple[list[int], list]:
    """The least-norm w with a_iᵀ w = 1 for i in S, as (B, λ_B), w = Σ_{i∈B} λ_i a_i: a Cholesky factorisation
    G_BB = L Lᵀ with diagonal pivoting (the row of largest pivot relative to its ⟨a_i, a_i⟩ first), ended when
    every remaining pivot is ≤ DEPENDENT·⟨a_i, a_i⟩ (those rows lie in the span of B); λ_B = L⁻ᵀ L⁻¹ 1.
    ``G(i, j)`` = ⟨a_i, a_j⟩. B is in pivot order; the rows of S \\ B get a_iᵀ w = 1 only if consistent."""
    residual = {i: G(i, i) for i in S}
    basis, columns = [], []                       # columns[c][i] = L[i, c] over the rows of S
    while residual:
        k = max(residual, key=lambda i: residual[i] / G(i, i))
        if residual[k] <= DEPENDENT * G(k, k):
            break
        pivot = mpmath.sqrt(residual.pop(k))
        column = {i: (G(i, k) - mpmath.fdot([c[i] for c in columns], [c[k] for c in columns])) / pivot
                  for i in residual}
        column[k] = pivot
        for i in residual:
            residual[i] -= column[i] ** 2
        basis.append(k)
        columns.append(column)
    y = []
    for r, i in enumerate(basis):                 # L y = 1
        y.append((1 - mpmath.fdot([columns[c][i] for c in range(r)], y)) / columns[r][i])
    lam = [mpmath.mpf(0)] * len(basis)
    for r in reversed(range(len(basis))):         # Lᵀ λ = y
        lam[r] = (y[r] - mpmath.fdot([columns[r][basis[c]] for c in range(r + 1, len(basis))],
                                     lam[r + 1:])) / columns[r][basis[r]]
    return basis, lam


def combination(columns: list, constraints: list, lam: list) -> list:
    """Σ_i λ_i (e_u − e_v) e_qᵀ [d][d], summed per query: Σ_q D_q e_qᵀ with D_q = Σ_{i: q_i = q} λ_i (e_u − e_v)."""
    d = len(columns[0])
    D = {}
    for (u, v, q), value in zip(constraints, lam, strict=True):
        D.setdefault(q, []).append((value, u, v))
    directions = {q: [mpmath.fsum(x * (columns[u][j] - columns[v][j]) for x, u, v in terms) for j in range(d)]
                  for q, terms in D.items()}
    if not directions:
        return zeros(d, d)
    return [[mpmath.fdot([g[j] for g in directions.values()], [columns[q][k] for q in directions])
             for k in range(d)] for j in range(d)]


def kkt(columns: list, constraints: list, W: list, lam: list) -> KKT:
    """The KKT violations of (W [d][d], λ [p]) for the constraints (u, v, q) (:class:`KKT`); the margins
    m_i = (e_u − e_v)ᵀ (W e_q) are formed from W."""
    d = len(columns[0])
    We = {q: [mpmath.fdot(row, columns[q]) for row in W] for q in {q for _, _, q in constraints}}
    margins = [mpmath.fdot([columns[u][j] - columns[v][j] for j in range(d)], We[q]) for u, v, q in constraints]
    scale = max((abs(x) for x in lam), default=mpmath.mpf(0))
    relative = (lambda x: x / scale) if scale else (lambda x: x)
    residual = norm([a - b for a, b in zip(flatten(W), flatten(combination(columns, constraints, lam)))])
    size = norm(W)
    zero = mpmath.mpf(0)
    return KKT(primal=max([zero] + [1 - m for m in margins]),
               dual=relative(max([zero] + [-x for x in lam])),
               complementarity=relative(max([zero] + [abs(x * (m - 1)) for x, m in zip(lam, margins)])),
               stationarity=residual / size if size else residual,
               margins=margins)
