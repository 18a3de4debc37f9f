"""Initialisation strategies in the teacher–student setting of paper (2) (its future work names "the impact of
different initialization strategies"; not an experiment of the paper): min training loss vs the width m, and
the head movement and kernel drift of the ``ntk`` target, for four initial points θ(0).

Training as :mod:`ntpref.reproduce.width` and :mod:`ntpref.reproduce.ntk` (the authors' "diagonal" teacher,
full-batch ProjGD with η = 1.75/√steps and ρ = 3 for all blocks, MSE); only θ(0) changes. With the unit
draws (c̃_i, Ũ_i, W̃_i) of :func:`ntpref.shallow.paired_init` / :func:`ntpref.shallow.iid_init` (W̃, Ũ i.i.d.
N(0, 1), c̃ = ±1) from seed + INIT_SEED_OFFSET, the initialisations (:data:`INITS`) are
  ``paired``       θ_i = (c̃_i, Ũ_i, W̃_i), θ_{m/2+i} = (−c̃_i, Ũ_i, W̃_i): f ≡ 0 at t = 0 (the project's default);
  ``unpaired``     θ_i = (c̃_i, Ũ_i, W̃_i) for all m heads drawn independently (the same distribution per
                   head, no pairing: f(0) ≠ 0);
  ``paired-x0.5``  s·θ_paired(0) with s = 1/2, and ``paired-x2`` with s = 2: every entry of all three blocks
                   c, U and W multiplied by s (so the pairs still cancel, f ≡ 0 at t = 0).
For every initialisation the projection ball of head i is centred at its θ_i(0) with the same radius ρ/√m.

Cells:
  ``kind="train"`` (seed, init, m): :func:`ntpref.reproduce.ntk.train_diagnostics` from the initialisation's
      θ(0): the min training loss, the per-head movement ratio ‖B_i(t) − B_i(0)‖ / (ρ/√m) per block, the
      kernel drift ‖K(θ(t)) − K(θ(0))‖_F / ‖K(θ(0))‖_F on the first ``n_drift`` training inputs and the first
      step the projection acted. The ``paired`` cell is the ``ntk`` target's training cell of the same seed,
      m and data, bit for bit (:func:`equivalent_cell`: copied from its finished results).
  ``kind="start"`` (seed, init, m): the training loss L(θ(0)) and max_j |f(X_j; θ(0))| over the training
      inputs (0 exactly for the paired initialisations).
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from tabulate import tabulate

from .. import shallow
from ..errors import InputError
from ..sweep import CellArray
from . import Summary
from .configs import by_axis, config_text, select_config
from .ntk import boundary_fraction, median_head, train_diagnostics
from .ntk import cell_arrays as ntk_cell_arrays
from .plots import ci_errorbar, finish_figure, loglog_panel, pyplot
from .stats import BOOTSTRAP_DRAWS, axis_table, bootstrap_interval, median_slope_interval, medians, stats
from .teacher_student import D, INIT_SEED_OFFSET, RHO, teacher_data

DESCRIPTION = "initialisations (paired, unpaired, paired x1/2, x2): min training loss, head movement, kernel drift vs m"

INITS = {"paired": (True, 1.0), "unpaired": (False, 1.0), "paired-x0.5": (True, 0.5), "paired-x2": (True, 2.0)}
"""init name -> (paired, s): θ(0) = s · (paired_init or iid_init)'s unit draws (see the module docstring)."""
STYLE = {"paired": ("C0", "o"), "unpaired": ("C3", "s"), "paired-x0.5": ("C2", "^"), "paired-x2": ("C1", "v")}

SIZES = {
    # quick: 10 seeds x 4 initialisations in minutes on 2 cores, so a much smaller setting than the width
    # sweep's quick one (n = 1000, 1500 steps, m up to 128): n = 300 (240 training inputs), K = 1024, 400 steps
    # (η = 1.75/√400), m = 8..64, the drift on 100 inputs (docs/performance.md: its CPU time). The unpaired
    # cells cost more where its heads reach their balls (the cell then also runs plain GD). At so few steps
    # the losses are far from converged: the quick size tests the pipeline and shows the large effects only.
    "quick": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64), n=300, K=1024, T=16, steps=400, n_drift=100,
                  inits=tuple(INITS), teacher="diagonal"),
    # full: the width sweep's and the ntk target's setting (n = 5000, K = 8192, 4000 steps, m = 8..256, the
    # drift on 400 inputs), 5 seeds, whose paired cells are the ntk target's committed cells (copied); ``--seeds
    # 10`` adds five more. Estimate, from the ntk target's 0.33 CPU-h of training cells per seed: 1.0 to 1.3
    # CPU-h per seed for the three other initialisations (the upper end counts the unpaired cells twice, as
    # when its heads reach their balls at every width): 5 to 6.6 CPU-h for the 5 seeds, half of it in wall
    # time on 2 workers; 0.33 more per seed beyond 5, whose paired cells are computed.
    "full": dict(seeds=tuple(range(1, 6)), widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, T=16, steps=4000,
                 n_drift=400, inits=tuple(INITS), teacher="diagonal"),
}


