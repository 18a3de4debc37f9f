"""The max-margin QP against the scale and the conditioning of E (docs/twostage.md §5).

Scaling E by s scales every margin (e_u − e_v)^T W e_q by s², so W*(s E) = W*(E) / s². Badly conditioned E
are checked against solutions found without the solver: with orthogonal columns of chosen norms,
E = Q D, W = Q D^−1 M D^−1 Q^T and ‖W‖² = Σ M_vq² / (d_v d_q)², so each column of M = E^T W E solves
min Σ_v m_v² / d_v² s.t. m_u − m_v ≥ 1 on its own: W_ov* in closed form, W_kq* by enumerating active sets
in exact rational arithmetic.
"""
from fractions import Fraction
from itertools import combinations

import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import InfeasibleError
from ntpref.npzio import load_npz, save_npz
from ntpref.twostage import Dataset, W_kq_star, W_ov_star, five_token_example, observed_relations
from ntpref.twostage.least_norm import least_norm

SCALES = [1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1e3]
FIVE = five_token_example()


def E0():
    """The fixed general embedding: a 5 x 5 Gaussian matrix."""
    return np.random.default_rng(2024).standard_normal((5, 5))


def with_E(ds, E):
    return Dataset(ds.tokens, ds.lengths, ds.targets, E, ds.succ)


def assert_certified(cert, W, floor=0.0):
    """The certificate's bounds, free of the scale of E: margins ≥ 1 − max(1e-9, floor), λ ≥ 0,
    |gap| ≤ max(1e-12, floor) ‖W‖² (floor: the float64 resolution of the margins, :func:`margin_floor`)."""
    assert cert.min_margin >= 1 - max(1e-9, floor)
    assert cert.max_dual_violation == 0.0
    assert abs(cert.duality_gap) <= max(1e-12, floor) * np.sum(W * W)


def kq_triples(ds):
    return [(u, v, q) for q, pairs in observed_relations(ds).items() for u, v in pairs]


def ov_triples(succ):
    return [(succ[x], v, x) for x in range(len(succ)) for v in range(len(succ)) if v != succ[x]]


def margin_floor(E, W, triples_):
    """64 eps max |e_u − e_v|^T |W| |e_q|: the float64 resolution of the margins of W."""
    return 64 * np.finfo(float).eps * max(np.abs(E[:, u] - E[:, v]) @ np.abs(W) @ np.abs(E[:, q])
                                          for u, v, q in triples_)


def margins(E, W, triples_):
    """(e_u − e_v)^T W e_q, from the definition."""
    return np.array([(E[:, u] - E[:, v]) @ W @ E[:, q] for u, v, q in triples_])


@pytest.mark.parametrize("s", SCALES)
def test_W_star_scales_as_one_over_s_squared(s):
    E = E0()
    for solve, rows in ((lambda E: W_ov_star(E, FIVE.succ), ov_triples(FIVE.succ)),
                        (lambda E: W_kq_star(with_E(FIVE, E)), kq_triples(FIVE))):
        W1, _ = solve(E)
        W, cert = solve(s * E)
        np.testing.assert_allclose(W * s**2, W1, rtol=1e-11, atol=1e-11 * np.abs(W1).max())
        assert_certified(cert, W)
        assert margins(s * E, W, rows).min() == pytest.approx(1.0, abs=1e-9)   # on the boundary, from the definition


@pytest.mark.parametrize("s", [1e-6, 1e-3, 1.0, 1e3, 1e6])
def test_least_norm_scales(s):
    A = np.array([[1.0, 0.0], [1.0, 1.0], [2.0, -1.0]])
    w, cert = least_norm(s * A)
    np.testing.assert_allclose(w * s, [1.0, 0.0], atol=1e-13)
    assert cert.min_margin == pytest.approx(1.0, abs=1e-13)
    assert abs(cert.duality_gap) <= 1e-12 * (w @ w)
    with pytest.raises(InfeasibleError, match="infeasible"):
        least_norm(s * np.array([[1.0, 0.0], [-1.0, 0.0]]))


# ---- badly conditioned E with a solution known without the solver ------------------------------

def orthogonal_embedding(exponents):
    """E [8, K] = Q D with orthonormal Q = first K columns of I − ¼ 1 1^T and D = diag(2^exponents): every
    entry exact in float64, so E is exactly Q D. Returns (E, Q, d)."""
    K = len(exponents)
    Q = (np.eye(8) - 0.25)[:, :K]
    d = np.ldexp(1.0, np.asarray(exponents))
    return Q * d, Q, d


