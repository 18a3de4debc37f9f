"""Teacher–student width sweep (spec/shallow.md §5): min training loss vs the width m, log–log axes,
mean ± 95% CI over seeds, fitted power law (the paper expects a slope of about −1/2).

Setting: d = 8 tokens of T = 16 per input (i.i.d. N(0, I) scaled to norm ≤ 1), the kernel-machine
teacher of :func:`ntpref.shallow.data.teacher_student` (R = 16 anchors, ν = 3, K random heads, the
theory's "full" attention), 80/20 train/validation split. Student: the shallow transformer with paired
initialisation, full-batch ProjGD for ``steps`` steps with η = 1.75/√steps (the authors' rule; 0.0277 at
4000 steps) and ρ = 3 for all three blocks, loss = mean squared error (κ = 2). Metric: the minimum over the
steps of the pre-update training loss.

Seeds. The data seed s draws the tokens, anchors and teacher heads; the student's initial heads come from
seed s + :data:`INIT_SEED_OFFSET`, so they are never the same random numbers as the data (paired_init and
teacher_student both start drawing standard normals from ``default_rng(seed)``).

Teacher reuse. Every width of a seed trains on the same data set. A cell regenerates it only when its
process has not built it already: :func:`teacher_data` keeps the last few data sets in memory
(``lru_cache``). Cells are listed seed by seed, so a worker process builds a seed's teacher at most once;
with w workers each teacher is built at most w times (the full teacher, K = 8192 at n = 5000, costs about
27 CPU-s, ~2% of the full sweep). No files besides the cell results, so nothing can go stale.

Run time (measured on the shared 2-core machine, CPU seconds, which count both Numba threads):
one ProjGD step on 4000 samples costs about 0.039 + 0.00104·m CPU-s (0.047 at m = 8, 0.31 at m = 256).
Full size (10 seeds × m ∈ {8..256} × 4000 steps): about 4000 · (6 · 0.039 + 504 · 0.00104) ≈ 3000 CPU-s
per seed, ≈ 8.5 CPU-hours in all (about 4.5 hours of wall time on 2 idle cores).
Quick size: see :data:`SIZES` (measured 236 CPU-s, 264 s wall with --workers 2 on the loaded machine).
"""
from __future__ import annotations

import math
import time
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..shallow.data import TeacherStudent, teacher_student
from ..shallow.model import forward, paired_init
from ..shallow.train import proj_gd
from ..sweep import grid
from . import Summary
from .common import loglog_slope, mean_ci, pyplot, save_figure

DESCRIPTION = "teacher-student: min training loss vs width m, log-log, mean ± 95% CI, power-law slope (≈ -1/2)"

D, R, NU, RHO, ETA_SCALE, TRAIN_FRACTION = 8, 16, 3.0, 3.0, 1.75, 0.8
INIT_SEED_OFFSET = 1_000_003
"""Student seed = data seed + INIT_SEED_OFFSET (module docstring)."""

SIZES = {
    # quick: n = 1000 (800 training samples), a K = 1024-head teacher, 600 steps (η = 1.75/√600),
    # 3 seeds, widths 8..128. Measured 236 CPU-s (≈ 2 min on 2 idle cores with --workers 2).
    "quick": dict(seeds=(1, 2, 3), widths=(8, 16, 32, 64, 128), n=1000, K=1024, steps=600, T=16),
    # full: the paper's setting (spec §5).
    "full": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, steps=4000, T=16),
}


def cells(seeds, widths, n, K, steps, T) -> list[dict]:
    """One cell per (seed, m); seed by seed, the widest student first (the longest cells start early)."""
    return [dict(seed=s, m=m, n=n, K=K, steps=steps, T=T)
            for s in seeds for m in sorted(widths, reverse=True)]


@lru_cache(maxsize=4)
def teacher_data(seed: int, n: int, T: int, K: int) -> TeacherStudent:
    """The seed's teacher–student data set (d = 8, R = 16, ν = 3, 80/20 split), cached in this process."""
    return teacher_student(n=n, d=D, T=T, R=R, K=K, nu=NU, n_train=round(TRAIN_FRACTION * n), seed=seed)


