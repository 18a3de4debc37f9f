"""Two-stage Figure 2 (spec/twostage.md §6, §7): the six panels over seeds and the geometric rate of L − L*.

One cell = one seed: a random realizable dataset (``random_realizable(K, N, seed=seed)``, lengths 2..6,
E = I, d = K) trained by Algorithm 1 (``two_stage``: zero init, η0 = 0.2/√d, η = 0.05/√d, stable
direction) for T0 stage-1 and T stage-2 updates. The cell stores the per-step metrics on a subsampled time
grid (:func:`ntpref.reproduce.common.time_grid`: about 1000 evenly and 200 log-spaced steps, always containing 0 and the last step):

  t1 [n1]                            stage-1 steps; loss0 (L0), corr_ov ρ(W_ov, W_ov*), norm_ov ‖W_ov‖_F
  t2 [n2]                            stage-2 steps; loss (L, Eq. 1), corr_kq ρ(W_kq, W_kq*), norm_kq ‖W_kq‖_F,
                                     excess L − L*, accuracy, attn_opt (attention mass on x*)
  L_star, eta0, eta                  0-d: the floor L* and the step sizes
  stop1, stop2                       0-d str: why each stage ended ("max_steps" | "zero_gradient")

Run time (2-core machine, --workers 2): quick (3 seeds) 6 s wall, full (10 seeds) 8.5 s wall.

The summary has the six-panel figure (mean and 95% CI band over seeds, with the spec's closed forms
L0(t) = log(1 + (K−1) exp(−η0 t/√(K−1))), ‖W_ov‖ = η0 t and the bound ‖W_kq‖ ≤ η t as dashed lines), the
L − L* figure on a log axis with the fitted geometric rate, and a table per seed.

Geometric rate: L − L*(t) ≈ C r^t is fitted by least squares on log(L − L*) over the window where the gap
is geometric (:func:`fit_window`). The local decay rate −Δlog(L − L*)/Δt (:func:`local_decay`, plotted next
to the fit) is not constant over stage 2: it rises while the attention starts concentrating on x*, peaks,
and then settles to a constant. The window is the tail of the run over which the local rate of the
geometric mean of the seeds' gaps stays within ``WINDOW_TOL`` of its final value; the same window is used
for every seed. Points with L − L* below the float64 resolution of L (``EXCESS_RESOLUTION`` · L*) are
left out.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from ..twostage.data import random_realizable
from ..twostage.train import two_stage
from . import Summary
from .common import band, geometric_rate, mean_row, per_seed_config, pyplot, save_figure, seed_cells, time_grid

DESCRIPTION = "two-stage Figure 2: six panels (L0, rho, norms; L, L*, rho, norms) + geometric rate of L - L*"
SIZES = {
    "quick": {"seeds": 3, "K": 20, "N": 200, "T0": 1000, "T": 10000},
    "full": {"seeds": 10, "K": 20, "N": 200, "T0": 1000, "T": 10000},
}
EXCESS_RESOLUTION = 1e4 * np.finfo(np.float64).eps   # L − L* below this · L* is rounding, not signal
LOCAL_STRETCHES = 40     # the local decay rate of L − L* is measured over this many stretches of stage 2
WINDOW_TOL = 0.1         # fit window: the tail where the local rate is within 10% of its final value
# stored name -> key of TwoStageResult.stage1 / .stage2
STAGE1 = {"loss0": "loss", "corr_ov": "corr", "norm_ov": "norm"}
STAGE2 = {"loss": "loss", "corr_kq": "corr", "norm_kq": "norm", "excess": "excess", "accuracy": "accuracy",
          "attn_opt": "attn_opt"}
cells = seed_cells   # one cell per seed 0..seeds−1 with the rest of the configuration (K, N, T0, T)


def cell(seed: int, K: int, N: int, T0: int, T: int) -> dict[str, np.ndarray]:
    """Train one random realizable dataset with Algorithm 1 and return its metrics on the time grid."""
    task = random_realizable(K=K, N=N, seed=seed)
    d = task.dataset.d
    eta0, eta = 0.2 / np.sqrt(d), 0.05 / np.sqrt(d)
    r = two_stage(task.dataset, eta0=eta0, eta=eta, T0=T0, T=T)
    t1, t2 = time_grid(T0), time_grid(T)
    out = {"t1": t1, "t2": t2, "L_star": np.float64(r.loss_floor), "eta0": np.float64(eta0),
           "eta": np.float64(eta), "stop1": np.array(r.stop1.reason), "stop2": np.array(r.stop2.reason)}
    out.update({name: r.stage1[key][t1] for name, key in STAGE1.items()})
    out.update({name: r.stage2[key][t2] for name, key in STAGE2.items()})
    return out


# ---- analysis -----------------------------------------------------------------------------------

def local_decay(t: np.ndarray, excess: np.ndarray, points: int = LOCAL_STRETCHES):
    """(start, end, rate): index pairs of ``points`` evenly spaced stretches of the grid t (only stretches
    with L − L* > 0 at both ends) and the per-step decay rate −Δlog(L − L*)/Δt over each one; the rate is
    constant (= −log r) where the gap is geometric."""
    edges = np.unique(np.searchsorted(t, np.linspace(t[0], t[-1], points + 1)))
    a, b = edges[:-1], edges[1:]
    ok = (excess[a] > 0) & (excess[b] > 0)
    a, b = a[ok], b[ok]
    return a, b, -(np.log(excess[b]) - np.log(excess[a])) / (t[b] - t[a])


def fit_window(t: np.ndarray, excess: np.ndarray, L_star: float, tol: float = WINDOW_TOL) -> np.ndarray:
    """bool mask of the geometric window: the longest tail of the run over which the local decay rate
    (:func:`local_decay`) stays within ``tol`` (relative) of its value on the last stretch, without points
    where L − L* is below the float64 resolution of L. All False when the gap does not decrease at the end."""
    resolved = excess > EXCESS_RESOLUTION * L_star
    a, b, rate = local_decay(t, np.where(resolved, excess, 0.0))
    if rate.size == 0 or not rate[-1] > 0:
        return np.zeros(t.shape, dtype=bool)
    inside = np.abs(rate / rate[-1] - 1.0) <= tol
    j0 = rate.size - int(np.argmin(inside[::-1])) if not inside.all() else 0
    return resolved & (t >= t[a[j0]]) & (t <= t[b[-1]])


def excess_fit(t: np.ndarray, excess: np.ndarray, window: np.ndarray) -> dict[str, float]:
    """Least-squares fit L − L* ≈ C r^t over the points of ``window`` (bool mask): {"rate": r, "log_C",
    "r2" (of the fit of log(L − L*)), "t_lo", "t_hi" (the window's ends)}; NaN entries when fewer than two
    points have L − L* > 0."""
    keep = window & (excess > 0)
    if keep.sum() < 2:
        return {"rate": math.nan, "log_C": math.nan, "r2": math.nan, "t_lo": math.nan, "t_hi": math.nan}
    tw, yw = t[keep].astype(np.float64), np.log(excess[keep])
    rate = geometric_rate(tw, excess[keep])
    log_C = float(np.mean(yw - tw * math.log(rate)))
    resid = yw - (log_C + tw * math.log(rate))
    total = float(np.sum((yw - yw.mean()) ** 2))
    r2 = 1.0 - float(np.sum(resid ** 2)) / total if total > 0 else 1.0
    return {"rate": rate, "log_C": log_C, "r2": r2, "t_lo": float(tw[0]), "t_hi": float(tw[-1])}


def _stack(per_seed: list, name: str) -> np.ndarray:
    return np.stack([arrays[name] for _, arrays in per_seed])


def _six_panels(plt, per_seed, config, outdir: Path) -> Path:
    a0 = per_seed[0][1]
    t1, t2 = a0["t1"], a0["t2"]
    K, eta0, eta = config["K"], float(a0["eta0"]), float(a0["eta"])
    L_star = float(np.mean([float(a["L_star"]) for _, a in per_seed]))
    n = len(per_seed)
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    panels = [
        (axes[0, 0], t1, "loss0", "$L_0(W_{ov})$", True),
        (axes[0, 1], t1, "corr_ov", r"$\rho(W_{ov}, W_{ov}^*)$", False),
        (axes[0, 2], t1, "norm_ov", r"$\|W_{ov}\|_F$", False),
        (axes[1, 0], t2, "loss", "$L(W_{ov}, W_{kq})$", True),
        (axes[1, 1], t2, "corr_kq", r"$\rho(W_{kq}, W_{kq}^*)$", False),
        (axes[1, 2], t2, "norm_kq", r"$\|W_{kq}\|_F$", False),
    ]
    for ax, t, name, title, logy in panels:
        band(ax, t, _stack(per_seed, name), f"mean over {n} seeds (95% CI)", "C0")
        ax.set_title(title)
        ax.set_xlabel("stage-1 step $t$" if t is t1 else "stage-2 step $t$")
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    closed = np.log1p((K - 1) * np.exp(-eta0 * t1 / np.sqrt(K - 1)))
    axes[0, 0].plot(t1, closed, "k--", lw=1, label=r"spec §6: $\log(1+(K-1)e^{-\eta_0 t/\sqrt{K-1}})$")
    axes[0, 2].plot(t1, eta0 * t1, "k--", lw=1, label=r"$\eta_0 t$")
    axes[1, 0].axhline(L_star, color="C3", ls="--", lw=1, label=f"floor $L^*$ = {L_star:.3g}")
    axes[1, 2].plot(t2, eta * t2, "k--", lw=1, label=r"$\eta t$ (upper bound)")
    for ax in axes.flat:
        ax.legend(fontsize=8)
    fig.suptitle(f"Two-stage normalized GD, random realizable data: K = d = {K}, N = {config['N']}, "
                 f"$\\eta_0$ = 0.2/√d, $\\eta$ = 0.05/√d (top: stage 1, bottom: stage 2)")
    fig.tight_layout()
    return save_figure(fig, outdir / "figure2.png")


def _gap_figure(plt, per_seed, mean_fit, outdir: Path) -> Path:
    t2 = per_seed[0][1]["t2"]
    excess = _stack(per_seed, "excess")
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for _, a in per_seed:
        ax.plot(t2, np.where(a["excess"] > 0, a["excess"], np.nan), color="0.6", lw=0.7)
    ax.plot([], [], color="0.6", lw=0.7, label="each seed")
    if (excess > 0).all():
        band(ax, t2, excess, f"geometric mean over {len(per_seed)} seeds (95% CI)", "C0", log=True)
    if not math.isnan(mean_fit["rate"]):
        tw = np.linspace(mean_fit["t_lo"], mean_fit["t_hi"], 50)
        ax.plot(tw, np.exp(mean_fit["log_C"] + tw * math.log(mean_fit["rate"])), "C3--", lw=2,
                label=f"fit $C r^t$, r = {mean_fit['rate']:.6f} per step")
        ax2.axhline(-math.log(mean_fit["rate"]), color="C3", ls="--", lw=1.5, label=r"fitted $-\log r$")
        for a_ in (ax, ax2):
            a_.axvspan(mean_fit["t_lo"], mean_fit["t_hi"], color="C3", alpha=0.07, lw=0)
    ax.set_yscale("log")
    ax.set_xlabel("stage-2 step $t$")
    ax.set_ylabel("$L - L^*$")
    ax.set_title("gap to the floor (log axis); shaded: fit window")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    for _, a in per_seed:
        i, j, rate = local_decay(t2, a["excess"])
        ax2.plot((t2[i] + t2[j]) / 2, rate, color="0.6", lw=0.8, marker=".", ms=3)
    ax2.plot([], [], color="0.6", lw=0.8, marker=".", ms=3, label="each seed")
    ax2.set_xlabel("stage-2 step $t$")
    ax2.set_ylabel(r"local decay rate $-\Delta \log(L - L^*) / \Delta t$")
    ax2.set_title("constant where the gap is geometric")
    ax2.set_ylim(bottom=0)
    ax2.grid(alpha=0.3)
    ax2.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, outdir / "gap.png")


def summarize(results: list, outdir) -> Summary:
    """Six-panel figure, L − L* figure with the fitted geometric rate and the per-seed table, from the cells."""
    outdir = Path(outdir)
    config, per_seed, note = per_seed_config(results)
    if len({a["t2"].size for _, a in per_seed}) != 1:
        raise InputError("figure2 summary: the cells of one configuration have different time grids")
    t2 = per_seed[0][1]["t2"]
    L_star_mean = float(np.mean([float(a["L_star"]) for _, a in per_seed]))
    gmean = np.exp(np.mean(np.log(np.maximum(_stack(per_seed, "excess"), np.finfo(float).tiny)), axis=0))
    window = fit_window(t2, gmean, L_star_mean)
    mean_fit = excess_fit(t2, gmean, window)
    fits = [excess_fit(t2, a["excess"], window) for _, a in per_seed]
    cols = {
        "rho(W_ov, W_ov*)": [float(a["corr_ov"][-1]) for _, a in per_seed],
        "rho(W_kq, W_kq*)": [float(a["corr_kq"][-1]) for _, a in per_seed],
        "L - L*": [float(a["excess"][-1]) for _, a in per_seed],
        "accuracy": [float(a["accuracy"][-1]) for _, a in per_seed],
        "attn on x*": [float(a["attn_opt"][-1]) for _, a in per_seed],
        "rate r": [f["rate"] for f in fits],
        "R^2 of fit": [f["r2"] for f in fits],
    }
    rows = [[seed] + [f"{c[i]:.6g}" for c in cols.values()] for i, (seed, _) in enumerate(per_seed)]
    rows.append(mean_row("mean ± 95% CI", cols.values()))
    stops = sorted({f"{a['stop1']}/{a['stop2']}" for _, a in per_seed})
    header = [
        f"two-stage Figure 2: K = d = {config['K']}, N = {config['N']}, T0 = {config['T0']}, T = {config['T']}, "
        f"{len(per_seed)} seeds; final values at t = T (stage 1 at T0); stops (stage 1/stage 2): {', '.join(stops)}",
        f"floor L* = {L_star_mean:.6g} (mean over seeds)",
        f"L - L* ≈ C r^t fitted on t in [{mean_fit['t_lo']:.0f}, {mean_fit['t_hi']:.0f}] "
        f"(where the local decay rate of the geometric-mean gap stays within {WINDOW_TOL:.0%} of its final value): "
        f"r = {mean_fit['rate']:.7f} per step (geometric mean of the seeds' curves), "
        f"i.e. the gap shrinks by 10x every {math.log(10) / -math.log(mean_fit['rate']):.0f} steps"
        if 0 < mean_fit["rate"] < 1 else "L - L*: no geometric decrease in the fit window",
    ]
    if note:
        header.append(f"({note})")
    table = "\n".join(header) + "\n" + tabulate(rows, headers=["seed", *cols], disable_numparse=True)
    plt = pyplot()
    figures = [_six_panels(plt, per_seed, config, outdir), _gap_figure(plt, per_seed, mean_fit, outdir)]
    numbers = {
        "seeds": float(len(per_seed)),
        "rho_kq_final": float(np.mean(cols["rho(W_kq, W_kq*)"])),
        "rho_kq_final_min": float(np.min(cols["rho(W_kq, W_kq*)"])),
        "rho_ov_final": float(np.mean(cols["rho(W_ov, W_ov*)"])),
        "excess_final": float(np.mean(cols["L - L*"])),
        "accuracy_final": float(np.mean(cols["accuracy"])),
        "attn_opt_final": float(np.mean(cols["attn on x*"])),
        "L_star": L_star_mean,
        "rate": mean_fit["rate"],
        "rate_r2": mean_fit["r2"],
        "norm_kq_over_eta_T": float(np.mean([float(a["norm_kq"][-1]) / (float(a["eta"]) * config["T"])
                                             for _, a in per_seed])) if config["T"] > 0 else math.nan,
    }
    return Summary(table, figures, numbers)
