"""Reproduction targets of the two-stage paper: Figure 2 (ntpref.reproduce.figure2) and the generalization
experiment (ntpref.reproduce.generalization).

Quantitative checks on the paper's configuration (K = d = 20, N = 200, T0 = 1000, η0 = 0.2/√d, η = 0.05/√d)
against the closed forms of docs/twostage.md §6 and its predictions (the decay rate γη/‖W_kq*‖ of L − L*
included); the analysis functions on synthetic curves; the closure-only classification on a hand-made order;
the pipeline (run, resume, summarize from the results directory alone) on tiny sizes.
"""
import math
import shutil

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.reproduce import figure2, generalization, run_target
from ntpref.reproduce.configs import time_grid
from ntpref.twostage import (Dataset, UnseenSplit, W_kq_star, five_token_example, needs_transitive_step,
                             observed_relations, random_realizable, unseen_parts)

K20 = {"K": 20, "N": 200, "T0": 1000}
T_LONG = 30000


@pytest.fixture(scope="module")
def fig2_cell():
    """One seed of Figure 2 at K = 20, T = 30000 (the full size) instead of the quick 10000: ρ(W_kq, W_kq*) → 1
    only sub-linearly (it crosses 0.99 a little after t = 10000), and the local decay rate of L − L* reaches the
    predicted rate to 0.1% only after about t = 20000."""
    return figure2.cell(seed=0, T=T_LONG, **K20)


def test_geometric_fit_on_a_synthetic_gap():
    """A gap that falls fast until t = 4000 and exactly as C r^t afterwards: the window is the geometric
    tail (within one stretch of t = 4000) and the fit recovers r and C exactly (R² = 1)."""
    t = time_grid(10000)
    r, C = 0.999, 2.0
    excess = np.where(t >= 4000, C * r ** t, C * r ** 4000 * 0.99 ** (t - 4000.0))
    window = figure2.fit_window(t, excess, L_star=1e-3)
    assert 4000 <= t[window][0] <= 4250 and t[window][-1] == 10000
    fit = figure2.excess_fit(t, excess, window)
    assert fit["rate"] == pytest.approx(r, rel=1e-13)
    assert fit["log_C"] == pytest.approx(math.log(C), abs=1e-9)
    assert fit["r2"] == pytest.approx(1.0, abs=1e-12)
    assert figure2.end_decay(t, excess, L_star=1e-3) == pytest.approx(-math.log(r), rel=1e-9)
    # a gap that stops decreasing has no geometric window
    assert not figure2.fit_window(t, np.full(t.shape, 1e-3), L_star=1e-3).any()


def test_power_fit_on_a_synthetic_power_law():
    """y = 3 t^−1.5 on the grid: the exponent and prefactor are recovered exactly on any window; a curve that
    bends from t^−1 to t^−2 at t = 1000 gives −2 on [1000, 10000] (log-spaced points: the bend at the left
    end counts as much as the right end), and the local exponent of :func:`figure2.local_decay` over log t is
    −1 before the bend and −2 after it. A window outside the positive part of the curve is an InputError."""
    t = time_grid(10000)
    tf = np.maximum(t, 1).astype(np.float64)
    y = 3.0 * tf ** -1.5
    for lo, hi in ((1, 10000), (1000, 10000), (10, 100)):
        fit = figure2.power_fit(t, y, lo, hi)
        assert fit["exponent"] == pytest.approx(-1.5, abs=1e-12)
        assert fit["log_C"] == pytest.approx(math.log(3.0), abs=1e-10)
    bent = np.where(tf < 1000, 1.0 / tf, 1000.0 / tf ** 2)
    assert figure2.power_fit(t, bent, 1000, 10000)["exponent"] == pytest.approx(-2.0, abs=1e-12)
    assert figure2.power_fit(t, bent, 1, 1000)["exponent"] == pytest.approx(-1.0, abs=1e-12)
    late = t >= 1
    a, b, rate = figure2.local_decay(np.log(tf[late]), bent[late])
    starts, ends = t[late][a], t[late][b]
    np.testing.assert_allclose(-rate[ends <= 1000], -1.0, atol=1e-12)
    np.testing.assert_allclose(-rate[starts >= 1000], -2.0, atol=1e-12)
    with pytest.raises(InputError, match="power_fit"):
        figure2.power_fit(t, y, 1000, 20000)


