"""Max-margin solutions (docs/twostage.md §5, §8): closed forms, the certified QP, KKT, infeasibility."""

import numpy as np
import pytest

from ntpref.errors import InfeasibleError, InputError, NtprefError
from ntpref.twostage import (Dataset, W_kq_star, W_ov_star, five_token_example, observed_relations, random_realizable,
                             rho)
from ntpref.twostage import least_norm as ln
from ntpref.twostage import svm
from ntpref.twostage.least_norm import SolverError, least_norm, solve_ldp


def assert_certified(cert, W):
    """Margins ≥ 1 − 1e-9, λ ≥ 0, |duality gap| ≤ 1e-12 ‖W‖² (well-conditioned problems: no float64 floor)."""
    assert cert.min_margin >= 1 - 1e-9
    assert cert.max_dual_violation == 0.0
    assert abs(cert.duality_gap) <= 1e-12 * np.sum(np.square(W))


def kq_rows(ds):
    """Constraint rows vec((e_u − e_v)(e_q)^T) of W_kq*, built directly from the definition."""
    rows = []
    for q, pairs in observed_relations(ds).items():
        for u, v in pairs:
            rows.append(np.outer(ds.E[:, u] - ds.E[:, v], ds.E[:, q]).ravel())
    return np.array(rows)


def ov_rows(E, succ):
    K = E.shape[1]
    return np.array([np.outer(E[:, succ[x]] - E[:, v], E[:, x]).ravel()
                     for x in range(K) if succ[x] >= 0 for v in range(K) if v != succ[x]])


def assert_kkt(A, w):
    """KKT of min ‖w‖ s.t. A w ≥ 1 for rows A built here from the definition: feasibility, multipliers λ ≥ 0
    (from the solver on these rows; any valid λ proves optimality), stationarity w = A^T λ, complementary
    slackness λ_i (a_i^T w − 1) = 0."""
    m = A @ w
    assert m.min() >= 1 - 1e-9
    _, lam, _ = solve_ldp(A)
    assert lam.min() >= 0.0
    scale = max(1.0, np.abs(w).max())
    np.testing.assert_allclose(A.T @ lam, w, atol=1e-9 * scale)
    assert np.abs(lam * (m - 1)).max() <= 1e-9 * scale


def test_five_token_W_kq_star_spec_values():
    ds = five_token_example()
    W, cert = W_kq_star(ds)
    expected = np.zeros((5, 5))
    expected[:, 0] = [-0.8, 0.2, -0.8, 1.2, 0.2]
    expected[:, 2] = [0.2, 1.2, -0.8, 0.2, -0.8]
    np.testing.assert_allclose(W, expected, atol=1e-12)
    assert round(np.linalg.norm(W), 5) == 2.36643
    assert_certified(cert, W)
    assert cert.iterations > 0
    W_qp, cert_qp = W_kq_star(ds, method="qp")          # the general QP path on the one-hot problem
    np.testing.assert_allclose(W_qp, expected, atol=1e-8)
    assert_certified(cert_qp, W_qp)
    assert_kkt(kq_rows(ds), W_qp.ravel())


def test_five_token_W_ov_star_closed_form():
    ds = five_token_example()
    M = (np.arange(5)[:, None] == (np.arange(5)[None, :] + 1) % 5) - 0.2
    W, cert = W_ov_star(ds.E, ds.succ)
    np.testing.assert_allclose(W, M, atol=1e-15)
    assert np.sum(W * W) == pytest.approx(5 * 4 / 5, rel=1e-14)
    assert_certified(cert, W)
    assert cert.iterations == 0 and cert.min_margin == pytest.approx(1.0, abs=1e-15)
    W_qp, cert_qp = W_ov_star(ds.E, ds.succ, method="qp")
    np.testing.assert_allclose(W_qp, M, atol=1e-8)
    assert_certified(cert_qp, W_qp)
    # a subset C: columns outside C are zero, ‖W‖² = |C|(K−1)/K
    C = [0, 2, 3]
    W, cert = W_ov_star(ds.E, ds.succ, C=C)
    Wc = np.zeros((5, 5))
    Wc[:, C] = M[:, C]
    np.testing.assert_allclose(W, Wc, atol=1e-15)
    assert np.sum(W * W) == pytest.approx(3 * 4 / 5, rel=1e-14)
    np.testing.assert_allclose(W_ov_star(ds.E, ds.succ, C=C, method="qp")[0], Wc, atol=1e-8)