def _checked(init: str) -> str:
    """``init`` if it names an initialisation of :data:`INITS`, else InputError."""
    if init not in INITS:
        raise InputError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    return init


def initial_heads(init: str, m: int, seed: int) -> shallow.Params:
    """θ(0) of initialisation ``init`` (:data:`INITS`) for the data seed ``seed``: c [m], U [m, d], W [m, d, d]
    drawn from seed + INIT_SEED_OFFSET (d = 8)."""
    paired, scale = INITS[_checked(init)]
    return (shallow.paired_init if paired else shallow.iid_init)(m, D, seed + INIT_SEED_OFFSET, scale=scale)


def cells(seeds, widths, n, K, T, steps, n_drift, inits, teacher) -> list[dict]:
    """Seed by seed: the training cells of each initialisation (the widest first), then the start cells."""
    if n_drift > round(0.8 * n):
        raise InputError(f"n_drift must not exceed the {round(0.8 * n)} training inputs")
    for init in inits:
        _checked(init)
    data = dict(n=n, K=K, T=T, teacher=teacher)
    out = []
    for s in seeds:
        out += [dict(kind="train", seed=s, init=i, m=m, steps=steps, n_drift=n_drift, **data)
                for i in inits for m in sorted(widths, reverse=True)]
        out += [dict(kind="start", seed=s, init=i, m=m, **data) for i in inits for m in widths]
    return out


def equivalent_cell(params: dict) -> tuple[str, dict] | None:
    """A paired training cell is the ntk target's training cell of the same seed, m and data (the same
    initial heads, the same ProjGD run and diagnostics, bit for bit)."""
    if params["kind"] != "train" or params["init"] != "paired":
        return None
    return "ntk", {k: v for k, v in params.items() if k != "init"}


def cell(kind, seed, init, m, n, K, T, teacher, steps=None, n_drift=None) -> dict:
    """One cell of ``kind`` "train" | "start" (see the module docstring)."""
    data = teacher_data(seed, n, T, K, teacher)
    theta0 = initial_heads(init, m, seed)
    if kind == "train":
        return train_diagnostics(data, theta0, steps, n_drift)
    if kind == "start":
        fw = shallow.forward(shallow.prepare(data.X_train, data.y_train), *theta0)
        return dict(initial_train_loss=fw.loss, max_abs_f0=float(np.max(np.abs(fw.f))))
    raise InputError(f"unknown init cell kind {kind!r}")


def cell_arrays(kind, seed, init, m, n, K, T, teacher, steps=None, n_drift=None) -> dict:
    """What :func:`cell` returns: a training cell holds what the ntk target's training cell holds
    (:func:`ntpref.reproduce.ntk.cell_arrays`); a start cell L(θ(0)) and max_j |f(X_j; θ(0))|, both ≥ 0."""
    if kind == "train":
        return ntk_cell_arrays("train", seed, n, K, T, teacher, m=m, steps=steps, n_drift=n_drift)
    return {"initial_train_loss": CellArray("f8", low=0.0), "max_abs_f0": CellArray("f8", low=0.0)}


def _interval(values, statistic=np.median, fmt: str = ".3g") -> str:
    """"0.0523 [0.0497, 0.0561]": statistic over the seeds and its 95% bootstrap interval (none for one seed),
    each formatted by ``fmt``."""
    interval = bootstrap_interval(values, statistic)
    text = f"{float(statistic(values)):{fmt}}"
    return text if interval is None else f"{text} [{interval[0]:{fmt}}, {interval[1]:{fmt}}]"


def _slope_text(slope, x, groups) -> str:
    """"-0.312 [-0.401, -0.220]": a slope fitted to the medians and its 95% bootstrap interval; "-" for None."""
    interval = median_slope_interval(x, groups)
    if slope is None:
        return "-"
    return f"{slope:+.3f}" + ("" if interval is None else f" [{interval[0]:+.3f}, {interval[1]:+.3f}]")


