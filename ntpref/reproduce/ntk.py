"""NTK-regime diagnostics of ProjGD in the teacher–student setting (docs/shallow.md §3–§4; not an experiment
of the paper): does training stay in the kernel regime the analysis assumes, and does the projection onto
Ω_ρ ever act?

Training as :mod:`ntpref.reproduce.width` (the authors' "diagonal" teacher, paired init from
seed + INIT_SEED_OFFSET, ProjGD with η = 1.75/√steps and ρ = 3 for all blocks) for widths m = 8..256. Cells:
  ``kind="train"`` (seed, m): one ProjGD run of ``steps`` steps, keeping the iterates θ(t) at the checkpoints
      t = 0, steps/8, steps/4, steps/2, steps. Per checkpoint:
        per-head movement  ratio_{b,i}(t) = ‖B_i(t) − B_i(0)‖ / (ρ/√m) for the blocks b = c, U, W
                           (:func:`head_movement`; ≤ 1 always, = 1 on the boundary of the head's ball);
        kernel drift       ‖K(θ(t)) − K(θ(0))‖_F / ‖K(θ(0))‖_F of the finite-width NTK Gram matrix
                           (:func:`ntpref.shallow.ntk.ntk_gram`) on the first ``n_drift`` training inputs.
      first_bind: the first step t whose iterate θ(t) the projection changed (:func:`first_bind`); −1 if it
      never did. free_ratio: the movement at the end of plain GD (no projection, same η and steps): how far
      the heads would go without Ω_ρ. When the projection never acted, the ProjGD run is that plain GD run
      bit for bit (heads inside their balls are kept unchanged), so it is not run a second time.
  ``kind="gram"`` (seed, m, n_gram): λ_min of K_m(θ(0)) on the first n_gram training inputs.
  ``kind="limit"`` (seed, n_gram): λ_min of the Monte-Carlo limit kernel
      (:func:`ntpref.shallow.ntk.limit_kernel`, ``draws`` heads from default_rng(seed)) on the same inputs.
Expected (this project's reconstruction, docs/shallow.md §4; the paper's available text states no values):
each head moves O(1/√m), like the radius, so the movement ratio of a typical head (the summary's median
head) does not grow with m, while the largest of the m heads' ratios may, as the maximum of more draws; the
kernel drift falls at least like m^{−1/2} (with the paired initialisation the two heads of a pair move U and
W in opposite directions, so their first-order kernel changes cancel and the drift can fall faster, towards
m^{−1});
K_m → K_∞ as m grows, so λ_min(K_m) approaches the limit kernel's. K_m is singular (λ_min = 0 to rounding)
when the m/2 distinct heads have fewer parameters, (m/2)(1 + d + d²), than there are inputs.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from .. import shallow
from ..shallow.ntk import limit_kernel, min_eigenvalue, ntk_gram
from ..sweep import CellArray
from . import Summary
from .configs import by_axis, config_text, select_config
from .plots import finish_figure, loglog_panel, pyplot
from .stats import mean_ci, medians, slope_text, stats
from .teacher_student import D, INIT_SEED_OFFSET, RHO, student_eta, teacher_data

DESCRIPTION = "NTK-regime diagnostics: per-head movement vs the radius, lambda_min of the NTK, kernel drift vs m"

BLOCKS = ("c", "U", "W")
CHECKPOINTS = (8, 4, 2, 1)
"""The checkpoints are steps // k for these k (and t = 0)."""
BOUNDARY = 1.0 - 1e-9
"""A head is on the boundary of its ball when its movement ratio is at least this (the projection scales
Δ to the radius exactly up to rounding)."""

SIZES = {
    # quick: n = 1000 (800 training inputs), K = 1024, 1000 steps, 2 seeds; Gram matrices on up to 400 inputs,
    # the drift on 200, the limit kernel from 4096 draws.
    "quick": dict(seeds=(1, 2), widths=(8, 16, 32, 64, 128, 256), n=1000, K=1024, T=16, steps=1000,
                  n_grams=(50, 100, 200, 400), n_drift=200, draws=4096, teacher="diagonal"),
    # full: the width sweep's setting (n = 5000, K = 8192, 4000 steps), 5 seeds, Gram matrices up to 1600.
    "full": dict(seeds=(1, 2, 3, 4, 5), widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, T=16, steps=4000,
                 n_grams=(100, 200, 400, 800, 1600), n_drift=400, draws=16384, teacher="diagonal"),
}


