"""ProjGD and ProjSGD on the teacher–student task (docs/shallow.md §3; the paper analyses both algorithms,
the authors' code runs no ProjSGD experiment): min training loss vs the width m for full-batch ProjGD and
ProjSGD at two minibatch sizes.

Training as :mod:`ntpref.reproduce.width` (the authors' "diagonal" teacher, paired init from
seed + INIT_SEED_OFFSET, η = 1.75/√steps and ρ = 3 for all blocks, the same number of steps for every
method). ``batch`` = 0 is ProjGD, a cell of the width sweep at both sizes (:func:`equivalent_cell`: copied
from its finished results instead of computed); ``batch`` = B > 0 is ProjSGD (:func:`ntpref.shallow.train`,
batch_size = B: B sample indices drawn uniformly with replacement every step from
default_rng(seed + SGD_SEED_OFFSET), the minibatch gradient, the same projection). Metric: the minimum over
the steps of the pre-update training loss on the whole training set (the trainer logs it for both methods),
and the final validation loss.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tabulate import tabulate

from . import Summary
from .configs import by_axis, config_text, select_config
from .plots import ci_errorbar, loglog_panel, pyplot, save_figure
from .stats import medians, slope_text, stats
from .teacher_student import D, student_arrays, teacher_data, train_student

DESCRIPTION = "ProjGD vs ProjSGD (two batch sizes): min training loss vs width m"

SIZES = {
    # quick: the width sweep's quick data (n = 1000, K = 1024, 1500 steps, 3 seeds, m = 8..128), B = 32, 256.
    "quick": dict(seeds=(1, 2, 3), widths=(8, 16, 32, 64, 128), n=1000, K=1024, steps=1500, T=16,
                  batches=(0, 32, 256), teacher="diagonal"),
    # full: the authors' width setting (n = 5000, K = 8192, 4000 steps, 10 seeds, m = 8..256), B = 32, 256.
    "full": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, steps=4000, T=16,
                 batches=(0, 32, 256), teacher="diagonal"),
}


def method(batch: int) -> str:
    """The method's name: ProjGD for batch 0, else ProjSGD with its batch size."""
    return "ProjGD" if batch == 0 else f"ProjSGD (B = {batch})"


def cells(seeds, widths, n, K, steps, T, batches, teacher) -> list[dict]:
    """One cell per (seed, batch, m), seed by seed, the widest student first."""
    return [dict(seed=s, batch=b, m=m, n=n, K=K, steps=steps, T=T, teacher=teacher)
            for s in seeds for b in batches for m in sorted(widths, reverse=True)]


def equivalent_cell(params: dict) -> tuple[str, dict] | None:
    """A ProjGD cell (batch 0) is the width sweep's cell of the same seed, teacher, m and data: the same
    training, bit for bit."""
    if params["batch"] != 0:
        return None
    return "width", {k: v for k, v in params.items() if k != "batch"}


def cell(seed, batch, m, n, K, steps, T, teacher) -> dict:
    """Train one student by ProjGD (batch 0) or ProjSGD (see the module docstring)."""
    return train_student(teacher_data(seed, n, T, K, teacher), m, seed, steps, batch=batch or None)


def cell_arrays(seed, batch, m, n, K, steps, T, teacher) -> dict:
    """What :func:`cell` returns: :func:`ntpref.reproduce.teacher_student.student_arrays`."""
    return student_arrays(steps)


def summarize(results, outdir) -> Summary:
    """Per method: min training loss per width (mean ± CI, median), median-fit slope, and the ratio to ProjGD
    on the same seed (same data and initial heads); ``projsgd.png`` (the losses, the ratios)."""
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw=dict(wspace=0.28))
    lines, numbers, table, config = [], {}, [], {}
    gd = {(p["seed"], p["m"]): a["min_train_loss"] for p, a in results if p["batch"] == 0}
    for i, b in enumerate(sorted({p["batch"] for p, _ in results})):
        config, rows, note = select_config([r for r in results if r[0]["batch"] == b], ("seed", "m"))
        config.pop("batch")
        color, marker = f"C{i}", "os^v"[i % 4]
        m, groups = by_axis(rows, "m", "min_train_loss")
        mean, ci = stats(groups)
        med = medians(groups)
        _, val = by_axis(rows, "m", "final_val_loss")
        slope = loglog_panel(axes[0], m, mean, ci, label=method(b), color=color, marker=marker, median=med, fit=med)
        paired = [r for r in rows if (r[0]["seed"], r[0]["m"]) in gd]
        ratio_groups = [np.array([a["min_train_loss"] / gd[p["seed"], p["m"]] for p, a in paired if p["m"] == w])
                        for w in m]
        if b and all(len(g) for g in ratio_groups):
            r_mean, r_ci = stats(ratio_groups)
            ci_errorbar(axes[1], m, r_mean, r_ci, label=method(b), color=color, marker=marker)
            numbers[f"ratio_batch{b}_max"] = float(max(np.max(np.abs(g - 1.0)) for g in ratio_groups))
            lines.append(f"{method(b)}: largest |min training loss / ProjGD's - 1| over the seeds and widths: "
                         f"{100 * numbers[f'ratio_batch{b}_max']:.2f}%")
        table += [(method(b), int(w), len(g), f"{mu:.4e} ± {c:.1e}", f"{md:.4e}",
                   f"{float(np.mean(rg)):.4f}" if len(rg) else "-", f"{float(np.mean(v)):.4e}")
                  for w, g, mu, c, md, rg, v in zip(m, groups, mean, ci, med, ratio_groups, val)]
        if slope is not None:
            numbers[f"slope_batch{b}"] = slope
            lines.append(f"{method(b)}: log-log slope of the median min training loss in m: "
                         f"{slope_text(slope, m, groups)}")
        lines += [note] if note else []
    axes[0].set_ylabel("min training loss (MSE, whole training set)")
    axes[0].set_title("min training loss vs m (open markers: medians)", fontsize=9)
    axes[1].axhline(1.0, color="0.4", ls=":", lw=1)
    axes[1].set_xscale("log", base=2)
    axes[1].set_xticks(m, [f"{v:g}" for v in m])
    axes[1].tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    axes[1].set_ylabel("min training loss / ProjGD's (same seed)")
    axes[1].set_title("ProjSGD relative to ProjGD (mean ± 95% CI over seeds)", fontsize=9)
    axes[1].grid(True, which="both", alpha=0.3)
    for ax in axes:
        ax.set_xlabel("width m (heads)")
        ax.legend(fontsize=7)
    fig.suptitle(f"Teacher–student ({config.get('teacher')} teacher), n={config.get('n')}, {config.get('steps')} "
                 "steps, the same η for every method", fontsize=9)
    path = save_figure(fig, Path(outdir) / "projsgd.png")
    head = [f"ProjGD vs ProjSGD, min training loss vs m (d = {D}; {config_text(config)})",
            tabulate(table, headers=["method", "m", "seeds", "min train loss (mean ± CI)", "median",
                                     "mean ratio to ProjGD", "mean final val loss"], disable_numparse=True)]
    return Summary("\n".join(head + lines), [path], numbers)
