"""The ``joint`` and ``optimizers`` targets (ntpref.reproduce.joint, .optimizers) and what they share: the
update rules (ntpref.reproduce.updates) against their equations on hand examples, the runs
(ntpref.reproduce.trajectory) against Algorithm 1 of ntpref.twostage.train and against the closed forms of
the max-margin problems, and the summaries on tiny sizes (consistent with the cells, rebuilt byte for byte)."""
import math

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.reproduce import joint, optimizers, run_target, stats, trajectory
from ntpref.reproduce.updates import Rule, Updater, frobenius
from ntpref.sweep import load_results
from ntpref.twostage import loss_and_grad, loss_floor, random_realizable, rho, train

K, N = 20, 200


@pytest.fixture(scope="module")
def prob():
    return trajectory.problem(0, K, N)


# ---- update rules ----------------------------------------------------------------------------------------

G1 = np.array([[3.0, 0.0], [0.0, 0.0]])
G2 = np.array([[0.0, 0.0], [4.0, 0.0]])
W1 = np.array([[1.0, -2.0], [0.5, 0.0]])
W2 = np.array([[0.0, 1.0], [-1.0, 2.0]])


def test_gd_and_joint_ngd_on_a_hand_example():
    """‖(G1, G2)‖ = 5: normalized GD moves each block by −lr G_b/5, a joint step of length lr; GD by −lr G_b."""
    a, b = Updater(Rule("ngd", 0.5), 2).step((W1, W2), (G1, G2))
    assert np.array_equal(a, W1 - 0.5 * G1 / 5) and np.array_equal(b, W2 - 0.5 * G2 / 5)
    assert math.hypot(np.linalg.norm(a - W1), np.linalg.norm(b - W2)) == pytest.approx(0.5, rel=1e-15)
    a, b = Updater(Rule("gd", 0.25), 2).step((W1, W2), (G1, G2))
    assert np.array_equal(a, W1 - 0.25 * G1) and np.array_equal(b, W2 - 0.25 * G2)
    # no gradient, no direction: normalized GD stays
    a, b = Updater(Rule("ngd", 0.5), 2).step((W1, W2), (0 * G1, 0 * G2))
    assert np.array_equal(a, W1) and np.array_equal(b, W2)


def test_per_block_ngd_gives_unit_block_steps_and_a_zero_block_stays():
    rng = np.random.default_rng(3)
    Gs = (1e-30 * rng.standard_normal((4, 4)), 7.0 * rng.standard_normal((4, 4)))
    new = Updater(Rule("ngd-block", 0.3), 2).step((W1[:1, :1] * np.ones((4, 4)), np.zeros((4, 4))), Gs)
    for W_new, W_old, G in zip(new, (W1[:1, :1] * np.ones((4, 4)), np.zeros((4, 4))), Gs):
        assert np.linalg.norm(W_new - W_old) == pytest.approx(0.3, rel=1e-14)
        assert rho(W_old - W_new, G) == pytest.approx(1.0, abs=1e-15)
    a, b = Updater(Rule("ngd-block", 0.3), 2).step((W1, W2), (G1, 0 * G2))
    assert np.array_equal(b, W2) and np.array_equal(a, W1 - 0.3 * G1 / 3)
    assert frobenius(np.array([[3e-200, 4e-200]])) == pytest.approx(5e-200, rel=1e-15)   # no underflow


def test_adam_steps_follow_the_bias_corrected_equations():
    """Step 1: m̂ = g, v̂ = g², so W1 = W0 − lr g/(|g| + ε) (−lr sign(g) up to ε/|g|; 0 where g = 0). Step 2
    by hand from m = β1 m + (1−β1) g, v = β2 v + (1−β2) g², bias corrections 1 − β^2."""
    lr, b1, b2, eps = 1e-3, 0.9, 0.999, 1e-8
    g = np.array([[2.0, -0.5], [0.0, 1e-3]])
    up = Updater(Rule("adam", lr), 1)
    (first,) = up.step((W1,), (g,))
    assert np.array_equal(first, W1 - lr * g / (np.abs(g) + eps))
    assert np.allclose(first - W1, -lr * np.sign(g), rtol=0, atol=lr * 1e-5)
    assert first[1, 0] == W1[1, 0]
    h = np.array([[-1.0, -0.5], [3.0, 1e-3]])
    (second,) = up.step((first,), (h,))
    m = b1 * (1 - b1) * g + (1 - b1) * h
    v = b2 * (1 - b2) * g * g + (1 - b2) * h * h
    expected = first - lr * (m / (1 - b1 ** 2)) / (np.sqrt(v / (1 - b2 ** 2)) + eps)
    assert np.allclose(second, expected, rtol=1e-14, atol=0)
    # entry (1, 0): m̂ = 0.1·3/0.19, v̂ = 0.001·9/(1 − 0.999²), a step of −lr·1.5789.../(2.1218... + ε)
    step = (0.3 / 0.19) / (math.sqrt(0.009 / (1 - 0.999 ** 2)) + 1e-8)
    assert second[1, 0] - W1[1, 0] == pytest.approx(-lr * step, rel=1e-12)


