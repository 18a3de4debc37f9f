"""Teacher–student width sweep (spec/shallow.md §5): min training loss vs the width m, log–log axes,
mean ± 95% CI over seeds, fitted power law (the paper expects a slope of about −1/2).

Setting: d = 8 tokens of T = 16 per input (i.i.d. N(0, I) scaled to norm ≤ 1), the kernel-machine
teacher of :func:`ntpref.shallow.data.teacher_student` (R = 16 anchors, ν = 3, K random heads, the
theory's "full" attention), 80/20 train/validation split. Student: the shallow transformer with paired
initialisation, full-batch ProjGD for ``steps`` steps with η = 1.75/√steps (the authors' rule; 0.0277 at
4000 steps) and ρ = 3 for all three blocks, loss = mean squared error (κ = 2). Metric: the minimum over the
steps of the pre-update training loss.

Seeds. The data seed s draws the tokens, anchors and teacher heads; the student's initial heads come from
seed s + :data:`ntpref.reproduce.common.INIT_SEED_OFFSET`, so they are never the same random numbers as the
data.

Teacher reuse. Every width of a seed trains on the same data set, built once per worker process by
:func:`ntpref.reproduce.common.teacher_data` (in-memory cache; the full teacher, K = 8192 at n = 5000,
costs about 27 CPU-s, ~2% of the full sweep).

Run time, measured on this project's 2-core machine (idle) with --workers 2 and 1 Numba thread per
worker (:func:`ntpref.sweep.worker_threads`):
  quick (:data:`SIZES`): 66 s wall.
  one ProjGD step on 4000 samples, T = 16, 1 thread: 8, 9, 13, 23, 42 and 103 ms CPU at m = 8, 16, 32,
  64, 128, 256 (0.20 s for the six widths); on 800 samples about a fifth of that.
  full (10 seeds × m ∈ {8..256} × 4000 steps): ≈ 4000 · 0.20 s ≈ 800 CPU-s per seed (+14 CPU-s for its
  teacher), ≈ 2.2 CPU-hours, ≈ 1.1 hours of wall time with --workers 2 (estimated from the per-step
  times, not run).
"""
from __future__ import annotations

from pathlib import Path

from . import Summary
from .common import (D, axis_table, by_axis, loglog_panel, pyplot, save_figure, select_config, stats,
                     teacher_data, train_student)

DESCRIPTION = "teacher-student: min training loss vs width m, log-log, mean ± 95% CI, power-law slope (≈ -1/2)"

SIZES = {
    # quick: n = 1000 (800 training samples), a K = 1024-head teacher, 1500 steps (η = 1.75/√1500),
    # 3 seeds, widths 8..128 (600 steps gave a slope of only -0.32: too few steps to reach the width limit).
    "quick": dict(seeds=(1, 2, 3), widths=(8, 16, 32, 64, 128), n=1000, K=1024, steps=1500, T=16),
    # full: the paper's setting (spec §5).
    "full": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, steps=4000, T=16),
}


def cells(seeds, widths, n, K, steps, T) -> list[dict]:
    """One cell per (seed, m); seed by seed, the widest student first (the longest cells start early)."""
    return [dict(seed=s, m=m, n=n, K=K, steps=steps, T=T)
            for s in seeds for m in sorted(widths, reverse=True)]


def cell(seed, m, n, K, steps, T) -> dict:
    """Train one student of width m on the seed's teacher data (see the module docstring)."""
    return train_student(teacher_data(seed, n, T, K), m, seed, steps)


def summarize(results, outdir) -> Summary:
    """Table of min training loss per width, the fitted slope, and ``width.png``."""
    config, rows, note = select_config(results, ("seed", "m"))
    m, groups = by_axis(rows, "m", "min_train_loss")
    mean, ci = stats(groups)
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4.2))
    slope = loglog_panel(ax, m, mean, ci, label="min training loss", color="C0")
    ax.set_xlabel("width m (heads)")
    ax.set_ylabel("min training loss (MSE)")
    ax.set_title(f"Teacher–student, d={D}, T={config['T']}, n={config['n']}, {config['steps']} ProjGD steps",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig_path = save_figure(fig, Path(outdir) / "width.png")
    lines = [f"Teacher-student width sweep ({config}): min training loss vs m",
             axis_table(m, groups, mean, ci)]
    numbers = {}
    if slope is not None:
        lines.append(f"fitted log-log slope: {slope:+.3f}   (paper: about -1/2)")
        numbers["slope"] = slope
    if note:
        lines.append(note)
    return Summary("\n".join(lines), [fig_path], numbers)
