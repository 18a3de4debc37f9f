"""Joint training against Algorithm 1 (docs/reproductions.md, "Beyond paper 1: joint training of both
layers"): W_ov and W_kq trained together from zero on Figure 2's data, beside the two stages, for the same
number of gradient evaluations.

One cell = one seed: Figure 2's data set (``random_realizable(K, N, seed)``, lengths 2..6, E = I, d = K) and
three runs of T0 + T gradient evaluations each (:mod:`.trajectory`, rules of :mod:`.updates`), all from
W_ov = W_kq = 0:

  two-stage   Algorithm 1: T0 normalized-GD steps of W_ov on L0 (η0 = 0.2/√d), then T of W_kq on L, W_ov
              frozen (η = 0.05/√d): Figure 2's run (the float64 gradient; equal to ntpref.twostage.train
              with direction="naive" up to rounding)
  joint       normalized GD on the joint parameter (W_ov, W_kq): one step of length η = 0.05/√d along the
              joint gradient of L, T0 + T times
  per-block   normalized GD per block: W_ov and W_kq each a step of length η along its own gradient of L
              (a block whose gradient is 0 stays), T0 + T times

From zero, ∇_{W_kq} L = 0 (W_ov = 0 gives every token the same logits, so the attention does not matter):
the first joint step moves W_ov alone, and W_kq moves from the second step on.

The cell stores, for each run ``R`` in :data:`ARMS`, the metrics of :data:`trajectory.METRICS` as
``R_<metric>`` [n] on the grid ``t`` (:func:`grid`: :func:`time_grid` of T0 + T plus :func:`checkpoints`),
and ``R_grad_cos``: the cosine at the last iterate between the float64 gradient the run used and the
log-scale direction of docs/twostage.md §4 (min over the blocks of its last phase; 1 = the float64 gradient
was still exact at the end), and ``cpu_seconds`` (the cell's CPU time, never summarized). L* is the floor
at the current W_ov (:mod:`.trajectory`): constant in stage 2, moving with W_ov in joint training.

At W_kq = 0 (Algorithm 1's stage 1) the attention is uniform and, with W_ov on the ray of W_ov*, the
successors of a sentence's distinct tokens have equal logits in exact arithmetic: the accuracy there (a tie
counts as wrong) is decided by rounding and says nothing.
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..sweep import CellArray
from . import Summary
from .configs import per_seed_config, seed_cells, time_grid
from .plots import band, finish_figure, pyplot
from .stats import first_lasting, interval_table, mean_interval_text
from .trajectory import Phase, gradient_agreement, problem, run, series_arrays
from .updates import Rule

DESCRIPTION = ("joint training of W_ov, W_kq from zero (normalized GD, joint and per block) vs Algorithm 1 "
               "at equal gradient evaluations: loss, L - L*, accuracy, rho to W_ov*, W_kq*")
SIZES = {
    # quick: 3 seeds, 4000 gradient evaluations per run (3 runs per cell): 3.5 s of CPU per cell (measured).
    # full: 10 seeds, Figure 2's full size (T0 + T = 31000 evaluations per run): 17 s of CPU for the cell of
    # seed 0 (measured), so about 3 CPU minutes for the 10 cells (estimate).
    "quick": {"seeds": 3, "K": 20, "N": 200, "T0": 1000, "T": 3000},
    "full": {"seeds": 10, "K": 20, "N": 200, "T0": 1000, "T": 30000},
}
ARMS = {"alg1": "two-stage (Algorithm 1)", "joint": "joint NGD", "block": "per-block NGD"}
COLORS = {"alg1": "C0", "joint": "C3", "block": "C2"}
RHO_LEVELS = (0.9, 0.99)
cells = seed_cells   # one cell per seed 0..seeds−1 with the rest of the configuration (K, N, T0, T)


def step_sizes(d: int) -> tuple[float, float]:
    """(η0, η) = (0.2/√d, 0.05/√d): Algorithm 1's step sizes (Figure 2); η is also the joint runs' step."""
    return 0.2 / math.sqrt(d), 0.05 / math.sqrt(d)


def arms(d: int, T0: int, T: int) -> dict[str, list[Phase]]:
    """The phases of the three runs (module docstring), keyed as :data:`ARMS`."""
    eta0, eta = step_sizes(d)
    return {"alg1": [Phase(T0, ("ov",), "L0", Rule("ngd", eta0)), Phase(T, ("kq",), "L", Rule("ngd", eta))],
            "joint": [Phase(T0 + T, ("ov", "kq"), "L", Rule("ngd", eta))],
            "block": [Phase(T0 + T, ("ov", "kq"), "L", Rule("ngd-block", eta))]}


def checkpoints(T0: int, T: int) -> tuple[int, int, int]:
    """The steps the table reports: the end of Algorithm 1's stage 1, a tenth of stage 2 later, the end."""
    return T0, T0 + T // 10, T0 + T