def test_adamw_decays_decoupled_from_the_gradient():
    """AdamW: W ← (1 − lr λ) W − lr m̂/(√v̂ + ε); with g = 0 only the decay acts; else it is Adam's step
    applied to the decayed W."""
    rule = Rule("adamw", 1e-3, weight_decay=0.01)
    (a,) = Updater(rule, 1).step((W1,), (np.zeros((2, 2)),))
    assert np.array_equal(a, (1 - 1e-5) * W1)
    g = np.array([[2.0, -0.5], [0.0, 1e-3]])
    (adamw,) = Updater(rule, 1).step((W1,), (g,))
    (adam,) = Updater(Rule("adam", 1e-3), 1).step((W1,), (g,))
    assert np.allclose(adamw, adam - 1e-5 * W1, rtol=0, atol=1e-15)
    for bad in (dict(name="sgd", lr=1.0), dict(name="gd", lr=0.0), dict(name="adam", lr=1.0, beta1=1.0)):
        with pytest.raises(InputError):
            Rule(**bad)


# ---- runs --------------------------------------------------------------------------------------------------

def test_joint_ngd_from_zero_first_moves_w_ov_only(prob):
    """At W_ov = 0 every token has the same logits, so ∇_{W_kq} L = 0 exactly: the first joint step (length η)
    is all W_ov, along −∇_{W_ov} L; W_kq moves from the second step on. Per block: the same first step."""
    zero = np.zeros((K, K))
    g = loss_and_grad(prob.prep, zero, zero)
    assert not np.any(g.grad_W_kq) and np.any(g.grad_W_ov)
    eta = 0.05 / math.sqrt(K)
    for name in ("ngd", "ngd-block"):
        r = trajectory.run(prob, [trajectory.Phase(2, ("ov", "kq"), "L", Rule(name, eta))], snapshots=(1, 2))
        W_ov1, W_kq1 = r.snapshots[1]
        assert not np.any(W_kq1)
        assert np.linalg.norm(W_ov1) == pytest.approx(eta, rel=1e-14)
        assert rho(-W_ov1, g.grad_W_ov) == pytest.approx(1.0, abs=1e-14)
        assert np.linalg.norm(r.snapshots[2][1]) > 0


def test_algorithm_1_run_is_twostage_train(prob):
    """The two-stage run of the ``joint`` target is ntpref.twostage.train with the float64 gradient
    (direction="naive"): the same iterates and metrics up to rounding, and its floor is loss_floor."""
    T0, T = 40, 60
    phases = joint.arms(K, T0, T)["alg1"]
    r = trajectory.run(prob, phases, np.arange(T0 + T + 1))
    ref = train(random_realizable(K=K, N=N, seed=0).dataset, T0=T0, T=T, direction="naive")
    assert np.allclose(r.W_ov, ref.W_ov, rtol=0, atol=1e-13) and np.allclose(r.W_kq, ref.W_kq, rtol=0, atol=1e-13)
    for mine, theirs in (("loss", "loss"), ("corr_kq", "corr"), ("excess", "excess"), ("attn_opt", "attn_opt")):
        assert np.allclose(r.series[mine][T0:], ref.stage2[theirs], rtol=0, atol=1e-12), mine
    # at W_kq = 0 (t = T0) the successors of a sentence's tokens tie in exact arithmetic, and rounding decides
    # which wins: the accuracies agree once the attention has moved
    assert np.array_equal(r.series["accuracy"][T0 + 1:], ref.stage2["accuracy"][1:])
    assert np.allclose(r.series["corr_ov"][:T0 + 1], ref.stage1["corr"], rtol=0, atol=1e-12)
    assert r.series["floor"][-1] == pytest.approx(ref.loss_floor, rel=1e-13)
    assert r.series["floor"][-1] == pytest.approx(loss_floor(random_realizable(K=K, N=N, seed=0).dataset, r.W_ov),
                                                  rel=1e-13)
    assert trajectory.gradient_agreement(prob, r.W_ov, r.W_kq) == pytest.approx(1.0, abs=1e-12)


