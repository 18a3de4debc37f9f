"""Statistics of the reproduction targets: 95% Student-t intervals over seeds, medians, power-law and
geometric fits, and the table rows built from them."""
from __future__ import annotations

import math

import numpy as np
from tabulate import tabulate

from ..errors import InputError

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


def stats(groups: list) -> tuple[np.ndarray, np.ndarray]:
    """Mean and 95% CI half-width of each group (groups may have different numbers of seeds)."""
    mc = [mean_ci(g) for g in groups]
    return np.array([float(m) for m, _ in mc]), np.array([float(c) for _, c in mc])


def medians(groups: list) -> np.ndarray:
    """The median of each group (per x value, over the seeds)."""
    return np.array([float(np.median(g)) for g in groups])


def loglog_slope(x, y) -> tuple[float, float]:
    """Least-squares fit log y = slope · log x + intercept; returns (slope, intercept)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if x.size < 2 or (x <= 0).any() or (y <= 0).any():
        raise InputError("loglog_slope needs at least two positive points")
    return line_fit([math.log(v) for v in x], [math.log(v) for v in y])


def line_fit(x, y) -> tuple[float, float]:
    """Least-squares line y = slope · x + intercept through k ≥ 2 points; returns (slope, intercept).

    slope = Σ (x_i − x̄)(y_i − ȳ) / Σ (x_i − x̄)², intercept = ȳ − slope · x̄, every sum correctly rounded
    (math.fsum) and no BLAS call, so the fit (and a figure that draws it) is the same bit for bit whatever
    the CPU and the BLAS kernels it selects."""
    x, y = [float(v) for v in x], [float(v) for v in y]
    x_bar, y_bar = math.fsum(x) / len(x), math.fsum(y) / len(y)
    dx = [v - x_bar for v in x]
    slope = math.fsum(a * (b - y_bar) for a, b in zip(dx, y)) / math.fsum(a * a for a in dx)
    return slope, y_bar - slope * x_bar


#: Resamples of the seeds behind every bootstrap interval.
BOOTSTRAP_DRAWS = 4000


def paired_resamples(seeds: int, draws: int = BOOTSTRAP_DRAWS) -> np.ndarray:
    """[draws, seeds] seed indices drawn with replacement from ``np.random.default_rng(0)``: one bootstrap
    resample of the seeds per row, to be applied to every point of a grid that shares its seeds."""
    return np.random.default_rng(0).integers(0, seeds, size=(draws, seeds))


def median_slope_interval(x, groups, draws: int = BOOTSTRAP_DRAWS) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of the log–log slope fitted to the medians over seeds.

    x [k] positive; groups: k arrays of per-seed values, sorted by seed. Each draw resamples the seeds with
    replacement, the same seeds at every x when every x has the same number of seeds (a grid's seeds are
    shared by its x values, so their errors are paired), each x on its own otherwise; then it refits the
    slope of log median against log x (least squares). None with fewer than 2 seeds anywhere. The draws
    come from ``np.random.default_rng(0)``, so the same results give the same interval."""
    sizes = {len(g) for g in groups}
    if min(sizes) < 2 or len(groups) < 2:
        return None
    if len(sizes) == 1:
        idx = paired_resamples(sizes.pop(), draws)
        med = np.stack([np.median(np.asarray(g, float)[idx], axis=1) for g in groups])
    else:
        rng = np.random.default_rng(0)
        med = np.stack([np.median(np.asarray(g, float)[rng.integers(0, len(g), size=(draws, len(g)))], axis=1)
                        for g in groups])
    if (med <= 0).any():
        return None
    lx = np.log(np.asarray(x, float))
    lx = lx - lx.mean()
    ly = np.log(med)
    slopes = (lx[:, None] * (ly - ly.mean(axis=0))).sum(axis=0) / (lx ** 2).sum()
    lo, hi = np.percentile(slopes, [2.5, 97.5])
    return float(lo), float(hi)


