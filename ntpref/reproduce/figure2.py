"""Two-stage Figure 2 (docs/twostage.md §6, §7): the six panels over seeds, the direction of W_kq on log–log
axes and the geometric rate of L − L* against the predicted rate.

One cell = one seed: a random realizable dataset (``random_realizable(K, N, seed=seed)``, lengths 2..6,
E = I, d = K) trained by Algorithm 1 (``ntpref.twostage.train``: zero init, η0 = 0.2/√d, η = 0.05/√d, stable
direction) for T0 stage-1 and T stage-2 updates, plus stage 1 once more from a random W_ov (the
*random-init variant*, below). The cell stores the per-step metrics on a subsampled time grid
(:func:`ntpref.reproduce.configs.time_grid`: about 1000 evenly and 200 log-spaced steps, always containing 0
and the last step):

  t1 [n1]                            stage-1 steps; loss0 (L0), corr_ov ρ(W_ov, W_ov*), norm_ov ‖W_ov‖_F
  loss0_rand, corr_ov_rand, norm_ov_rand [n1]   the same for the random-init variant
  t2 [n2]                            stage-2 steps; loss (L, Eq. 1), corr_kq ρ(W_kq, W_kq*), norm_kq ‖W_kq‖_F,
                                     excess L − L*, accuracy, attn_opt (attention mass on x*)
  L_star, eta0, eta, sigma_rand      0-d: the floor L*, the step sizes, the random-init scale σ
  norm_kq_star, margin_kq_star       0-d: ‖W_kq*‖_F and the smallest margin γ of W_kq* (1 by its definition)
  stop1, stop2                       0-d str: why each stage ended ("max_steps" | "zero_gradient")

Stage 1 from zero init (E = I, C = V, uniform weights) lies on the ray of W_ov* from the first step: ρ ≡ 1
and L0, ‖W_ov‖ follow closed forms, so its direction panel cannot show convergence. The random-init variant
starts stage 1 from W_ov0 with i.i.d. N(0, σ²) entries, σ = 1/√d (``RANDOM_INIT_SCALE``), drawn from
``default_rng(RANDOM_INIT_SEED_OFFSET + seed)``; its ρ(W_ov, W_ov*) rises from about 0 to near 1 within T0
steps. Stage 2 is run from the zero-init stage 1 only (Algorithm 1).

Direction of W_kq: 1 − ρ(W_kq, W_kq*) ≈ C t^p is fitted on log–log axes over the last decade of stage 2,
t in [T/10, T] (:func:`power_fit`); the local exponent Δlog(1 − ρ)/Δlog t is plotted next to it (the
direction converges sub-linearly and the local exponent is still steepening at T).

Geometric rate: L − L*(t) ≈ C r^t is fitted by least squares on log(L − L*) over the window where the gap
is geometric (:func:`fit_window`). The local decay rate −Δlog(L − L*)/Δt (:func:`local_decay`, plotted next
to the fit) is not constant over stage 2: it rises while the attention starts concentrating on x*, peaks,
and then settles to a constant. The window is the tail of the run over which the local rate of the
geometric mean of the seeds' gaps stays within ``WINDOW_TOL`` of its final value; the same window is used
for every seed. Points with L − L* below the float64 resolution of L (``EXCESS_RESOLUTION`` · L*) are
left out. The predicted rate (:func:`predicted_decay`, docs/twostage.md §6) is −log r = γ η/‖W_kq*‖_F: late
in stage 2, L − L* ≈ A (1 − attention on x*) with a constant A, the attention gap is a sum of exp(−margin)
terms, and each normalized step adds η γ/‖W_kq*‖ to the smallest margins once the step direction is that of
W_kq*. The table compares it with the fitted rate and with the local rate over the last stretch of the run.

The three figures are drawn once, as the README's first command (a quick run of this target) should: their
subplot parameters are fixed (``FIGURE2_MARGINS``, ``PAIR_MARGINS``), where ``tight_layout`` leaves a layout
engine on the figure with which saving it draws it twice, and they are saved as laid out, not cropped
(``crop=False`` of :func:`ntpref.reproduce.plots.save_figure`), where cropping would draw them once more.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from tabulate import tabulate

from ..errors import InputError
from ..precompile import TWOSTAGE_TRAINING
from ..sweep import CellArray
from ..twostage import random_realizable, train
from . import Summary
from .configs import per_seed_config, seed_cells, time_grid
from .plots import band, finish_figure, pyplot, save_figure
from .stats import geometric_rate, loglog_slope, mean_row

#: Subplot parameters (``Figure.subplots_adjust``) of figure2.png and of the two-panel gap.png and
#: direction.png: what ``tight_layout`` gives them for the quick and the full run, the left margin and the
#: spacing between panels widened a little for wider tick labels.
FIGURE2_MARGINS = dict(left=0.045, right=0.984, bottom=0.078, top=0.872, wspace=0.16, hspace=0.33)
PAIR_MARGINS = dict(left=0.07, right=0.988, bottom=0.127, top=0.924, wspace=0.18)

DESCRIPTION = ("two-stage Figure 2: six panels (L0, rho, norms; L, L*, rho, norms), 1 - rho on log-log axes, "
               "geometric rate of L - L* vs the predicted rate")
SIZES = {
    "quick": {"seeds": 3, "K": 20, "N": 200, "T0": 1000, "T": 10000},
    "full": {"seeds": 10, "K": 20, "N": 200, "T0": 1000, "T": 30000},
}
EXCESS_RESOLUTION = 1e4 * np.finfo(np.float64).eps   # L − L* below this · L* is rounding, not signal
LOCAL_STRETCHES = 40     # the local decay rate of L − L* is measured over this many stretches of stage 2
WINDOW_TOL = 0.1         # fit window: the tail where the local rate is within 10% of its final value
RANDOM_INIT_SCALE = 1.0  # σ·√d: the random-init variant draws W_ov0 entries from N(0, σ²), σ = 1/√d
RANDOM_INIT_SEED_OFFSET = 2_000_000   # its W_ov0 comes from default_rng(offset + seed), not the data's stream
POWER_FIT_POINTS = 50    # 1 − ρ is fitted at this many log-spaced steps of [T/10, T]
# stored name -> key of TwoStageResult.stage1 / .stage2
STAGE1 = {"loss0": "loss", "corr_ov": "corr", "norm_ov": "norm"}
STAGE2 = {"loss": "loss", "corr_kq": "corr", "norm_kq": "norm", "excess": "excess", "accuracy": "accuracy",
          "attn_opt": "attn_opt"}
PRECOMPILE = TWOSTAGE_TRAINING    # a cell's kernels (ntpref.precompile)
cells = seed_cells   # one cell per seed 0..seeds−1 with the rest of the configuration (K, N, T0, T)


def random_init_W_ov(d: int, seed: int) -> np.ndarray:
    """[d, d] W_ov0 of the random-init variant: i.i.d. N(0, 1/d) entries from default_rng(RANDOM_INIT_SEED_OFFSET
    + seed)."""
    sigma = RANDOM_INIT_SCALE / math.sqrt(d)
    return sigma * np.random.default_rng(RANDOM_INIT_SEED_OFFSET + seed).standard_normal((d, d))


def cell(seed: int, K: int, N: int, T0: int, T: int) -> dict[str, np.ndarray]:
    """Train one random realizable dataset with Algorithm 1, run stage 1 again from a random W_ov, and return
    the metrics on the time grid."""
    task = random_realizable(K=K, N=N, seed=seed)
    d = task.dataset.d
    eta0, eta = 0.2 / np.sqrt(d), 0.05 / np.sqrt(d)
    r = train(task.dataset, eta0=eta0, eta=eta, T0=T0, T=T)
    rand = train(task.dataset, eta0=eta0, eta=eta, T0=T0, T=0, W_ov0=random_init_W_ov(d, seed))
    t1, t2 = time_grid(T0), time_grid(T)
    out = {"t1": t1, "t2": t2, "L_star": np.float64(r.loss_floor), "eta0": np.float64(eta0),
           "eta": np.float64(eta), "sigma_rand": np.float64(RANDOM_INIT_SCALE / math.sqrt(d)),
           "norm_kq_star": np.float64(np.linalg.norm(r.W_kq_star)),
           "margin_kq_star": np.float64(r.certificates["W_kq_star"].min_margin),
           "stop1": np.array(r.stop1.reason), "stop2": np.array(r.stop2.reason)}
    out.update({name: r.stage1[key][t1] for name, key in STAGE1.items()})
    out.update({f"{name}_rand": rand.stage1[key][t1] for name, key in STAGE1.items()})
    out.update({name: r.stage2[key][t2] for name, key in STAGE2.items()})
    return out


#: Bounds of the stored metrics (low, high); the others (correlations, L − L*) have none a check could use.
BOUNDS = {"loss0": (0.0, np.inf), "norm_ov": (0.0, np.inf), "loss": (0.0, np.inf), "norm_kq": (0.0, np.inf),
          "accuracy": (0.0, 1.0)}


def cell_arrays(seed: int, K: int, N: int, T0: int, T: int) -> dict[str, CellArray]:
    """What :func:`cell` returns (the module docstring): n1 = len(time_grid(T0)), n2 = len(time_grid(T))."""
    n1, n2 = time_grid(T0).size, time_grid(T).size
    positive = CellArray("f8", low=0.0)
    out = {"t1": CellArray("i8", (n1,), low=0), "t2": CellArray("i8", (n2,), low=0), "L_star": positive,
           "eta0": positive, "eta": positive, "sigma_rand": positive, "norm_kq_star": positive,
           "margin_kq_star": CellArray("f8"), "stop1": CellArray("U"), "stop2": CellArray("U")}
    for names, n in ((STAGE1, n1), ({f"{k}_rand": v for k, v in STAGE1.items()}, n1), (STAGE2, n2)):
        out.update({name: CellArray("f8", (n,), *BOUNDS.get(name.removesuffix("_rand"), ())) for name in names})
    return out


# ---- analysis -----------------------------------------------------------------------------------

def predicted_decay(eta: float, norm_star: float, margin: float = 1.0) -> float:
    """The predicted asymptotic decay rate −log r of L − L* ≈ C r^t in stage 2 (docs/twostage.md §6):
    γ η/‖W_kq*‖_F, with γ = ``margin`` the smallest margin of W_kq* (1 by its definition) and ``norm_star``
    = ‖W_kq*‖_F."""
    return margin * eta / norm_star


def stage1_closed_forms(t1: np.ndarray, K: int, eta0: float) -> tuple[np.ndarray, np.ndarray]:
    """(L0(t), ‖W_ov‖(t)) of stage 1 from zero init with E = I, C = V, uniform weights (docs/twostage.md §6):
    log(1 + (K−1) exp(−η0 t/√(K−1))) and η0 t, on the steps ``t1``."""
    return np.log1p((K - 1) * np.exp(-eta0 * t1 / np.sqrt(K - 1))), eta0 * t1


def local_decay(t: np.ndarray, excess: np.ndarray, points: int = LOCAL_STRETCHES):
    """(start, end, rate): index pairs of ``points`` evenly spaced stretches of the grid t (only stretches
    with L − L* > 0 at both ends) and the per-step decay rate −Δlog(L − L*)/Δt over each one; the rate is
    constant (= −log r) where the gap is geometric. With t = log(steps) the rate is minus the local exponent
    of a power law."""
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


def end_decay(t: np.ndarray, excess: np.ndarray, L_star: float) -> float:
    """The local decay rate −Δlog(L − L*)/Δt over the last of the :func:`local_decay` stretches whose ends are
    resolved in float64 (NaN when there is none)."""
    resolved = excess > EXCESS_RESOLUTION * L_star
    _, _, rate = local_decay(t, np.where(resolved, excess, 0.0))
    return float(rate[-1]) if rate.size else math.nan


def power_fit(t: np.ndarray, y: np.ndarray, t_lo: float, t_hi: float, points: int = POWER_FIT_POINTS) -> dict:
    """Least-squares fit y ≈ C t^p on log–log axes at ``points`` log-spaced steps of [t_lo, t_hi] (log y
    interpolated linearly in log t between the grid points t ≥ 1, so the many evenly spaced late steps of
    the grid do not outweigh the early ones): {"exponent": p, "log_C", "t_lo", "t_hi"}. y must be positive on
    the grid points inside [t_lo, t_hi] and around them."""
    inside = (t >= 1) & (y > 0)
    tt, ly = np.log(t[inside].astype(np.float64)), np.log(y[inside])
    ts = np.geomspace(t_lo, t_hi, points)
    if ts[0] < math.exp(tt[0]) or ts[-1] > math.exp(tt[-1]):
        raise InputError(f"power_fit: [{t_lo}, {t_hi}] is not inside the positive part of the curve")
    p, log_C = loglog_slope(ts, np.exp(np.interp(np.log(ts), tt, ly)))
    return {"exponent": p, "log_C": log_C, "t_lo": float(t_lo), "t_hi": float(t_hi)}


def corr_gap(per_seed) -> np.ndarray:
    """[seeds, n2] 1 − ρ(W_kq, W_kq*) of every seed, floored at the smallest positive float64 (ρ rounds to 1 on
    the ray of W_kq*) so that its logarithm is finite."""
    return np.maximum(1.0 - _stack(per_seed, "corr_kq"), np.finfo(np.float64).tiny)


def _stack(per_seed: list, name: str) -> np.ndarray:
    return np.stack([arrays[name] for _, arrays in per_seed])


def _six_panels(plt, per_seed, config, outdir: Path) -> Path:
    a0 = per_seed[0][1]
    t1, t2 = a0["t1"], a0["t2"]
    K, eta0 = config["K"], float(a0["eta0"])
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
        zero_init = " from zero init" if t is t1 else ""
        band(ax, t, _stack(per_seed, name), f"mean over {n} seeds{zero_init} (95% CI)", "C0")
        if t is t1:
            band(ax, t, _stack(per_seed, f"{name}_rand"), r"random init $W_{ov}$ ~ N(0, 1/d)", "C1")
        ax.set_title(title)
        ax.set_xlabel("stage-1 step $t$" if t is t1 else "stage-2 step $t$")
        if logy:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    closed_L0, closed_norm = stage1_closed_forms(t1, K, eta0)
    axes[0, 0].plot(t1, closed_L0, "k--", lw=1, label=r"closed form $\log(1+(K-1)e^{-\eta_0 t/\sqrt{K-1}})$")
    axes[0, 2].plot(t1, closed_norm, "k--", lw=1, label=r"$\eta_0 t$")
    axes[1, 0].axhline(L_star, color="C3", ls="--", lw=1, label=f"floor $L^*$ = {L_star:.3g}")
    axes[1, 2].plot(t2, float(a0["eta"]) * t2, "k--", lw=1, label=r"$\eta t$ (upper bound)")
    for ax in axes.flat:
        ax.legend(fontsize=8)
    title = (f"Two-stage normalized GD, random realizable data: K = d = {K}, N = {config['N']}, "
             f"$\\eta_0$ = 0.2/√d, $\\eta$ = 0.05/√d\n(top: stage 1, bottom: stage 2 from the zero-init stage 1)")
    return finish_figure(fig, title, outdir / "figure2.png", margins=FIGURE2_MARGINS, crop=False)


def _gap_figure(plt, per_seed, mean_fit, predicted: float, outdir: Path) -> Path:
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
        ax.plot(tw, np.exp(mean_fit["log_C"] + mean_fit["t_hi"] * math.log(mean_fit["rate"])
                           - predicted * (tw - mean_fit["t_hi"])), "k:", lw=1.5,
                label=r"predicted slope $\gamma\eta/\|W_{kq}^*\|$ (through the fit's end)")
        ax2.axhline(-math.log(mean_fit["rate"]), color="C3", ls="--", lw=1.5, label=r"fitted $-\log r$")
        for a_ in (ax, ax2):
            a_.axvspan(mean_fit["t_lo"], mean_fit["t_hi"], color="C3", alpha=0.07, lw=0)
    ax2.axhline(predicted, color="k", ls=":", lw=1.5, label=r"predicted $\gamma\eta/\|W_{kq}^*\|_F$ (mean over seeds)")
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
    fig.subplots_adjust(**PAIR_MARGINS)
    return save_figure(fig, outdir / "gap.png", crop=False)


def _direction_figure(plt, per_seed, mean_power, outdir: Path) -> Path:
    t2 = per_seed[0][1]["t2"]
    gap = corr_gap(per_seed)
    late = t2 >= 1
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    for g in gap:
        ax.plot(t2[late], g[late], color="0.6", lw=0.7)
        i, j, rate = local_decay(np.log(t2[late].astype(np.float64)), g[late])
        ax2.plot(np.sqrt(t2[late][i] * t2[late][j]), -rate, color="0.6", lw=0.8, marker=".", ms=3)
    ax.plot([], [], color="0.6", lw=0.7, label="each seed")
    ax2.plot([], [], color="0.6", lw=0.8, marker=".", ms=3, label="each seed")
    band(ax, t2[late], gap[:, late], f"geometric mean over {len(per_seed)} seeds (95% CI)", "C0", log=True)
    tw = np.geomspace(mean_power["t_lo"], mean_power["t_hi"], 50)
    ax.plot(tw, np.exp(mean_power["log_C"]) * tw ** mean_power["exponent"], "C3--", lw=2,
            label=f"fit $C t^p$ on [T/10, T]: p = {mean_power['exponent']:.3f}")
    ax2.axhline(mean_power["exponent"], color="C3", ls="--", lw=1.5, label="fitted exponent p")
    for a_ in (ax, ax2):
        a_.set_xscale("log")
        a_.set_xlabel("stage-2 step $t$")
        a_.grid(alpha=0.3, which="both")
    ax.set_yscale("log")
    ax.set_ylabel(r"$1 - \rho(W_{kq}, W_{kq}^*)$")
    ax.set_title("direction of $W_{kq}$: sub-linear convergence (log–log)")
    ax2.set_ylabel(r"local exponent $\Delta \log(1 - \rho) / \Delta \log t$")
    ax2.set_title("still steepening at $t = T$")
    ax.legend(fontsize=8)
    ax2.legend(fontsize=8)
    fig.subplots_adjust(**PAIR_MARGINS)
    return save_figure(fig, outdir / "direction.png", crop=False)


def summarize(results: list, outdir) -> Summary:
    """Six-panel figure, direction and L − L* figures with their fits, and the per-seed table, from the cells."""
    outdir = Path(outdir)
    config, per_seed, note = per_seed_config(results)
    if len({a["t2"].size for _, a in per_seed}) != 1:
        raise InputError("figure2 summary: the cells of one configuration have different time grids")
    a0 = per_seed[0][1]
    t1, t2, T = a0["t1"], a0["t2"], int(config["T"])
    L_star_mean = float(np.mean([float(a["L_star"]) for _, a in per_seed]))
    gmean = np.exp(np.mean(np.log(np.maximum(_stack(per_seed, "excess"), np.finfo(float).tiny)), axis=0))
    window = fit_window(t2, gmean, L_star_mean)
    mean_fit = excess_fit(t2, gmean, window)
    fits = [excess_fit(t2, a["excess"], window) for _, a in per_seed]
    predicted = [predicted_decay(float(a["eta"]), float(a["norm_kq_star"]), float(a["margin_kq_star"]))
                 for _, a in per_seed]
    fitted = [-math.log(f["rate"]) for f in fits]
    at_end = [end_decay(t2, a["excess"], float(a["L_star"])) for _, a in per_seed]
    gap = corr_gap(per_seed)
    powers = [power_fit(t2, g, T / 10, T) for g in gap] if T >= 10 else []
    mean_power = power_fit(t2, np.exp(np.mean(np.log(gap), axis=0)), T / 10, T) if powers else None
    closed_L0, closed_norm = stage1_closed_forms(t1.astype(np.float64), config["K"], float(a0["eta0"]))
    cols = {
        "rho(W_kq, W_kq*)": [float(a["corr_kq"][-1]) for _, a in per_seed],
        "1-rho exponent": [p["exponent"] for p in powers] if powers else [math.nan] * len(per_seed),
        "L - L*": [float(a["excess"][-1]) for _, a in per_seed],
        "accuracy": [float(a["accuracy"][-1]) for _, a in per_seed],
        "attn on x*": [float(a["attn_opt"][-1]) for _, a in per_seed],
        "-ln r fit": fitted,
        "-ln r at end": at_end,
        "predicted": predicted,
        "fit/pred": [f / p for f, p in zip(fitted, predicted)],
        "end/pred": [e / p for e, p in zip(at_end, predicted)],
        "rho_ov rand init": [float(a["corr_ov_rand"][-1]) for _, a in per_seed],
    }
    rows = [[seed] + [f"{c[i]:.6g}" for c in cols.values()] for i, (seed, _) in enumerate(per_seed)]
    rows.append(mean_row("mean ± 95% CI", cols.values()))
    stops = sorted({f"{a['stop1']}/{a['stop2']}" for _, a in per_seed})
    rho0_rand = [float(a["corr_ov_rand"][0]) for _, a in per_seed]
    rising = sum(bool(np.all(np.diff(a["corr_ov_rand"]) > 0)) for _, a in per_seed)
    header = [
        f"two-stage Figure 2: K = d = {config['K']}, N = {config['N']}, T0 = {config['T0']}, T = {T}, "
        f"{len(per_seed)} seeds; final values at t = T (stage 1 at T0); stops (stage 1/stage 2): {', '.join(stops)}",
        f"floor L* = {L_star_mean:.6g} (mean over seeds)",
        "stage 1 from zero init against its closed forms (all seeds, all grid steps): max relative error of L0 "
        f"{max(float(np.max(np.abs(a['loss0'] / closed_L0 - 1))) for _, a in per_seed):.1e}, of ‖W_ov‖ "
        f"{max(float(np.max(np.abs(a['norm_ov'][1:] / closed_norm[1:] - 1))) for _, a in per_seed):.1e}; "
        f"min rho(W_ov, W_ov*) for t >= 1: {min(float(np.min(a['corr_ov'][1:])) for _, a in per_seed):.15f}",
        f"stage 1 from random init (W_ov0 entries N(0, sigma^2), sigma = {float(a0['sigma_rand']):.4g} = 1/sqrt(d), "
        f"rng default_rng({RANDOM_INIT_SEED_OFFSET} + seed)): rho(W_ov, W_ov*) from {np.mean(rho0_rand):.3g} at t = 0 "
        f"to {np.mean(cols['rho_ov rand init']):.6g} at t = T0 (means), increasing at every grid step in {rising} "
        f"of {len(per_seed)} seeds",
    ]
    norm_ratio = float(np.mean([float(a["norm_kq"][-1]) / (float(a["eta"]) * T) for _, a in per_seed])) \
        if T > 0 else math.nan
    if T > 0:
        header.append(f"stage 2: ‖W_kq‖_F / (eta T) = {norm_ratio:.4f} at t = T (mean over seeds; each step has "
                      "length eta, so <= 1)")
    if mean_power is not None:
        header.append(f"1 - rho(W_kq, W_kq*) ≈ C t^p fitted on t in [{T / 10:.0f}, {T}] (log-log, geometric mean "
                      f"of the seeds): p = {mean_power['exponent']:.3f}")
    if 0 < mean_fit["rate"] < 1:
        header.append(
            f"L - L* ≈ C r^t fitted on t in [{mean_fit['t_lo']:.0f}, {mean_fit['t_hi']:.0f}] (where the local decay "
            f"rate of the geometric-mean gap stays within {WINDOW_TOL:.0%} of its final value): r = "
            f"{mean_fit['rate']:.7f} per step (geometric mean of the seeds' curves), -ln r = "
            f"{-math.log(mean_fit['rate']):.4e}; the gap shrinks by 10x every "
            f"{math.log(10) / -math.log(mean_fit['rate']):.0f} steps")
        header.append(
            f"predicted -ln r = gamma eta/‖W_kq*‖_F (gamma = min margin of W_kq* = 1) = {np.mean(predicted):.4e} "
            f"(mean over seeds); fitted/predicted {-math.log(mean_fit['rate']) / np.mean(predicted):.4f}, local rate "
            f"over the last 1/{LOCAL_STRETCHES} of the run / predicted {np.mean(cols['end/pred']):.4f} (means)")
    else:
        header.append("L - L*: no geometric decrease in the fit window")
    if note:
        header.append(f"({note})")
    table = "\n".join(header) + "\n" + tabulate(rows, headers=["seed", *cols], disable_numparse=True)
    plt = pyplot()
    figures = [_six_panels(plt, per_seed, config, outdir),
               _gap_figure(plt, per_seed, mean_fit, float(np.mean(predicted)), outdir)]
    if mean_power is not None:
        figures.append(_direction_figure(plt, per_seed, mean_power, outdir))
    numbers = {
        "seeds": float(len(per_seed)),
        "rho_kq_final": float(np.mean(cols["rho(W_kq, W_kq*)"])),
        "rho_kq_final_min": float(np.min(cols["rho(W_kq, W_kq*)"])),
        "rho_ov_final": float(np.mean([float(a["corr_ov"][-1]) for _, a in per_seed])),
        "rho_ov_rand_initial": float(np.mean(rho0_rand)),
        "rho_ov_rand_final": float(np.mean(cols["rho_ov rand init"])),
        "corr_gap_exponent": mean_power["exponent"] if mean_power is not None else math.nan,
        "excess_final": float(np.mean(cols["L - L*"])),
        "accuracy_final": float(np.mean(cols["accuracy"])),
        "attn_opt_final": float(np.mean(cols["attn on x*"])),
        "L_star": L_star_mean,
        "rate": mean_fit["rate"],
        "rate_r2": mean_fit["r2"],
        "decay_predicted": float(np.mean(predicted)),
        "decay_at_end": float(np.mean(at_end)),
        "norm_kq_over_eta_T": norm_ratio,
    }
    return Summary(table, figures, numbers)