def test_margin_measures_against_closed_forms(prob):
    """A chain 0 > 1 > 2 > 3 in one column needs max|M| ≥ 3/2; the W_ov problem (one relation per pair) ½.
    W_ov* = 1[v = n(x)] − 1/K: ℓ2 ratio 1, ℓ∞ ratio ½/(1 − 1/K), ρ(W_ov*, S_ov) = 2√(K−1)/K; W_kq*: ℓ2 ratio 1,
    ℓ∞ ratio ≤ 1; a cycle is refused."""
    U, V, Q = np.array([0, 1, 2, 0]), np.array([1, 2, 3, 3]), np.zeros(4, dtype=np.int64)
    assert trajectory.linf_norm_star(U, V, Q, 4) == 1.5
    with pytest.raises(InputError):
        trajectory.linf_norm_star(np.array([0, 1]), np.array([1, 0]), np.zeros(2, dtype=np.int64), 2)
    assert prob.ov.linf_star == 0.5
    l2, linf = prob.ov.ratios(prob.W_ov_star)
    assert l2 == pytest.approx(1.0, rel=1e-14) and linf == pytest.approx(0.5 / (1 - 1 / K), rel=1e-14)
    assert prob.ov.ratios(prob.S_ov) == pytest.approx((2 * math.sqrt(K - 1) / K, 1.0), rel=1e-14)
    assert rho(prob.W_ov_star, prob.S_ov) == pytest.approx(2 * math.sqrt(K - 1) / K, rel=1e-14)
    l2, linf = prob.kq.ratios(prob.W_kq_star)
    assert l2 == pytest.approx(1.0, abs=1e-9) and 0 < linf <= 1
    assert prob.kq.ratios(3.0 * prob.W_kq_star) == pytest.approx((l2, linf), rel=1e-14)
    assert prob.kq.ratios(np.zeros((K, K))) == (0.0, 0.0)


def test_first_lasting_and_the_bootstrap_mean_interval():
    t = np.array([0, 10, 20, 30])
    assert stats.first_lasting(t, [0.5, 0.95, 0.85, 0.97], 0.9) == 30
    assert stats.first_lasting(t, [0.95, 0.95, 0.95, 0.97], 0.9) == 0
    assert math.isnan(stats.first_lasting(t, [0.95, 0.95, 0.95, 0.7], 0.9))
    assert stats.mean_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    lo, hi = stats.mean_interval([1.0, 2.0, 3.0, 4.0])
    assert 1.0 <= lo < 2.5 < hi <= 4.0
    assert stats.mean_interval([1.0]) is None
    assert stats.mean_interval_text([1.0, math.nan, 1.0]) == "1 [1, 1] (2 of 3 seeds)"
    assert stats.mean_interval_text([math.nan]) == "-"


# ---- the targets on tiny sizes ----------------------------------------------------------------------------

TINY = {"seeds": 2, "K": K, "N": N, "T0": 10, "T": 20}


@pytest.mark.parametrize("mod", [joint, optimizers])
def test_tiny_run_summary_matches_its_cells_and_is_rebuilt_byte_for_byte(mod, tmp_path, monkeypatch):
    name = mod.__name__.rsplit(".", 1)[1]
    monkeypatch.setitem(mod.SIZES, "quick", TINY)
    s = run_target(name, "quick", tmp_path)
    text = (tmp_path / name / "quick" / "summary.txt").read_text()
    assert all(f.is_file() and f.stat().st_size > 0 for f in s.figures)
    assert s.numbers["seeds"] == 2
    results = load_results(tmp_path / name / "quick" / "cells", mod.cells(**TINY))
    if mod is joint:
        cells = [a for _, a in sorted(results, key=lambda r: r[0]["seed"])]
        assert s.numbers["alg1_corr_kq_final"] == np.mean([c["alg1_corr_kq"][-1] for c in cells])
        assert s.numbers["joint_loss_final"] == np.mean([c["joint_loss"][-1] for c in cells])
        # Algorithm 1's W_kq is still 0 at the end of stage 1 (t = T0 = 10), and has moved at the end
        assert all(c["alg1_corr_kq"][np.searchsorted(c["t"], 10)] == 0 < c["alg1_corr_kq"][-1] for c in cells)
        assert "at t = 10 (end of stage 1)" in text and "at t = 30 (end)" in text
    else:
        adam = [a for p, a in sorted(results, key=lambda r: r[0]["seed"])
                if p["setting"] == "stage2" and p["method"] == "adam"]
        assert len(adam) == 2 and all(a["t"][-1] == 20 and np.all(a["corr_ov"] == a["corr_ov"][0]) for a in adam)
        assert s.numbers["stage2_adam_linf_kq"] == np.mean([a["linf_kq"][-1] for a in adam])
        assert "stage 2 (W_ov from stage 1, frozen): 20 updates" in text and "joint (W_ov, W_kq from zero): 30" in text
    run_target(name, "quick", tmp_path, summarize_only=True)
    assert (tmp_path / name / "quick" / "summary.txt").read_text() == text