def train_student(data: TeacherStudent, m: int, seed: int, steps: int, n_train: int | None = None) -> dict:
    """Train a width-m student (paired init from seed + INIT_SEED_OFFSET) by ProjGD on the first
    ``n_train`` training samples (all by default). Returns min_train_loss, final_train_loss,
    final_val_loss, train_loss [steps] and the cell's CPU seconds (Numba threads included)."""
    start = time.process_time()
    X, y = data.X_train[:n_train], data.y_train[:n_train]
    c, U, W = paired_init(m, D, seed + INIT_SEED_OFFSET)
    res = proj_gd("shallow", X, y, (c, U, W), eta=ETA_SCALE / math.sqrt(steps), steps=steps, rho=(RHO,) * 3)
    r = forward(data.X_val, res.params["c"], res.params["U"], res.params["W"]) - data.y_val
    return dict(min_train_loss=res.min_train_loss, final_train_loss=res.final_train_loss,
                final_val_loss=float(np.mean(r * r)), train_loss=res.train_loss,
                cpu_seconds=time.process_time() - start)


def cell(seed, m, n, K, steps, T) -> dict:
    """Train one student of width m on the seed's teacher data (see the module docstring)."""
    return train_student(teacher_data(seed, n, T, K), m, seed, steps)


# ----------------------------------------------------------------------------------------------------
# Summaries (shared with ntpref.reproduce.approx and ntpref.reproduce.length)


def select_config(results, varying):
    """Group the cells by their parameters other than ``varying``; return (config, cells, note) of the
    group with the most cells (e.g. a quick and a full run written to the same directory). ``note`` names
    the groups left out ("" when there are none)."""
    groups = defaultdict(list)
    for params, arrays in results:
        key = tuple(sorted((k, v) for k, v in params.items() if k not in varying))
        groups[key].append((params, arrays))
    best = max(groups, key=lambda k: len(groups[k]))
    others = [f"{dict(k)} ({len(v)} cells)" for k, v in groups.items() if k != best]
    note = "" if not others else "ignored other configurations in this directory: " + "; ".join(others)
    return dict(best), groups[best], note


def by_axis(rows, axis: str, value: str) -> tuple[np.ndarray, list[np.ndarray]]:
    """(sorted values of the parameter ``axis``, per value the array of result ``value`` over seeds)."""
    per = defaultdict(list)
    for params, arrays in sorted(rows, key=lambda r: r[0]["seed"]):
        per[params[axis]].append(float(arrays[value]))
    xs = sorted(per)
    return np.array(xs, dtype=float), [np.array(per[x]) for x in xs]


def stats(groups: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean and 95% CI half-width of each group (groups may have different numbers of seeds)."""
    mc = [mean_ci(g) for g in groups]
    return np.array([float(m) for m, _ in mc]), np.array([float(c) for _, c in mc])


def loglog_panel(ax, x, mean, ci, *, label: str, color: str, fit: bool = True, marker: str = "o"):
    """Mean ± CI on log–log axes (the lower bar clipped to stay positive) and, with ``fit``, the
    least-squares power law drawn dashed with its slope in the legend. Returns the slope (or None)."""
    lower = np.minimum(ci, 0.95 * mean)
    ax.errorbar(x, mean, yerr=[lower, ci], fmt=marker + "-", color=color, capsize=3, label=label + " (mean ± 95% CI)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    if not fit or len(x) < 2:
        return None
    slope, intercept = loglog_slope(x, mean)
    xx = np.geomspace(x[0], x[-1], 50)
    ax.plot(xx, np.exp(intercept) * xx ** slope, "--", color=color, alpha=0.8, label=f"fit: slope {slope:+.3f}")
    return slope


def width_table(x, groups, mean, ci, xname="m", yname="min train loss") -> str:
    """A tabulate table: x | seeds | mean | ± 95% CI."""
    rows = [(int(v), len(g), f"{mu:.4e}", f"{c:.2e}") for v, g, mu, c in zip(x, groups, mean, ci)]
    return tabulate(rows, headers=[xname, "seeds", f"mean {yname}", "± 95% CI"])


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
             width_table(m, groups, mean, ci)]
    numbers = {}
    if slope is not None:
        lines.append(f"fitted log-log slope: {slope:+.3f}   (paper: about -1/2)")
        numbers["slope"] = slope
    if note:
        lines.append(note)
    return Summary("\n".join(lines), [fig_path], numbers)
