"""Statistics and plotting shared by the reproduction targets."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..oracle.npzio import atomic_write

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
    """Write ``fig`` as PNG atomically (dpi 110) and close it."""
    path = Path(path)
    atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=110, bbox_inches="tight"))
    pyplot().close(fig)
    return path
