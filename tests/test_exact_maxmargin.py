"""The max-margin solutions (docs/twostage.md §5) of the exact backend's general active-set solver
(ntpref.exact.maxmargin): the closed form of W_ov* for orthonormal E and W_kq* of relations solved by hand
and of the five-token example, to 1e-45; for a general E the KKT conditions in 50 digits, the oracle's
float64 solutions within their tolerance and rejected by the KKT check; a wrong float64 active set repaired
in mpmath; cyclic relations infeasible.
"""
import mpmath
import numpy as np
import pytest

from ntpref.errors import InfeasibleError
from ntpref.exact import arith, maxmargin, twostage
from ntpref.oracle import certify, contract
from ntpref.rounding import qp_tolerance

from exact_support import TRAIN_CASES, error


def columns_of(E: np.ndarray) -> list:
    """The columns e_v of E [d, K] as lists of mpf (exact)."""
    return [list(arith.to_mp(E[:, v])) for v in range(E.shape[1])]


HADAMARD = np.array([[1, 1, 1, 1], [1, -1, 1, -1], [1, 1, -1, -1], [1, -1, -1, 1]]) / 2.0


@pytest.mark.parametrize("E, succ", [(np.eye(5), np.array([1, 2, -1, 0, 3])),     # C = {0, 1, 3, 4} ≠ V
                                     (HADAMARD[:, :3], np.array([2, 0, 1])),      # orthonormal, d = 4 > K = 3
                                     (HADAMARD, np.array([1, 0, 3, -1]))],
                         ids=["onehot_C_not_V", "hadamard_d4_K3", "hadamard_K4"])
def test_W_ov_star_is_the_closed_form_of_orthonormal_E(E, succ):
    """docs/twostage.md §5: with orthonormal columns W_ov* = E M Eᵀ, M[v, x] = 1[v = n(x)] − 1/K for x ∈ C
    (0 elsewhere), every multiplier 1/K, ‖W_ov*‖_F² = |C|(K−1)/K; from the general solver, to 1e-45."""
    K, C = E.shape[1], [x for x in range(len(succ)) if succ[x] >= 0]
    columns = columns_of(E)
    constraints = twostage.collocation_constraints(succ)
    with arith.precision():
        solution = maxmargin.least_norm(columns, constraints)
        M = [[(int(v == succ[x]) - mpmath.mpf(1) / K) if x in C else 0 for x in range(K)] for v in range(K)]
        closed = [[mpmath.fsum(columns[v][i] * M[v][x] * columns[x][j] for v in range(K) for x in range(K))
                   for j in range(E.shape[0])] for i in range(E.shape[0])]
        assert max(abs(a - b) for a, b in zip(arith.flatten(solution.W), arith.flatten(closed))) <= 1e-45
        assert max(abs(x - mpmath.mpf(1) / K) for x in solution.lam) <= 1e-45
        assert abs(arith.norm(solution.W) ** 2 - mpmath.mpf(len(C) * (K - 1)) / K) <= 1e-45
        assert maxmargin.kkt(columns, constraints, solution.W, solution.lam).ok


def test_W_kq_star_of_relations_solved_by_hand():
    """One-hot E, K = 4. Column 3, the chain 0 > 1 > 2 observed as (0, 1), (1, 2) and (0, 2): min ‖m‖² s.t.
    m_0 − m_1 ≥ 1, m_1 − m_2 ≥ 1 (the third is their sum, margin 2, inactive) gives m = (1, 0, −1, 0), λ = 1, 1, 0
    (m = λ_01 (e_0 − e_1) + λ_12 (e_1 − e_2)). Column 2, 0 > 1 and 0 > 3: by symmetry m_1 = m_3 = s, m_0 = 1 + s,
    minimal at s = −1/3: m = (2/3, −1/3, 0, −1/3), λ = 1/3, 1/3. Columns 0 and 1: no relation, 0."""
    constraints = [(0, 1, 3), (1, 2, 3), (0, 2, 3), (0, 1, 2), (0, 3, 2)]
    with arith.precision():
        third = mpmath.mpf(1) / 3
        solution = maxmargin.least_norm(columns_of(np.eye(4)), constraints)
        expected = [[0, 0, 2 * third, 1], [0, 0, -third, 0], [0, 0, 0, -1], [0, 0, -third, 0]]
        assert max(abs(a - b) for a, b in zip(arith.flatten(solution.W), arith.flatten(expected))) <= 1e-45
        assert max(abs(a - b) for a, b in zip(solution.lam, [1, 1, 0, third, third])) <= 1e-45
        check = maxmargin.kkt(columns_of(np.eye(4)), constraints, solution.W, solution.lam)
        assert check.ok and abs(check.margins[2] - 2) <= 1e-45