def test_figure2_stage1_closed_forms(fig2_cell):
    """Zero init, E = I, C = V, uniform weights (docs/twostage.md §6): ρ(W_ov, W_ov*) = 1 for t ≥ 1,
    ‖W_ov‖ = η0 t and L0(t) = log(1 + (K−1) exp(−η0 t/√(K−1))); the floor L* = ℓ0 of any token = L0(T0)."""
    a, K = fig2_cell, 20
    t1, eta0 = a["t1"].astype(float), 0.2 / math.sqrt(K)
    assert float(a["eta0"]) == eta0 and float(a["eta"]) == 0.05 / math.sqrt(K)
    L0, norm = figure2.stage1_closed_forms(t1, K, eta0)
    np.testing.assert_allclose(L0, np.log1p(19 * np.exp(-eta0 * t1 / math.sqrt(19))), rtol=1e-15)
    np.testing.assert_allclose(a["loss0"], L0, rtol=1e-10)
    np.testing.assert_allclose(a["norm_ov"], norm, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(a["corr_ov"][1:], 1.0, atol=1e-12)
    assert float(a["L_star"]) == pytest.approx(float(a["loss0"][-1]), rel=1e-10)
    assert str(a["stop1"]) == str(a["stop2"]) == "max_steps"


def test_figure2_stage1_random_init_converges(fig2_cell):
    """The random-init variant: W_ov0 has N(0, 1/d) entries from default_rng(RANDOM_INIT_SEED_OFFSET + seed), so
    ‖W_ov(0)‖ is that matrix's norm (≈ √d = 4.47) and ρ(W_ov, W_ov*) starts near 0 (a random matrix is nearly
    orthogonal to W_ov*); ρ then increases at every grid step towards 1 (≥ 0.99 at T0 = 1000) while L0
    decreases, and ‖W_ov‖ ends within ‖W_ov(0)‖ of the zero-init η0 T0 (each step has length η0)."""
    a, d = fig2_cell, 20
    W0 = figure2.random_init_W_ov(d, 0)
    assert W0.std() == pytest.approx(1 / math.sqrt(d), rel=0.1)
    assert float(a["sigma_rand"]) == 1 / math.sqrt(d)
    assert float(a["norm_ov_rand"][0]) == pytest.approx(np.linalg.norm(W0), rel=1e-15)
    rho = a["corr_ov_rand"]
    assert abs(rho[0]) < 0.1 and rho[-1] > 0.99
    assert np.all(np.diff(rho) > 0)
    assert np.all(np.diff(a["loss0_rand"]) < 0)
    assert abs(float(a["norm_ov_rand"][-1]) - float(a["norm_ov"][-1])) <= np.linalg.norm(W0)
    # the zero-init stage 1 is on the ray from the first step: nothing to converge
    assert np.all(a["corr_ov"][1:] > 1 - 1e-12)


def test_figure2_stage2_predictions(fig2_cell):
    """Stage 2 at K = 20: ρ(W_kq, W_kq*) ≥ 0.99 at the end; ‖W_kq‖ ≤ η t always (triangle inequality, each
    step has length η) and ≥ 0.95 η T at the end (‖W_kq‖ ≈ η t); L − L* > 0 (W_ov lies on the ray of
    W_ov*, so the loss of a sentence is smallest with all attention on x*), non-increasing, and geometric on
    the fit window: rate < 1 with R² ≥ 0.99 of the straight-line fit of log(L − L*); all sentences fitted.
    1 − ρ falls sub-linearly: a power law of exponent between −2 and −1 over the last decade."""
    a = fig2_cell
    t2, eta, T = a["t2"], float(a["eta"]), T_LONG
    assert t2[-1] == T
    assert a["corr_kq"][-1] >= 0.99
    assert np.all(a["norm_kq"] <= eta * t2 * (1 + 1e-12))
    assert a["norm_kq"][-1] >= 0.95 * eta * T
    excess = a["excess"]
    np.testing.assert_allclose(excess, a["loss"] - float(a["L_star"]), rtol=0, atol=1e-15)
    assert np.all(excess > 0) and np.all(np.diff(excess) <= 0)
    assert excess[-1] < 1e-5 * excess[0]
    window = figure2.fit_window(t2, excess, float(a["L_star"]))
    fit = figure2.excess_fit(t2, excess, window)
    assert window.sum() > 50 and t2[window][-1] == T
    assert 0 < fit["rate"] < 1 and fit["r2"] >= 0.99
    assert a["accuracy"][-1] == 1.0 and a["attn_opt"][-1] > 0.99
    p = figure2.power_fit(t2, 1 - a["corr_kq"], T / 10, T)["exponent"]
    assert -2 < p < -1


def test_figure2_decay_rate_matches_prediction(fig2_cell):
    """The predicted rate −log r = γη/‖W_kq*‖_F (docs/twostage.md §6) against a direct computation.

    W_kq* is recomputed from the dataset (svm.W_kq_star) and its margins (e_u − e_v)^T W e_q over every observed
    relation (u, v) of every query q are evaluated here: the smallest is γ = 1, and the cell stores the same
    ‖W_kq*‖ and γ. The derivation's first step: with W_ov = c M on the ray of W_ov* (c = η0 T0/√(K−1)), the
    logits are c(ψ_v − 1/K) and L − L* = A (1 − attention on x*) + O((1 − attention)²),
    A = cK e^{−c}/(1 + (K−1) e^{−c}); at t = T the ratio is 1 to 1e-5. The local decay rate over the last
    stretch of the run then equals γη/‖W_kq*‖ to 0.1% (it approaches from above); the geometric fit over the
    quick size's T = 10000 is within 5% above it, over T = 30000 within 1%."""
    a, K = fig2_cell, 20
    task = random_realizable(seed=0, **{k: v for k, v in K20.items() if k != "T0"})
    W, _ = W_kq_star(task.dataset)
    margins = [W[u, q] - W[v, q] for q, pairs in observed_relations(task.dataset).items() for u, v in pairs]
    gamma = min(margins)
    assert gamma == pytest.approx(1.0, abs=1e-9) and float(a["margin_kq_star"]) == pytest.approx(gamma, abs=1e-12)
    assert float(a["norm_kq_star"]) == pytest.approx(np.linalg.norm(W), rel=1e-12)
    eta = 0.05 / math.sqrt(K)
    predicted = figure2.predicted_decay(float(a["eta"]), float(a["norm_kq_star"]), float(a["margin_kq_star"]))
    assert predicted == pytest.approx(gamma * eta / np.linalg.norm(W), rel=1e-12)

    c = 0.2 / math.sqrt(K) * K20["T0"] / math.sqrt(K - 1)
    A = c * K * math.exp(-c) / (1 + (K - 1) * math.exp(-c))
    assert float(a["excess"][-1]) / (A * (1 - float(a["attn_opt"][-1]))) == pytest.approx(1.0, abs=1e-5)

    t2, excess, L_star = a["t2"], a["excess"], float(a["L_star"])
    end = figure2.end_decay(t2, excess, L_star)
    assert 1.0 < end / predicted < 1.001
    for T, tol in ((10000, 0.05), (T_LONG, 0.01)):
        upto = t2 <= T
        fit = figure2.excess_fit(t2[upto], excess[upto], figure2.fit_window(t2[upto], excess[upto], L_star))
        assert 1.0 < -math.log(fit["rate"]) / predicted < 1.0 + tol


def test_closure_only_on_a_hand_made_order():
    """Five-token example (docs/twostage.md §8), query 0: R_0 = {1 > 2, 1 > 0, 3 > 1, 3 > 0, 4 > 2, 4 > 0}.
    [3, 2, 0] → 4 is decided only through 3 > 1 > 2 (3 > 2 is not observed): closure-only. [0, 3, 1, 0] → 4
    (3 > 1, 3 > 0 observed) and [4, 2, 2, 0] → 0 (4 > 2, 4 > 0 observed) are decided by observed pairs: not
    closure-only. unseen_parts keeps exactly the first as the closure-only part."""
    five = five_token_example()
    assert observed_relations(five)[0] == {(1, 2), (1, 0), (3, 1), (3, 0), (4, 2), (4, 0)}
    determined = Dataset.from_sentences([[3, 2, 0], [0, 3, 1, 0], [4, 2, 2, 0]], [4, 4, 0], K=5, succ=five.succ)
    assert needs_transitive_step(five, determined).tolist() == [True, False, False]
    noncomp = Dataset.from_sentences([[1, 4, 0]], [2], K=5, succ=five.succ)
    parts = unseen_parts(five, UnseenSplit(determined, noncomp), prefix="long_")
    assert list(parts) == ["long_determined", "long_closure_only", "long_noncomparable"]
    assert parts["long_determined"] is determined and parts["long_noncomparable"] is noncomp
    assert parts["long_closure_only"].N == 1 and parts["long_closure_only"].sentence(0).tolist() == [3, 2, 0]
    assert int(parts["long_closure_only"].targets[0]) == 4
    direct_only = determined.subset([1, 2])
    assert unseen_parts(five, UnseenSplit(direct_only, None))["closure_only"] is None


def test_generalization_determined_vs_noncomparable():
    """K = 20, T = 6000, 400 unseen sentences of lengths 2..6 and 400 of lengths 7..12. Asserted at the end of
    training: accuracy 1 on the training sentences and on the closure-determined unseen ones, including the
    closure-only ones and the longer ones, attention on their closure maximum x̂ > 0.99, and the determined
    accuracy strictly above the non-comparable one.

    Why: in the max-margin direction W_kq* (docs/twostage.md §5) a closure-determined x̂ beats every other token v
    of the sentence through a chain of observed relations x̂ > w1 > ... > v, each with margin ≥ 1, so its score
    exceeds v's by at least the chain length, whatever the sentence's length; as W_kq aligns with W_kq* and
    grows (ρ → 1, ‖W_kq‖ ≈ η t) the attention goes to x̂ and, W_ov being on the ray of W_ov* (logits
    c(ψ_v − 1/K), ψ_v the attention on tokens with successor v), the prediction is n(x̂) (docs/twostage.md §6).
    On a non-comparable sentence the data never ranked the candidates, so the model's pick is the hidden-order
    maximum only by chance: its accuracy is well below 1 (the sentences being random, over a few hundred of them
    at least one is missed)."""
    a = generalization.cell(seed=0, T=6000, n_unseen=400, n_long=400, **K20)
    n = {p: int(a[f"n_{p}"]) for p in generalization.PARTS}
    assert n["determined"] + n["noncomparable"] == 400 and n["determined"] > 20 and n["noncomparable"] > 20
    assert n["long_determined"] + n["long_noncomparable"] == 400 and n["train"] == 200
    assert 0 < n["closure_only"] < n["determined"] and 0 < n["long_closure_only"] <= n["long_determined"]
    assert a["steps"][0] == 0 and a["steps"][-1] == 6000
    assert a["train_accuracy"][-1] == 1.0
    for part in ("determined", "closure_only", "long_determined", "long_closure_only"):
        assert a[f"{part}_accuracy"][-1] == 1.0 and a[f"{part}_attn_max"][-1] > 0.99
    assert a["determined_accuracy"][-1] > a["noncomparable_accuracy"][-1]
    assert a["long_determined_accuracy"][-1] > a["long_noncomparable_accuracy"][-1]
    # p(n(x̂)|X) = exp(−ℓ) can not beat the floor exp(−L*) of the training loss, reached on the determined part
    L_star = math.log1p(19 * math.exp(-(0.2 / math.sqrt(20)) * 1000 / math.sqrt(19)))
    assert a["determined_p_target"][-1] <= math.exp(-L_star) * (1 + 1e-12)
    assert a["determined_p_target"][-1] > 0.99 * math.exp(-L_star)
    # at t = 0 (W_kq = 0) attention is uniform over positions and nothing has been learnt yet
    assert a["determined_accuracy"][0] < 0.5 and a["noncomparable_accuracy"][0] < 0.5


TINY = {
    "twostage": {"seeds": 2, "K": 6, "N": 20, "T0": 100, "T": 600},
    "generalization": {"seeds": 2, "K": 6, "N": 20, "T0": 100, "T": 600, "n_unseen": 30, "n_long": 30},
}


MODULES = {"twostage": figure2, "generalization": generalization}


@pytest.fixture(scope="module", params=["twostage", "generalization"])
def tiny_run(request, tmp_path_factory):
    """(name, results directory, Summary) of one run_target of ``name`` on the tiny size (module-wide: the
    cells are the costly part; tests that change the directory work on a copy)."""
    name = request.param
    root = tmp_path_factory.mktemp(name)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(MODULES[name].SIZES, "tiny", TINY[name])
        return name, root, run_target(name, "tiny", root)


@pytest.fixture
def tiny_copy(tiny_run, tmp_path, monkeypatch):
    """(name, a private copy of the tiny run's results directory, the first Summary, the first run's figure
    paths inside the copy, a list recording every cell computed from now on), the tiny size registered."""
    name, root, first = tiny_run
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    mod = MODULES[name]
    monkeypatch.setitem(mod.SIZES, "tiny", TINY[name])
    real_cell, calls = mod.cell, []
    monkeypatch.setattr(mod, "cell", lambda **p: calls.append(p) or real_cell(**p))
    return name, tmp_path, first, [tmp_path / f.relative_to(root) for f in first.figures], calls


def test_pipeline_writes_cells_figures_and_summary(tiny_run):
    name, root, first = tiny_run
    outdir = root / name / "tiny"
    assert len(list((outdir / "cells").glob("*.npz"))) == 2
    assert first.figures and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in first.figures)
    assert (outdir / "summary.txt").read_text().strip() == first.table.strip()
    assert first.numbers["seeds"] == 2.0


