"""Figures of the reproduction targets: the Agg pyplot, atomic PNG writes (after the overall title and a tight
or fixed layout), mean ± 95% CI bands, error bars and log–log panels with a fitted power law."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import InputError
from ..npzio import atomic_write
from .stats import loglog_slope, mean_ci

def pyplot():
    """matplotlib.pyplot with the non-interactive Agg backend; InputError if the plot extra is missing."""
    try:
        import matplotlib
    except ImportError:
        raise InputError("figures need matplotlib: pip install 'ntpref[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str | Path, *, crop: bool = True) -> Path:
    """Write ``fig`` as PNG atomically (dpi 110; missing directories are created) and close it. ``crop``: the
    saved area is cropped to what is drawn (``bbox_inches="tight"``, which draws the figure once more to
    measure it); otherwise the whole canvas is saved, for a figure already laid out (``tight_layout`` or fixed
    subplot parameters)."""
    path = Path(path)
    extent = {"bbox_inches": "tight"} if crop else {}
    try:
        atomic_write(path, lambda fh: fig.savefig(fh, format="png", dpi=110, **extent))
    finally:
        pyplot().close(fig)
    return path


def finish_figure(fig, title: str, path: str | Path, *, margins: dict | None = None, crop: bool = True,
                  **text) -> Path:
    """Give ``fig`` its overall title (``fig.suptitle(title, **text)``, e.g. ``fontsize=10``), lay it out and
    write it with :func:`save_figure` (``crop`` as there); returns the path. The layout is ``tight_layout``
    (which leaves a layout engine on the figure, with which saving it draws it twice), or with ``margins``
    those subplot parameters (``fig.subplots_adjust(**margins)``; saving then draws the figure once)."""
    fig.suptitle(title, **text)
    if margins is None:
        fig.tight_layout()
    else:
        fig.subplots_adjust(**margins)
    return save_figure(fig, path, crop=crop)


def band(ax, t, values, label, color, log=False, ls="-"):
    """Mean over seeds (rows of ``values``) with its 95% CI band, the mean drawn in line style ``ls``; ``log``:
    geometric mean (CI of log)."""
    mean, half = mean_ci(np.log(values) if log else values)
    lo, mid, hi = (np.exp(mean - half), np.exp(mean), np.exp(mean + half)) if log else (mean - half, mean, mean + half)
    ax.plot(t, mid, color=color, lw=1.6, label=label, ls=ls)
    ax.fill_between(t, lo, hi, color=color, alpha=0.25, lw=0)


def ci_errorbar(ax, x, mean, ci, *, label: str, color: str, marker: str = "o", ls: str = "-"):
    """Mean ± 95% CI as error bars, the lower bar clipped to stay positive (for log y axes)."""
    ax.errorbar(x, mean, yerr=[np.minimum(ci, 0.95 * mean), ci], fmt=marker, ls=ls, color=color, capsize=3,
                label=label)


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