def grid(T0: int, T: int) -> np.ndarray:
    """[n] int64 steps of the stored metrics: :func:`time_grid` of T0 + T with the :func:`checkpoints`."""
    return np.union1d(time_grid(T0 + T), checkpoints(T0, T)).astype(np.int64)


def cell(seed: int, K: int, N: int, T0: int, T: int) -> dict[str, np.ndarray]:
    """The three runs of one seed's data set (module docstring), and the CPU seconds they took."""
    start = time.process_time()
    p = problem(seed, K, N)
    t = grid(T0, T)
    eta0, eta = step_sizes(K)
    out = {"t": t, "eta0": np.float64(eta0), "eta": np.float64(eta)}
    for name, phases in arms(K, T0, T).items():
        r = run(p, phases, t)
        out.update({f"{name}_{k}": v for k, v in r.series.items()})
        out[f"{name}_grad_cos"] = np.float64(gradient_agreement(p, r.W_ov, r.W_kq, phases[-1].train))
    out["cpu_seconds"] = np.float64(time.process_time() - start)
    return out


def cell_arrays(seed: int, K: int, N: int, T0: int, T: int) -> dict[str, CellArray]:
    """What :func:`cell` returns: the grid t [n], the step sizes, per arm its series [n] and its gradient
    cosine, and the CPU seconds."""
    n, positive = grid(T0, T).size, CellArray("f8", low=0.0)
    out = {"t": CellArray("i8", (n,), low=0), "eta0": positive, "eta": positive, "cpu_seconds": positive}
    for name in arms(K, T0, T):
        out.update({f"{name}_{k}": v for k, v in series_arrays(n).items()})
        out[f"{name}_grad_cos"] = CellArray("f8")
    return out


# ---- summary ------------------------------------------------------------------------------------------

def arm_view(arrays: dict, arm: str) -> dict:
    """One run's arrays of a cell under the names of :data:`trajectory.METRICS` (and "t", "grad_cos")."""
    view = {k[len(arm) + 1:]: v for k, v in arrays.items() if k.startswith(f"{arm}_")}
    return {**view, "t": arrays["t"]}


#: The table's columns: header -> function of one run's arrays and a grid index.
COLUMNS = {"rho(W_ov, W_ov*)": lambda a, i: a["corr_ov"][i], "rho(W_kq, W_kq*)": lambda a, i: a["corr_kq"][i],
           "L": lambda a, i: a["loss"][i], "L*": lambda a, i: a["floor"][i], "L - L*": lambda a, i: a["excess"][i],
           "accuracy": lambda a, i: a["accuracy"][i], "l2 margin W_kq": lambda a, i: a["l2_kq"][i],
           "l2 margin W_ov": lambda a, i: a["l2_ov"][i],
           "|W_kq|/|W_ov|": lambda a, i: a["norm_kq"][i] / a["norm_ov"][i] if a["norm_ov"][i] > 0 else math.nan}
LEVELS = {"rho_ov >= 0.99": ("corr_ov", 0.99), **{f"rho_kq >= {v}": ("corr_kq", v) for v in RHO_LEVELS},
          "accuracy = 1": ("accuracy", 1.0)}


def _figure(plt, groups: dict, config, outdir: Path) -> Path:
    t = next(iter(groups.values()))[0]["t"]
    n = len(next(iter(groups.values())))
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    late = t >= 1
    tiny = np.finfo(np.float64).tiny
    panels = [(axes[0, 0], "loss", "$L$ (Eq. 1)", "log"), (axes[0, 1], "excess", "$L - L^*(W_{ov})$", "log"),
              (axes[0, 2], "accuracy", "training accuracy", None),
              (axes[1, 0], "corr_ov", r"$\rho(W_{ov}, W_{ov}^*)$", None),
              (axes[1, 1], "corr_kq", r"$\rho(W_{kq}, W_{kq}^*)$", None),
              (axes[1, 2], "gap_kq", r"$1 - \rho(W_{kq}, W_{kq}^*)$ (log-log)", "loglog")]
    for ax, name, title, scale in panels:
        for arm, seeds in groups.items():
            key = "corr_kq" if name == "gap_kq" else name
            values = np.stack([a[key] for a in seeds])[:, late]
            if name == "gap_kq":
                values = 1.0 - values
            if scale is not None:
                values = np.maximum(values, tiny)
            band(ax, t[late], values, ARMS[arm], COLORS[arm], log=scale is not None)
        ax.axvline(config["T0"], color="0.5", ls=":", lw=1)
        ax.set_title(title)
        ax.set_xlabel("gradient evaluations $t$")
        if scale is not None:
            ax.set_yscale("log")
        if scale == "loglog":
            ax.set_xscale("log")
        ax.grid(alpha=0.3, which="both")
    axes[0, 0].legend(fontsize=8)
    title = (f"Joint training vs Algorithm 1 from zero, K = d = {config['K']}, N = {config['N']}: mean over {n} "
             "seeds, 95% CI bands (log panels: geometric mean)\ndotted: end of stage 1 (T0); joint runs: "
             "step 0.05/√d (per block: each block)")
    return finish_figure(fig, title, outdir / "joint.png")


