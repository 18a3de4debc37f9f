"""Reproduction targets of paper (2) (ntpref.reproduce.width / approx / length / rnn) at tiny sizes:
the cells run through the sweep engine into a directory, the summaries are built from that directory
alone, and the effects that are robust at these sizes are checked quantitatively."""
import math

import numpy as np
import pytest

from ntpref.reproduce import approx, common, length, rnn, width
from ntpref.sweep import load_results, run_sweep


@pytest.fixture(autouse=True)
def one_numba_thread():
    """Run these tests' kernels on one Numba thread. The results do not depend on the thread count (the
    kernels are bitwise deterministic, checked in the kernels' own tests), but 2 spinning OpenMP threads on
    a busy 2-core machine made this file 5x slower (≈ 30 s instead of ≈ 6 s)."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


def run(mod, tmp_path, **size):
    """Run the cells of ``size`` into tmp_path/cells and summarize from the directory alone."""
    run_sweep(mod.cell, mod.cells(**size), tmp_path / "cells")
    summary = mod.summarize(load_results(tmp_path / "cells"), tmp_path)
    for f in summary.figures:
        assert f.exists() and f.stat().st_size > 10_000 and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return summary


def test_width_slope_negative(tmp_path):
    # Why it must hold: the student's best fit inside Ω_ρ is limited by its O(m^{-1/2}) distance to the
    # teacher's kernel machine; 16x the heads (4 -> 64) gave min-loss ratios 0.50..0.71 over seeds 1..10
    # at this size, i.e. slopes between -0.25 and -0.12; -0.05 leaves a wide margin.
    s = run(width, tmp_path, seeds=(1,), widths=(4, 64), n=200, K=128, steps=80, T=8)
    assert s.numbers["slope"] < -0.05
    assert "fitted log-log slope" in s.table
    # summarize again from the directory alone gives the same number
    again = width.summarize(load_results(tmp_path / "cells"), tmp_path)
    assert again.numbers == s.numbers


def test_approx_errors_decrease(tmp_path):
    # Both errors are O(m^{-1/2}) (a width-m Monte-Carlo estimate of the teacher; the second-order
    # remainder (1/√m) Σ_i O(‖Δθ_i‖²) with ‖Δθ_i‖ = O(ρ/√m)): 16x the heads must cut them well below 1/2
    # (expected 1/4; measured slopes -0.38 and -0.51 over 8..256).
    s = run(approx, tmp_path, seeds=(1, 2), widths=(8, 128), n=200, K=512, T=8)
    assert s.numbers["lin_error_slope"] < -0.35
    assert s.numbers["approx_error_slope"] < -0.2
    rows = load_results(tmp_path / "cells")
    for params, a in rows:
        assert 0 < a["lin_error"] and 0 < a["approx_error"] < 10 * a["teacher_max_abs"]


def test_width_needed_closed_form():
    # loss_n(m) = A_n m^{-1/2}: ε = loss of the middle width at the largest n; m_needed = (A_n/ε)^2.
    ms = np.array([8.0, 32.0, 128.0])
    A = {250: 0.5, 500: 1.0, 1000: 2.0}
    eps, needed = length.width_needed(ms, {n: a * ms ** -0.5 for n, a in A.items()})
    assert eps == pytest.approx(2.0 / math.sqrt(32.0))
    for n, a in A.items():
        assert needed[n] == pytest.approx((a / eps) ** 2, rel=1e-10)


def test_length_summary(tmp_path):
    s = run(length, tmp_path, seeds=(1,), Ts=(4, 8), m_T=8, ns=(100, 200), widths=(4, 16), n=200, K=64,
            steps=30, T_n=4)
    assert {"T_rel_slope", "T_rel_ratio", "T_slope", "T_ratio", "m_needed_n100", "m_needed_n200"} <= set(s.numbers)
    assert "T sweep" in s.table and "n sweep" in s.table
    rows = load_results(tmp_path / "cells")
    # the two sweeps' cells are told apart by 'sweep' (T = 4, m = 8, all samples occurs in both)
    assert sum(p["sweep"] == "T" for p, _ in rows) == 2
    # L(0) of the relative loss: the paired initialisation has f = 0 exactly, so the first (pre-update)
    # training loss is the mean of y² over the training samples (κ = 2), and ProjGD lowers it
    for p, a in rows:
        data = common.teacher_data(p["seed"], p["n"], p["T"], p["K"])
        y = data.y_train[:p["n_train"]]
        assert a["train_loss"][0] == pytest.approx(float(np.mean(y * y)), rel=1e-12)
        assert 0 < length.relative_loss(a) < 1
    rel = {p["T"]: length.relative_loss(a) for p, a in rows if p["sweep"] == "T"}
    assert s.numbers["T_rel_ratio"] == pytest.approx(rel[8] / rel[4], rel=1e-12)


def test_rnn_gradient_grows_with_lag(tmp_path):
    # At lag 48 (T = 49) the IndRNN's recurrent gradient is multiplied through 48 steps of u_i σ'(p_t)
    # with |u_i| = 1.5 and grows during training, while the transformer's ‖∇_W L‖ sees every token
    # through one softmax average. At this size (m = 64, 160 training windows, 60 GD steps) over seeds
    # 1..8: ‖∇_u L‖(L=48) > ‖∇_W L‖(L=48) in 8/8 seeds; the growth ratio RNN(48)/RNN(4) exceeds the
    # transformer's in 7/8 seeds (by 15x at seed 1, used here to keep the test fast; the per-seed growth
    # is not reliable at this size for every seed, so only this deterministic seed is asserted).
    s = run(rnn, tmp_path, seeds=(1,), lags=(4, 48), m=64, n=200, steps=60, block=20)
    cells = {(p["model"], p["lag"]): a for p, a in load_results(tmp_path / "cells")}
    assert cells["indrnn", 48]["max_grad_norm"] > cells["shallow", 48]["max_grad_norm"]
    assert cells["indrnn", 48]["block_max"].shape == (3,)
    assert s.numbers["indrnn_max_grad_norm_ratio"] > 5 * s.numbers["shallow_max_grad_norm_ratio"]
