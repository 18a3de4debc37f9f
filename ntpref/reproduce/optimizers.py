"""Optimizers in stage 2 and in joint training (docs/reproductions.md, "Beyond paper 1: optimizers"): plain
GD, normalized GD, Adam and AdamW on Figure 2's data, and where the direction of each one goes.

One cell = (seed, setting, method): Figure 2's data set (``random_realizable(K, N, seed)``, lengths 2..6,
E = I, d = K) and one run (:mod:`.trajectory`) by the rule :data:`METHODS` ``[method]`` (:mod:`.updates`):

  stage2   W_ov from Algorithm 1's stage 1 (T0 normalized-GD steps on L0 from zero, η0 = 0.2/√d), frozen;
           W_kq from zero, T updates on L
  joint    W_ov and W_kq from zero, T0 + T updates on L (both blocks by the same rule; normalized GD
           normalizes the joint gradient, as the ``joint`` target's joint run)

Hyper-parameters (the same for every seed and both settings): GD lr = 1; normalized GD η = 0.05/√d (Algorithm
1's stage-2 step); Adam lr = 10⁻³, β1 = 0.9, β2 = 0.999, ε = 10⁻⁸; AdamW the same with decoupled weight decay
λ = 0.01 (the defaults of torch.optim.Adam and torch.optim.AdamW).

The cell stores the metrics of :data:`trajectory.METRICS` [n] on the grid ``t`` (:func:`ntpref.reproduce.joint.grid`
of the run's length, with its checkpoints), W_ov, W_kq [d, d] at the end and at half the run (``W_ov_half``,
``W_kq_half``, for the drift of the direction over the second half), ``grad_cos`` (the float64 gradient
against the log-scale direction at the last iterate, :func:`trajectory.gradient_agreement`), and the
references ``star_linf_kq`` (the normalized ℓ∞ margin of W_kq* itself) and ``star_sign_ov`` (ρ(W_ov*, S_ov)),
and ``cpu_seconds`` (the cell's CPU time, never summarized).

Where a direction does not go to W_kq*, its normalized margins say which geometry it favours: the ℓ2 one
(γ₂/γ₂* = 1 only on the ray of W_kq*) or the ℓ∞ one (γ∞/γ∞* = 1 for any ℓ∞ max-margin solution); for W_ov the
ℓ∞ max-margin solution S_ov is unique and ρ(W_ov, S_ov) is reported too (:mod:`.trajectory`).
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from ..errors import InputError
from ..sweep import CellArray
from ..twostage import rho
from . import Summary
from .configs import select_config
from .joint import grid, step_sizes
from .plots import band, finish_figure, pyplot
from .stats import first_lasting, interval_table, mean_interval_text
from .trajectory import Phase, gradient_agreement, problem, run, series_arrays
from .updates import Rule

DESCRIPTION = ("GD, normalized GD, Adam, AdamW in stage 2 and in joint training from zero: rho to W_kq* (W_ov*), "
               "loss, accuracy, l2 vs l-inf normalized margins of the final directions")
SIZES = {
    # quick: 3 seeds, T0 = 1000, T = 3000 (stage 2: 3000 updates; joint: 4000): 0.85-1.25 s of CPU per cell
    # (measured), about 30 s for the 24 cells.
    # full: 10 seeds, Figure 2's full size (T = 30000 stage-2 updates, 31000 joint ones): 5.4 s of CPU for a
    # stage-2 Adam cell and 6.3 s for a joint normalized-GD cell (measured, seed 0), so about 8 CPU minutes
    # for the 80 cells (estimate).
    "quick": {"seeds": 3, "K": 20, "N": 200, "T0": 1000, "T": 3000},
    "full": {"seeds": 10, "K": 20, "N": 200, "T0": 1000, "T": 30000},
}
SETTINGS = {"stage2": "stage 2 (W_ov from stage 1, frozen)", "joint": "joint (W_ov, W_kq from zero)"}
METHOD_NAMES = {"gd": "GD", "ngd": "normalized GD", "adam": "Adam", "adamw": "AdamW"}
COLORS = {"gd": "C7", "ngd": "C0", "adam": "C3", "adamw": "C1"}


def methods(d: int) -> dict[str, Rule]:
    """The update rule of each method (module docstring); d sets normalized GD's η = 0.05/√d."""
    return {"gd": Rule("gd", 1.0), "ngd": Rule("ngd", step_sizes(d)[1]), "adam": Rule("adam", 1e-3),
            "adamw": Rule("adamw", 1e-3, weight_decay=0.01)}


def cells(seeds, K, N, T0, T) -> list[dict]:
    """One cell per (seed, setting, method), seed by seed."""
    return [dict(seed=s, setting=g, method=m, K=K, N=N, T0=T0, T=T)
            for s in range(int(seeds)) for g in SETTINGS for m in METHOD_NAMES]