def _paired_ratios(rows, paired: dict, m) -> np.ndarray:
    """Per seed, min training loss / the paired initialisation's on the same seed and width m (the same data
    set), for the seeds that have both."""
    return np.array([a["min_train_loss"] / paired[p["seed"], m] for p, a in rows
                     if p["m"] == m and (p["seed"], m) in paired])


def _init_summary(init, rows, paired, axes, head, detail, numbers) -> tuple:
    """One initialisation's training cells: its headline row (appended to ``head``), its rows of the
    movement table (``detail``), its headline numbers and its curves in the four panels. Returns (m, per-width
    min training losses over the seeds, their means and CI half-widths) for the loss table."""
    color, marker = STYLE[init]
    m, loss = by_axis(rows, "m", "min_train_loss")
    mean, ci = stats(loss)
    med = medians(loss)
    slope = loglog_panel(axes[0], m, mean, ci, label=init, color=color, marker=marker, median=med, fit=med)
    _, drift = by_axis(rows, "m", lambda a: a["drift"][-1])
    d_mean, d_ci = stats(drift)
    d_med = medians(drift)
    d_slope = loglog_panel(axes[3], m, d_mean, d_ci, label=init, color=color, marker=marker, median=d_med, fit=d_med)
    _, heads = by_axis(rows, "m", median_head)
    _, largest = by_axis(rows, "m", lambda a: a["ratio"][-1].max())
    _, boundary = by_axis(rows, "m", boundary_fraction)
    _, lam = by_axis(rows, "m", "lambda_min_0")
    axes[2].plot(m, medians(heads), marker + "-", color=color, label=f"{init}: median head")
    axes[2].plot(m, medians(largest), marker + "--", color=color, mfc="none", label=f"{init}: largest head")
    ratios = [_paired_ratios(rows, paired, w) for w in m]
    if init != "paired" and all(len(r) for r in ratios):
        r_mean, r_ci = stats(ratios)
        ci_errorbar(axes[1], m, r_mean, r_ci, label=init, color=color, marker=marker)
    top = int(m[-1])
    cols = [init, str(len(loss[-1]))]
    for name, slope_value in (("loss_slope", slope), ("drift_slope", d_slope)):
        if slope_value is not None:
            numbers[f"{name}_{init}"] = slope_value
    cols.append(_slope_text(slope, m, loss))
    for name, values, statistic, fmt in ((f"loss_ratio_m{top}", ratios[-1], np.median, ".3g"),
                                         (f"median_head_ratio_m{top}", heads[-1], np.median, ".3g"),
                                         (f"boundary_fraction_m{top}", boundary[-1], np.mean, ".1%"),
                                         (f"lambda_min_0_m{top}", lam[-1], np.median, ".3g"),
                                         (f"drift_m{top}", drift[-1], np.median, ".3g")):
        if len(values) == 0 or (init == "paired" and name.startswith("loss_ratio")):
            cols.append("-")
            continue
        numbers[f"{name}_{init}"] = float(statistic(values))
        cols.append(_interval(values, statistic, fmt))
    cols.append(_slope_text(d_slope, m, drift))
    head.append(cols)
    for i, w in enumerate(m):
        arrs = [a for p, a in rows if p["m"] == w]
        end = np.array([a["ratio"][-1] for a in arrs])                             # [seeds, 3, m]
        binds = [int(a["first_bind"]) for a in arrs if a["first_bind"] >= 0]
        detail.append((init, int(w), len(arrs), *(f"{end[:, b].max():.3f}" for b in range(3)),
                       f"{np.median(heads[i]):.3f}", f"{np.mean(boundary[i]):.1%}",
                       f"{len(binds)} of {len(arrs)}" + (f" (first: {min(binds)})" if binds else ""),
                       f"{d_mean[i]:.3e} ± {d_ci[i]:.1e}", f"{np.median(drift[i]):.3e}"))
    return m, loss, mean, ci


def _start_table(rows) -> list[str]:
    """L(θ(0)) per initialisation and width (mean over seeds) and max |f(0)| over seeds and widths."""
    inits = [i for i in INITS if any(p["init"] == i for p, _ in rows)]
    widths = sorted({p["m"] for p, _ in rows})
    table = []
    for init in inits:
        mine = [(p, a) for p, a in rows if p["init"] == init]
        loss = {w: np.mean([a["initial_train_loss"] for p, a in mine if p["m"] == w]) for w in widths}
        f0 = max(float(a["max_abs_f0"]) for _, a in mine)
        table.append([init] + [f"{loss[w]:.4e}" for w in widths] + ["0 (exactly)" if f0 == 0.0 else f"{f0:.3g}"])
    return ["", "θ(0): training loss L(θ(0)) (mean over seeds) and max |f(X; θ(0))| over the training inputs, seeds "
                "and widths",
            tabulate(table, headers=["init"] + [f"m = {w}" for w in widths] + ["max |f(0)|"], disable_numparse=True)]


