"""Sequence-length and sample-size sweeps of the teacher–student task (spec/shallow.md §5; the abstract's
claims, no released command): the min training loss stays flat in the sequence length T, and the width
needed for a fixed loss grows at most like log n.

Both sweeps train exactly as :mod:`ntpref.reproduce.width` (paired init from seed + INIT_SEED_OFFSET,
ProjGD with η = 1.75/√steps, ρ = 3, min training MSE over the steps).
  T sweep (``sweep="T"``): width ``m_T``, the seed's teacher for each T (a T-token teacher is a different
      function, so each T has its own data set of n inputs), all 0.8·n training samples.
  n sweep (``sweep="n"``): T = 16; one teacher per seed (n_max inputs) and nested training sets: the sample
      size n uses the first 0.8·n training samples of that data set, so every n fits the same teacher.
      Widths ``widths``. Width needed: ε = the mean min training loss of the middle width at the largest n;
      for each n a power law is fitted to loss vs m and m_needed(n) = the width where it crosses ε.
The cells carry ``sweep``, so the one setting the two sweeps share (T = 16, m = m_T, all samples) is
computed once per sweep (one extra cell per seed) and each sweep's files stay self-describing.

Run time (CPU seconds, shared 2-core machine): a ProjGD step costs ≈ (n_train/4000)·(0.039 +
0.00104·m·(d² + T·d)/192) CPU-s (measured at T = 16). Full size: T sweep ≈ 2600 CPU-s per seed,
n sweep ≈ 5150 CPU-s per seed, ≈ 21 CPU-hours for 10 seeds (≈ 11 hours on 2 idle cores).
Quick: see :data:`SIZES`.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from . import Summary
from .common import loglog_slope, pyplot, save_figure
from .width import (D, TRAIN_FRACTION, by_axis, loglog_panel, select_config, stats, teacher_data,
                    train_student)

DESCRIPTION = "sequence length T and sample size n sweeps: min training loss flat in T, width needed vs n"

SIZES = {
    # quick: n = 1000 inputs, a K = 1024-head teacher, 400 steps, 2 seeds; T in 4..32 at m = 32;
    # n in {250, 500, 1000} × m in {8, 32, 128}. Measured 318 CPU-s (376 s wall, --workers 2, loaded machine).
    "quick": dict(seeds=(1, 2), Ts=(4, 8, 16, 32), m_T=32, ns=(250, 500, 1000), widths=(8, 32, 128), n=1000,
                  K=1024, steps=400, T_n=16),
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


def summarize(results, outdir) -> Summary:
    """Tables of both sweeps and ``length.png``: loss vs T, loss vs m per n, width needed vs n."""
    lines, numbers = [], {}
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))

    t_rows = [r for r in results if r[0]["sweep"] == "T"]
    if t_rows:
        config, t_rows, note = select_config(t_rows, ("seed", "T"))
        Ts, groups = by_axis(t_rows, "T", "min_train_loss")
        mean, ci = stats(groups)
        slope = loglog_panel(axes[0], Ts, mean, ci, label=f"m = {config['m']}", color="C0")
        axes[0].set_xlabel("sequence length T")
        axes[0].set_ylabel("min training loss (MSE)")
        axes[0].set_title(f"T sweep (n = {config['n']}, {config['steps']} steps): flat in T?", fontsize=10)
        axes[0].legend(fontsize=8)
        lines += [f"T sweep ({config})",
                  tabulate([(int(T), len(g), f"{mu:.4e}", f"{c:.2e}") for T, g, mu, c in zip(Ts, groups, mean, ci)],
                           headers=["T", "seeds", "mean min train loss", "± 95% CI"])]
        if slope is not None:
            numbers["T_slope"] = slope
            numbers["T_ratio"] = float(mean[-1] / mean[0])
            lines.append(f"log-log slope in T: {slope:+.3f}; loss(T_max)/loss(T_min) = {mean[-1] / mean[0]:.3f}"
                         "   (paper: flat in T)")
        lines += [note] if note else []

    n_rows = [r for r in results if r[0]["sweep"] == "n"]
    if n_rows:
        config, n_rows, note = select_config(n_rows, ("seed", "m", "n_train"))
        n_trains = sorted({p["n_train"] for p, _ in n_rows})
        mean_by_n, table = {}, []
        for i, n_tr in enumerate(n_trains):
            n_sub = round(n_tr / TRAIN_FRACTION)
            ms, groups = by_axis([r for r in n_rows if r[0]["n_train"] == n_tr], "m", "min_train_loss")
            mean, ci = stats(groups)
            mean_by_n[n_sub] = mean
            loglog_panel(axes[1], ms, mean, ci, label=f"n = {n_sub}", color=f"C{i}", fit=False)
            table += [(n_sub, int(m), len(g), f"{mu:.4e}", f"{c:.2e}") for m, g, mu, c in zip(ms, groups, mean, ci)]
        lines += ["", f"n sweep ({config})",
                  tabulate(table, headers=["n", "m", "seeds", "mean min train loss", "± 95% CI"])]
        if len(ms) >= 2 and all(len(v) == len(ms) for v in mean_by_n.values()):
            eps, needed = width_needed(ms, mean_by_n)
            axes[1].axhline(eps, color="k", ls=":", label=f"ε = {eps:.2e}")
            ns = np.array(sorted(needed), dtype=float)
            mn = np.array([needed[k] for k in sorted(needed)])
            axes[2].plot(ns, mn, "o-", color="C0", label="width needed for ε (power-law fit per n)")
            ref = mn[-1] * np.log(ns) / np.log(ns[-1])
            axes[2].plot(ns, ref, "--", color="gray", label="∝ log n (through the largest n)")
            axes[2].set_xscale("log")
            axes[2].set_ylim(0, 1.3 * np.nanmax(np.r_[mn, ref]))
            lines.append(f"width needed for loss ε = {eps:.3e}: "
                         + ", ".join(f"n={k}: m≈{v:.1f}" for k, v in needed.items())
                         + "   (paper: grows at most like log n)")
            numbers.update({f"m_needed_n{k}": v for k, v in needed.items()})
            if np.isfinite(mn).all() and (mn > 0).all() and len(ns) >= 2:
                numbers["m_needed_slope"] = loglog_slope(ns, mn)[0]
        axes[1].set_xlabel("width m (heads)")
        axes[1].set_ylabel("min training loss (MSE)")
        axes[1].set_title(f"n sweep (T = {config['T']}): loss vs m per n", fontsize=10)
        axes[1].legend(fontsize=8)
        axes[2].set_xlabel("sample size n (80% used for training)")
        axes[2].set_ylabel("width m needed")
        axes[2].set_title("width needed for a fixed loss vs n", fontsize=10)
        axes[2].grid(True, which="both", alpha=0.3)
        axes[2].legend(fontsize=8)
        lines += [note] if note else []
    fig.suptitle(f"Teacher–student (d = {D}), ProjGD; mean ± 95% CI over seeds", fontsize=9)
    path = save_figure(fig, Path(outdir) / "length.png")
    return Summary("\n".join(lines), [path], numbers)
