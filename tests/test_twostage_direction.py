"""Normalized-GD directions (docs/twostage.md §4): "stable" log-scale vs "naive" float64, checked against
a high-precision (mpmath) evaluation of the same closed-form gradient, the stage-1 closed form of §6 and
the 5-token milestones of §8."""
import mpmath
import numpy as np
import pytest

from ntpref import twostage
from ntpref.twostage import Dataset, model

from test_twostage_model import random_dataset, stage1_direction, weights_for

# docs/twostage.md §8: K = 5, E = I, n(x) = x + 1 mod 5
FIVE_SENTENCES = [[1, 2, 0], [3, 1, 0], [4, 2, 0], [0, 4, 2], [1, 0, 2], [3, 3, 2]]
FIVE_TARGETS = [2, 4, 0, 1, 2, 4]


def five_token():
    return Dataset.from_sentences(FIVE_SENTENCES, FIVE_TARGETS, K=5, succ=(np.arange(5) + 1) % 5)


def w_kq_star():
    W = np.zeros((5, 5))
    W[:, 0] = [-0.8, 0.2, -0.8, 1.2, 0.2]
    W[:, 2] = [0.2, 1.2, -0.8, 0.2, -0.8]
    return W


def w_ov_star():
    return np.roll(np.eye(5), 1, axis=0) - 0.2        # W[v, x] = 1[v = x + 1 mod 5] - 0.2


def rho(W, S):
    return float((W * S).sum() / (np.linalg.norm(W) * np.linalg.norm(S)))


