"""Generalization to unseen sentences (spec/twostage.md §6, §7; the experiment the reviewers asked for).

One cell = one seed: a random realizable dataset (``random_realizable(K, N, seed=seed)``, hidden orders
known) is trained by Algorithm 1 (zero init, η0 = 0.2/√d, η = 0.05/√d, T0 and T updates), and at
checkpoints over stage-2 time (:func:`ntpref.reproduce.common.time_grid`, about 100 evenly spaced and 30
log-spaced steps) the model is evaluated on n_unseen sentences absent from the training set
(``unseen_sentences(ds, n_unseen, seed=UNSEEN_SEED_OFFSET + seed, orders=hidden orders)``), split into

  determined     the transitive closure of the observed relations makes one token x̂ the maximum; target n(x̂).
                 Theory: attention concentrates on x̂ and the model predicts n(x̂).
  noncomparable  the closure leaves the maximum open; x̂ = the hidden-order maximum, target n(x̂). Nothing
                 is guaranteed: the model has to pick among tokens the data never ranked.

and on the training sentences ("train", x̂ = x*). Metrics (:mod:`ntpref.twostage.generalization`):
accuracy (target logit strictly the largest), attn_max (attention mass on x̂) and p_target = mean p(n(x̂)|X).

Run time (2-core machine, --workers 2): quick (3 seeds) 4.4 s wall, full (10 seeds) 8 s wall.

Cell arrays: steps [n] int64; {part}_{metric} [n] for part in train / determined / noncomparable and metric in
accuracy / attn_max / p_target (NaN when the part has no sentences); n_{part} (0-d) the part's size.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..twostage.data import random_realizable, unseen_sentences
from ..twostage.generalization import METRICS, generalization_curve
from . import Summary
from .common import band, mean_row, per_seed_config, pyplot, save_figure, seed_cells, time_grid

DESCRIPTION = "two-stage generalization: accuracy, attention, p(n(x)|X) on closure-determined vs non-comparable"
SIZES = {
    "quick": {"seeds": 3, "K": 20, "N": 200, "T0": 1000, "T": 10000, "n_unseen": 400},
    "full": {"seeds": 10, "K": 20, "N": 200, "T0": 1000, "T": 10000, "n_unseen": 1000},
}
PARTS = ("train", "determined", "noncomparable")
LABELS = {"train": "training sentences", "determined": "unseen, closure-determined",
          "noncomparable": "unseen, non-comparable"}
METRIC_LABELS = {"accuracy": "accuracy", "attn_max": r"attention mass on $\hat x$",
                 "p_target": r"$p(n(\hat x) \mid X)$"}
CHECKPOINTS_UNIFORM, CHECKPOINTS_LOG = 100, 30
UNSEEN_SEED_OFFSET = 1_000_000   # the unseen sentences use their own random stream, not the dataset's
cells = seed_cells               # one cell per seed 0..seeds−1 with the rest of the configuration


def cell(seed: int, K: int, N: int, T0: int, T: int, n_unseen: int) -> dict[str, np.ndarray]:
    """Train one random realizable dataset and evaluate the three parts at the stage-2 checkpoints."""
    task = random_realizable(K=K, N=N, seed=seed)
    split = unseen_sentences(task.dataset, n=n_unseen, seed=UNSEEN_SEED_OFFSET + seed, orders=task.orders)
    d = task.dataset.d
    steps = time_grid(T, CHECKPOINTS_UNIFORM, CHECKPOINTS_LOG)
    curve = generalization_curve(task.dataset, split, steps, eta0=0.2 / np.sqrt(d), eta=0.05 / np.sqrt(d),
                                 T0=T0, T=T)
    out = {"steps": curve.steps}
    for part in PARTS:
        out[f"n_{part}"] = np.int64(curve.sizes.get(part, 0))
        missing = np.full(steps.size, np.nan)
        for metric in METRICS:
            out[f"{part}_{metric}"] = curve.curves[part][metric] if part in curve.curves else missing
    return out


def _present(per_seed: list, part: str) -> list:
    """The cells in which ``part`` has sentences."""
    return [(seed, a) for seed, a in per_seed if int(a[f"n_{part}"]) > 0]


def _figure(plt, per_seed, config, outdir: Path) -> Path:
    steps = per_seed[0][1]["steps"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6))
    for ax, metric in zip(axes, METRICS):
        for color, part in zip(("0.45", "C0", "C3"), PARTS):
            cells_ = _present(per_seed, part)
            if cells_:
                n = int(np.mean([int(a[f"n_{part}"]) for _, a in cells_]))
                band(ax, steps, np.stack([a[f"{part}_{metric}"] for _, a in cells_]),
                     f"{LABELS[part]} (~{n} per seed)", color)
        ax.set_title(METRIC_LABELS[metric])
        ax.set_xlabel("stage-2 step $t$")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Generalization to unseen sentences (K = d = {config['K']}, N = {config['N']}, "
                 f"mean and 95% CI over {len(per_seed)} seeds; $\\hat x$ = closure maximum, or hidden-order "
                 f"maximum when non-comparable)", fontsize=11)
    fig.tight_layout()
    return save_figure(fig, outdir / "generalization.png")


def summarize(results: list, outdir) -> Summary:
    """Figure (three metrics over stage-2 time, three parts), final-value table per seed and headline numbers."""
    outdir = Path(outdir)
    config, per_seed, note = per_seed_config(results)
    finals = {(part, metric): [float(a[f"{part}_{metric}"][-1]) for _, a in _present(per_seed, part)]
              for part in PARTS for metric in METRICS}
    sizes = {part: [int(a[f"n_{part}"]) for _, a in _present(per_seed, part)] for part in PARTS}
    overview = [mean_row(LABELS[part], [sizes[part]] + [finals[part, m] for m in METRICS]) for part in PARTS]
    per_seed_rows = [[seed] + [f"{a[f'{part}_accuracy'][-1]:.4f} ({int(a[f'n_{part}'])})" for part in PARTS]
                     for seed, a in per_seed]
    header = [f"generalization: K = d = {config['K']}, N = {config['N']}, T0 = {config['T0']}, T = {config['T']}, "
              f"{config['n_unseen']} unseen sentences per seed, {len(per_seed)} seeds; values at t = T, "
              "mean ± 95% CI over seeds",
              "x^ = the closure maximum (determined), the hidden-order maximum (non-comparable), x* (training)"]
    if note:
        header.append(f"({note})")
    table = "\n".join(header + [
        tabulate(overview, headers=["part", "sentences", "accuracy", "attention on x^", "p(n(x^) | X)"],
                 disable_numparse=True),
        "", "accuracy per seed (number of sentences)",
        tabulate(per_seed_rows, headers=["seed", *(LABELS[p] for p in PARTS)], disable_numparse=True)])
    figures = [_figure(pyplot(), per_seed, config, outdir)]
    numbers = {"seeds": float(len(per_seed))}
    for (part, metric), values in finals.items():
        numbers[f"{part}_{metric}"] = float(np.mean(values)) if values else float("nan")
    numbers["determined_fraction"] = float(np.mean([int(a["n_determined"]) / config["n_unseen"] for _, a in per_seed]))
    return Summary(table, figures, numbers)