def summarize(results: list, outdir) -> Summary:
    """The table at the :func:`checkpoints` (mean [95% bootstrap interval] over seeds), the steps at which the
    directions and the accuracy settle, paired differences to Algorithm 1, and ``joint.png``."""
    outdir = Path(outdir)
    config, per_seed, note = per_seed_config(results)
    t = per_seed[0][1]["t"]
    if any(a["t"].size != t.size for _, a in per_seed):
        raise InputError("joint summary: the cells of one configuration have different time grids")
    T0, T = int(config["T0"]), int(config["T"])
    groups = {arm: [arm_view(a, arm) for _, a in per_seed] for arm in ARMS}
    a0 = per_seed[0][1]
    lines = [f"Joint training vs Algorithm 1: K = d = {config['K']}, N = {config['N']}, every run from W_ov = W_kq = 0 "
             f"for T0 + T = {T0} + {T} = {T0 + T} gradient evaluations; {len(per_seed)} seeds; mean [95% bootstrap "
             "interval over seeds]",
             f"two-stage: Algorithm 1 (eta0 = 0.2/sqrt(d) = {float(a0['eta0']):.6g} for T0 steps of W_ov on L0, then "
             f"eta = 0.05/sqrt(d) = {float(a0['eta']):.6g} for T steps of W_kq on L); joint: normalized GD on "
             "(W_ov, W_kq), step eta; per-block: each block a step eta along its own gradient",
             "L* = L*(W_ov): Eq. 1 with all attention on x* at the current W_ov (Figure 2's floor; moves with W_ov in "
             "joint training); l2 margin: min margin(W) ‖W*‖/‖W‖ (1 only on the ray of W*)"]
    for step in checkpoints(T0, T):
        i = int(np.searchsorted(t, step))
        what = " (end of stage 1)" if step == T0 else " (end)" if step == T0 + T else ""
        lines += ["", f"at t = {step}{what}",
                  interval_table({ARMS[arm]: seeds for arm, seeds in groups.items()},
                                 {h: (lambda a, f=f, i=i: f(a, i)) for h, f in COLUMNS.items()})]
    lines += ["", "first step t from which the value stays at or above the level until the end (seeds that reach it)",
              interval_table({ARMS[arm]: seeds for arm, seeds in groups.items()},
                             {h: (lambda a, k=k, v=v: first_lasting(a["t"], a[k], v)) for h, (k, v) in LEVELS.items()})]
    lines += ["", "paired differences over seeds at the end (same data set)"]
    numbers: dict[str, float] = {"seeds": float(len(per_seed))}
    for arm in ("joint", "block"):
        for key in ("corr_ov", "corr_kq", "loss"):
            diff = [a[key][-1] - b[key][-1] for a, b in zip(groups[arm], groups["alg1"])]
            lines.append(f"{ARMS[arm]} - two-stage, {key}: {mean_interval_text(diff)}")
    worst = {arm: min(float(a["grad_cos"]) for a in seeds) for arm, seeds in groups.items()}
    lines += ["", "float64 gradient vs the log-scale direction at the last iterate, smallest cosine over seeds: " +
              ", ".join(f"{ARMS[arm]} {w:.15f}" for arm, w in worst.items())]
    if note:
        lines.append(f"({note})")
    for arm, seeds in groups.items():
        numbers.update({f"{arm}_{key}_final": float(np.mean([a[key][-1] for a in seeds]))
                        for key in ("corr_ov", "corr_kq", "loss", "excess", "accuracy", "l2_kq", "l2_ov")})
        numbers[f"{arm}_grad_cos_min"] = worst[arm]
    figure = _figure(pyplot(), groups, config, outdir)
    return Summary("\n".join(lines), [figure], numbers)
