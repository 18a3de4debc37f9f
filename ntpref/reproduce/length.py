"""Sequence-length and sample-size sweeps of the teacher–student task (docs/shallow.md §5; the abstract's
claims, no released command): the optimization error does not depend on the sequence length T, and the width
needed for a fixed loss grows at most like log n.

Both sweeps train exactly as :mod:`ntpref.reproduce.width` (the authors' "diagonal" teacher unless the size
says otherwise; paired init from seed + INIT_SEED_OFFSET, ProjGD with η = 1.75/√steps, ρ = 3, min training
MSE over the steps) and report the validation loss L_val(θ(steps)) on the teacher's validation split beside
the training loss.
  T sweep (``sweep="T"``): width ``m_T``, the seed's teacher for each T (a T-token teacher is a different
      function, so each T has its own data set of n inputs), all 0.8·n training samples. The theory's bound is
      absolute for fixed ν (it does not depend on T), so the raw min training loss leads; its log–log slope
      in T is ``T_slope``. The teacher's output scale L(0) = mean y² (the loss at the paired initialisation,
      where f = 0, stored as train_loss[0]) changes with T, so the relative loss min_t L(t) / L(0)
      (``T_rel_slope``) is kept as a control.
  n sweep (``sweep="n"``): T = 16; one teacher per seed (n_max inputs) and nested training sets: the sample
      size n uses the first 0.8·n training samples of that data set, so every n fits the same teacher and is
      validated on the same split. Widths ``widths``. Width needed: ε = the median min training loss of the
      middle width at the largest n; for each n a power law is fitted to the medians of loss vs m and
      m_needed(n) = the width where it crosses ε.
The cells carry ``sweep``, so the one setting the two sweeps share (T = 16, m = m_T, all samples) has a cell
in each sweep and each sweep's files stay self-describing. A cell on all training samples is a cell of the
width sweep when that sweep has the same parameters (:func:`equivalent_cell`; at full size the T = 16 cells),
and is copied from its finished results instead of computed.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from . import Summary
from .configs import by_axis, config_text, select_config
from .plots import finish_figure, loglog_panel, pyplot
from .stats import (axis_table, interval_text, loglog_slope, medians, paired_resamples, ratio_interval, slope_text,
                    stats)
from .teacher_student import D, TRAIN_FRACTION, student_arrays, teacher_data, train_student

DESCRIPTION = "sequence length T and sample size n sweeps: raw min loss vs T, width needed vs n, validation loss"

SIZES = {
    # quick: n = 1000 inputs, a K = 1024-head teacher, 800 steps, 3 seeds; T in 4..64 at m = 32;
    # n in {125, 250, 500, 1000} × m in {8, 32, 128}.
    "quick": dict(seeds=(1, 2, 3), Ts=(4, 8, 16, 32, 64), m_T=32, ns=(125, 250, 500, 1000), widths=(8, 32, 128),
                  n=1000, K=1024, steps=800, T_n=16, teacher="diagonal"),
    # full: the authors' teacher-student setting (n = 5000, K = 8192, 4000 steps, 10 seeds), T in 4..64 at
    # m = 64, n in 250..5000 × m = 8..256.
    "full": dict(seeds=tuple(range(1, 11)), Ts=(4, 8, 16, 32, 64), m_T=64, ns=(250, 500, 1000, 2000, 5000),
                 widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, steps=4000, T_n=16, teacher="diagonal"),
}


def cells(seeds, Ts, m_T, ns, widths, n, K, steps, T_n, teacher) -> list[dict]:
    """T-sweep cells, then n-sweep cells, seed by seed (``n`` is the teacher's sample size)."""
    if max(ns) > n:
        raise InputError(f"ns ({max(ns)}) must not exceed the teacher sample size n ({n})")
    out = []
    for s in seeds:
        out += [dict(sweep="T", seed=s, T=T, m=m_T, n=n, n_train=round(TRAIN_FRACTION * n), K=K, steps=steps,
                     teacher=teacher) for T in Ts]
        out += [dict(sweep="n", seed=s, T=T_n, m=m, n=n, n_train=round(TRAIN_FRACTION * n_sub), K=K, steps=steps,
                     teacher=teacher) for n_sub in ns for m in sorted(widths, reverse=True)]
    return out


def equivalent_cell(params: dict) -> tuple[str, dict] | None:
    """A cell that trains on all training samples is the width sweep's cell with the same parameters (the
    width sweep has them at full size for T = 16): the same training, bit for bit."""
    if params["n_train"] != round(TRAIN_FRACTION * params["n"]):
        return None
    return "width", {k: v for k, v in params.items() if k not in ("sweep", "n_train")}


def cell(sweep, seed, T, m, n, n_train, K, steps, teacher) -> dict:
    """Train a width-m student on the first n_train training samples of the seed's T-token teacher."""
    return train_student(teacher_data(seed, n, T, K, teacher), m, seed, steps, n_train)


def cell_arrays(sweep, seed, T, m, n, n_train, K, steps, teacher) -> dict:
    """What :func:`cell` returns: :func:`ntpref.reproduce.teacher_student.student_arrays`."""
    return student_arrays(steps)


def width_needed(ms, loss_by_n: dict) -> tuple[float, dict]:
    """(ε, {n: m_needed}): ε = the loss of the middle width at the largest n; m_needed from a power-law fit
    of loss vs m per n (extrapolated when ε is outside the measured range; NaN when the loss does not fall
    with m)."""
    ns = sorted(loss_by_n)
    widths = _needed_widths(ms, np.array([loss_by_n[n_sub] for n_sub in ns], dtype=float))
    return float(loss_by_n[ns[-1]][len(ms) // 2]), {n_sub: float(m) for n_sub, m in zip(ns, widths)}


#: Fewest seeds whose bootstrap may decide between the growth laws of :func:`growth_comparison`.
DECIDING_SEEDS = 5


def _needed_widths(ms, med: np.ndarray) -> np.ndarray:
    """:func:`width_needed` for a stack of median tables at once: med [..., len(ns), len(ms)] (ns ascending);
    returns m_needed [..., len(ns)] (NaN where the loss does not fall with m)."""
    lm = np.log(np.asarray(ms, float))
    lm = lm - lm.mean()
    ly = np.log(med)
    slope = (ly - ly.mean(axis=-1, keepdims=True)) @ lm / (lm @ lm)
    intercept = ly.mean(axis=-1) - slope * np.log(np.asarray(ms, float)).mean()
    log_eps = ly[..., -1, len(ms) // 2][..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(slope < 0, np.exp((log_eps - intercept) / slope), np.nan)


def growth_fits(ns, m_needed: np.ndarray) -> dict[str, np.ndarray]:
    """The two growth laws fitted to the width needed, m_needed [..., len(ns)] (one row per bootstrap draw):
    a power law log m = c + p log n and a log law m = a + b log n (least squares in m). Returns p, b and the
    RMS residual of log m under each ("rms_power", "rms_log"; NaN where the log law predicts m ≤ 0)."""
    ln = np.log(np.asarray(ns, float))
    x = ln - ln.mean()
    with np.errstate(divide="ignore", invalid="ignore"):
        lm = np.log(m_needed)
        p = (lm - lm.mean(axis=-1, keepdims=True)) @ x / (x @ x)
        rms_power = np.sqrt(np.mean((lm - lm.mean(axis=-1, keepdims=True) - p[..., None] * x) ** 2, axis=-1))
        b = (m_needed - m_needed.mean(axis=-1, keepdims=True)) @ x / (x @ x)
        log_law = m_needed.mean(axis=-1, keepdims=True) + b[..., None] * x
        rms_log = np.sqrt(np.mean((lm - np.log(np.where(log_law > 0, log_law, np.nan))) ** 2, axis=-1))
    return {"p": p, "b": b, "rms_power": rms_power, "rms_log": rms_log}


def growth_comparison(ms, ns, groups: list[list[np.ndarray]]) -> str:
    """What the seeds decide between a power law and a log law for the width needed vs n: groups[i][j] the
    per-seed min training losses at n = ns[i], m = ms[j] (sorted by seed, the same seeds everywhere). The fits
    of :func:`growth_fits` on the medians, 95% bootstrap intervals of p and b (the seeds resampled together,
    :func:`~ntpref.reproduce.stats.paired_resamples`) and the share of draws in which the log law leaves the
    smaller residual; that share decides only below 5% or above 95%, and only with at least
    :data:`DECIDING_SEEDS` seeds (the medians of two or three resampled seeds take few distinct values)."""
    seeds = {len(g) for row in groups for g in row}
    values = np.array([[np.asarray(g, float) for g in row] for row in groups]) if len(seeds) == 1 else None
    if values is None or seeds.pop() < 2:
        return "power law vs log law for the width needed: no comparison (needs the same seeds, at least 2, in every cell)"
    point = growth_fits(ns, _needed_widths(ms, np.median(values, axis=-1)))
    drawn = np.median(values[..., paired_resamples(values.shape[-1])], axis=-1)      # [ns, ms, draws]
    fits = growth_fits(ns, _needed_widths(ms, np.moveaxis(drawn, -1, 0)))
    usable = np.isfinite(fits["rms_power"]) & np.isfinite(fits["rms_log"])
    share = float(np.mean(fits["rms_log"][usable] < fits["rms_power"][usable])) if usable.any() else float("nan")
    p_lo, p_hi = np.nanpercentile(fits["p"], [2.5, 97.5])
    b_lo, b_hi = np.nanpercentile(fits["b"], [2.5, 97.5])
    verdict = (f"{values.shape[-1]} seeds are too few for a bootstrap to decide" if values.shape[-1] < DECIDING_SEEDS
               else "the log law fits better in almost every draw" if share > 0.95
               else "the power law fits better in almost every draw" if share < 0.05
               else "the seeds do not decide between the two")
    return (f"width needed vs n, power law m ∝ n^p: p = {float(point['p']):+.3f} (95% bootstrap interval "
            f"[{p_lo:+.3f}, {p_hi:+.3f}]), RMS log residual {float(point['rms_power']):.3g}; log law m = a + b·log n: "
            f"b = {float(point['b']):.3g} ([{b_lo:.3g}, {b_hi:.3g}]), RMS log residual {float(point['rms_log']):.3g}; "
            f"the log law leaves the smaller residual in {share:.0%} of {int(usable.sum())} draws: {verdict}")


def relative_loss(arrays) -> float:
    """min_t L(t) / L(0) of one cell: L(0) = train_loss[0] is the loss at the paired initialisation, where
    f = 0, i.e. the mean of y² over the training samples (the teacher's output scale)."""
    return float(np.min(arrays["train_loss"]) / arrays["train_loss"][0])


def axis_series(ax, rows, axis: str, value, *, key: str, header: str, label: str, short: str, color: str,
                fit: bool, lines: list, numbers: dict, marker: str = "o", ls: str = "-") -> tuple[np.ndarray, list]:
    """One quantity of a sweep along the parameter ``axis`` (e.g. "T"): ``value`` (a result name or a function
    arrays -> float, :func:`~ntpref.reproduce.configs.by_axis`) per seed, drawn on ``ax`` (mean ± 95% CI and
    medians, log–log), its table after ``header`` appended to ``lines``; with ``fit`` (and positive medians)
    the log–log slope of the medians with its 95% bootstrap interval over the seeds and median(max) /
    median(min) with its own, stored as ``numbers[key + "_slope"]`` and ``numbers[key + "_ratio"]``. Returns
    (the axis values, the per-seed groups of ``value``) as :func:`~ntpref.reproduce.configs.by_axis` does."""
    xs, groups = by_axis(rows, axis, value)
    mean, ci = stats(groups)
    med = medians(groups)
    fit = fit and bool((med > 0).all())
    slope = loglog_panel(ax, xs, mean, ci, label=label, color=color, median=med, fit=med if fit else None,
                         marker=marker, ls=ls)
    lines += ["", header, axis_table(xs, groups, mean, ci, xname=axis, yname=short)]
    if slope is not None:
        numbers[f"{key}_slope"] = slope
        numbers[f"{key}_ratio"] = float(med[-1] / med[0])
        interval = ratio_interval(groups[0], groups[-1], np.median)
        lines.append(f"log-log slope of the medians in {axis}: {slope_text(slope, xs, groups)}; "
                     f"median({axis}_max) / median({axis}_min) = "
                     f"{med[-1] / med[0]:.3f}" + (f" (95% bootstrap interval{interval_text(interval)})"
                                                  if interval else ""))
    return xs, groups


def _t_sweep(rows, axes, lines: list, numbers: dict) -> None:
    """T sweep: raw min training loss and validation loss vs T (lead), relative loss (control), L(0) vs T."""
    config, rows, note = select_config(rows, ("seed", "T"))
    lines.append(f"T sweep ({config_text(config)}); paper (abstract): the optimization error is independent of T")
    panels = (
        (axes[0], "min_train_loss", "T", "min training loss", "min train loss", "C0", True),
        (axes[0], "final_val_loss", "T_val", "final validation loss", "final val loss", "C2", True),
        (axes[1], relative_loss, "T_rel", "min_t L(t) / L(0) (control)", "min L / L(0)", "C1", True),
        (axes[2], lambda a: a["train_loss"][0], "T_L0", "L(0) = mean y² (teacher scale)", "L(0)", "C7", False))
    for ax, value, key, label, short, color, fit in panels:
        axis_series(ax, rows, "T", value, key=key, header=f"T sweep: {label} (m = {config['m']})", label=label,
                    short=short, color=color, fit=fit, lines=lines, numbers=numbers)
    for ax, ylabel, title in ((axes[0], "loss (MSE)", "raw losses vs T (lead)"),
                              (axes[1], "min$_t$ L(t) / L(0)", "relative loss vs T (control)"),
                              (axes[2], "mean y² over the training set", "teacher output scale vs T")):
        ax.set_xlabel("sequence length T")
        ax.set_ylabel(ylabel)
        ax.set_title(f"T sweep (n = {config['n']}, m = {config['m']}, {config['steps']} steps): {title}", fontsize=8.5)
        ax.legend(fontsize=7)
    lines += [note] if note else []


def _n_sweep(rows, axes, lines: list, numbers: dict) -> None:
    """n sweep: min training loss and validation loss vs m per n, and the width needed for the loss ε vs n."""
    config, rows, note = select_config(rows, ("seed", "m", "n_train"))
    n_trains = sorted({p["n_train"] for p, _ in rows})
    med_by_n, table, ms, groups_by_n = {}, [], [], []
    for i, n_tr in enumerate(n_trains):
        n_sub = round(n_tr / TRAIN_FRACTION)
        sub = [r for r in rows if r[0]["n_train"] == n_tr]
        ms, groups = by_axis(sub, "m", "min_train_loss")
        mean, ci = stats(groups)
        med_by_n[n_sub] = med = medians(groups)
        groups_by_n.append(groups)
        loglog_panel(axes[0], ms, mean, ci, label=f"n = {n_sub}", color=f"C{i}", median=med)
        _, val_groups = by_axis(sub, "m", "final_val_loss")
        val_mean, val_ci = stats(val_groups)
        loglog_panel(axes[1], ms, val_mean, val_ci, label=f"n = {n_sub}", color=f"C{i}", median=medians(val_groups))
        table += [(n_sub, int(m), len(g), f"{mu:.4e} ± {c:.1e}", f"{md:.4e}", f"{float(np.median(vg)):.4e}")
                  for m, g, mu, c, md, vg in zip(ms, groups, mean, ci, med, val_groups)]
    lines += ["", f"n sweep ({config_text(config)})",
              tabulate(table, headers=["n", "m", "seeds", "min train loss (mean ± CI)", "median",
                                       "median final val loss"])]
    if len(ms) >= 2 and all(len(v) == len(ms) for v in med_by_n.values()):
        eps, needed = width_needed(ms, med_by_n)
        axes[0].axhline(eps, color="k", ls=":", label=f"ε = {eps:.2e}")
        ns = np.array(sorted(needed), dtype=float)
        mn = np.array([needed[k] for k in sorted(needed)])
        axes[2].plot(ns, mn, "o-", color="C0", label="width needed for ε (power-law fit of the medians per n)")
        ref = mn[-1] * np.log(ns) / np.log(ns[-1])
        axes[2].plot(ns, ref, "--", color="gray", label="∝ log n (through the largest n)")
        axes[2].set_xscale("log")
        axes[2].set_xticks(ns, [f"{v:g}" for v in ns])
        axes[2].tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
        axes[2].set_ylim(0, 1.3 * np.nanmax(np.r_[mn, ref]))
        lines.append(f"width needed for loss ε = {eps:.3e}: "
                     + ", ".join(f"n={k}: m≈{v:.1f}" for k, v in needed.items())
                     + "   (paper, abstract: the width needed scales only logarithmically with n)")
        numbers.update({f"m_needed_n{k}": v for k, v in needed.items()})
        if np.isfinite(mn).all() and (mn > 0).all() and len(ns) >= 2:
            numbers["m_needed_slope"] = loglog_slope(ns, mn)[0]
            lines.append(growth_comparison(ms, sorted(needed), groups_by_n))
    for ax, ylabel, title in ((axes[0], "min training loss (MSE)", "min training loss vs m per n"),
                              (axes[1], "final validation loss (MSE)", "validation loss vs m per n")):
        ax.set_xlabel("width m (heads)")
        ax.set_ylabel(ylabel)
        ax.set_title(f"n sweep (T = {config['T']}): {title}", fontsize=9)
        ax.legend(fontsize=7)
    axes[2].set_xlabel("sample size n (80% used for training)")
    axes[2].set_ylabel("width m needed")
    axes[2].set_title("width needed for a fixed training loss vs n", fontsize=9)
    axes[2].grid(True, which="both", alpha=0.3)
    axes[2].legend(fontsize=7)
    lines += [note] if note else []


def summarize(results, outdir) -> Summary:
    """Tables of both sweeps and ``length.png``: raw losses, relative loss and teacher scale vs T (top);
    training and validation loss vs m per n and the width needed vs n (bottom)."""
    lines, numbers = [], {}
    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    t_rows = [r for r in results if r[0]["sweep"] == "T"]
    n_rows = [r for r in results if r[0]["sweep"] == "n"]
    if t_rows:
        _t_sweep(t_rows, axes[0], lines, numbers)
    if n_rows:
        _n_sweep(n_rows, axes[1], lines, numbers)
    title = f"Teacher–student (d = {D}), ProjGD; mean ± 95% CI over seeds, open markers: medians"
    path = finish_figure(fig, title, Path(outdir) / "length.png", fontsize=10)
    return Summary("\n".join(lines).strip("\n"), [path], numbers)
