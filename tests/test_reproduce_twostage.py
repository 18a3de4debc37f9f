"""Reproduction targets of the two-stage paper: Figure 2 (ntpref.reproduce.figure2) and the generalization
experiment (ntpref.reproduce.generalization).

Quantitative checks on the paper's configuration (K = d = 20, N = 200, T0 = 1000, η0 = 0.2/√d, η = 0.05/√d)
against the closed forms of spec §6 and its predictions; the pipeline (run, resume, summarize from the results
directory alone) on tiny sizes.
"""
import math

import numpy as np
import pytest

from ntpref.reproduce import figure2, generalization, run_target
from ntpref.reproduce.common import time_grid

K20 = {"K": 20, "N": 200, "T0": 1000}


@pytest.fixture(scope="module")
def fig2_cell():
    """One seed of Figure 2 at K = 20. T = 12000 instead of the spec's 10000: ρ(W_kq, W_kq*) → 1 only
    sub-linearly and crosses 0.99 a little after t = 10000, so 12000 steps are needed for the 0.99 check."""
    return figure2.cell(seed=0, T=12000, **K20)


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
    # a gap that stops decreasing has no geometric window
    assert not figure2.fit_window(t, np.full(t.shape, 1e-3), L_star=1e-3).any()


def test_figure2_stage1_closed_forms(fig2_cell):
    """Zero init, E = I, C = V, uniform weights (spec §6): ρ(W_ov, W_ov*) = 1 for t ≥ 1, ‖W_ov‖ = η0 t and
    L0(t) = log(1 + (K−1) exp(−η0 t/√(K−1))); the floor L* = ℓ0 of any token = L0(T0)."""
    a, K = fig2_cell, 20
    t1, eta0 = a["t1"].astype(float), 0.2 / math.sqrt(K)
    assert float(a["eta0"]) == eta0 and float(a["eta"]) == 0.05 / math.sqrt(K)
    np.testing.assert_allclose(a["loss0"], np.log1p((K - 1) * np.exp(-eta0 * t1 / math.sqrt(K - 1))), rtol=1e-10)
    np.testing.assert_allclose(a["norm_ov"], eta0 * t1, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(a["corr_ov"][1:], 1.0, atol=1e-12)
    assert float(a["L_star"]) == pytest.approx(float(a["loss0"][-1]), rel=1e-10)
    assert str(a["stop1"]) == str(a["stop2"]) == "max_steps"


def test_figure2_stage2_predictions(fig2_cell):
    """Stage 2 at K = 20: ρ(W_kq, W_kq*) ≥ 0.99 at the end; ‖W_kq‖ ≤ η t always (triangle inequality, each
    step has length η) and ≥ 0.95 η T at the end (spec: ‖W_kq‖ ≈ η t); L − L* > 0 (W_ov lies on the ray of
    W_ov*, so the loss of a sentence is smallest with all attention on x*), non-increasing, and geometric on
    the fit window: rate < 1 with R² ≥ 0.99 of the straight-line fit of log(L − L*); all sentences fitted."""
    a = fig2_cell
    t2, eta, T = a["t2"], float(a["eta"]), 12000
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


def test_generalization_determined_vs_noncomparable():
    """K = 20, T = 6000, 400 unseen sentences. Asserted at the end of training: accuracy 1 on the training
    sentences and on the closure-determined unseen ones, attention on their closure maximum x̂ > 0.99, and
    the determined accuracy strictly above the non-comparable one.

    Why: in the max-margin direction W_kq* (spec §5) a closure-determined x̂ beats every other token v of the
    sentence through a chain of observed relations x̂ > w1 > ... > v, each with margin ≥ 1, so its score
    exceeds v's by at least the chain length; as W_kq aligns with W_kq* and grows (ρ → 1, ‖W_kq‖ ≈ η t) the
    attention goes to x̂ and, W_ov being on the ray of W_ov* (logits c(ψ_v − 1/K), ψ_v the attention on tokens
    with successor v), the prediction is n(x̂) (spec §6). On a non-comparable sentence the data never ranked
    the candidates, so the model's pick is the hidden-order maximum only by chance: its accuracy is well
    below 1 (the sentences being random, over a few hundred of them at least one is missed)."""
    a = generalization.cell(seed=0, T=6000, n_unseen=400, **K20)
    n_det, n_nc = int(a["n_determined"]), int(a["n_noncomparable"])
    assert n_det + n_nc == 400 and n_det > 20 and n_nc > 20 and int(a["n_train"]) == 200
    assert a["steps"][0] == 0 and a["steps"][-1] == 6000
    assert a["train_accuracy"][-1] == 1.0 and a["determined_accuracy"][-1] == 1.0
    assert a["determined_attn_max"][-1] > 0.99
    assert a["determined_accuracy"][-1] > a["noncomparable_accuracy"][-1]
    # p(n(x̂)|X) = exp(−ℓ) can not beat the floor exp(−L*) of the training loss, reached on the determined part
    L_star = math.log1p(19 * math.exp(-(0.2 / math.sqrt(20)) * 1000 / math.sqrt(19)))
    assert a["determined_p_target"][-1] <= math.exp(-L_star) * (1 + 1e-12)
    assert a["determined_p_target"][-1] > 0.99 * math.exp(-L_star)
    # at t = 0 (W_kq = 0) attention is uniform over positions and nothing has been learnt yet
    assert a["determined_accuracy"][0] < 0.5 and a["noncomparable_accuracy"][0] < 0.5


TINY = {
    "twostage": {"seeds": 2, "K": 6, "N": 20, "T0": 100, "T": 600},
    "generalization": {"seeds": 2, "K": 6, "N": 20, "T0": 100, "T": 600, "n_unseen": 30},
}


@pytest.mark.parametrize("name", ["twostage", "generalization"])
def test_pipeline_resume_and_summarize_from_directory(name, tmp_path, monkeypatch):
    """run_target on a tiny size: figures and summary.txt appear; a rerun computes nothing (resume); deleting
    the outputs and summarizing from the cells alone gives the same table and numbers; a removed cell is
    recomputed, and only that one."""
    mod = {"twostage": figure2, "generalization": generalization}[name]
    monkeypatch.setitem(mod.SIZES, "tiny", TINY[name])
    first = run_target(name, "tiny", tmp_path)
    outdir = tmp_path / name / "tiny"
    assert len(list((outdir / "cells").glob("*.npz"))) == 2
    assert first.figures and all(f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for f in first.figures)
    assert (outdir / "summary.txt").read_text().strip() == first.table.strip()
    assert all(isinstance(v, float) for v in first.numbers.values())

    real_cell, calls = mod.cell, []
    monkeypatch.setattr(mod, "cell", lambda **p: calls.append(p) or real_cell(**p))
    again = run_target(name, "tiny", tmp_path)
    assert calls == []
    for f in first.figures:
        f.unlink()
    rebuilt = run_target(name, "tiny", tmp_path, summarize_only=True)
    assert calls == [] and all(f.exists() for f in first.figures)
    for s in (again, rebuilt):
        assert s.table == first.table
        np.testing.assert_equal(s.numbers, first.numbers)

    next(iter(sorted((outdir / "cells").glob("*seed=1*")))).unlink()
    resumed = run_target(name, "tiny", tmp_path)
    assert [c["seed"] for c in calls] == [1]
    np.testing.assert_equal(resumed.numbers, first.numbers)    # cells are deterministic
