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
