"""What more than one reproduction target uses: statistics, configuration selection, tables, plots, and
the teacher–student setting of paper (2)."""
from __future__ import annotations

import math
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from ..oracle.npzio import atomic_write
from ..shallow.data import TeacherStudent, teacher_student
from ..shallow.model import forward, paired_init
from ..shallow.train import proj_gd

# two-sided 95% Student-t critical values t_{0.975, df}, df = 1..30 (beyond: the normal 1.96)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def mean_ci(values, axis: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Mean and half-width of the 95% Student-t confidence interval along ``axis`` (0 for one value)."""
    v = np.asarray(values, dtype=np.float64)
    n = v.shape[axis]
    mean = v.mean(axis=axis)
    if n < 2:
        return mean, np.zeros_like(mean)
    t = _T975[n - 2] if n - 1 <= len(_T975) else 1.96
    return mean, t * v.std(axis=axis, ddof=1) / math.sqrt(n)


def loglog_slope(x, y) -> tuple[float, float]:
    """Least-squares fit log y = slope · log x + intercept; returns (slope, intercept)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2 or (x <= 0).any() or (y <= 0).any():
        raise InputError("loglog_slope needs at least two positive points")
    slope, intercept = np.polyfit(np.log(x), np.log(y), 1)
    return float(slope), float(intercept)


def geometric_rate(t, y) -> float:
    """Fitted ratio r of y(t) ≈ C r^t (least squares on log y over the positive entries)."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    keep = y > 0
    if keep.sum() < 2:
        raise InputError("geometric_rate needs at least two positive points")
    slope, _ = np.polyfit(t[keep], np.log(y[keep]), 1)
    return float(np.exp(slope))


def pyplot():
    """matplotlib.pyplot with the non-interactive Agg backend; InputError if the plot extra is missing."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("figures need matplotlib: pip install 'ntpref[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str | Path) -> Path:
    """Write ``fig`` as PNG atomically (dpi 110; the directory is created if needed) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=110, bbox_inches="tight"))
    pyplot().close(fig)
    return path


# ---- cells and configurations -------------------------------------------------------------------

def seed_cells(seeds: int, **config) -> list[dict]:
    """One cell per seed 0..seeds−1, each with the rest of the configuration (the ``cells`` of the
    two-stage targets)."""
    return [{"seed": s, **config} for s in range(int(seeds))]


def select_config(results: list, varying=("seed",)) -> tuple[dict, list, str]:
    """(config, rows, note): the cells of one configuration of a results directory.

    Cells whose parameters differ in more than the names in ``varying`` (e.g. a quick and a full run written
    to the same directory) belong to different configurations. The one with the most cells is chosen (ties:
    the larger parameter values, so a full run beats a quick one); ``rows`` are its (params, arrays) sorted by
    the ``varying`` parameters, ``config`` its shared parameters and ``note`` names the configurations left
    out ("" when there are none). InputError on an empty list."""
    groups: dict[tuple, list] = {}
    for params, arrays in results:
        key = tuple(sorted((k, v) for k, v in params.items() if k not in varying))
        groups.setdefault(key, []).append((params, arrays))
    if not groups:
        raise InputError("no finished cells to summarize")
    best = max(groups, key=lambda k: (len(groups[k]), [v for _, v in k]))
    rows = sorted(groups[best], key=lambda r: [r[0].get(k) for k in varying])
    others = [f"{dict(k)} ({len(v)} cells)" for k, v in groups.items() if k != best]
    note = "ignored other configurations in this directory: " + "; ".join(others) if others else ""
    return dict(best), rows, note


def per_seed_config(results: list) -> tuple[dict, list, str]:
    """:func:`select_config` over the seeds only, its rows as (seed, arrays) pairs sorted by seed."""
    config, rows, note = select_config(results)
    return config, [(params["seed"], arrays) for params, arrays in rows], note