def test_orthonormal_embedding_closed_forms_match_qp():
    task = random_realizable(K=7, N=50, seed=5, embedding="orthonormal", d=10)
    ds = task.dataset
    W, cert = W_kq_star(ds)
    W_qp, cert_qp = W_kq_star(ds, method="qp")
    np.testing.assert_allclose(W, W_qp, atol=1e-8)
    assert_certified(cert, W)
    assert_certified(cert_qp, W_qp)
    assert_kkt(kq_rows(ds), W.ravel())
    M = (np.arange(7)[:, None] == ds.succ[None, :]) - 1 / 7
    Wo, cert = W_ov_star(ds.E, ds.succ)
    np.testing.assert_allclose(Wo, ds.E @ M @ ds.E.T, atol=1e-14)
    assert np.sum(Wo * Wo) == pytest.approx(7 * 6 / 7, rel=1e-12)
    np.testing.assert_allclose(W_ov_star(ds.E, ds.succ, method="qp")[0], Wo, atol=1e-8)
    assert_certified(cert, Wo)
    # the one-hot version of the same task has the same M (W = E M E^T)
    W1, _ = W_kq_star(Dataset(ds.tokens, ds.lengths, ds.targets, np.eye(7), ds.succ))
    np.testing.assert_allclose(W, ds.E @ W1 @ ds.E.T, atol=1e-10)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gaussian_embedding_certificate_and_kkt(seed):
    task = random_realizable(K=8, N=100, seed=seed, embedding="gaussian")
    ds = task.dataset
    W, cert = W_kq_star(ds)
    assert_certified(cert, W)
    assert_kkt(kq_rows(ds), W.ravel())
    Wo, cert_o = W_ov_star(ds.E, ds.succ)
    assert_certified(cert_o, Wo)
    assert_kkt(ov_rows(ds.E, ds.succ), Wo.ravel())
    with pytest.raises(InputError, match="orthonormal"):
        W_ov_star(ds.E, ds.succ, method="orthonormal")


def test_least_norm_small_problems():
    cases = [([[1.0, 0.0], [0.0, 1.0]], [1.0, 1.0]),
             ([[2.0, 0.0]], [0.5, 0.0]),
             ([[1.0, 1.0]], [0.5, 0.5]),
             ([[1.0, 0.0], [1.0, 0.0], [2.0, 0.0], [1.0, -1.0]], [1.0, 0.0]),   # duplicates, inactive rows
             ([[1.0, -1.0, 0.0], [0.0, 1.0, -1.0], [1.0, 0.0, -1.0]], [1.0, 0.0, -1.0])]  # transitive chain
    for A, w_expected in cases:
        w, cert = least_norm(A)
        np.testing.assert_allclose(w, w_expected, atol=1e-13)
        assert_certified(cert, w)
    w, cert = least_norm(np.zeros((0, 3)))
    np.testing.assert_array_equal(w, np.zeros(3))
    assert cert.min_margin == np.inf and cert.duality_gap == 0.0