def mp_gradient(sentences, targets, K, W_ov, W_kq, wrt, dps):
    """∇_{W_wrt} of Eq. 1 (E = I) by the plain §3 formulas in mpmath at ``dps`` digits, from the exact
    binary values of the float64 weights. Returns (G as a float64 array of G/‖G‖, log ‖G‖ as float)."""
    with mpmath.workdps(dps):
        Wo = [[mpmath.mpf(float(x)) for x in row] for row in W_ov]
        Wk = [[mpmath.mpf(float(x)) for x in row] for row in W_kq]
        G = [[mpmath.mpf(0) for _ in range(K)] for _ in range(K)]
        for tau, y in zip(sentences, targets):
            q = tau[-1]
            s = [Wk[t][q] for t in tau]
            e = [mpmath.exp(v - max(s)) for v in s]
            phi = [v / sum(e) for v in e]
            z = [sum(f * Wo[v][t] for f, t in zip(phi, tau)) for v in range(K)]
            ez = [mpmath.exp(v - max(z)) for v in z]
            g = [v / sum(ez) for v in ez]
            g[y] -= 1                                  # g_z = p - e_y
            if wrt == "ov":
                for f, t in zip(phi, tau):
                    for v in range(K):
                        G[v][t] += g[v] * f / len(sentences)
                continue
            a = [sum(g[v] * Wo[v][t] for v in range(K)) for t in tau]
            pa = sum(f * x for f, x in zip(phi, a))
            for f, x, t in zip(phi, a, tau):
                G[t][q] += f * (x - pa) / len(sentences)
        norm = mpmath.sqrt(sum(x * x for row in G for x in row))
        return np.array([[float(x / norm) for x in row] for row in G]), float(mpmath.log(norm))


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("embedding", ["onehot", "gaussian"])
def test_stable_equals_naive_on_moderate_weights(rng, backend, embedding):
    ds = random_dataset(rng, embedding, N=20)
    for scale in (0.3, 1.0, 3.0):
        W_ov, W_kq = weights_for(ds, rng, scale)
        w = rng.uniform(0.0, 2.0, size=ds.K)
        pairs = [(twostage.direction(ds, W_ov, W_kq, wrt="kq", method=m, backend=backend) for m in ("naive", "stable")),
                 (stage1_direction(ds, W_ov, weights=w, method=m, backend=backend) for m in ("naive", "stable"))]
        for naive, stable in map(tuple, pairs):
            assert np.abs(stable.unit - naive.unit).max() <= 1e-13
            assert stable.log_norm == pytest.approx(naive.log_norm, rel=1e-13, abs=1e-13)
            assert np.linalg.norm(stable.unit) == pytest.approx(1.0, abs=1e-15)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_stable_direction_matches_high_precision_reference_where_naive_fails(backend):
    """W_kq = 200 W_kq*: attention saturates (φ off the optimum ~ e^-200), so a_l* - φ·a cancels
    catastrophically in float64; with W_ov = 1000 W_ov*, p_y - 1 ~ e^-1000 underflows as well."""
    ds = five_token()
    for lam_ov, dps in ((20.0, 300), (1000.0, 1000)):
        W_ov, W_kq = lam_ov * w_ov_star(), 200.0 * w_kq_star()
        ref, ref_log = mp_gradient(FIVE_SENTENCES, FIVE_TARGETS, 5, W_ov, W_kq, "kq", dps)
        stable = twostage.direction(ds, W_ov, W_kq, wrt="kq", method="stable", backend=backend)
        assert np.abs(stable.unit - ref).max() <= 1e-13
        assert stable.log_norm == pytest.approx(ref_log, rel=1e-13)
        assert np.linalg.norm(stable.unit) == pytest.approx(1.0, abs=1e-15)
        naive = twostage.direction(ds, W_ov, W_kq, wrt="kq", method="naive", backend=backend)
        assert naive.unit is None or np.abs(naive.unit - ref).max() > 1e-2
        if lam_ov == 1000.0:
            assert naive.unit is None and naive.log_norm == -np.inf       # float64 gradient is exactly 0
        assert ref_log < -100                                              # far below float64 resolution of p
    # the reference itself: on moderate weights it reproduces the float64 gradient
    W_ov, W_kq = 2.0 * w_ov_star(), 1.5 * w_kq_star() + 0.1
    ref, ref_log = mp_gradient(FIVE_SENTENCES, FIVE_TARGETS, 5, W_ov, W_kq, "kq", 50)
    naive = twostage.direction(ds, W_ov, W_kq, wrt="kq", method="naive", backend=backend)
    assert np.abs(naive.unit - ref).max() <= 1e-14 and naive.log_norm == pytest.approx(ref_log, rel=1e-14)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_stable_kq_direction_with_score_gaps_beyond_float64_range(rng, backend):
    """Scores 0 > -10 > -1000 > -1500 on query 0: φ spans e^-1500 (far below float64), tokens 3 and 4 have
    equal columns of W_ov (so a_3 = a_4 exactly: a copy-like class A of the arg max that is not the arg max,
    e^{s_4 - s_2nd} = e^990 would overflow), a sentence with all a equal contributes nothing; checked
    against the mpmath evaluation of the plain §3 formulas."""
    K = 5
    W_ov = rng.normal(size=(K, K))
    W_ov[:, 4] = W_ov[:, 3]
    W_kq = rng.normal(size=(K, K))
    W_kq[[3, 4, 1, 0, 2], 0] = [0.0, -10.0, -1000.0, -1500.0, -1200.0]
    sentences = [[3, 1, 4, 0], [1, 4, 3, 3, 2, 0], [4, 1, 2, 0], [3, 4, 3], [2, 1, 0]]
    targets = [2, 0, 1, 4, 3]
    ds = Dataset.from_sentences(sentences, targets, K=K)
    ref, ref_log = mp_gradient(sentences, targets, K, W_ov, W_kq, "kq", 2000)
    stable = twostage.direction(ds, W_ov, W_kq, wrt="kq", method="stable", backend=backend)
    assert np.abs(stable.unit - ref).max() <= 1e-13
    assert stable.log_norm == pytest.approx(ref_log, rel=1e-13)
    assert ref_log < -10                       # the gradient is set by the e^-10 and e^-1000 attention


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_stable_ov_direction_matches_high_precision_reference(rng, backend):
    """Stage 1 with saturated logits (W_ov = 1000 W_ov* + noise): p_v ~ e^-1000 underflows."""
    K = 5
    succ = (np.arange(K) + 1) % K
    W_ov = 1000.0 * w_ov_star() + rng.normal(size=(K, K))
    ref, ref_log = mp_gradient([[x] for x in range(K)], list(succ), K, W_ov, np.zeros((K, K)), "ov", 1000)
    D0 = twostage.prepare_collocations(np.eye(K), succ)
    stable = twostage.direction(D0, W_ov, None, wrt="ov", method="stable", backend=backend)
    assert np.abs(stable.unit - ref).max() <= 1e-13
    assert stable.log_norm == pytest.approx(ref_log, rel=1e-13)
    assert twostage.direction(D0, W_ov, None, wrt="ov", method="naive", backend=backend).unit is None