def cells(seeds, widths, n, K, T, steps, n_grams, n_drift, draws, teacher) -> list[dict]:
    """Per seed: the training cells (widest first), then the Gram cells, then the limit-kernel cells."""
    if max(max(n_grams), n_drift) > round(0.8 * n):
        raise InputError(f"n_grams and n_drift must not exceed the {round(0.8 * n)} training inputs")
    data = dict(n=n, K=K, T=T, teacher=teacher)
    out = []
    for s in seeds:
        out += [dict(kind="train", seed=s, m=m, steps=steps, n_drift=n_drift, **data)
                for m in sorted(widths, reverse=True)]
        out += [dict(kind="gram", seed=s, m=m, n_gram=g, **data) for m in widths for g in n_grams]
        out += [dict(kind="limit", seed=s, n_gram=g, draws=draws, **data) for g in n_grams]
    return out


def checkpoint_steps(steps: int) -> np.ndarray:
    """[k] int64: 0 and steps // k for k in :data:`CHECKPOINTS` (sorted, without repeats)."""
    return np.unique(np.array([0] + [max(1, steps // k) for k in CHECKPOINTS], dtype=np.int64))


def head_movement(theta, theta0, rho: float) -> np.ndarray:
    """[3, m] ratio_{b,i} = ‖B_i − B0_i‖ / (ρ/√m) for the blocks B = c, U, W of theta and theta0 (Frobenius
    norm over head i's entries)."""
    m = theta0[0].shape[0]
    radius = rho / math.sqrt(m)
    out = np.empty((len(theta0), m))
    for b, (B, B0) in enumerate(zip(theta, theta0, strict=True)):
        delta = (np.asarray(B) - B0).reshape(m, -1)
        out[b] = np.sqrt(np.sum(delta * delta, axis=1)) / radius
    return out


def kernel_drift(X, K0: np.ndarray, theta) -> float:
    """‖K(θ) − K0‖_F / ‖K0‖_F with K(θ) = :func:`ntk_gram` (X, *θ)."""
    diff = ntk_gram(X, *theta) - K0
    return float(np.sqrt(np.sum(diff * diff)) / np.sqrt(np.sum(K0 * K0)))


def first_bind(projected: dict) -> int:
    """The first step t whose iterate θ(t) the projection changed: 1 + the first update at which it moved a
    head of some block (``projected``: :attr:`ntpref.shallow.TrainResult.projected`); −1 if it never did."""
    acted = np.flatnonzero(np.sum(list(projected.values()), axis=0))
    return int(acted[0]) + 1 if acted.size else -1


def train_diagnostics(data, theta0, steps: int, n_drift: int) -> dict:
    """One ``kind="train"`` cell's results (see the module docstring) for the initial heads ``theta0``
    (c [m], U [m, d], W [m, d, d]; also the centre of the projection balls) on the teacher–student data set
    ``data``: ProjGD with η = 1.75/√steps and ρ = 3 for all blocks, the movement ratios and the kernel drift
    on the first ``n_drift`` training inputs at the checkpoints, first_bind, the free run's movement, the
    min training losses, λ_min of K at the start and the end, and the CPU seconds."""
    start = time.process_time()
    train, Xd = shallow.prepare(data.X_train, data.y_train), data.X_train[:n_drift]
    m = theta0[0].shape[0]
    eta, rho = student_eta(steps), (RHO,) * 3
    K0 = ntk_gram(Xd, *theta0)
    t_at = checkpoint_steps(steps)
    res = shallow.train(train, theta0, eta=eta, steps=steps, rho=rho, snapshots=t_at[1:])
    ratio, drift = np.zeros((t_at.size, 3, m)), np.zeros(t_at.size)
    for k, t in enumerate(t_at[1:], start=1):
        theta = tuple(res.snapshots[int(t)][b] for b in BLOCKS)
        ratio[k], drift[k] = head_movement(theta, theta0, RHO), kernel_drift(Xd, K0, theta)
    bind = first_bind(res.projected)
    free = res if bind < 0 else shallow.train(train, theta0, eta=eta, steps=steps)
    free_theta = tuple(free.params[b] for b in BLOCKS)
    return dict(t=t_at, ratio=ratio, drift=drift, free_ratio=head_movement(free_theta, theta0, RHO),
                first_bind=bind, min_train_loss=res.min_train_loss, free_min_train_loss=free.min_train_loss,
                lambda_min_0=min_eigenvalue(K0), lambda_min_end=min_eigenvalue(ntk_gram(Xd, *theta)),
                cpu_seconds=time.process_time() - start)


def cell(kind, seed, n, K, T, teacher, m=None, steps=None, n_drift=None, n_gram=None, draws=None) -> dict:
    """One cell of ``kind`` "train" | "gram" | "limit" (see the module docstring)."""
    if kind == "train":
        return train_diagnostics(teacher_data(seed, n, T, K, teacher),
                                 shallow.paired_init(m, D, seed + INIT_SEED_OFFSET), steps, n_drift)
    X = teacher_data(seed, n, T, K, teacher).X_train[:n_gram]
    if kind == "gram":
        return dict(lambda_min=min_eigenvalue(ntk_gram(X, *shallow.paired_init(m, D, seed + INIT_SEED_OFFSET))))
    if kind == "limit":
        return dict(lambda_min=min_eigenvalue(limit_kernel(X, draws=draws, seed=seed)))
    raise InputError(f"unknown ntk cell kind {kind!r}")


def cell_arrays(kind, seed, n, K, T, teacher, m=None, steps=None, n_drift=None, n_gram=None, draws=None) -> dict:
    """What :func:`cell` returns: λ_min (a Gram or limit cell); for a training cell the k checkpoints t [k]
    (:func:`checkpoint_steps`), ratio [k, 3, m], drift [k], free_ratio [3, m], first_bind (>= −1), the losses,
    both λ_min and the CPU seconds."""
    if kind != "train":
        return {"lambda_min": CellArray("f8")}
    k, scalar = checkpoint_steps(steps).size, CellArray("f8", low=0.0)
    return dict(t=CellArray("i8", (k,), low=0), ratio=CellArray("f8", (k, 3, m), low=0.0),
                drift=CellArray("f8", (k,), low=0.0), free_ratio=CellArray("f8", (3, m), low=0.0),
                first_bind=CellArray("i8", low=-1), min_train_loss=scalar, free_min_train_loss=scalar,
                lambda_min_0=CellArray("f8"), lambda_min_end=CellArray("f8"), cpu_seconds=scalar)


def median_head(arrays) -> float:
    """The median over heads of each head's largest block movement ratio at the end of one training cell."""
    return float(np.median(arrays["ratio"][-1].max(axis=0)))


def boundary_fraction(arrays) -> float:
    """The fraction of heads with some block on the boundary of its ball (ratio ≥ :data:`BOUNDARY`) at the
    end of one training cell."""
    return float((arrays["ratio"][-1] >= BOUNDARY).any(axis=0).mean())


def _train_summary(rows, axes, lines, numbers) -> dict:
    """Movement, binding, drift per width: table lines, panels (a), (b), (d)."""
    config, rows, note = select_config(rows, ("seed", "m"))
    widths = sorted({p["m"] for p, _ in rows})
    head_median = medians(by_axis(rows, "m", median_head)[1])               # per width, in the order of widths
    table = []
    for i, m in enumerate(widths):
        arrs = [a for p, a in rows if p["m"] == m]
        t = arrs[0]["t"]
        overall = np.array([a["ratio"].max(axis=(1, 2)) for a in arrs])          # [seeds, checkpoints]
        axes[0].plot(t, np.median(overall, axis=0), "o-", color=f"C{i}", ms=3, label=f"m = {m}")
        end = np.array([a["ratio"][-1] for a in arrs])                           # [seeds, 3, m]
        on_boundary = np.array([boundary_fraction(a) for a in arrs])             # per seed
        binds = [int(a["first_bind"]) for a in arrs]
        free = np.array([a["free_ratio"].max() for a in arrs])
        table.append((m, len(arrs), *(f"{end[:, b].max():.3f}" for b in range(3)), f"{head_median[i]:.3f}",
                      f"{on_boundary.mean():.1%}",
                      ", ".join("never" if s < 0 else str(s) for s in binds), f"{np.median(free):.3f}",
                      f"{np.median([a['min_train_loss'] for a in arrs]):.4e}",
                      f"{np.median([a['free_min_train_loss'] for a in arrs]):.4e}"))
        numbers[f"max_ratio_m{m}"] = float(end.max())
        numbers[f"median_head_ratio_m{m}"] = float(head_median[i])
        numbers[f"boundary_fraction_m{m}"] = float(on_boundary.mean())
    axes[0].axhline(1.0, color="k", ls=":", lw=1, label="radius ρ/√m")
    ms, free_groups = by_axis(rows, "m", lambda a: a["free_ratio"].max())
    _, proj_groups = by_axis(rows, "m", lambda a: a["ratio"][-1].max())
    axes[1].plot(ms, medians(proj_groups), "o-", color="C0", label="ProjGD (ρ = 3), largest head")
    axes[1].plot(ms, head_median, "^-.", color="C2", label="ProjGD, median head")
    axes[1].plot(ms, medians(free_groups), "s--", color="C3", label="GD without projection, largest head")
    axes[1].axhline(1.0, color="k", ls=":", lw=1, label="radius ρ/√m")
    ms, groups = by_axis(rows, "m", lambda a: a["drift"][-1])
    mean, ci = stats(groups)
    med = medians(groups)
    slope = loglog_panel(axes[3], ms, mean, ci, label="kernel drift at the end", color="C2", median=med, fit=med)
    numbers["drift_slope"] = slope
    lines += [f"NTK-regime diagnostics ({config_text(config)})",
              "movement ratio = ‖θ_i(t) − θ_i(0)‖ / (ρ/√m) per block; on the boundary: ratio ≥ 1 − 1e-9 in some "
              "block; median head: the median over heads of each head's largest block ratio (median over seeds); first "
              "step the projection acted: per seed ('never' = the unprojected run is identical)",
              tabulate(table, headers=["m", "seeds", "max ratio c", "U", "W", "median head", "heads on boundary",
                                       "first step projected", "free max ratio", "min loss ProjGD", "min loss GD"]),
              "", "kernel drift ‖K_T − K_0‖_F / ‖K_0‖_F at the end (first n_drift training inputs)",
              tabulate([(int(m), len(g), f"{mu:.4e} ± {c:.1e}", f"{md:.4e}") for m, g, mu, c, md
                        in zip(ms, groups, mean, ci, med)], headers=["m", "seeds", "mean ± CI", "median"]),
              f"log-log slope of the median drift in m: {slope_text(slope, ms, groups)}   (expected at most about "
              "-1/2, faster with paired heads: this project's reconstruction, not stated in the paper's available "
              "text)"]
    lines += [note] if note else []
    return config


def _gram_summary(gram_rows, limit_rows, ax, lines, numbers) -> None:
    """λ_min vs n per width and for the limit kernel: table and panel (c)."""
    ns = sorted({p["n_gram"] for p, _ in gram_rows + limit_rows})
    widths = sorted({p["m"] for p, _ in gram_rows})
    series = [(f"m = {m}", f"C{i}", "o-", [r for r in gram_rows if r[0]["m"] == m]) for i, m in enumerate(widths)]
    series.append(("limit kernel", "k", "s--", limit_rows))
    table = {}
    for label, color, style, rows in series:
        if not rows:
            continue
        xs, groups = by_axis(rows, "n_gram", "lambda_min")
        means = [float(mean_ci(g)[0]) for g in groups]
        ax.plot(xs, means, style, color=color, ms=4, label=label)
        table[label] = dict(zip(xs, means))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(ns, [f"{v:g}" for v in ns])
    draws = limit_rows[0][0]["draws"] if limit_rows else None
    lines += ["", f"λ_min of the NTK Gram matrix at θ(0) on the first n training inputs (mean over seeds); limit "
                  f"kernel: Monte Carlo over {draws} draws; K_m is singular where (m/2)(1 + d + d²) < n",
              tabulate([[label] + [f"{vals.get(n, float('nan')):.3e}" for n in ns] for label, vals in table.items()],
                       headers=["n ="] + [str(int(n)) for n in ns])]
    if "limit kernel" in table and widths:
        widest = table[f"m = {widths[-1]}"]
        numbers["lambda_ratio_widest_to_limit"] = float(widest[ns[-1]] / table["limit kernel"][ns[-1]])


def summarize(results, outdir) -> Summary:
    """Tables and ``ntk.png``: (a) movement over training, (b) end movement with and without projection,
    (c) λ_min vs n, (d) kernel drift vs m."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    axes = axes.ravel()
    lines, numbers, config = [], {}, {}
    train = [r for r in results if r[0]["kind"] == "train"]
    if train:
        config = _train_summary(train, axes, lines, numbers)
    gram = [r for r in results if r[0]["kind"] == "gram"]
    limit = [r for r in results if r[0]["kind"] == "limit"]
    if gram or limit:
        _gram_summary(gram, limit, axes[2], lines, numbers)
    titles = ("(a) max over heads and blocks of the movement ratio vs t (median over seeds)",
              "(b) movement ratio at the end, max over blocks (median over seeds)",
              "(c) λ_min of the NTK Gram matrix at θ(0) vs n",
              "(d) kernel drift at the end vs m (open markers: medians)")
    xlabels = ("step t", "width m (heads)", "n (training inputs)", "width m (heads)")
    ylabels = ("‖θ_i(t) − θ_i(0)‖ / (ρ/√m)", "‖θ_i(T) − θ_i(0)‖ / (ρ/√m)", "λ_min", "‖K_T − K_0‖_F / ‖K_0‖_F")
    for ax, title, xl, yl in zip(axes, titles, xlabels, ylabels):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(xl)
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    axes[1].set_xscale("log", base=2)
    axes[1].set_yscale("log")
    if config:
        widths = sorted({p["m"] for p, _ in train})
        axes[1].set_xticks(widths, [str(m) for m in widths])
        axes[1].tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    title = (f"Teacher–student ({config.get('teacher')} teacher), d={D}, T={config.get('T')}, "
             f"n={config.get('n')}, {config.get('steps')} ProjGD steps, ρ={RHO:g}")
    path = finish_figure(fig, title, Path(outdir) / "ntk.png", fontsize=10)
    return Summary("\n".join(lines), [path], numbers)
