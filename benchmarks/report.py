"""Reports of the benchmark's :class:`~benchmarks.timing.Timing` rows: the paper-size table, the scaling
slopes, the log–log figure, the machine description and the report text."""
from __future__ import annotations

import math
import os
import platform
from collections.abc import Sequence

import numpy as np
from tabulate import tabulate

from ntpref.bench import format_seconds
from ntpref.errors import InputError
from ntpref.reproduce.plots import pyplot, save_figure

from .timing import BASELINE, Timing


def table(rows: Sequence[Timing], baseline: str = BASELINE) -> str:
    """Times, GFLOP/s and the ratio time / time(baseline, same case and thread count; for rows
    without a thread count, the baseline's best time) as a tabulate grid."""
    base = {}
    for r in rows:
        if r.implementation == baseline:
            base[(r.case, r.threads)] = r.seconds
            base[(r.case, 0)] = min(base.get((r.case, 0), math.inf), r.seconds)
    out = []
    for r in rows:
        b = base.get((r.case, r.threads))
        out.append([r.case, r.implementation, r.threads or "default", format_seconds(r.seconds),
                    format_seconds(r.best), f"{r.flops / r.seconds / 1e9:.2f}",
                    "" if b is None else f"{r.seconds / b:.1f}x"])
    return tabulate(out, headers=["case", "implementation", "threads", "median step", "min step",
                                  "GFLOP/s (median)", f"median / {baseline}"], tablefmt="github")


def slopes(rows: Sequence[Timing]) -> list[tuple[str, str, str, int, float, float, float]]:
    """Fitted log–log slopes of time vs the varied size, from the median and from the minimum times,
    and the slope of the stated flop count (what a constant GFLOP/s would give: below 1 where a term
    does not grow with the size, e.g. the d² terms of the shallow model in T):
    (model, series, implementation, threads, b_median, b_min, b_flops)."""
    groups: dict = {}
    for r in rows:
        if r.series is not None:
            groups.setdefault((r.model, r.series, r.implementation, r.threads), []).append(r)
    out = []
    for (model, series, impl, k), rs in groups.items():
        if len(rs) >= 2:
            x = np.log([r.size[series] for r in rs])
            b_med = np.polyfit(x, np.log([r.seconds for r in rs]), 1)[0]
            b_min = np.polyfit(x, np.log([r.best for r in rs]), 1)[0]
            b_flops = np.polyfit(x, np.log([r.flops for r in rs]), 1)[0]
            out.append((model, series, impl, k, float(b_med), float(b_min), float(b_flops)))
    return out


def slope_table(rows: Sequence[Timing]) -> str:
    """:func:`slopes` as a tabulate grid, with the range of each varied size."""
    rows_out = []
    for m, s, i, k, b, c, f in slopes(rows):
        sizes = sorted({r.size[s] for r in rows if (r.model, r.series) == (m, s)})
        rows_out.append([m, f"{s} = {sizes[0]}..{sizes[-1]}", i, k or "default", f"{b:.2f}", f"{c:.2f}", f"{f:.2f}"])
    return tabulate(rows_out, headers=["model", "size doubled", "implementation", "threads", "slope (median)",
                                       "slope (min)", "flop-count slope"], tablefmt="github")


def figure(rows: Sequence[Timing], path: str) -> None:
    """Log–log plot of time vs size, one panel per (model, series), one line per implementation and
    thread count, written as PNG atomically (needs matplotlib, the ``plot`` extra)."""
    plt = pyplot()
    panels = sorted({(r.model, r.series) for r in rows if r.series is not None})
    if not panels:
        raise InputError("no scaling series in the results: nothing to plot")
    cols = min(3, len(panels))
    nrows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(4.2 * cols, 3.4 * nrows), squeeze=False)
    for ax, (model, series) in zip(axes.ravel(), panels):
        lines: dict = {}
        for r in rows:
            if (r.model, r.series) == (model, series):
                lines.setdefault((r.implementation, r.threads), []).append((r.size[series], r.seconds))
        for (impl, k), pts in sorted(lines.items()):
            pts.sort()
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], "o-", base=2,
                      label=f"{impl} ({k} thr)" if k else impl)
        ax.set_title(f"{model}: time vs {series}")
        ax.set_xlabel(series)
        ax.set_ylabel("seconds per step")
        ax.legend(fontsize=6)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, path)


def machine() -> dict:
    """Machine and software description for the report."""
    import numba
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = dict(cpu=cpu, cores=os.cpu_count(), python=platform.python_version(), numpy=np.__version__,
                numba=numba.__version__, platform=platform.platform())
    try:
        info["load_average"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    return info


def report(rows: Sequence[Timing], extras: dict | None = None) -> str:
    """Machine description, the paper-size table, the scaling slopes and any extra measurements."""
    paper = [r for r in rows if r.series is None]
    scaling = [r for r in rows if r.series is not None]
    parts = ["machine: " + ", ".join(f"{k} {v}" for k, v in machine().items())]
    if paper:
        parts += ["", "one loss-and-gradient step, paper sizes (median wall clock):", table(paper)]
    if scaling:
        parts += ["", "scaling (fitted slope of log time vs log size):", slope_table(scaling)]
    for k, v in (extras or {}).items():
        parts.append(f"{k}: {v}")
    return "\n".join(parts)