def bootstrap_interval(values, statistic=np.median, draws: int = BOOTSTRAP_DRAWS) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of statistic(values) over the seeds: values [seeds], one per
    seed; each draw resamples the seeds with replacement (:func:`paired_resamples`) and takes
    statistic(resample) (``statistic`` takes an ``axis`` argument, as np.median and np.mean do). None with
    fewer than two seeds."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or v.size < 2:
        return None
    lo, hi = np.percentile(statistic(v[paired_resamples(v.size, draws)], axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def ratio_interval(first, last, statistic=np.mean, draws: int = BOOTSTRAP_DRAWS) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of statistic(last) / statistic(first) over the seeds.

    first, last: per-seed values at the two ends of a grid axis, the same seeds in the same order; a seed's
    value may be an array, whose entries are pooled with those of the other drawn seeds (NaN left out).
    Each draw resamples the seeds with replacement (:func:`paired_resamples`), the same seeds at both ends.
    None with fewer than two seeds, or when the two ends do not have the same number of seeds (a partial
    grid: the seeds cannot be paired)."""
    if len(first) != len(last) or len(first) < 2:
        return None
    per_seed = [[np.ravel(np.asarray(v, dtype=np.float64)) for v in end] for end in (first, last)]

    def pooled(values, row):
        v = np.concatenate([values[i] for i in row])
        v = v[np.isfinite(v)]
        return statistic(v) if v.size else math.nan

    ratios = np.array([pooled(per_seed[1], row) / pooled(per_seed[0], row) for row in paired_resamples(len(first), draws)])
    lo, hi = np.nanpercentile(ratios, [2.5, 97.5])
    return float(lo), float(hi)


def mean_interval(values, draws: int = BOOTSTRAP_DRAWS) -> tuple[float, float] | None:
    """The 95% percentile-bootstrap interval of the mean of per-seed ``values`` (one value per seed, in seed
    order): each draw averages a resample of the seeds with replacement (:func:`paired_resamples`, so values
    of the same seeds stay paired across calls). None with fewer than two seeds."""
    v = np.asarray(values, dtype=np.float64)
    if v.size < 2:
        return None
    lo, hi = np.percentile(v[paired_resamples(v.size, draws)].mean(axis=1), [2.5, 97.5])
    return float(lo), float(hi)


def mean_interval_text(values, digits: int = 4) -> str:
    """"0.9837 [0.9801, 0.9866]": the mean of the finite per-seed ``values`` and its bootstrap interval
    (:func:`mean_interval`); " (k of n seeds)" follows when some values are NaN (e.g. a level not reached),
    "-" stands for none."""
    v = np.asarray(values, dtype=np.float64)
    finite = v[np.isfinite(v)]
    if finite.size == 0:
        return "-"
    text = f"{float(np.mean(finite)):.{digits}g}{interval_text(mean_interval(finite), digits)}"
    return text if finite.size == v.size else f"{text} ({finite.size} of {v.size} seeds)"


def interval_table(groups: dict, columns: dict) -> str:
    """A tabulate table with one row per group (label -> its seeds' arrays, a list of dicts) and one column
    per entry of ``columns`` (header -> function of one seed's arrays giving a number): mean [95% bootstrap
    interval] over the group's seeds (:func:`mean_interval_text`)."""
    rows = [[label, *[mean_interval_text([fn(a) for a in seeds]) for fn in columns.values()]]
            for label, seeds in groups.items()]
    return tabulate(rows, headers=["", *columns], disable_numparse=True)


def first_lasting(t, y, level: float) -> float:
    """The first step of the grid ``t`` from which ``y`` ≥ ``level`` at every later step of the grid; NaN
    when y < level at the last step."""
    below = np.flatnonzero(np.asarray(y) < level)
    if below.size == 0:
        return float(t[0])
    return math.nan if below[-1] == len(t) - 1 else float(t[below[-1] + 1])


def interval_text(interval: tuple[float, float] | None, digits: int = 3) -> str:
    """" [1.05, 1.32]" for an interval, "" for None (too few seeds)."""
    return "" if interval is None else f" [{interval[0]:.{digits}g}, {interval[1]:.{digits}g}]"


def slope_text(slope: float, x, groups) -> str:
    """"-0.499 (95% bootstrap interval over 10 seeds: [-0.531, -0.466])" for a slope fitted to the medians
    of ``groups`` (:func:`median_slope_interval`); without an interval when there are too few seeds."""
    interval = median_slope_interval(x, groups)
    seeds = min(len(g) for g in groups)
    if interval is None:
        return f"{slope:+.3f} (no interval: {seeds} seed{'s' if seeds != 1 else ''})"
    return f"{slope:+.3f} (95% bootstrap interval over {seeds} seeds: [{interval[0]:+.3f}, {interval[1]:+.3f}])"


def geometric_rate(t, y) -> float:
    """Fitted ratio r of y(t) ≈ C r^t (least squares on log y over the positive entries)."""
    t, y = np.asarray(t, float), np.asarray(y, float)
    keep = y > 0
    if keep.sum() < 2:
        raise InputError("geometric_rate needs at least two positive points")
    slope, _ = line_fit(t[keep], [math.log(v) for v in y[keep]])
    return math.exp(slope)


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