def cell(seed: int, setting: str, method: str, K: int, N: int, T0: int, T: int) -> dict[str, np.ndarray]:
    """One run (module docstring), and the CPU seconds it took."""
    start = time.process_time()
    if setting not in SETTINGS or method not in METHOD_NAMES:
        raise InputError(f"optimizers: unknown setting {setting!r} or method {method!r}")
    p = problem(seed, K, N)
    rule = methods(K)[method]
    W_ov = None
    if setting == "stage2":
        W_ov = run(p, [Phase(T0, ("ov",), "L0", Rule("ngd", step_sizes(K)[0]))]).W_ov
        phase, t = Phase(T, ("kq",), "L", rule), grid(0, T)
    else:
        phase, t = Phase(T0 + T, ("ov", "kq"), "L", rule), grid(T0, T)
    half = phase.steps // 2
    r = run(p, [phase], t, W_ov=W_ov, snapshots=(half,))
    out = {"t": t, "W_ov": r.W_ov, "W_kq": r.W_kq, "W_ov_half": r.snapshots[half][0],
           "W_kq_half": r.snapshots[half][1],
           "grad_cos": np.float64(gradient_agreement(p, r.W_ov, r.W_kq, phase.train)),
           "star_linf_kq": np.float64(p.kq.ratios(p.W_kq_star)[1]),
           "star_sign_ov": np.float64(rho(p.W_ov_star, p.S_ov))}
    out.update(r.series)
    out["cpu_seconds"] = np.float64(time.process_time() - start)
    return out


def cell_arrays(seed: int, setting: str, method: str, K: int, N: int, T0: int, T: int) -> dict[str, CellArray]:
    """What :func:`cell` returns: the grid t [n], the final and half-way W_ov, W_kq [K, K], the gradient cosine,
    the two reference margins, the run's series [n] and the CPU seconds."""
    n = (grid(0, T) if setting == "stage2" else grid(T0, T)).size
    matrix, scalar = CellArray("f8", (K, K)), CellArray("f8")
    return {"t": CellArray("i8", (n,), low=0), "W_ov": matrix, "W_kq": matrix, "W_ov_half": matrix,
            "W_kq_half": matrix, "grad_cos": scalar, "star_linf_kq": scalar, "star_sign_ov": scalar,
            **series_arrays(n), "cpu_seconds": CellArray("f8", low=0.0)}


# ---- summary ------------------------------------------------------------------------------------------

def _drift(a: dict, block: str) -> float:
    """1 − ρ(W(half), W(end)) of the block: how much its direction still turned over the second half."""
    return 1.0 - rho(a[f"W_{block}_half"], a[f"W_{block}"])


END = {"rho(W_kq, W_kq*)": lambda a: a["corr_kq"][-1], "l2 margin W_kq": lambda a: a["l2_kq"][-1],
       "linf margin W_kq": lambda a: a["linf_kq"][-1], "1-rho(W_kq half, end)": lambda a: _drift(a, "kq"),
       "L": lambda a: a["loss"][-1], "L - L*": lambda a: a["excess"][-1], "accuracy": lambda a: a["accuracy"][-1],
       "rho_kq >= 0.9 from t": lambda a: first_lasting(a["t"], a["corr_kq"], 0.9)}
END_OV = {"rho(W_ov, W_ov*)": lambda a: a["corr_ov"][-1], "rho(W_ov, S_ov)": lambda a: a["sign_ov"][-1],
          "l2 margin W_ov": lambda a: a["l2_ov"][-1], "linf margin W_ov": lambda a: a["linf_ov"][-1],
          "1-rho(W_ov half, end)": lambda a: _drift(a, "ov")}


def _figure(plt, groups: dict, config, outdir: Path) -> Path:
    fig, axes = plt.subplots(2, 4, figsize=(19, 8.5))
    tiny = np.finfo(np.float64).tiny
    for row, setting in enumerate(SETTINGS):
        second = "margins" if setting == "stage2" else "corr_ov"
        panels = [("corr_kq", r"$\rho(W_{kq}, W_{kq}^*)$", False), (second, None, False),
                  ("excess" if setting == "stage2" else "loss", None, True), ("accuracy", "training accuracy", False)]
        for col, (key, title, log) in enumerate(panels):
            ax = axes[row, col]
            for method, seeds in groups[setting].items():
                t = seeds[0]["t"]
                late = t >= 1
                ls, color = ("--" if method == "adamw" else "-"), COLORS[method]
                if key in ("margins", "corr_ov"):     # two measures per method: mean lines, no bands
                    first, other = ("l2_kq", "linf_kq") if key == "margins" else ("corr_ov", "sign_ov")
                    ax.plot(t[late], np.mean([a[first][late] for a in seeds], axis=0), color=color, lw=1.4, ls=ls,
                            label=METHOD_NAMES[method])
                    ax.plot(t[late], np.mean([a[other][late] for a in seeds], axis=0), color=color, lw=1.4,
                            ls=ls, alpha=0.45)
                    continue
                values = np.stack([a[key] for a in seeds])[:, late]
                band(ax, t[late], np.maximum(values, tiny) if log else values, METHOD_NAMES[method], color,
                     log=log, ls=ls)
            if key == "margins":
                title = r"$W_{kq}$ margin / optimum: $\ell_2$ (dark), $\ell_\infty$ (light); means"
                ax.set_ylim(-0.5, 1.02)
            elif key == "corr_ov":
                title = r"$\rho(W_{ov}, W_{ov}^*)$ (dark), $\rho(W_{ov}, S_{ov})$ (light); means"
            elif title is None:
                title = "$L - L^*$" if key == "excess" else "$L$ (Eq. 1)"
            if log:
                ax.set_yscale("log")
            ax.set_title(f"{SETTINGS[setting]}:\n{title}", fontsize=9)
            ax.set_xlabel("stage-2 step $t$" if setting == "stage2" else "gradient evaluations $t$")
            ax.grid(alpha=0.3, which="both")
        axes[row, 0].legend(fontsize=8)
    n = min(len(s) for g in groups.values() for s in g.values())
    title = (f"Optimizers on Figure 2's data, K = d = {config['K']}, N = {config['N']}: mean over {n} seeds, 95% "
             "CI bands (log panels: geometric mean)\nGD lr 1, normalized GD 0.05/√d, Adam lr 1e-3, AdamW (dashed) "
             "lr 1e-3 with weight decay 0.01")
    return finish_figure(fig, title, outdir / "optimizers.png")