def summarize(results, outdir) -> Summary:
    """Headline table (every number with its 95% bootstrap interval over the seeds), the min training loss per
    width, L(θ(0)), the movement and drift per width; ``init.png``: (a) min training loss vs m, (b) its ratio
    to the paired initialisation's, (c) head movement at the end, (d) kernel drift at the end."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    axes = axes.ravel()
    train = [r for r in results if r[0]["kind"] == "train"]
    paired = {(p["seed"], p["m"]): a["min_train_loss"] for p, a in train if p["init"] == "paired"}
    head, detail, losses, numbers, notes, config = [], [], [], {}, [], {}
    for init in [i for i in INITS if any(p["init"] == i for p, _ in train)]:
        config, rows, note = select_config([r for r in train if r[0]["init"] == init], ("seed", "m"))
        m, loss, mean, ci = _init_summary(init, rows, paired, axes, head, detail, numbers)
        losses += [f"{init}:", axis_table(m, loss, mean, ci), ""]
        notes += [note] if note else []
    top = f"m = {max((p['m'] for p, _ in train), default='-')}"
    lines = [f"Initialisations, teacher–student ({config_text(config, ('init', 'kind'))}); ProjGD from each θ(0), "
             f"the balls centred at θ(0) with radius ρ/√m, ρ = {RHO:g}",
             "paired: f ≡ 0 at t = 0 (default); unpaired: m independent heads of the same distribution (f(0) ≠ 0); "
             "paired-x0.5 / paired-x2: the paired θ(0) with all of c, U and W multiplied by 1/2 / 2",
             f"95% percentile-bootstrap intervals over the seeds ({BOOTSTRAP_DRAWS} resamples); the last columns at "
             f"the widest width {top}; slopes: log-log fits to the medians over seeds; λ_min(K_0): the smallest "
             "eigenvalue of the NTK Gram matrix at θ(0) on the first n_drift training inputs",
             tabulate(head, headers=["init", "seeds", "slope of min loss in m", f"min loss / paired's ({top}, median)",
                                     "median-head ratio", "heads on boundary (mean)", "λ_min(K_0) (median)",
                                     "kernel drift (median)",
                                     "slope of drift in m"], disable_numparse=True),
             "", "min training loss vs m (mean ± 95% Student-t CI over seeds, median)"] + losses[:-1]
    start = [r for r in results if r[0]["kind"] == "start"]
    lines += _start_table(start) if start else []
    lines += ["", "movement ratio ‖θ_i(T) − θ_i(0)‖ / (ρ/√m) at the end (max over seeds and heads per block; median "
                  "head: median over seeds of each seed's median over heads of the largest block ratio); seeds in "
                  "which the projection acted (first: the earliest step); kernel drift ‖K_T − K_0‖_F / ‖K_0‖_F on "
                  "the first n_drift training inputs (mean ± 95% Student-t CI, median)",
              tabulate(detail, headers=["init", "m", "seeds", "max ratio c", "U", "W", "median head",
                                        "heads on boundary", "projection acted", "drift mean ± CI", "drift median"],
                       disable_numparse=True)]
    lines += notes
    axes[1].axhline(1.0, color="0.4", ls=":", lw=1)
    axes[2].axhline(1.0, color="k", ls=":", lw=1, label="radius ρ/√m")
    widths = sorted({p["m"] for p, _ in train})
    for ax in axes[1:3]:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.tick_params(axis="x", which="minor", bottom=False, labelbottom=False)
    titles = ("(a) min training loss vs m (open markers: medians)",
              "(b) min training loss / the paired initialisation's, same seed (mean ± 95% CI)",
              "(c) movement ratio at the end, max over blocks (median over seeds)",
              "(d) kernel drift at the end vs m (open markers: medians)")
    ylabels = ("min training loss (MSE)", "ratio to paired", "‖θ_i(T) − θ_i(0)‖ / (ρ/√m)", "‖K_T − K_0‖_F / ‖K_0‖_F")
    for ax, title, yl in zip(axes, titles, ylabels):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("width m (heads)")
        ax.set_ylabel(yl)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    title = (f"Initialisations: teacher–student ({config.get('teacher')} teacher), d={D}, T={config.get('T')}, "
             f"n={config.get('n')}, {config.get('steps')} ProjGD steps, ρ={RHO:g}")
    path = finish_figure(fig, title, Path(outdir) / "init.png", fontsize=10)
    return Summary("\n".join(lines), [path], numbers)