def test_least_norm_random_degenerate_kkt(rng):
    for _ in range(20):
        n, p = rng.integers(2, 9), rng.integers(2, 25)
        A = rng.integers(-2, 3, size=(p, n)).astype(float)
        A = A[np.abs(A).sum(axis=1) > 0]
        A = np.vstack([A, A[: len(A) // 2]])
        try:
            w, cert = least_norm(A)
        except InfeasibleError:
            continue
        assert_certified(cert, w)
        assert_kkt(A, w)


def test_least_norm_infeasible_and_uncertified(monkeypatch):
    with pytest.raises(InfeasibleError, match="infeasible"):
        least_norm([[1.0, 0.0], [-1.0, 0.0]])
    with pytest.raises(InfeasibleError):
        least_norm([[1.0, 2.0], [0.0, 0.0]])
    with pytest.raises(InputError, match="'A'"):
        least_norm([[np.nan, 1.0]])
    solve = ln.solve_ldp
    monkeypatch.setattr(ln, "solve_ldp", lambda A: (lambda w, lam, it: (0.999 * w, lam, it))(*solve(A)))
    with pytest.raises(SolverError, match="not certified") as info:
        least_norm([[1.0, 0.0], [0.0, 1.0]])
    assert isinstance(info.value, NtprefError)


@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-9, 1e-11])
def test_least_norm_large_solution_is_not_infeasible(delta):
    """w1 ≥ 1 and δ w2 − w1 ≥ 1 give w* = (1, 2/δ): ‖w*‖ up to 2e11 with rows of order 1 (the NNLS slack
    1/(1 + ‖w‖²) is far below rounding, so the problem is solved again on rescaled rows)."""
    w, cert = least_norm([[1.0, 0.0], [-1.0, delta]])
    np.testing.assert_allclose(w, [1.0, 2.0 / delta], rtol=1e-12)
    assert_certified(cert, w)
    assert cert.min_margin == pytest.approx(1.0, abs=1e-12)


def test_certify_bounds_and_float64_floor():
    """Margins ≥ 1 − 1e-9 and |gap| ≤ 1e-12 ‖w‖², each relaxed to 64 eps max_i Σ_j |a_ij w_j| when larger."""
    lam, margins = np.array([0.5, 0.0]), np.array([1.0 - 5e-9, 3.0])
    with pytest.raises(SolverError, match=r"min margin 0\.999999995 \(need >= 1 - 1e-09\)"):
        ln.certify(margins, lam, 1.0, 0.0, 1.0, 7)
    floor_magnitude = 1e-8 / (64 * np.finfo(float).eps)     # a margin resolved only to 1e-8
    cert = ln.certify(margins, lam, 1.0, 0.0, floor_magnitude, 7)
    assert cert.min_margin == 1.0 - 5e-9 and cert.iterations == 7
    assert cert.duality_gap == pytest.approx(-2.5e-9, rel=1e-6)
    with pytest.raises(SolverError, match=r"duality gap 2\.5e-10 \(need \|gap\| <= 1e-10\)"):
        ln.certify(np.ones(2), lam, 100.0, 5e-10, 1.0, 0)      # ½‖w − A^T λ‖² counts in the gap
    with pytest.raises(SolverError, match="dual violation 1e-30"):
        ln.certify(np.ones(2), np.array([1.0, -1e-30]), 1.0, 0.0, 1.0, 0)


def test_uncertified_matrix_solution_names_E(monkeypatch):
    ds = random_realizable(K=6, N=40, seed=3, embedding="gaussian").dataset
    solve = svm.solve_ldp
    monkeypatch.setattr(svm, "solve_ldp", lambda A: (lambda w, lam, it: (0.999 * w, lam, it))(*solve(A)))
    cond = np.linalg.cond(ds.E)
    for problem, head in ((lambda: W_kq_star(ds), rf"\(condition number {cond:.3g}\): W_kq"),
                          (lambda: W_ov_star(ds.E, ds.succ), rf"\(condition number {cond:.3g}\): W_ov"),
                          (lambda: W_kq_star(five_token_example()), r"\(condition number 1\): W_kq")):  # per column
        with pytest.raises(SolverError, match=rf"^array 'E' {head}\*: least-norm solution not certified: "
                                              r"min margin 0\.99899"):
            problem()


def test_W_kq_star_cyclic_dataset_names_cycle():
    ds = Dataset.from_sentences([[1, 2, 0], [2, 3, 0], [3, 1, 0]], [2, 3, 4], K=5, succ=[1, 2, 3, 4, 0])
    for method in ("auto", "qp"):
        with pytest.raises(InfeasibleError, match=r"q=0: 1 > 2 > 3 > 1"):
            W_kq_star(ds, method=method)


def test_W_ov_star_validation():
    E, succ = np.eye(4), np.array([1, 2, 3, -1])
    W, _ = W_ov_star(E, succ)                       # default C skips the token without successor
    assert np.all(W[:, 3] == 0) and np.sum(W * W) == pytest.approx(3 * 3 / 4)
    with pytest.raises(InputError, match="no successor"):
        W_ov_star(E, succ, C=[0, 3])
    with pytest.raises(InputError, match="distinct"):
        W_ov_star(E, succ, C=[0, 0])
    with pytest.raises(InputError, match="method"):
        W_ov_star(E, succ, method="svd")
    with pytest.raises(InputError, match="'succ'"):
        W_ov_star(E, [1, 2, 3])


def test_rho():
    W = np.arange(9.0).reshape(3, 3)
    assert rho(W, W) == pytest.approx(1.0, abs=1e-15)
    assert rho(W, -2 * W) == pytest.approx(-1.0, abs=1e-15)
    assert rho(np.zeros((3, 3)), W) == 0.0 and rho(W, np.zeros((3, 3))) == 0.0
    V = np.eye(3)
    assert rho(W, V) == pytest.approx(12 / (np.linalg.norm(W) * np.sqrt(3)), rel=1e-15)
    assert np.sqrt(2 - 2 * rho(W, V)) == pytest.approx(np.linalg.norm(W / np.linalg.norm(W) - V / np.sqrt(3)))
    with pytest.raises(InputError, match="shapes differ"):
        rho(W, np.eye(2))


def test_paper_size_problems_certify():
    """The K = 20 one-hot task and a Gaussian-embedding task are solved and certified (timings: python -m benchmarks.run)."""
    task = random_realizable(K=20, N=200, seed=0)
    W, cert = W_kq_star(task.dataset)
    assert_certified(cert, W)
    task = random_realizable(K=8, N=200, seed=0, embedding="gaussian")
    W, cert = W_kq_star(task.dataset)
    assert_certified(cert, W)
    W, cert = W_ov_star(task.dataset.E, task.dataset.succ)
    assert_certified(cert, W)
