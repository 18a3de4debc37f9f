"""Approximation error and linearisation error vs the width m (docs/shallow.md §5, the authors' two other
width experiments), log–log, mean ± 95% CI and medians over seeds, power laws fitted to the medians.

Data: the teacher–student data sets of :mod:`ntpref.reproduce.width` (:func:`ntpref.reproduce.teacher_student.teacher_data`,
both teachers of :data:`ntpref.reproduce.teacher_student.TEACHERS` on the same inputs); all n inputs (training and
validation).

Approximation error, max_j |f_lin(X_j; θ̄) − y_j|: the initial heads θ0 are moved by the teacher's
transport map, θ̄ = :func:`ntpref.shallow.ntk.transport` (θ0, v(θ0)) with v =
:func:`ntpref.shallow.ntk.transport_map` (the teacher's anchors and coefficients, ν = 3), and
f_lin(X; θ̄) = ⟨∇f(X; θ0), θ̄ − θ0⟩ = (1/m) Σ_i ⟨φ(X; θ_i), v(θ_i)⟩ is a width-m Monte-Carlo estimate of
the K-head teacher. The features φ use the teacher's attention (diag(W) for the "diagonal" teacher, as the
authors' script computes both sides with the same features). The heads θ0 are the paired student
initialisation paired_init(m, 8, seed + INIT_SEED_OFFSET): m/2 independent draws, each twice. The authors'
approximation script draws m independent heads instead; with c_i² = 1 a head counted twice contributes
exactly what it contributes once, so their error at width m is this error at width 2m (the same curve
shifted by a factor 2 in m, the same slope).
Linearisation error: the worst-case Δ on the boundary of Ω_ρ (ρ = 3, :func:`worst_case_delta`: per head
ΔU_i, ΔW_i along the gradient of Σ_j σ(s_i(X_j)), Δc_i = +ρ/√m) at the paired initialisation;
mean_j |f(X_j; θ0 + Δ) − f_lin(X_j; θ0 + Δ)| (f(θ0) = 0 exactly). It involves the inputs only, so both
teachers' cells give the same value; the summary reports it once.

Expected slopes (both about −1/2): this project's reconstruction (docs/shallow.md §5); the Monte-Carlo
error of m i.i.d. terms is O(m^{−1/2}), the linearisation remainder (1/√m) Σ_i O(‖Δθ_i‖²) with
‖Δθ_i‖ = O(ρ/√m) is O(m^{−1/2}).

Teacher reuse: per-process cache as in :mod:`ntpref.reproduce.width` (a cell costs little besides the
teacher).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import shallow
from ..sweep import CellArray
from ..shallow.ntk import attention_weights, jvp, linearized_f, transport, transport_map, worst_case_delta
from . import Summary
from .configs import by_axis, config_text, select_config
from .plots import loglog_panel, pyplot, save_figure
from .stats import axis_table, medians, slope_text, stats
from .teacher_student import D, INIT_SEED_OFFSET, NU, RHO, TEACHERS, teacher_data

DESCRIPTION = "approximation and linearisation errors vs width m (both teachers; log-log, median fits)"

SIZES = {
    # quick: n = 1000 inputs, a K = 2048-head teacher (its Monte-Carlo error stays below the students'
    # up to m = 256), the authors' 10 seeds.
    "quick": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64, 128, 256), n=1000, K=2048, T=16,
                  teachers=("diagonal", "full")),
    # full: the authors' README command (its teacher has K = 8196 heads, as written there).
    "full": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64, 128, 256), n=5000, K=8196, T=16,
                 teachers=("diagonal", "full")),
}

STYLE = {"diagonal": ("C0", "o"), "full": ("C1", "s")}


def cells(seeds, widths, n, K, T, teachers) -> list[dict]:
    """One cell per (seed, teacher, m), seed by seed."""
    return [dict(seed=s, teacher=t, m=m, n=n, K=K, T=T) for s in seeds for t in teachers for m in widths]


def approx_error(X, y, data, theta0, teacher: str) -> float:
    """max_j |f_lin(X_j; θ̄) − y_j| for the heads θ0 = (c, U, W), with the features and the transport map
    of the teacher's attention ("diagonal": the logits of diag(W))."""
    c, U, W = theta0
    W_att = attention_weights(W, teacher)
    v = transport_map(U, W, data.anchors, data.alpha, NU, attention=teacher)
    theta_bar = transport(c, U, W_att, *v)
    return float(np.max(np.abs(linearized_f(X, (c, U, W_att), theta_bar) - y)))


