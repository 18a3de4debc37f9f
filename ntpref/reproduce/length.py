"""Sequence-length and sample-size sweeps of the teacher–student task (spec/shallow.md §5; the abstract's
claims, no released command): the min training loss stays flat in the sequence length T, and the width
needed for a fixed loss grows at most like log n.

Both sweeps train exactly as :mod:`ntpref.reproduce.width` (paired init from seed + INIT_SEED_OFFSET,
ProjGD with η = 1.75/√steps, ρ = 3, min training MSE over the steps).
  T sweep (``sweep="T"``): width ``m_T``, the seed's teacher for each T (a T-token teacher is a different
      function, so each T has its own data set of n inputs), all 0.8·n training samples. The raw min loss
      is not comparable across T: the teacher's output scale shrinks as T grows (its attention averages
      over more tokens), so the primary quantity is the relative loss min_t L(t) / L(0), L(0) = mean y² =
      the loss at the paired initialisation (f = 0, stored as train_loss[0]); its log–log slope in T is
      ``T_rel_slope`` (flat in T: slope ≈ 0). The raw min loss is the figure's second panel (``T_slope``).
  n sweep (``sweep="n"``): T = 16; one teacher per seed (n_max inputs) and nested training sets: the sample
      size n uses the first 0.8·n training samples of that data set, so every n fits the same teacher.
      Widths ``widths``. Width needed: ε = the mean min training loss of the middle width at the largest n;
      for each n a power law is fitted to loss vs m and m_needed(n) = the width where it crosses ε.
The cells carry ``sweep``, so the one setting the two sweeps share (T = 16, m = m_T, all samples) is
computed once per sweep (one extra cell per seed) and each sweep's files stay self-describing.

Run time, measured on the 2-core machine (idle) with --workers 2, 1 Numba thread per worker:
  quick (:data:`SIZES`): 76 s wall.
  a ProjGD step on 4000 samples at T = 16 costs 0.20 s CPU summed over the six widths (see
  :mod:`ntpref.reproduce.width`); at m = 64 it is 10, 14, 23, 41 and 91 ms at T = 4, 8, 16, 32, 64
  (0.18 s in all), and it scales with the number of training samples.
  full: T sweep ≈ 4000 · 0.18 s ≈ 720 CPU-s per seed, n sweep ≈ 4000 · 1.7 · 0.20 s ≈ 1350 CPU-s per
  seed, ≈ 5.7 CPU-hours for 10 seeds, ≈ 3 hours of wall time with --workers 2 (estimated, not run).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from . import Summary
from .common import (D, TRAIN_FRACTION, axis_table, by_axis, loglog_panel, loglog_slope, pyplot, save_figure,
                     select_config, stats, teacher_data, train_student)

DESCRIPTION = "sequence length T and sample size n sweeps: min training loss flat in T, width needed vs n"

SIZES = {
    # quick: n = 1000 inputs, a K = 1024-head teacher, 800 steps, 3 seeds; T in 4..64 at m = 32;
    # n in {250, 500, 1000} × m in {8, 32, 128}.
    "quick": dict(seeds=(1, 2, 3), Ts=(4, 8, 16, 32, 64), m_T=32, ns=(250, 500, 1000), widths=(8, 32, 128),
                  n=1000, K=1024, steps=800, T_n=16),
    # full: the paper's teacher–student setting (spec §5), T in 4..64 at m = 64, n in 500..5000.
    "full": dict(seeds=tuple(range(1, 11)), Ts=(4, 8, 16, 32, 64), m_T=64, ns=(500, 1000, 2000, 5000),
                 widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, steps=4000, T_n=16),
}


def cells(seeds, Ts, m_T, ns, widths, n, K, steps, T_n) -> list[dict]:
    """T-sweep cells, then n-sweep cells, seed by seed (``n`` is the teacher's sample size)."""
    if max(ns) > n:
        raise InputError(f"ns ({max(ns)}) must not exceed the teacher sample size n ({n})")
    out = []
    for s in seeds:
        out += [dict(sweep="T", seed=s, T=T, m=m_T, n=n, n_train=round(TRAIN_FRACTION * n), K=K, steps=steps)
                for T in Ts]
        out += [dict(sweep="n", seed=s, T=T_n, m=m, n=n, n_train=round(TRAIN_FRACTION * n_sub), K=K, steps=steps)
                for n_sub in ns for m in sorted(widths, reverse=True)]
    return out


def cell(sweep, seed, T, m, n, n_train, K, steps) -> dict:
    """Train a width-m student on the first n_train training samples of the seed's T-token teacher."""
    return train_student(teacher_data(seed, n, T, K), m, seed, steps, n_train)


def width_needed(ms, mean_by_n: dict) -> tuple[float, dict]:
    """(ε, {n: m_needed}): ε = the loss of the middle width at the largest n; m_needed from a power-law fit
    of loss vs m per n (extrapolated when ε is outside the measured range)."""
    ns = sorted(mean_by_n)
    eps = float(mean_by_n[ns[-1]][len(ms) // 2])
    needed = {}
    for n_sub in ns:
        slope, intercept = loglog_slope(ms, mean_by_n[n_sub])
        needed[n_sub] = float(np.exp((np.log(eps) - intercept) / slope)) if slope < 0 else float("nan")
    return eps, needed


def relative_loss(arrays) -> float:
    """min_t L(t) / L(0) of one cell: L(0) = train_loss[0] is the loss at the paired initialisation, where
    f = 0, i.e. the mean of y² over the training samples (the teacher's output scale)."""
    return float(np.min(arrays["train_loss"]) / arrays["train_loss"][0])


def _t_sweep(rows, axes, lines: list, numbers: dict) -> None:
    """T sweep: relative min loss vs T (primary, fitted slope) and the raw min loss vs T (second panel)."""
    config, rows, note = select_config(rows, ("seed", "T"))
    for ax, value, key, ylabel, title in (
            (axes[0], relative_loss, "T_rel", "relative loss min$_t$ L(t) / L(0)",
             "relative loss vs T (flat in T?)"),
            (axes[1], "min_train_loss", "T", "min training loss (MSE)", "raw min loss vs T")):
        Ts, groups = by_axis(rows, "T", value)
        mean, ci = stats(groups)
        slope = loglog_panel(ax, Ts, mean, ci, label=f"m = {config['m']}", color="C0")
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.set_title(f"T sweep (n = {config['n']}, {config['steps']} steps): {title}", fontsize=10)
        ax.legend(fontsize=8)
        lines += ["", f"T sweep, {'min_t L(t) / L(0)' if key == 'T_rel' else 'raw min training loss'} ({config})",
                  axis_table(Ts, groups, mean, ci, xname="T",
                             yname="min L / L(0)" if key == "T_rel" else "min train loss")]
        if slope is None:
            continue
        numbers[f"{key}_slope"] = slope
        numbers[f"{key}_ratio"] = float(mean[-1] / mean[0])
        lines.append(f"log-log slope in T: {slope:+.3f}; value(T_max)/value(T_min) = {mean[-1] / mean[0]:.3f}"
                     + ("   (paper: flat in T)" if key == "T_rel" else
                        "   (not comparable across T: the teacher's output scale L(0) changes with T)"))
    L0, L0_groups = by_axis(rows, "T", lambda a: a["train_loss"][0])
    lines.append("loss at init L(0) = mean y² per T: "
                 + ", ".join(f"T={int(T)}: {float(np.mean(g)):.3e}" for T, g in zip(L0, L0_groups)))
    lines += [note] if note else []


def _n_sweep(rows, axes, lines: list, numbers: dict) -> None:
    """n sweep: loss vs m per n and the width needed for the loss ε vs n."""
    config, rows, note = select_config(rows, ("seed", "m", "n_train"))
    n_trains = sorted({p["n_train"] for p, _ in rows})
    mean_by_n, table = {}, []
    for i, n_tr in enumerate(n_trains):
        n_sub = round(n_tr / TRAIN_FRACTION)
        ms, groups = by_axis([r for r in rows if r[0]["n_train"] == n_tr], "m", "min_train_loss")
        mean, ci = stats(groups)
        mean_by_n[n_sub] = mean
        loglog_panel(axes[0], ms, mean, ci, label=f"n = {n_sub}", color=f"C{i}", fit=False)
        table += [(n_sub, int(m), len(g), f"{mu:.4e}", f"{c:.2e}") for m, g, mu, c in zip(ms, groups, mean, ci)]
    lines += ["", f"n sweep ({config})",
              tabulate(table, headers=["n", "m", "seeds", "mean min train loss", "± 95% CI"])]
    if len(ms) >= 2 and all(len(v) == len(ms) for v in mean_by_n.values()):
        eps, needed = width_needed(ms, mean_by_n)
        axes[0].axhline(eps, color="k", ls=":", label=f"ε = {eps:.2e}")
        ns = np.array(sorted(needed), dtype=float)
        mn = np.array([needed[k] for k in sorted(needed)])
        axes[1].plot(ns, mn, "o-", color="C0", label="width needed for ε (power-law fit per n)")
        ref = mn[-1] * np.log(ns) / np.log(ns[-1])
        axes[1].plot(ns, ref, "--", color="gray", label="∝ log n (through the largest n)")
        axes[1].set_xscale("log")
        axes[1].set_xticks(ns, [f"{v:g}" for v in ns])
        axes[1].tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
        axes[1].set_ylim(0, 1.3 * np.nanmax(np.r_[mn, ref]))
        lines.append(f"width needed for loss ε = {eps:.3e}: "
                     + ", ".join(f"n={k}: m≈{v:.1f}" for k, v in needed.items())
                     + "   (paper: grows at most like log n)")
        numbers.update({f"m_needed_n{k}": v for k, v in needed.items()})
        if np.isfinite(mn).all() and (mn > 0).all() and len(ns) >= 2:
            numbers["m_needed_slope"] = loglog_slope(ns, mn)[0]
    axes[0].set_xlabel("width m (heads)")
    axes[0].set_ylabel("min training loss (MSE)")
    axes[0].set_title(f"n sweep (T = {config['T']}): loss vs m per n", fontsize=10)
    axes[0].legend(fontsize=8)
    axes[1].set_xlabel("sample size n (80% used for training)")
    axes[1].set_ylabel("width m needed")
    axes[1].set_title("width needed for a fixed loss vs n", fontsize=10)
    axes[1].grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=8)
    lines += [note] if note else []


def summarize(results, outdir) -> Summary:
    """Tables of both sweeps and ``length.png``: relative and raw min loss vs T (top), loss vs m per n and
    the width needed vs n (bottom)."""
    lines, numbers = [], {}
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    t_rows = [r for r in results if r[0]["sweep"] == "T"]
    n_rows = [r for r in results if r[0]["sweep"] == "n"]
    if t_rows:
        _t_sweep(t_rows, axes[0], lines, numbers)
    if n_rows:
        _n_sweep(n_rows, axes[1], lines, numbers)
    fig.suptitle(f"Teacher–student (d = {D}), ProjGD; mean ± 95% CI over seeds", fontsize=10)
    fig.tight_layout()
    path = save_figure(fig, Path(outdir) / "length.png")
    return Summary("\n".join(lines).strip("\n"), [path], numbers)
