"""Transformer vs IndRNN on the autoregressive task (docs/shallow.md §5), as the authors' comparison script
runs it: min validation MSE vs the lag L and the gradient-norm metric of their plotting script vs L, both
models; and the validation curves, to show whether training has converged.

Data: :func:`ntpref.shallow.autoregressive` (x_t = 0.9 x_{t−L} + ε_t, ε ~ N(0, 0.1), windows of
T = L + 1 values, 17 token features: the value and 8 sin/cos pairs of periods 32·2^k, y z-scored, random
80/20 split; the data seed is the cell's seed). The authors z-score y over all n windows before the split;
here the training windows' mean and standard deviation are used (no validation statistics leak into
training).
Models: both of width m = 64, tanh, paired initialisation from seed + INIT_SEED_OFFSET (the shallow
transformer's :func:`ntpref.shallow.paired_init`; the IndRNN's :func:`ntpref.shallow.indrnn.paired_init`,
u_i = ±1.5); plain full-batch GD
(no projection) with η = 0.05; loss = MSE (κ = 2).
Metrics:
  min validation MSE  min over the steps of the validation MSE after each update (``val_loss``, stored per
                      cell as the validation curve); mean ± 95% CI over seeds.
  gradient metric     the norm of the logged block at every step (‖∇_W L‖_F for the transformer, ‖∇_u L‖ for
                      the RNN), its maximum over each block of ``block`` steps (:func:`block_maxima`, stored as
                      ``block_max``), then the mean over all blocks of all seeds with its 95% interval over
                      those blocks (:func:`pooled_blocks`): the authors' plotting script concatenates the
                      seeds' per-step logs of a lag and takes 500-step block maxima of that file.
  tail gain           how much the running minimum of the validation MSE still fell over the last 20% of the
                      steps, relative (:func:`tail_gain`; 0 = the curve had flattened).
A run whose loss or parameters become non-finite is recorded as diverged (NaN metrics, ``diverged`` = 1)
instead of failing the sweep.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from .. import shallow
from ..shallow.projgd import model_named
from ..sweep import CellArray
from . import Summary
from .configs import by_axis, config_text, select_config
from .plots import ci_errorbar, pyplot, save_figure
from .stats import interval_text, mean_ci, ratio_interval, stats
from .teacher_student import INIT_SEED_OFFSET, TRAIN_FRACTION

DESCRIPTION = "transformer vs IndRNN on AR(L): min validation MSE, gradient-norm block maxima and validation curves"

MODELS = ("shallow", "indrnn")
NAMES = {"shallow": "transformer", "indrnn": "IndRNN"}
GRADIENTS = {"shallow": r"$\|\nabla_W L\|_F$", "indrnn": r"$\|\nabla_u L\|$"}   # what the gradient metric measures
COEF = 0.9   # x_t = COEF · x_{t−L} + ε_t
MSE_FLOOR = 1 - COEF ** 2
"""The best possible validation MSE of the standardised target: the innovation variance over the series'
variance, noise_var / (noise_var / (1 − 0.9²)) = 1 − 0.9² = 0.19."""
ETA, D_TOKEN, TAIL = 0.05, 17, 0.2

SIZES = {
    # quick: n = 250 windows (200 training), lags 4 and 16, 2 seeds, 20000 steps: at η = 0.05 the
    # transformer's validation MSE keeps falling for about 18000 steps at this size (lag 4, seed 1: 0.476
    # at 8000 steps, 0.401 at 16000, 0.395 at 18000 and 20000); 500-step blocks as the authors'.
    "quick": dict(seeds=(1, 2), lags=(4, 16), m=64, n=250, steps=20000, block=500),
    # full: the authors' README command (20 seeds, lags 4, 16, 72, 96, n = 5000, 5000 steps, 500-step blocks).
    "full": dict(seeds=tuple(range(1, 21)), lags=(4, 16, 72, 96), m=64, n=5000, steps=5000, block=500),
}


def _check_block(steps: int, block: int) -> None:
    if block < 1 or steps % block:
        raise InputError(f"the number of steps ({steps}) must be a multiple of block ({block})")


def cells(seeds, lags, m, n, steps, block) -> list[dict]:
    """One cell per (seed, lag, model); the longest lags first within a seed."""
    _check_block(steps, block)
    return [dict(model=model, lag=L, seed=s, m=m, n=n, steps=steps, block=block)
            for s in seeds for L in sorted(lags, reverse=True) for model in MODELS]


def block_maxima(norms, block: int) -> np.ndarray:
    """[steps / block] maxima of the per-step gradient norms over consecutive blocks of ``block`` steps."""
    norms = np.asarray(norms, dtype=np.float64)
    _check_block(norms.size, block)
    return norms.reshape(-1, block).max(axis=1)


def pooled_blocks(block_max: list) -> tuple[float, float, int]:
    """(mean, 95% CI half-width, number of blocks) over the block maxima of all seeds pooled (NaN ignored)."""
    v = np.concatenate([np.asarray(b, dtype=np.float64).ravel() for b in block_max])
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan, 0
    mean, half = mean_ci(v)
    return float(mean), float(half), int(v.size)


def tail_gain(val_loss, tail: float = TAIL) -> float:
    """(min of the first 1 − tail of the curve − min of the whole curve) / min of the whole curve: the
    relative drop of the running minimum over the last ``tail`` of the steps (0 = flat)."""
    v = np.asarray(val_loss, dtype=np.float64)
    head = v[:max(1, int(round((1.0 - tail) * v.size)))]
    return float((head.min() - v.min()) / v.min())


def cell(model, lag, seed, m, n, steps, block) -> dict:
    """Train one model on the seed's AR(lag) data by plain GD; see the module docstring for the outputs."""
    _check_block(steps, block)
    start = time.process_time()
    data = shallow.autoregressive(lag, n=n, n_train=round(TRAIN_FRACTION * n), coef=COEF, seed=seed)
    api = shallow if model == "shallow" else shallow.indrnn
    params = api.paired_init(m, D_TOKEN, seed + INIT_SEED_OFFSET)
    try:
        res = shallow.train(api.prepare(data.X_train, data.y_train), params, eta=ETA, steps=steps,
                            val=api.prepare(data.X_val, data.y_val))
    except InputError as err:
        if "diverged" not in str(err):
            raise
        nan = math.nan
        return dict(min_val_mse=nan, min_train_mse=nan, final_val_mse=nan, block_max=np.full(steps // block, nan),
                    val_loss=np.full(steps, nan), diverged=1, cpu_seconds=time.process_time() - start)
    norms = res.grad_norms[model_named(model).logged]
    return dict(min_val_mse=float(res.val_loss.min()), min_train_mse=res.min_train_loss,
                final_val_mse=res.final_val_loss, block_max=block_maxima(norms, block),
                val_loss=res.val_loss, diverged=0, cpu_seconds=time.process_time() - start)


def cell_arrays(model, lag, seed, m, n, steps, block) -> dict:
    """What :func:`cell` returns: the MSEs (>= 0), block_max [steps / block] and val_loss [steps], all NaN
    for a run that diverged (``diverged`` 1, else 0), and the CPU seconds."""
    def mse(*shape):
        return CellArray("f8", shape, low=0.0, nonfinite=True)

    return dict(min_val_mse=mse(), min_train_mse=mse(), final_val_mse=mse(), block_max=mse(steps // block),
                val_loss=mse(steps), diverged=CellArray("i8", low=0, high=1), cpu_seconds=CellArray("f8", low=0.0))


def _finite(groups):
    return [g[np.isfinite(g)] for g in groups]


def summarize(results, outdir) -> Summary:
    """Table per (model, lag), the ratios L_max/L_min of both metrics with their 95% bootstrap intervals over the
    seeds (:func:`ntpref.reproduce.stats.ratio_interval`), and ``rnn.png`` (three panels: min
    validation MSE vs L, gradient metric vs L, validation curves)."""
    lines, numbers, table, intervals = [], {}, [], {}
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.4), gridspec_kw=dict(wspace=0.28))
    config = None
    for model, color, marker in zip(MODELS, ("C0", "C3"), ("o", "s")):
        rows = [r for r in results if r[0]["model"] == model]
        if not rows:
            continue
        config, rows, note = select_config(rows, ("seed", "lag"))
        config.pop("model")
        lines += [f"{model}: {note}"] if note else []
        lags, groups = by_axis(rows, "lag", "min_val_mse")
        groups = _finite(groups)
        mean, ci = stats(groups)
        ci_errorbar(axes[0], lags, mean, ci, label=NAMES[model], color=color, marker=marker)
        grad = [pooled_blocks([a["block_max"] for p, a in rows if p["lag"] == L]) for L in lags]
        g_mean, g_ci = np.array([g[0] for g in grad]), np.array([g[1] for g in grad])
        ci_errorbar(axes[1], lags, g_mean, g_ci, label=f"{NAMES[model]} ({GRADIENTS[model]})", color=color,
                    marker=marker)
        _, gains = by_axis(rows, "lag", lambda a: tail_gain(a["val_loss"]) if not a["diverged"] else math.nan)
        gains = _finite(gains)
        for i, L in enumerate(lags):
            curves = np.array([a["val_loss"] for p, a in rows if p["lag"] == L and not a["diverged"]])
            if curves.size:
                axes[2].plot(np.arange(1, curves.shape[1] + 1), curves.mean(axis=0), color=color, lw=1.2,
                             alpha=0.4 + 0.6 * i / max(1, len(lags) - 1), ls="-" if model == "shallow" else "--",
                             label=f"{NAMES[model]}, L = {int(L)}")
            g, (gm, gc, nb), tg = groups[i], grad[i], gains[i]
            table.append((model, int(L), len(g), f"{mean[i]:.4g} ± {ci[i]:.2g}",
                          f"{np.median(g):.4g}" if len(g) else "-", f"{gm:.4g} ± {gc:.2g}", nb,
                          f"{np.max(tg):.2%}" if len(tg) else "-"))
        numbers[f"{model}_min_val_mse_ratio"] = float(mean[-1] / mean[0])
        numbers[f"{model}_grad_ratio"] = float(g_mean[-1] / g_mean[0])
        ends = {(p["seed"], p["lag"]): a for p, a in rows if p["lag"] in (lags[0], lags[-1])}
        paired = sorted(seed for seed, lag in ends if lag == lags[0] and (seed, lags[-1]) in ends)
        for key, value in (("min_val_mse", "min_val_mse"), ("grad", "block_max")):
            interval = ratio_interval([ends[seed, lags[0]][value] for seed in paired],
                                      [ends[seed, lags[-1]][value] for seed in paired])
            intervals[f"{model}_{key}_ratio"] = interval
            if interval:
                numbers[f"{model}_{key}_ratio_lo"], numbers[f"{model}_{key}_ratio_hi"] = interval
        numbers[f"{model}_tail_gain_max"] = float(max((np.max(g) for g in gains if len(g)), default=math.nan))
        diverged = sum(int(a["diverged"]) for _, a in rows)
        if diverged:
            lines.append(f"{model}: {diverged} diverged runs left out")
    axes[0].axhline(MSE_FLOOR, color="0.4", ls=":", lw=1.2, label=f"best possible: 1 − {COEF:g}² = {MSE_FLOOR:.2f}")
    axes[2].axhline(MSE_FLOOR, color="0.4", ls=":", lw=1.2)
    titles = ("min validation MSE vs lag (mean ± 95% CI over seeds)",
              "gradient metric vs lag (mean ± 95% CI over blocks)", "validation MSE vs step (mean over seeds)")
    ylabels = ("min validation MSE", "mean of the block maxima of the gradient norm", "validation MSE")
    for ax, title, ylabel in zip(axes, titles, ylabels):
        ax.set_ylabel(ylabel)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
        ax.set_title(title, fontsize=9.5)
        ax.legend(fontsize=7.5)
    for ax in axes[:2]:
        ax.set_xlabel("lag L (window length T = L + 1)")
        ax.set_xticks(sorted({p["lag"] for p, _ in results}))
    axes[2].set_xlabel("GD step")
    if config is not None:
        fig.suptitle(f"AR(L), m={config['m']}, n={config['n']}, {config['steps']} GD steps (η={ETA}), "
                     f"gradient maxima over {config['block']}-step blocks", fontsize=9)
    path = save_figure(fig, Path(outdir) / "rnn.png")
    head = [f"Transformer vs IndRNN on AR(L) ({config_text(config)})",
            "paper (abstract): the transformer's optimization error is independent of the sequence length T; "
            "for recurrent architectures it can grow exponentially with T",
            tabulate(table, headers=["model", "lag", "seeds", "min val MSE (mean ± CI)", "median",
                                     "gradient metric (mean ± CI)", "blocks", "tail gain (max)"])]
    ratios = [f"{k}: {v:.3g}{interval_text(intervals.get(k))}" for k, v in numbers.items() if k.endswith("_ratio")]
    head.append("largest / smallest lag (mean over the seeds; in brackets the 95% bootstrap interval, the seeds "
                "resampled in pairs across the two lags): " + ", ".join(ratios))
    head.append(f"tail gain: relative drop of the running min of the validation MSE over the last {TAIL:.0%} "
                "of the steps (0 = flat)")
    return Summary("\n".join(head + lines), [path], numbers)
