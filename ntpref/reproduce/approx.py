"""Approximation error and linearisation error vs the width m (spec/shallow.md §5, the authors' two
other width experiments; both are expected to decay like m^{−1/2}).

Data: the teacher–student data set of :mod:`ntpref.reproduce.width` (:func:`ntpref.reproduce.common.teacher_data`:
same seeds and teacher; student initialisation θ0 = paired_init(m, 8, seed + INIT_SEED_OFFSET)); all n inputs
(training and validation).

Approximation error: the student's initial heads are moved by the teacher's transport map,
θ̄ = :func:`ntpref.shallow.ntk.transport` (θ0, v(θ0)) with v = :func:`ntpref.shallow.ntk.transport_map`
(the teacher's anchors and coefficients, ν = 3), and the linearised model at θ̄,
f_lin(X; θ̄) = ⟨∇f(X; θ0), θ̄ − θ0⟩ (= (1/m) Σ_i ⟨φ(X; θ_i), v(θ_i)⟩, a width-m Monte-Carlo estimate of the
K-head teacher), is compared with the teacher labels: max_j |f_lin(X_j; θ̄) − y_j|.
Linearisation error: the worst-case Δ on the boundary of Ω_ρ (ρ = 3, :func:`worst_case_delta`: per head
ΔU_i, ΔW_i along the gradient of Σ_j σ(s_i(X_j)), Δc_i = +ρ/√m); mean_j |f(X_j; θ0 + Δ) − f_lin(X_j; θ0 + Δ)|
(f(θ0) = 0 exactly for the paired initialisation).

Teacher reuse: per-process cache as in :mod:`ntpref.reproduce.width` (a cell costs little besides the
teacher). Run time on the 2-core machine (--workers 2, 1 Numba thread each): quick 11 s wall (18 CPU-s);
full: the teacher (n = 5000, K = 8192) costs 14 CPU-s per seed, each worker builds the seeds it meets,
the errors ≈ 5x the quick ones, ≈ 3-5 CPU-minutes in all, ≈ 2-3 minutes of wall time (estimated, not run).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..shallow.model import forward, paired_init
from ..shallow.ntk import jvp, linearized_f, transport, transport_map, worst_case_delta
from . import Summary
from .common import (D, INIT_SEED_OFFSET, NU, RHO, axis_table, by_axis, loglog_panel, pyplot, save_figure,
                     select_config, stats, teacher_data)

DESCRIPTION = "approximation error and linearisation error vs width m (log-log, slopes ≈ -1/2)"

SIZES = {
    # quick: n = 1000 inputs, a K = 2048-head teacher (its Monte-Carlo error stays below the students'
    # up to m = 256), the paper's 10 seeds. Measured 11 s wall (module docstring).
    "quick": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64, 128, 256), n=1000, K=2048, T=16),
    # full: the paper's setting (spec §5).
    "full": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, T=16),
}


def cells(seeds, widths, n, K, T) -> list[dict]:
    """One cell per (seed, m), seed by seed."""
    return [dict(seed=s, m=m, n=n, K=K, T=T) for s in seeds for m in widths]


def cell(seed, m, n, K, T) -> dict:
    """approx_error (max over the n inputs), lin_error (mean over them) and max|y| for scale."""
    data = teacher_data(seed, n, T, K)
    X = np.concatenate([data.X_train, data.X_val])
    y = np.concatenate([data.y_train, data.y_val])
    theta0 = paired_init(m, D, seed + INIT_SEED_OFFSET)
    c, U, W = theta0
    theta_bar = transport(c, U, W, *transport_map(U, W, data.anchors, data.alpha, NU))
    approx = float(np.max(np.abs(linearized_f(X, theta0, theta_bar) - y)))
    dc, dU, dW = worst_case_delta(X, U, W, RHO)
    f_pert = forward(X, c + dc, U + dU, W + dW)
    lin = float(np.mean(np.abs(f_pert - jvp(X, c, U, W, dc, dU, dW))))
    return dict(approx_error=approx, lin_error=lin, teacher_max_abs=float(np.max(np.abs(y))))


def summarize(results, outdir) -> Summary:
    """Both errors per width (table), fitted slopes, and ``approx.png`` (two log–log panels)."""
    config, rows, note = select_config(results, ("seed", "m"))
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw=dict(wspace=0.32))
    lines, numbers = [f"Approximation and linearisation errors vs m ({config})"], {}
    panels = (("approx_error", "approximation error", "max_j |f_lin(X_j; θ̄) − y_j|", "C0"),
              ("lin_error", "linearisation error", "mean_j |f(θ0+Δ) − f_lin(θ0+Δ)|", "C3"))
    for ax, (key, title, ylabel, color) in zip(axes, panels):
        m, groups = by_axis(rows, "m", key)
        mean, ci = stats(groups)
        slope = loglog_panel(ax, m, mean, ci, label=title, color=color)
        ax.set_xlabel("width m (heads)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title} vs m", fontsize=10)
        ax.legend(fontsize=8)
        lines += ["", title, axis_table(m, groups, mean, ci, yname=title)]
        if slope is not None:
            lines.append(f"fitted log-log slope: {slope:+.3f}   (paper: about -1/2)")
            numbers[f"{key}_slope"] = slope
    fig.suptitle(f"d={D}, T={config['T']}, n={config['n']}, teacher K={config['K']}, ρ={RHO:g}", fontsize=9)
    path = save_figure(fig, Path(outdir) / "approx.png")
    if note:
        lines.append(note)
    return Summary("\n".join(lines), [path], numbers)