def column_qp(d, pairs):
    """Exact argmin Σ_v m_v² / d_v² s.t. m_u − m_v ≥ 1 for (u, v) in pairs, by enumerating active sets.

    KKT: m = diag(d²) C^T λ; an active set S with C_S diag(d²) C_S^T λ_S = 1, λ_S ≥ 0 and C m ≥ 1 is optimal."""
    w = [Fraction(float(x)) ** 2 for x in d]
    K = len(d)

    def m_of(S, lam):
        m = [Fraction(0)] * K
        for (u, v), l in zip(S, lam):
            m[u] += w[u] * l
            m[v] -= w[v] * l
        return m

    for size in range(1, len(pairs) + 1):
        for S in combinations(sorted(pairs), size):
            G = [[(w[u] * ((u == u2) - (u == v2)) - w[v] * ((v == u2) - (v == v2))) for (u2, v2) in S]
                 for (u, v) in S]
            lam = _solve_exact(G, [Fraction(1)] * size)
            if lam is None or min(lam) < 0:
                continue
            m = m_of(S, lam)
            if all(m[u] - m[v] >= 1 for u, v in pairs):
                return m
    raise AssertionError("no active set satisfies the KKT conditions")


def _solve_exact(G, b):
    """Gauss–Jordan elimination over the rationals; None when G is singular."""
    n = len(b)
    M = [row[:] + [b[i]] for i, row in enumerate(G)]
    for c in range(n):
        piv = next((r for r in range(c, n) if M[r][c] != 0), None)
        if piv is None:
            return None
        M[c], M[piv] = M[piv], M[c]
        for r in range(n):
            if r != c and M[r][c] != 0:
                f = M[r][c] / M[c][c]
                M[r] = [a - f * b_ for a, b_ in zip(M[r], M[c])]
    return [M[i][n] / M[i][i] for i in range(n)]


