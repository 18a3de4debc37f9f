"""Generalization to unseen sentences (docs/twostage.md §6, §7; the experiment the reviewers asked for).

One cell = one seed: a random realizable dataset (``random_realizable(K, N, seed=seed)``, lengths 2..6, hidden
orders known) is trained by Algorithm 1 (zero init, η0 = 0.2/√d, η = 0.05/√d, T0 and T updates), and at
checkpoints over stage-2 time (:func:`ntpref.reproduce.configs.time_grid`, about 100 evenly spaced and 30
log-spaced steps) the model is evaluated on two sets of sentences absent from the training set:

  n_unseen sentences of the training lengths 2..6
      (``unseen_sentences(ds, n_unseen, seed=UNSEEN_SEED_OFFSET + seed, orders=hidden orders)``)
  n_long sentences longer than any training sentence, lengths ``LONG_LENGTHS`` = 7..12 (the length shift)
      (``unseen_sentences(ds, n_long, seed=LONG_SEED_OFFSET + seed, orders=..., min_len=7, max_len=12)``)

each split (:func:`ntpref.twostage.generalization.unseen_parts`) into

  determined     the transitive closure of the observed relations makes one token x̂ the maximum; target n(x̂).
                 Theory: attention concentrates on x̂ and the model predicts n(x̂).
  closure_only   the determined sentences whose maximum needs at least one transitive step (x̂ > v known only
                 through x̂ > w > ... > v for some token v of the sentence); most determined sentences of
                 lengths 2..6 are decided by pairs observed directly in training, these are the test of the
                 closure.
  noncomparable  the closure leaves the maximum open; x̂ = the hidden-order maximum, target n(x̂). Nothing
                 is guaranteed: the model has to pick among tokens the data never ranked.

and on the training sentences ("train", x̂ = x*). Metrics (:mod:`ntpref.twostage.generalization`):
accuracy (target logit strictly the largest), attn_max (attention mass on x̂) and p_target = mean p(n(x̂)|X).

Cell arrays: steps [n] int64; {part}_{metric} [n] for part in ``PARTS`` (train, determined, closure_only,
noncomparable and the same three with the prefix ``long_``) and metric in accuracy / attn_max / p_target (NaN
when the part has no sentences); n_{part} (0-d) the part's size.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..precompile import TWOSTAGE_TRAINING_AND_PASS
from ..sweep import CellArray
from ..twostage import generalization_curve, random_realizable, unseen_parts, unseen_sentences
from ..twostage.generalization import METRICS
from . import Summary
from .configs import per_seed_config, seed_cells, time_grid
from .plots import band, finish_figure, pyplot
from .stats import mean_row

DESCRIPTION = ("two-stage generalization: accuracy, attention, p(n(x)|X) on closure-determined, closure-only and "
               "non-comparable unseen sentences, at the training lengths and longer")
SIZES = {
    "quick": {"seeds": 3, "K": 20, "N": 200, "T0": 1000, "T": 10000, "n_unseen": 1000, "n_long": 2000},
    "full": {"seeds": 10, "K": 20, "N": 200, "T0": 1000, "T": 10000, "n_unseen": 4000, "n_long": 8000},
}
LONG_LENGTHS = (7, 12)           # longer than every training sentence (random_realizable: lengths 2..6)
SPLITS = ("determined", "closure_only", "noncomparable")
PARTS = ("train", *SPLITS, *(f"long_{p}" for p in SPLITS))
LABELS = {"train": "training sentences", "determined": "unseen, closure-determined",
          "closure_only": "unseen, closure-only (transitive step)", "noncomparable": "unseen, non-comparable",
          **{f"long_{p}": f"longer ({LONG_LENGTHS[0]}..{LONG_LENGTHS[1]}), {label}" for p, label in
             (("determined", "determined"), ("closure_only", "closure-only"), ("noncomparable", "non-comparable"))}}
SHORT = {"train": "train", "determined": "determined", "closure_only": "closure-only",
         "noncomparable": "non-comp.", "long_determined": "long det.", "long_closure_only": "long closure-only",
         "long_noncomparable": "long non-comp."}
METRIC_LABELS = {"accuracy": "accuracy", "attn_max": r"attention mass on $\hat x$",
                 "p_target": r"$p(n(\hat x) \mid X)$"}
CHECKPOINTS_UNIFORM, CHECKPOINTS_LOG = 100, 30
UNSEEN_SEED_OFFSET = 1_000_000   # the unseen sentences use their own random stream, not the dataset's
LONG_SEED_OFFSET = 3_000_000     # and the longer ones another one
PRECOMPILE = TWOSTAGE_TRAINING_AND_PASS   # a cell's kernels (ntpref.precompile): it evaluates with forward
cells = seed_cells               # one cell per seed 0..seeds−1 with the rest of the configuration


def cell(seed: int, K: int, N: int, T0: int, T: int, n_unseen: int, n_long: int) -> dict[str, np.ndarray]:
    """Train one random realizable dataset and evaluate every part at the stage-2 checkpoints."""
    task = random_realizable(K=K, N=N, seed=seed)
    ds = task.dataset
    split = unseen_sentences(ds, n=n_unseen, seed=UNSEEN_SEED_OFFSET + seed, orders=task.orders)
    longer = unseen_sentences(ds, n=n_long, seed=LONG_SEED_OFFSET + seed, orders=task.orders,
                              min_len=LONG_LENGTHS[0], max_len=LONG_LENGTHS[1])
    d = ds.d
    steps = time_grid(T, CHECKPOINTS_UNIFORM, CHECKPOINTS_LOG)
    curve = generalization_curve(ds, {**unseen_parts(ds, split), **unseen_parts(ds, longer, prefix="long_")}, steps,
                                 eta0=0.2 / np.sqrt(d), eta=0.05 / np.sqrt(d), T0=T0, T=T)
    out = {"steps": curve.steps}
    for part in PARTS:
        out[f"n_{part}"] = np.int64(curve.sizes.get(part, 0))
        missing = np.full(steps.size, np.nan)
        for metric in METRICS:
            out[f"{part}_{metric}"] = curve.curves[part][metric] if part in curve.curves else missing
    return out


def cell_arrays(seed: int, K: int, N: int, T0: int, T: int, n_unseen: int, n_long: int) -> dict[str, CellArray]:
    """What :func:`cell` returns: the checkpoints ``steps`` [n], per part its size n_PART and its metrics
    PART_METRIC [n] in [0, 1] (NaN when the part has no sentences)."""
    n = time_grid(T, CHECKPOINTS_UNIFORM, CHECKPOINTS_LOG).size
    out = {"steps": CellArray("i8", (n,), low=0)}
    for part in PARTS:
        out[f"n_{part}"] = CellArray("i8", low=0)
        out.update({f"{part}_{metric}": CellArray("f8", (n,), 0.0, 1.0, nonfinite=True) for metric in METRICS})
    return out


def _present(per_seed: list, part: str) -> list:
    """The cells in which ``part`` has sentences."""
    return [(seed, a) for seed, a in per_seed if int(a[f"n_{part}"]) > 0]


def _figure(plt, per_seed, config, outdir: Path) -> Path:
    steps = per_seed[0][1]["steps"]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8.6))
    rows = (("train", *SPLITS), tuple(f"long_{p}" for p in SPLITS))
    colors = {"train": "0.45", "determined": "C0", "closure_only": "C2", "noncomparable": "C3"}
    for row, parts in zip(axes, rows):
        for ax, metric in zip(row, METRICS):
            for part in parts:
                cells_ = _present(per_seed, part)
                if cells_:
                    n = int(np.mean([int(a[f"n_{part}"]) for _, a in cells_]))
                    band(ax, steps, np.stack([a[f"{part}_{metric}"] for _, a in cells_]),
                         f"{LABELS[part]} (~{n} per seed)", colors[part.removeprefix("long_")])
            ax.set_title(METRIC_LABELS[metric] + ("" if parts[0] == "train" else " (longer sentences)"))
            ax.set_xlabel("stage-2 step $t$")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8, loc="lower right")
    title = (f"Generalization to unseen sentences (K = d = {config['K']}, N = {config['N']}, training lengths "
             f"2..6)\ntop: unseen lengths 2..6, bottom: {LONG_LENGTHS[0]}..{LONG_LENGTHS[1]}; mean and 95% CI over "
             f"{len(per_seed)} seeds; $\\hat x$ = closure maximum, or hidden-order maximum when non-comparable")
    return finish_figure(fig, title, outdir / "generalization.png", fontsize=11)


def summarize(results: list, outdir) -> Summary:
    """Figure (three metrics over stage-2 time, every part), final-value table per seed and headline numbers."""
    outdir = Path(outdir)
    config, per_seed, note = per_seed_config(results)
    finals = {(part, metric): [float(a[f"{part}_{metric}"][-1]) for _, a in _present(per_seed, part)]
              for part in PARTS for metric in METRICS}
    sizes = {part: [int(a[f"n_{part}"]) for _, a in _present(per_seed, part)] for part in PARTS}
    total = {part: sum(int(a[f"n_{part}"]) for _, a in per_seed) for part in PARTS}
    overview = [mean_row(LABELS[part], [sizes[part]] + [finals[part, m] for m in METRICS]) for part in PARTS]
    per_seed_rows = [[seed] + [f"{a[f'{part}_accuracy'][-1]:.4f} ({int(a[f'n_{part}'])})"
                               if int(a[f"n_{part}"]) else "- (0)" for part in PARTS] for seed, a in per_seed]
    seeds = len(per_seed)

    def share(part, of) -> str:
        """"n of m (p%)": the part's total against another part's total (``of`` a name) or a count."""
        m = total[of] if isinstance(of, str) else of
        return f"{total[part]} of {m} ({total[part] / max(m, 1):.0%})"

    header = [f"generalization: K = d = {config['K']}, N = {config['N']} (lengths 2..6), T0 = {config['T0']}, "
              f"T = {config['T']}, {config['n_unseen']} unseen sentences of lengths 2..6 and {config['n_long']} of "
              f"lengths {LONG_LENGTHS[0]}..{LONG_LENGTHS[1]} per seed, {seeds} seeds; values at t = T, mean ± 95% CI "
              "over the seeds in which the part has sentences",
              "x^ = the closure maximum (determined), the hidden-order maximum (non-comparable), x* (training)"]
    for prefix, lengths, n in (("", "2..6", config["n_unseen"]),
                               ("long_", f"{LONG_LENGTHS[0]}..{LONG_LENGTHS[1]}", config["n_long"])):
        header.append(f"lengths {lengths} (totals over seeds): determined {share(prefix + 'determined', seeds * n)}, "
                      f"of which closure-only {share(prefix + 'closure_only', prefix + 'determined')}; "
                      f"non-comparable {share(prefix + 'noncomparable', seeds * n)}")
    if note:
        header.append(f"({note})")
    table = "\n".join(header + [
        tabulate(overview, headers=["part", "sentences per seed", "accuracy", "attention on x^", "p(n(x^) | X)"],
                 disable_numparse=True),
        "", "accuracy per seed (number of sentences)",
        tabulate(per_seed_rows, headers=["seed", *(SHORT[p] for p in PARTS)], disable_numparse=True)])
    figures = [_figure(pyplot(), per_seed, config, outdir)]
    numbers = {"seeds": float(seeds)}
    for (part, metric), values in finals.items():
        numbers[f"{part}_{metric}"] = float(np.mean(values)) if values else float("nan")
    numbers["determined_fraction"] = total["determined"] / (seeds * config["n_unseen"])
    numbers["closure_only_fraction"] = total["closure_only"] / max(total["determined"], 1)
    numbers["long_determined_fraction"] = total["long_determined"] / (seeds * config["n_long"])
    numbers["long_closure_only_fraction"] = total["long_closure_only"] / max(total["long_determined"], 1)
    return Summary(table, figures, numbers)