def test_W_kq_star_of_the_five_token_example():
    """docs/twostage.md §8: the observed relations of the six sentences give W_kq*[:, 0] = (−0.8, 0.2, −0.8,
    1.2, 0.2), W_kq*[:, 2] = (0.2, 1.2, −0.8, 0.2, −0.8), the other columns 0."""
    inputs = certify.stored()["twostage_train_five_token"].inputs
    with arith.precision():
        S = twostage.sentences(inputs)
        constraints = twostage.relation_constraints(S, inputs["succ"])
        assert {q for _, _, q in constraints} == {0, 2} and (3, 0, 0) in constraints   # the query is a token
        W = maxmargin.least_norm(S.columns, constraints).W
        fifth = mpmath.mpf(1) / 5
        expected = {0: [-4, 1, -4, 6, 1], 2: [1, 6, -4, 1, -4]}
        for q in range(5):
            column = [fifth * x for x in expected.get(q, [0] * 5)]
            assert max(abs(W[i][q] - column[i]) for i in range(5)) <= 1e-45, q


def test_the_max_margin_solutions_of_a_general_E_are_certified_and_the_oracle_is_within_its_tolerance():
    """Gaussian E [K+1, K] (no closed form, one block): the KKT conditions hold in 50 digits, the oracle's
    float64 W_ov_star, W_kq_star (its QP solver) are within their tolerance QP_REL·max|W*|, and the KKT check
    rejects them (float64 margins miss 1 by ~1e-16) as it does a relative 1e-30 change of W*."""
    case = next(c for c in TRAIN_CASES if c.id.endswith("train_naive"))
    oracle = contract.train(case.inputs)
    with arith.precision():
        S = twostage.sentences(case.inputs)
        for name, constraints in (("W_ov_star", twostage.collocation_constraints(case.inputs["succ"])),
                                  ("W_kq_star", twostage.relation_constraints(S, case.inputs["succ"]))):
            solution = maxmargin.least_norm(S.columns, constraints)
            check = maxmargin.kkt(S.columns, constraints, solution.W, solution.lam)
            assert check.ok and max(check[:4]) <= 1e-45, (name, check[:4])
            assert 0 < sum(1 for x in solution.lam if x) < len(constraints), name     # some constraints inactive
            W = arith.to_numpy(solution.W, as_float=False)
            err = error(oracle[name], W)
            assert 0 < err <= qp_tolerance(arith.to_numpy(solution.W)).atol, (name, err)
            assert not maxmargin.kkt(S.columns, constraints, arith.to_mp(oracle[name]), solution.lam).ok
            moved = arith.combine(solution.W, solution.W, mpmath.mpf("1e-30"))
            assert not maxmargin.kkt(S.columns, constraints, moved, solution.lam).ok


@pytest.mark.parametrize("wrong", [[], "all"], ids=["empty", "every_row"])
def test_a_wrong_float64_active_set_is_repaired_in_mpmath(monkeypatch, wrong):
    """From an empty candidate set, or one holding every row (dependent and inactive ones too), the mpmath
    active-set changes reach the same certified W* (K20: 423 relations in 20 blocks of about 21 rows in
    the 19 dimensions of a column's differences e_u − e_v, so dependent rows in each)."""
    inputs = certify.stored()["twostage_train_K20"].inputs
    with arith.precision():
        S = twostage.sentences(inputs)
        constraints = twostage.relation_constraints(S, inputs["succ"])
        right = maxmargin.least_norm(S.columns, constraints).W
        monkeypatch.setattr(maxmargin, "candidate", lambda A: [] if wrong == [] else list(range(len(A))))
        repaired = maxmargin.least_norm(S.columns, constraints).W
        assert max(abs(a - b) for a, b in zip(arith.flatten(repaired), arith.flatten(right))) <= 1e-45


def test_cyclic_relations_are_infeasible():
    with arith.precision(), pytest.raises(InfeasibleError, match="infeasible"):
        maxmargin.least_norm(columns_of(np.eye(3)), [(0, 1, 2), (1, 0, 2)])