@pytest.mark.parametrize("span", [16, 20])
def test_badly_conditioned_E_matches_change_of_basis(span):
    """cond(E) = 2^span (6.6e4, 1.0e6; ‖W*‖ ~ 2^(2 span)): W_ov* against its closed form, W_kq* against exact
    column QPs."""
    exponents = [0, -span, -span // 2, -3, -span + 4]
    E, Q, d = orthogonal_embedding(exponents)
    K = 5
    sv = np.linalg.svd(E, compute_uv=False)
    assert sv[0] / sv[-1] == pytest.approx(2.0**span, rel=1e-9)

    # W_ov*: column x of M is m_n = H d_n² / (1 + H d_n²), m_v = −1 / (1 + H d_n²), H = Σ_{v≠n} d_v^−2
    M = np.zeros((K, K))
    for x in range(K):
        n = FIVE.succ[x]
        H = sum(1 / d[v] ** 2 for v in range(K) if v != n)
        M[:, x] = -1 / (1 + H * d[n] ** 2)
        M[n, x] = H * d[n] ** 2 / (1 + H * d[n] ** 2)
    expected = Q @ (M / np.outer(d, d)) @ Q.T
    W, cert = W_ov_star(E, FIVE.succ)
    np.testing.assert_allclose(W, expected, rtol=0, atol=1e-8 * np.abs(expected).max())
    assert_certified(cert, W, margin_floor(E, W, ov_triples(FIVE.succ)))

    # W_kq*: the columns q with relations, each exact over the rationals
    M = np.zeros((K, K))
    for q, pairs in observed_relations(FIVE).items():
        M[:, q] = [float(x) for x in column_qp(d, pairs)]
    expected = Q @ (M / np.outer(d, d)) @ Q.T
    W, cert = W_kq_star(with_E(FIVE, E))
    np.testing.assert_allclose(W, expected, rtol=0, atol=1e-8 * np.abs(expected).max())
    assert_certified(cert, W, margin_floor(E, W, kq_triples(FIVE)))


def exact_optimum(E, triples_, W):
    """The exact optimum for the float64 E, taking from W only a guess of the active set (margins within 1e-6
    of 1): over the rationals, λ_S = (A_S A_S^T)^−1 1 must be > 0 and w = A_S^T λ_S must satisfy every
    constraint a_i^T w ≥ 1 (rows a_i = vec((e_u − e_v) e_q^T) built here); then w is the unique optimum."""
    F = [[Fraction(float(x)) for x in row] for row in E]
    d = len(F)
    rows = [[(F[i][u] - F[i][v]) * F[j][q] for i in range(d) for j in range(d)] for u, v, q in triples_]
    S = [r for r, m in zip(rows, margins(E, W, triples_)) if m <= 1 + 1e-6]
    lam = _solve_exact([[sum(a * b for a, b in zip(r1, r2)) for r2 in S] for r1 in S], [Fraction(1)] * len(S))
    assert lam is not None and min(lam) > 0
    w = [sum(l * r[j] for l, r in zip(lam, S)) for j in range(d * d)]
    assert min(sum(a * b for a, b in zip(r, w)) for r in rows) >= 1
    return np.array([float(x) for x in w]).reshape(d, d)


@pytest.mark.parametrize("cond, seed", [(None, 0)] + [(c, s) for c in (1e6, 1e8) for s in range(3)])
def test_badly_conditioned_svd_E_matches_exact_kkt(cond, seed):
    """E = U diag(σ) V^T with random U, V and σ from 1 to 1/cond (None: the Gaussian E0): certified, and equal to
    the exact optimum."""
    if cond is None:
        E = E0()
    else:
        rng = np.random.default_rng(seed)
        U, _ = np.linalg.qr(rng.standard_normal((5, 5)))
        V, _ = np.linalg.qr(rng.standard_normal((5, 5)))
        E = U @ np.diag(np.geomspace(1, 1 / cond, 5)) @ V.T
    for W, cert, rows in ((*W_ov_star(E, FIVE.succ), ov_triples(FIVE.succ)),
                          (*W_kq_star(with_E(FIVE, E)), kq_triples(FIVE))):
        assert_certified(cert, W, margin_floor(E, W, rows))
        expected = exact_optimum(E, rows, W)
        np.testing.assert_allclose(W, expected, rtol=0, atol=1e-9 * np.abs(expected).max())


# ---- errors name E -------------------------------------------------------------------------------

def test_infeasible_embeddings_are_named():
    E = E0()
    E[:, 3] = E[:, 1]
    with pytest.raises(InfeasibleError, match=r"^array 'E': columns 1 and 3 are equal, so \(e_1 - e_3\)\^T W e_0 "
                                              r"= 0 < 1 for every W \(W_ov\* does not exist\)$"):
        W_ov_star(E, FIVE.succ)
    with pytest.raises(InfeasibleError, match=r"^array 'E': columns 3 and 1 are equal, .*W_kq\* does not exist"):
        W_kq_star(with_E(FIVE, E))
    E = E0()
    E[:, 2] = 0.0
    with pytest.raises(InfeasibleError, match=r"^array 'E': column 2 is zero, so \(e_3 - e_0\)\^T W e_2 = 0 < 1"):
        W_ov_star(E, FIVE.succ)
    E = E0()
    E[:, 4] = (E[:, 0] + E[:, 2]) / 2          # token 4 between 0 and 2: n(3) = 4 cannot beat both
    for s in (1e-4, 1.0, 1e3):
        with pytest.raises(InfeasibleError, match=r"^array 'E': W_ov\* does not exist for these embeddings "
                                                  r"\(E \[5, 5\] has rank 4\): no W gives every margin"):
            W_ov_star(s * E, FIVE.succ)
    E = np.random.default_rng(7).standard_normal((2, 5))
    with pytest.raises(InfeasibleError, match=r"^array 'E': W_kq\* does not exist .*\(E \[2, 5\] has rank 2\)"):
        W_kq_star(with_E(FIVE, E))


# ---- the command line ------------------------------------------------------------------------------

def train_input(E):
    return {"model": np.array("twostage"), "tokens": FIVE.tokens, "lengths": FIVE.lengths,
            "targets": FIVE.targets, "E": E, "succ": FIVE.succ, "W_ov": np.zeros((5, 5)), "W_kq": np.zeros((5, 5)),
            "eta0": np.array(0.1), "eta": np.array(0.1), "T0": np.array(2), "T": np.array(2)}


def test_cli_train_any_scale_of_E(tmp_path):
    W_star = {}
    for s in (1.0, 1e-4, 1e3):
        save_npz(tmp_path / "in.npz", train_input(s * E0()))
        assert main(["train", str(tmp_path / "in.npz"), "-o", str(tmp_path / f"out{s:g}.npz")]) == 0
        W_star[s] = load_npz(tmp_path / f"out{s:g}.npz")["W_kq_star"]
    for s in (1e-4, 1e3):
        np.testing.assert_allclose(W_star[s] * s**2, W_star[1.0], rtol=1e-11, atol=1e-11 * np.abs(W_star[1.0]).max())


def test_cli_train_infeasible_E_names_the_file_and_E(tmp_path, capsys):
    E = E0()
    E[:, 3] = E[:, 1]
    save_npz(tmp_path / "dup.npz", train_input(E))
    assert main(["train", str(tmp_path / "dup.npz"), "-o", str(tmp_path / "out.npz")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("ntpref: error: ") and "dup.npz" in err and "array 'E': columns 1 and 3 are equal" in err
    assert "\n" not in err
    assert not (tmp_path / "out.npz").exists()