def test_zero_gradient_gives_no_direction(rng):
    ds = Dataset.from_sentences([[0], [2], [1]], [1, 2, 0], K=3, succ=[1, 2, 0])  # one-token sentences
    W = rng.normal(size=(3, 3))
    for b in ("numba", "numpy"):
        for m in model.METHODS:
            assert twostage.direction(ds, W, W, wrt="kq", method=m, backend=b) == (None, -np.inf)
    # all tokens of every sentence equal: the attention gradient vanishes exactly
    ds = Dataset.from_sentences([[1, 1, 1], [0, 0]], [1, 2], K=3)
    for b in ("numba", "numpy"):
        for m in model.METHODS:
            assert twostage.direction(ds, W, W, wrt="kq", method=m, backend=b) == (None, -np.inf)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_stage1_closed_form(backend):
    """Spec §6: from W_ov = 0 with E = I, C = V, uniform weights, ‖W_ov‖ = η0 t, ρ(W_ov, W_ov*) = 1 and
    L0(t) = log(1 + (K - 1) exp(-η0 t / √(K - 1)))."""
    K = 6
    succ = np.random.default_rng(3).permutation(K)
    E = np.eye(K)
    star = np.eye(K)[succ].T - 1.0 / K                 # W_ov*[v, x] = 1[v = n(x)] - 1/K
    eta0 = 0.2 / np.sqrt(K)
    D0 = twostage.prepare_collocations(E, succ)
    W = np.zeros((K, K))
    for t in range(1, 301):
        W = W - eta0 * twostage.direction(D0, W, None, wrt="ov", backend=backend).unit
        if t % 50 == 0:
            L0 = twostage.loss_and_grad(D0, W, None, backend=backend).loss
            assert L0 == pytest.approx(np.log1p((K - 1) * np.exp(-eta0 * t / np.sqrt(K - 1))), rel=1e-11)
            assert np.linalg.norm(W) == pytest.approx(eta0 * t, rel=1e-13)
            assert rho(W, star) == pytest.approx(1.0, abs=1e-14)


def two_stage_rhos(method, checkpoints, T0=500):
    """Throwaway Algorithm 1 on the 5-token example: the directions on the prepared sets, step by step."""
    ds = five_token()
    prep, prep0 = twostage.prepare(ds), twostage.prepare_collocations(ds.E, ds.succ)
    eta0, eta = 0.2 / np.sqrt(5), 0.05 / np.sqrt(5)
    W_ov = np.zeros((5, 5))
    for _ in range(T0):
        W_ov -= eta0 * twostage.direction(prep0, W_ov, None, wrt="ov").unit
    W_kq, out = np.zeros((5, 5)), {}
    for t in range(1, max(checkpoints) + 1):
        W_kq -= eta * twostage.direction(prep, W_ov, W_kq, wrt="kq", method=method).unit
        if t in checkpoints:
            out[t] = rho(W_kq, w_kq_star())
    return out


def test_five_token_milestones_and_naive_stall():
    assert np.linalg.norm(w_kq_star()) == pytest.approx(2.36643, abs=5e-6)
    stable = two_stage_rhos("stable", (100, 1000, 5000))
    for t, expected in ((100, 0.98865), (1000, 0.99701), (5000, 0.99984)):
        assert stable[t] == pytest.approx(expected, abs=6e-6)
    assert two_stage_rhos("naive", (5000,))[5000] < 0.99            # float64 direction already drifts


@pytest.mark.slow
def test_five_token_20000_steps():
    stable = two_stage_rhos("stable", (20000,))
    assert stable[20000] == pytest.approx(0.99999, abs=6e-6)
    assert two_stage_rhos("naive", (20000,))[20000] < 0.8           # spec: stalls near 0.72