def summarize(results: list, outdir) -> Summary:
    """Per setting: the methods' values at the end (mean [95% bootstrap interval] over seeds), paired
    differences of Adam, AdamW and GD to normalized GD (over the seeds both have), and ``optimizers.png``."""
    outdir = Path(outdir)
    config, rows, note = select_config(results, ("seed", "setting", "method"))
    found: dict = {}
    for params, arrays in rows:
        found.setdefault(params["setting"], {}).setdefault(params["method"], {})[params["seed"]] = arrays
    by_seed = {g: {m: found[g][m] for m in METHOD_NAMES if m in found[g]} for g in SETTINGS if g in found}
    groups = {g: {m: list(per.values()) for m, per in methods_.items()} for g, methods_ in by_seed.items()}
    seeds = sorted({params["seed"] for params, _ in rows})
    counts = sorted({len(per) for methods_ in by_seed.values() for per in methods_.values()})
    lines = [f"Optimizers on Figure 2's data: K = d = {config['K']}, N = {config['N']}, T0 = {config['T0']}, "
             f"T = {config['T']}; seeds {', '.join(map(str, seeds))}"
             + ("" if len(counts) == 1 else " (not every method has every seed)")
             + "; values at the end of each run, mean [95% bootstrap interval over seeds]",
             "rules: " + "; ".join(f"{METHOD_NAMES[m]} {r.describe()}" for m, r in methods(int(config["K"])).items()),
             "l2 margin: min margin(W) ‖W*‖_F/‖W‖_F (1 only on the ray of W*); linf margin: min margin(W) t*/max|W| "
             "(1 for every l-inf max-margin solution); S_ov: the unique l-inf max-margin W_ov; 1-rho(W half, end): "
             "how much the direction still turned over the second half of the run"]
    numbers: dict[str, float] = {"seeds": float(len(seeds))}
    for setting, per_method in by_seed.items():
        any_seeds = groups[setting][next(iter(per_method))]
        labelled = {f"{METHOD_NAMES[m]}" + ("" if len(counts) == 1 else f" ({len(per)} seeds)"): list(per.values())
                    for m, per in per_method.items()}
        lines += ["", f"{SETTINGS[setting]}: {int(any_seeds[0]['t'][-1])} updates", interval_table(labelled, END)]
        if setting == "joint":
            lines.append(interval_table(labelled, END_OV))
        star = mean_interval_text([float(a["star_linf_kq"]) for a in any_seeds])
        lines.append(f"reference, W_kq* itself: linf margin {star}"
                     + (f"; W_ov*: rho(W_ov*, S_ov) = {float(any_seeds[0]['star_sign_ov']):.6g}"
                        if setting == "joint" else ""))
        for method in ("adam", "adamw", "gd"):
            if method not in per_method or "ngd" not in per_method:
                continue
            common = sorted(set(per_method[method]) & set(per_method["ngd"]))
            for key in ("corr_kq", "l2_kq", "linf_kq"):
                diff = [per_method[method][s_][key][-1] - per_method["ngd"][s_][key][-1] for s_ in common]
                lines.append(f"{METHOD_NAMES[method]} - normalized GD, {key} at the end: {mean_interval_text(diff)}")
        worst = {m: min(float(a["grad_cos"]) for a in per.values()) for m, per in per_method.items()}
        lines.append("float64 gradient vs the log-scale direction at the last iterate, smallest cosine: " +
                     ", ".join(f"{METHOD_NAMES[m]} {w:.12f}" for m, w in worst.items()))
        keys = ("corr_kq", "l2_kq", "linf_kq", "loss", "accuracy") + (("corr_ov", "sign_ov") if setting == "joint" else ())
        for method, per in per_method.items():
            numbers.update({f"{setting}_{method}_{k}": float(np.mean([a[k][-1] for a in per.values()])) for k in keys})
    if note:
        lines.append(f"({note})")
    figure = _figure(pyplot(), groups, config, outdir)
    return Summary("\n".join(lines), [figure], numbers)