def test_pipeline_rerun_computes_nothing(tiny_copy):
    name, root, first, _, calls = tiny_copy
    again = run_target(name, "tiny", root)
    assert calls == []
    assert again.table == first.table
    np.testing.assert_equal(again.numbers, first.numbers)


def test_pipeline_summarizes_from_the_cells_alone(tiny_copy):
    """Deleting the figures and summarizing from the stored cells rebuilds the same table, numbers, figures."""
    name, root, first, figures, calls = tiny_copy
    for f in figures:
        f.unlink()
    rebuilt = run_target(name, "tiny", root, summarize_only=True)
    assert calls == [] and all(f.exists() for f in figures)
    assert rebuilt.figures == figures
    assert rebuilt.table == first.table
    np.testing.assert_equal(rebuilt.numbers, first.numbers)


def test_pipeline_recomputes_only_a_removed_cell(tiny_copy):
    name, root, first, _, calls = tiny_copy
    next(iter(sorted((root / name / "tiny" / "cells").glob("*seed=1*")))).unlink()
    resumed = run_target(name, "tiny", root)
    assert [c["seed"] for c in calls] == [1]
    np.testing.assert_equal(resumed.numbers, first.numbers)    # cells are deterministic


@pytest.mark.parametrize("tiny_run", ["twostage"], indirect=True)
def test_figure2_figures_are_drawn_once_with_their_fixed_margins(tiny_copy, monkeypatch):
    """Summarizing Figure 2 draws each of its three figures once (no tight_layout, after which saving draws a
    figure twice, and no cropping, another drawing) and lays them out with the fixed subplot parameters."""
    from matplotlib.figure import Figure

    name, root, _, figures, _ = tiny_copy
    drawn, real_draw = [], Figure.draw
    monkeypatch.setattr(Figure, "draw", lambda fig, renderer: drawn.append(fig) or real_draw(fig, renderer))
    monkeypatch.setattr(Figure, "tight_layout",
                        lambda fig, *a, **k: pytest.fail("tight_layout: saving then draws twice"))
    run_target(name, "tiny", root, summarize_only=True)
    assert len(drawn) == len(figures) == 3 and len({id(f) for f in drawn}) == 3
    margins = [figure2.FIGURE2_MARGINS, figure2.PAIR_MARGINS, figure2.PAIR_MARGINS]
    for fig, expected in zip(drawn, margins):
        assert {k: getattr(fig.subplotpars, k) for k in expected} == expected
