"""Transformer vs IndRNN on the autoregressive task (spec/shallow.md §5): min validation MSE vs the lag L
and max gradient norm vs L, both models, mean ± 95% CI over seeds. Expected: the transformer stays flat in
L; the RNN's error and recurrent gradient grow with L.

Data: :func:`ntpref.shallow.data.autoregressive` (x_t = 0.9 x_{t−L} + ε_t, ε ~ N(0, 0.1), windows of
T = L + 1 values, 17 token features, y standardised, 80/20 random split; the data seed is the cell's seed).
Models: both of width m = 64, tanh, paired initialisation from seed + INIT_SEED_OFFSET (the shallow
transformer's :func:`paired_init`, the IndRNN's :func:`rnn_paired_init`); plain full-batch GD (no
projection, as the authors' comparison) with η = 0.05; loss = MSE (κ = 2).
Metrics: min over steps of the validation MSE (measured after each update); gradient norm of the logged
block at every step (‖∇_W L‖_F for the transformer, ‖∇_u L‖ for the RNN), its maxima over blocks of
``block`` steps (stored per cell as ``block_max``) and their maximum (``max_grad_norm``, the figure).
A run whose loss or parameters become non-finite is recorded as diverged (NaN metrics, ``diverged`` = 1)
instead of failing the sweep.

Run time, measured on the 2-core machine (idle) with --workers 2, 1 Numba thread per worker:
  quick (:data:`SIZES`): 70 s wall.
  one GD step on 4000 training + 1000 validation windows, m = 64 (T = L + 1), 1 thread: transformer
  0.029, 0.055, 0.23 and 0.33 CPU-s at L = 4, 16, 72, 96, IndRNN 0.008, 0.024, 0.13 and 0.20 (1.0 s for
  all eight).
  full (20 seeds, lags 4, 16, 72, 96, both models, 5000 steps): ≈ 20 · 5000 · 1.0 s ≈ 100,000 CPU-s ≈
  28 CPU-hours, ≈ 14 hours of wall time with --workers 2 (estimated, not run; the 160 cells are
  independent, so a Dask cluster divides it).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from ..shallow.data import autoregressive
from ..shallow.model import paired_init
from ..shallow.rnn import rnn_paired_init
from ..shallow.train import adapter, proj_gd
from . import Summary
from .common import INIT_SEED_OFFSET, TRAIN_FRACTION, by_axis, ci_errorbar, pyplot, save_figure, select_config, stats

DESCRIPTION = "transformer vs IndRNN on AR(L): min validation MSE and max gradient norm vs lag L"

MODELS = ("shallow", "indrnn")
LABELS = {"shallow": r"transformer ($\|\nabla_W L\|_F$)", "indrnn": r"IndRNN ($\|\nabla_u L\|$)"}
COEF = 0.9   # x_t = COEF · x_{t−L} + ε_t
MSE_FLOOR = 1 - COEF ** 2
"""The best possible validation MSE of the standardised target: the innovation variance over the series'
variance, noise_var / (noise_var / (1 − 0.9²)) = 1 − 0.9² = 0.19."""
ETA, D_TOKEN = 0.05, 17

SIZES = {
    # quick: n = 500 windows (400 training), 1000 GD steps (blocks of 100), lags 4, 16, 48, 3 seeds. With 300
    # steps the transformer had not learnt the task (min validation MSE ≈ 0.8); by 1000 steps it is ≈ 0.5 at
    # lag 4 (the best possible standardised MSE is 0.1/0.526 ≈ 0.19: the noise over the series' variance).
    "quick": dict(seeds=(1, 2, 3), lags=(4, 16, 48), m=64, n=500, steps=1000, block=100),
    # full: the paper's setting (spec §5).
    "full": dict(seeds=tuple(range(1, 21)), lags=(4, 16, 72, 96), m=64, n=5000, steps=5000, block=500),
}


def cells(seeds, lags, m, n, steps, block) -> list[dict]:
    """One cell per (seed, lag, model); the longest lags first within a seed."""
    return [dict(model=model, lag=L, seed=s, m=m, n=n, steps=steps, block=block)
            for s in seeds for L in sorted(lags, reverse=True) for model in MODELS]


def cell(model, lag, seed, m, n, steps, block) -> dict:
    """Train one model on the seed's AR(lag) data by plain GD; see the module docstring for the outputs."""
    if steps % block:
        raise InputError(f"steps ({steps}) must be a multiple of block ({block})")
    start = time.process_time()
    data = autoregressive(lag, n=n, n_train=round(TRAIN_FRACTION * n), coef=COEF, seed=seed)
    init = paired_init if model == "shallow" else rnn_paired_init
    params = init(m, D_TOKEN, seed + INIT_SEED_OFFSET)
    try:
        res = proj_gd(model, data.X_train, data.y_train, params, eta=ETA, steps=steps, X_val=data.X_val,
                      y_val=data.y_val)
    except InputError as err:
        if "diverged" not in str(err):
            raise
        nan = math.nan
        return dict(min_val_mse=nan, min_train_mse=nan, final_val_mse=nan, max_grad_norm=nan,
                    block_max=np.full(steps // block, nan), diverged=1, cpu_seconds=time.process_time() - start)
    norms = res.grad_norms[adapter(model).logged]
    block_max = norms.reshape(-1, block).max(axis=1)
    return dict(min_val_mse=float(res.val_loss.min()), min_train_mse=res.min_train_loss,
                final_val_mse=res.final_val_loss, max_grad_norm=float(block_max.max()), block_max=block_max,
                diverged=0, cpu_seconds=time.process_time() - start)


def summarize(results, outdir) -> Summary:
    """Table per (model, lag), the ratios L_max/L_min of both metrics, and ``rnn.png`` (two panels)."""
    lines, numbers, table = [], {}, []
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10.5, 4.0))
    panels = (("min_val_mse", "min validation MSE"), ("max_grad_norm", "max gradient norm (block maxima)"))
    config = None
    for model, color, marker in zip(MODELS, ("C0", "C3"), ("o", "s")):
        rows = [r for r in results if r[0]["model"] == model]
        if not rows:
            continue
        config, rows, note = select_config(rows, ("seed", "lag"))
        config.pop("model")
        if note:
            lines.append(f"{model}: {note}")
        for ax, (key, title) in zip(axes, panels):
            lags, groups = by_axis(rows, "lag", key)
            groups = [g[np.isfinite(g)] for g in groups]
            mean, ci = stats(groups)
            ci_errorbar(ax, lags, mean, ci, label=LABELS[model], color=color, marker=marker)
            numbers[f"{model}_{key}_ratio"] = float(mean[-1] / mean[0])
            for L, g, mu, c in zip(lags, groups, mean, ci):
                table.append((model, int(L), key, len(g), f"{mu:.4g}", f"{c:.2g}"))
        diverged = sum(int(a["diverged"]) for _, a in rows)
        if diverged:
            lines.append(f"{model}: {diverged} diverged runs left out")
    axes[0].axhline(MSE_FLOOR, color="0.4", ls=":", lw=1.2, label=f"best possible: 1 − {COEF:g}² = {MSE_FLOOR:.2f}")
    for ax, (key, title) in zip(axes, panels):
        ax.set_xlabel("lag L (window length T = L + 1)")
        ax.set_ylabel(title)
        ax.set_yscale("log")
        ax.set_xticks(sorted({p["lag"] for p, _ in results}))
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{title} vs lag (mean ± 95% CI)", fontsize=10)
        ax.legend(fontsize=8)
    if config is not None:
        fig.suptitle(f"AR(L), m={config['m']}, n={config['n']}, {config['steps']} GD steps (η={ETA}), "
                     f"gradient maxima over {config['block']}-step blocks", fontsize=9)
    path = save_figure(fig, Path(outdir) / "rnn.png")
    head = [f"Transformer vs IndRNN on AR(L) ({config})",
            tabulate(table, headers=["model", "lag", "metric", "seeds", "mean", "± 95% CI"])]
    ratios = [f"{k}: {v:.3g}" for k, v in numbers.items()]
    head.append("largest / smallest lag (paper: RNN grows with L, transformer flat): " + ", ".join(ratios))
    return Summary("\n".join(head + lines), [path], numbers)