def by_axis(rows: list, axis: str, value) -> tuple[np.ndarray, list[np.ndarray]]:
    """(sorted values of the parameter ``axis``, per value the array of ``value`` over the rows' seeds);
    ``value`` is the name of a 0-d result or a function arrays -> float."""
    get = value if callable(value) else (lambda arrays: arrays[value])
    per: dict = {}
    for params, arrays in sorted(rows, key=lambda r: r[0]["seed"]):
        per.setdefault(params[axis], []).append(float(get(arrays)))
    xs = sorted(per)
    return np.array(xs, dtype=float), [np.array(per[x]) for x in xs]


def stats(groups: list) -> tuple[np.ndarray, np.ndarray]:
    """Mean and 95% CI half-width of each group (groups may have different numbers of seeds)."""
    mc = [mean_ci(g) for g in groups]
    return np.array([float(m) for m, _ in mc]), np.array([float(c) for _, c in mc])


def mean_row(label, columns) -> list:
    """A table row: ``label``, then "mean ± half-width of the 95% CI" of each per-seed column ("-" if empty)."""
    row = [label]
    for col in columns:
        if len(col) == 0:
            row.append("-")
            continue
        m, h = mean_ci(np.asarray(col, dtype=np.float64))
        row.append(f"{float(m):.6g} ± {float(h):.2g}")
    return row


def axis_table(x, groups, mean, ci, xname: str = "m", yname: str = "min train loss") -> str:
    """A tabulate table: x | seeds | mean | ± 95% CI | median."""
    rows = [(int(v), len(g), f"{mu:.4e}", f"{c:.2e}", f"{float(np.median(g)):.4e}")
            for v, g, mu, c in zip(x, groups, mean, ci)]
    return tabulate(rows, headers=[xname, "seeds", f"mean {yname}", "± 95% CI", "median"])


def time_grid(T: int, uniform: int = 1000, log: int = 200) -> np.ndarray:
    """[n] int64 sorted steps in 0..T: every ⌈T/uniform⌉-th step, ``log`` log-spaced steps in 1..T, 0 and T."""
    T = int(T)
    if T < 0:
        raise InputError(f"time_grid: T must be >= 0, got {T}")
    stride = max(1, math.ceil(T / max(uniform, 1)))
    parts = [np.arange(0, T + 1, stride), [0, T]]
    if T >= 1:
        parts.append(np.round(np.geomspace(1, T, log)))
    return np.unique(np.concatenate(parts).astype(np.int64))


# ---- plotting -----------------------------------------------------------------------------------

def band(ax, t, values, label, color, log=False):
    """Mean over seeds (rows of ``values``) with its 95% CI band; ``log``: geometric mean (CI of log)."""
    mean, half = mean_ci(np.log(values) if log else values)
    lo, mid, hi = (np.exp(mean - half), np.exp(mean), np.exp(mean + half)) if log else (mean - half, mean, mean + half)
    ax.plot(t, mid, color=color, lw=1.6, label=label)
    ax.fill_between(t, lo, hi, color=color, alpha=0.25, lw=0)


def ci_errorbar(ax, x, mean, ci, *, label: str, color: str, marker: str = "o", ls: str = "-"):
    """Mean ± 95% CI as error bars, the lower bar clipped to stay positive (for log y axes)."""
    ax.errorbar(x, mean, yerr=[np.minimum(ci, 0.95 * mean), ci], fmt=marker, ls=ls, color=color, capsize=3,
                label=label)


def medians(groups: list) -> np.ndarray:
    """The median of each group (per x value, over the seeds)."""
    return np.array([float(np.median(g)) for g in groups])