def cell(seed, teacher, m, n, K, T, data_seed=None) -> dict:
    """approx_error (max over the n inputs), lin_error (mean over them) and max|y| for scale; the inputs and
    the teacher are the data set of ``data_seed`` (default ``seed``: one data set per seed, every width)."""
    data = teacher_data(seed if data_seed is None else data_seed, n, T, K, teacher)
    X = np.concatenate([data.X_train, data.X_val])
    y = np.concatenate([data.y_train, data.y_val])
    c, U, W = theta0 = shallow.paired_init(m, D, seed + INIT_SEED_OFFSET)
    dc, dU, dW = worst_case_delta(X, U, W, RHO)
    f_pert = shallow.forward(shallow.prepare(X), c + dc, U + dU, W + dW).f
    lin = float(np.mean(np.abs(f_pert - jvp(X, c, U, W, dc, dU, dW))))
    return dict(approx_error=approx_error(X, y, data, theta0, teacher), lin_error=lin,
                teacher_max_abs=float(np.max(np.abs(y))))


def cell_arrays(seed, teacher, m, n, K, T, data_seed=None) -> dict:
    """What :func:`cell` returns: three float64 scalars, each >= 0."""
    return dict.fromkeys(("approx_error", "lin_error", "teacher_max_abs"), CellArray("f8", low=0.0))


def _series(ax, rows, key, label, color, marker, lines, numbers, number_key):
    """One error vs m: table, median fit and the panel's curve."""
    m, groups = by_axis(rows, "m", key)
    mean, ci = stats(groups)
    med = medians(groups)
    slope = loglog_panel(ax, m, mean, ci, label=label, color=color, marker=marker, median=med, fit=med)
    lines += ["", label, axis_table(m, groups, mean, ci, yname=key)]
    if slope is not None:
        lines.append(f"log-log slope fitted to the medians: {slope_text(slope, m, groups)}")
        numbers[number_key] = slope


def summarize(results, outdir, data: str | None = None) -> Summary:
    """Both errors per width (tables), slopes fitted to the medians, and ``approx.png`` (two log–log panels:
    the approximation error for both teachers, the linearisation error); ``data``, when given, says how the
    cells drew their data sets (in the first line and the figure's title)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), gridspec_kw=dict(wspace=0.3))
    lines = ["Approximation and linearisation errors vs m" + (f" ({data})" if data else "") +
             "; expected slopes about -1/2: this project's reconstruction (docs/shallow.md §5), not stated in "
             "the paper's available text"]
    numbers, config = {}, {}
    teachers = [t for t in TEACHERS if any(p["teacher"] == t for p, _ in results)]
    for teacher in teachers:
        config, rows, note = select_config([r for r in results if r[0]["teacher"] == teacher], ("seed", "m"))
        _series(axes[0], rows, "approx_error", TEACHERS[teacher], *STYLE[teacher], lines, numbers,
                f"approx_error_slope_{teacher}")
        lines += [note] if note else []
    # the linearisation error involves the inputs only: report it from the first teacher's cells
    config, rows, _ = select_config([r for r in results if r[0]["teacher"] == teachers[0]], ("seed", "m"))
    lines.insert(1, f"configuration (teachers: {', '.join(teachers)}): {config_text(config, ('teacher',))}")
    _series(axes[1], rows, "lin_error", "linearisation error", "C3", "o", lines, numbers, "lin_error_slope")
    for ax, ylabel, title in ((axes[0], "max_j |f_lin(X_j; θ̄) − y_j|", "approximation error vs m"),
                              (axes[1], "mean_j |f(θ0+Δ) − f_lin(θ0+Δ)|", "linearisation error vs m (no teacher)")):
        ax.set_xlabel("width m (heads)")
        ax.set_ylabel(ylabel)
        ax.set_title(title + " (open markers: medians)", fontsize=10)
        ax.legend(fontsize=7)
    fig.suptitle(f"d={D}, T={config.get('T')}, n={config.get('n')}, teacher K={config.get('K')}, ρ={RHO:g}"
                 + (f"; {data}" if data else ""),
                 fontsize=9)
    path = save_figure(fig, Path(outdir) / "approx.png")
    return Summary("\n".join(lines), [path], numbers)