def loglog_panel(ax, x, mean, ci, *, label: str, color: str, fit=None, marker: str = "o", ls: str = "-",
                 median=None):
    """Mean ± CI on log–log axes; ``median``: the medians drawn as open markers on a thin dashed line (no
    legend entry); ``fit``: the values a least-squares power law is fitted to (e.g. the medians; None = no
    fit), drawn dotted with its slope in the legend. Returns the slope (or None)."""
    ci_errorbar(ax, x, mean, ci, label=label + " (mean ± 95% CI)", color=color, marker=marker, ls=ls)
    if median is not None:
        ax.plot(x, median, marker, ls="--", lw=0.8, color=color, mfc="none", alpha=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xticks(x, [f"{v:g}" for v in x])
    ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    if fit is None or len(x) < 2:
        return None
    slope, intercept = loglog_slope(x, fit)
    xx = np.geomspace(x[0], x[-1], 50)
    what = "fit to the medians" if fit is median else "fit"
    ax.plot(xx, np.exp(intercept) * xx ** slope, ":", color=color, alpha=0.9, label=f"{what}: slope {slope:+.3f}")
    return slope


# ---- the teacher-student setting of paper (2) (width, approx, length, ntk, projsgd; rnn shares the seeds) --

D, R, NU, RHO, ETA_SCALE, TRAIN_FRACTION = 8, 16, 3.0, 3.0, 1.75, 0.8
INIT_SEED_OFFSET = 1_000_003
"""Student seed = data seed + INIT_SEED_OFFSET: paired_init and the data generators both start drawing
standard normals from ``default_rng(seed)``, so the student's initial heads must use another seed."""
SGD_SEED_OFFSET = 2_000_003
"""ProjSGD's minibatch seed = data seed + SGD_SEED_OFFSET (again never the data's random numbers)."""
TEACHERS = {"diagonal": "authors' teacher: attention logits from diag(W)",
            "full": "full-W teacher (the theory's kernel)"}
"""teacher_attention of :func:`ntpref.shallow.data.teacher_student`. The authors' code computes the teacher's
attention logits with diag(W_k) only (a repeated einsum index), the theory's kernel uses the full W_k."""


@lru_cache(maxsize=4)
def teacher_data(seed: int, n: int, T: int, K: int, teacher: str = "diagonal") -> TeacherStudent:
    """The seed's teacher–student data set (d = 8, R = 16, ν = 3, 80/20 split; ``teacher`` one of
    :data:`TEACHERS`), cached in this process.

    The tokens are the first draws of the seed, so both teachers label the same inputs. Every width of a
    seed trains on the same data set; cells are listed seed by seed, so a worker process builds a seed's
    teacher at most once (with w workers at most w times). No files, nothing can go stale."""
    if teacher not in TEACHERS:
        raise InputError(f"teacher must be one of {', '.join(TEACHERS)}, got {teacher!r}")
    return teacher_student(n=n, d=D, T=T, R=R, K=K, nu=NU, n_train=round(TRAIN_FRACTION * n), seed=seed,
                           teacher_attention=teacher)


def student_eta(steps: int) -> float:
    """The step size η = 1.75/√steps of the authors' training script (0.0277 at 4000 steps)."""
    return ETA_SCALE / math.sqrt(steps)


def train_student(data: TeacherStudent, m: int, seed: int, steps: int, n_train: int | None = None,
                  batch: int | None = None) -> dict:
    """Train a width-m student (paired init from seed + INIT_SEED_OFFSET) by ProjGD (``batch`` None) or
    ProjSGD (minibatches of ``batch`` drawn from seed + SGD_SEED_OFFSET), η = 1.75/√steps, ρ = 3 for all
    blocks, MSE, on the first ``n_train`` training samples (all by default). Returns min_train_loss,
    final_train_loss, final_val_loss (L_val(θ(steps)) on the whole validation split), train_loss [steps]
    (pre-update, so train_loss[0] is the loss at the paired initialisation, where f = 0) and the cell's
    CPU seconds (Numba threads included)."""
    start = time.process_time()
    X, y = data.X_train[:n_train], data.y_train[:n_train]
    c, U, W = paired_init(m, D, seed + INIT_SEED_OFFSET)
    sgd = {} if batch is None else dict(batch=batch, seed=seed + SGD_SEED_OFFSET)
    res = proj_gd("shallow", X, y, (c, U, W), eta=student_eta(steps), steps=steps, rho=(RHO,) * 3, **sgd)
    r = forward(data.X_val, res.params["c"], res.params["U"], res.params["W"]) - data.y_val
    return dict(min_train_loss=res.min_train_loss, final_train_loss=res.final_train_loss,
                final_val_loss=float(np.mean(r * r)), train_loss=res.train_loss,
                cpu_seconds=time.process_time() - start)
