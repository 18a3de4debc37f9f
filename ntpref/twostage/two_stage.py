"""Algorithm 1 of docs/twostage.md §4: two-stage normalized gradient descent.

stage 1 (pre-processing, feed-forward): W_ov ← W_ov0 (0);  T0 times  W_ov ← W_ov − η0 G/‖G‖_F,  G = ∇L0(W_ov)
stage 2 (main, attention, W_ov frozen):  W_kq ← W_kq0 (0); T  times  W_kq ← W_kq − η  G/‖G‖_F,  G = ∇_{W_kq} L

Step convention: ``t`` counts updates; the metrics at index t belong to the iterate after t updates
(index 0 is the initial value), so the stage-1 arrays have T0 + 1 entries and the stage-2 arrays T + 1.

A stage whose gradient is exactly zero (no direction, ‖G‖_F = 0) stops cleanly: no division by zero, the
iterate stays where it is, :attr:`Stop.reason` is ``"zero_gradient"`` and :attr:`Stop.step` the number of
updates made. The metric arrays keep their full length and are padded by repeating the last value — which
is exactly the trajectory of a method that stays put when it has no direction, and keeps the interchange
arrays at their fixed lengths T0 + 1 / T + 1.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..checks import as_float, as_scalar, check_backend, step_set
from ..errors import InputError
from ..progress import silent
from . import kernels, model
from .dataset import Dataset, check_dataset, collocation_set
from .orders import optimal_token_sentences, optimal_tokens
from .svm import W_kq_star, W_ov_star, rho

STAGE1_METRICS = ("loss", "norm", "corr")
STAGE2_METRICS = ("loss", "norm", "corr", "excess", "accuracy", "attn_opt")


@dataclass(frozen=True)
class Stop:
    """Why a stage ended: ``reason`` is "max_steps" (all steps made) or "zero_gradient" (‖G‖_F = 0 at the
    iterate after ``step`` updates); ``step`` = number of updates actually made."""

    reason: str
    step: int


@dataclass(frozen=True, eq=False)
class TwoStageResult:
    """Output of :func:`train`.

    W_ov       [d, d]  the feed-forward matrix used (frozen) in stage 2: the stage-1 result, or λ·W̄_ov* under
                       ``ideal_ff``
    W_ov_stage1 [d, d] the stage-1 result itself
    W_kq       [d, d]  the stage-2 result
    W_ov_star, W_kq_star [d, d]  max-margin solutions (docs/twostage.md §5); ``certificates`` holds their Certificates
                       under the keys "W_ov_star" and "W_kq_star"
    stage1     dict of [T0 + 1] arrays over t = 0..T0: "loss" L0, "norm" ‖W_ov‖_F, "corr" ρ(W_ov, W_ov*)
    stage2     dict of [T + 1] arrays over t = 0..T: "loss" L (Eq. 1 on the stage-2 sentences), "norm"
               ‖W_kq‖_F, "corr" ρ(W_kq, W_kq*), "excess" L − L*, "accuracy" (fraction of sentences whose
               target logit is strictly the largest), "attn_opt" (mean attention mass on the optimal token
               x*, all its copies)
    loss_floor L* = mean over the stage-2 sentences of −log softmax(E^T W_ov e_{x*})_y (attention fully on
               x*, W_ov frozen); L − L* → 0 is the stage-2 prediction of docs/twostage.md §6
    stop1, stop2  :class:`Stop` of each stage
    lam        λ of the ideal feed-forward (None when not used)
    snapshots  {t: W_kq after t stage-2 updates} for the requested ``snapshots`` steps
    """

    W_ov: np.ndarray
    W_kq: np.ndarray
    W_ov_star: np.ndarray
    W_kq_star: np.ndarray
    certificates: dict
    stage1: dict
    stage2: dict
    loss_floor: float
    stop1: Stop
    stop2: Stop
    W_ov_stage1: np.ndarray
    lam: float | None = None
    snapshots: dict = field(default_factory=dict)


# ---- helpers ------------------------------------------------------------------------------------

def with_collocations(ds: Dataset, C=None) -> Dataset:
    """D ∪ D0: the sentences of ``ds`` followed by the one-token sentences ([x], n(x)) for x in C
    (C default: every token with a successor, succ[x] ≥ 0)."""
    succ = ds.require_succ("with_collocations")
    C = collocation_set(succ, C)
    sentences = [ds.sentence(i).tolist() for i in range(ds.N)] + [[x] for x in C.tolist()]
    return Dataset.from_sentences(sentences, np.concatenate([ds.targets, succ[C]]), E=ds.E, succ=succ)


def token_frequency(ds: Dataset) -> np.ndarray:
    """[K] occurrences of each token over all positions of all sentences (the "frequency" L0 weights)."""
    return np.bincount(ds.tokens[ds.tokens >= 0], minlength=ds.K).astype(np.float64)


def loss_floor(ds: Dataset, W_ov, xstar=None, *, backend: str = "numba") -> float:
    """L* = mean_i −log softmax(E^T W_ov e_{x*_i})_{y_i} (docs/twostage.md §6): Eq. 1 with attention fully on
    the optimal token (each sentence reduced to the one-token sentence [x*] with the same target). W_ov [d, d];
    xstar [N]: the optimal tokens when already known.

    The forward pass of :func:`ntpref.twostage.forward` (W_kq = 0: a one-token sentence attends to its token
    whatever W_kq). Where :func:`ngd` runs in compiled code (:func:`compiled_loop`), it is the loss that loop
    records at t = 0 of a run of no step: the same operations, so the same bits, and a run of Algorithm 1
    compiles one Numba pass, its loop's."""
    check_backend(backend)
    sentences = model.prepare(optimal_token_sentences(ds, xstar))
    W_ov = as_float("W_ov", W_ov, (ds.d, ds.d))
    zero = np.zeros((ds.d, ds.d))
    if not compiled_loop(sentences, backend):
        return model.forward(sentences, W_ov, zero, backend=backend).loss
    _, metrics, _, _ = ngd(sentences, W_ov, zero, train_kq=False, W_star=zero, xstar=sentences.tokens[:, 0],
                           eta=0.0, T=0, method="stable", snapshots=set(), backend=backend, label="floor",
                           progress=silent)
    return float(metrics["loss"][0])


def prediction_metrics(ds: Dataset | model.Prepared, logits: np.ndarray, attn: np.ndarray,
                       xstar: np.ndarray) -> tuple[float, float]:
    """(accuracy, attention mass) of a forward pass over ``ds``: the fraction of sentences whose target logit is
    strictly the largest (a tie counts as wrong), and the mean over sentences of the attention on the token
    ``xstar[i]`` (all its copies). logits [N, K], attn [N, Lmax], xstar [N] int64."""
    return kernels.accuracy_and_mass(logits, attn, ds.tokens, ds.lengths, ds.targets, xstar)


def _init(shape, W0, name, init, sigma, rng):
    if W0 is not None:
        return as_float(name, W0, shape).copy()
    if init == "zeros":
        return np.zeros(shape)
    return sigma * rng.standard_normal(shape)


def _weights(ds: Dataset, l0_weights):
    """None | "frequency" | array [K] → the ``weights`` of the collocation loss (validated there)."""
    if isinstance(l0_weights, str):
        if l0_weights != "frequency":
            raise InputError(f"option 'l0_weights' must be None, \"frequency\" or an array [K], got {l0_weights!r}")
        return token_frequency(ds)
    return l0_weights


def _pad(arrays: dict, t: int) -> None:
    for a in arrays.values():
        a[t + 1:] = a[t]


# ---- Algorithm 1 --------------------------------------------------------------------------------

def train(ds: Dataset, *, eta0: float | None = None, eta: float | None = None, T0: int = 1000, T: int = 10000,
          direction: str = "stable", W_ov0=None, W_kq0=None, init: str = "zeros", sigma: float = 0.1,
          seed: int = 0, C=None, l0_weights=None, ideal_ff: bool | float = False, include_D0: bool = False,
          snapshots: Sequence[int] = (), backend: str = "numba",
          progress: Callable[[str, int, int], None] = silent) -> TwoStageResult:
    """Run Algorithm 1 (docs/twostage.md §4) on a realizable dataset with a collocation map ``ds.succ``:
    W_ov, W_kq [d, d] and their metrics in a :class:`TwoStageResult`.

    eta0, eta    step sizes; default the paper's 0.2/√d and 0.05/√d
    T0, T        number of updates of stage 1 and stage 2
    direction    "stable" (log-scale direction, default) or "naive" (plain float64 gradient), both stages
    W_ov0, W_kq0 initial values [d, d]; when absent: zeros (``init="zeros"``, the paper's algorithm) or
                 i.i.d. N(0, sigma²) entries (``init="gaussian"``, drawn from default_rng(seed), W_ov0 first)
    C            collocation set of L0 (distinct token ids with a successor); default every x with succ ≥ 0
                 (C = V when n is a permutation)
    l0_weights   None (uniform mean over C), "frequency" (x weighted by its number of occurrences over all
                 token positions of ``ds``; a token that never occurs gets weight 0 and its column of W_ov
                 stays at its initial value), or an array [K] of weights ≥ 0; normalised to sum 1 over C
    ideal_ff     False: stage 2 uses the stage-1 result W_ov. True: stage 2 uses the ideal feed-forward
                 λ·W̄_ov* (W̄ = W/‖W‖_F) with λ = ‖W_ov‖_F of the stage-1 result (= η0·T0 from zero init);
                 a positive number: that λ. Under the defaults (zero init, E = I, C = V, uniform weights)
                 the stage-1 result lies on the ray of W_ov*, so both give the same Eq. 1 (up to rounding).
    include_D0   False: stage 2 trains on the sentences of ``ds`` (D). True: on D ∪ D0, D0 = the one-token
                 sentences ([x], n(x)), x in C, each weighted like a sentence of D (mean over N + |C|). A
                 one-token sentence has attention 1 whatever W_kq, so it adds nothing to ∇_{W_kq} L: the
                 normalized direction, hence the W_kq trajectory, is the same up to rounding; the reported
                 L, L*, accuracy and attention mass average over D ∪ D0.
    snapshots    stage-2 steps t (0..T) at which W_kq is stored in ``result.snapshots``
    backend      "numba" | "numpy"
    progress     callable progress(label, done, total), labels "stage 1" and "stage 2"
    """
    check_backend(backend)
    check_dataset(ds)
    model.check_method(direction, "option 'direction'")
    if init not in ("zeros", "gaussian"):
        raise InputError(f"option 'init' must be \"zeros\" or \"gaussian\", got {init!r}")
    succ = ds.require_succ("train")
    d = ds.d
    eta0 = 0.2 / np.sqrt(d) if eta0 is None else as_scalar("eta0", eta0, low=0, low_open=True)
    eta = 0.05 / np.sqrt(d) if eta is None else as_scalar("eta", eta, low=0, low_open=True)
    T0 = as_scalar("T0", T0, kind="int", low=0)
    T = as_scalar("T", T, kind="int", low=0)
    sigma = as_scalar("sigma", sigma, low=0)
    snapshots = step_set("snapshots", snapshots, T)
    prep0 = model.prepare_collocations(ds.E, succ, C, _weights(ds, l0_weights))
    C = prep0.tokens[:, 0]
    rng = np.random.default_rng(seed)
    W_ov = _init((d, d), W_ov0, "W_ov0", init, sigma, rng)
    W_kq = _init((d, d), W_kq0, "W_kq0", init, sigma, rng)
    W_ov_s, cert_ov = W_ov_star(ds.E, succ, C)
    W_kq_s, cert_kq = W_kq_star(ds)

    W_ov_stage1, stage1, stop1, _ = ngd(prep0, W_ov, np.zeros((d, d)), False, W_ov_s, C, eta0, T0, direction,
                                         set(), backend, "stage 1", progress)
    stage1 = {k: stage1[k] for k in STAGE1_METRICS}
    W_ov, lam = W_ov_stage1, None
    if ideal_ff is not False:
        lam = float(np.linalg.norm(W_ov)) if ideal_ff is True else as_scalar("ideal_ff", ideal_ff, low=0,
                                                                             low_open=True)
        if not np.any(W_ov_s):
            raise InputError("option 'ideal_ff': W_ov* is zero (K = 1), there is no ideal feed-forward direction")
        W_ov = lam / np.linalg.norm(W_ov_s) * W_ov_s
    ds2 = with_collocations(ds, C) if include_D0 else ds
    xstar = optimal_tokens(ds2)
    floor = loss_floor(ds2, W_ov, xstar, backend=backend)
    W_kq, stage2, stop2, snaps = ngd(model.prepare(ds2), W_ov, W_kq, True, W_kq_s, xstar, eta, T, direction,
                                      snapshots, backend, "stage 2", progress)
    stage2["excess"] = stage2["loss"] - floor
    stage2 = {k: stage2[k] for k in STAGE2_METRICS}
    return TwoStageResult(W_ov=W_ov, W_kq=W_kq, W_ov_star=W_ov_s, W_kq_star=W_kq_s,
                          certificates={"W_ov_star": cert_ov, "W_kq_star": cert_kq}, stage1=stage1, stage2=stage2,
                          loss_floor=floor, stop1=stop1, stop2=stop2, W_ov_stage1=W_ov_stage1, lam=lam,
                          snapshots=snaps)


CHUNK = 500
"""Steps per compiled call of the Numba training loop; progress is reported between chunks."""


def compiled_loop(prep: model.Prepared, backend: str) -> bool:
    """Whether :func:`ngd` runs its steps in compiled code (``kernels.ngd_steps``): the Numba backend on a set
    that runs in one serial pass (not :func:`model.runs_parallel`)."""
    return backend == "numba" and not model.runs_parallel(prep)


def ngd(prep, W_ov, W_kq, train_kq, W_star, xstar, eta, T, method, snapshots, backend, label, progress):
    """Normalized GD on the weighted sentence set ``prep``, training W_kq (``train_kq``, W_ov frozen: stage
    2) or W_ov (stage 1, on the collocation set). Returns (trained W, metrics, Stop, snapshots) with the
    metrics "loss", "norm", "corr", "accuracy", "attn_opt" as [T + 1] arrays over t = 0..T (attention mass
    on ``xstar``) and the snapshots {t: W after t updates} for t in ``snapshots``.

    Numba backend: the steps run in compiled code (kernels.ngd_steps), in chunks of CHUNK steps and
    split at the snapshot steps. When the set is large enough for the parallel pass (model.runs_parallel),
    and for the NumPy backend, one model.step per step from Python instead.
    """
    keys = ("loss", "norm", "corr", "accuracy", "attn_opt")
    m = {k: np.empty(T + 1) for k in keys}
    stop = Stop("max_steps", T)
    snaps = {}
    wrt = "kq" if train_kq else "ov"
    mode = model.kernel_mode(wrt, method)
    W_star = np.ascontiguousarray(W_star, dtype=np.float64)
    xstar = np.array(xstar, dtype=np.int64)     # a writable copy: a read-only array is another Numba signature
    if compiled_loop(prep, backend):
        W_ov, W_kq = W_ov.copy(), W_kq.copy()            # trained in place
        W = W_kq if train_kq else W_ov
        bounds = sorted(set(range(0, T + 1, CHUNK)) | set(snapshots) | {T + 1})
        W_hist = np.empty((min(CHUNK, T + 1), *W.shape))
        star_norm = np.linalg.norm(W_star)
        for t0, t1 in zip(bounds, bounds[1:]):
            if t0 in snapshots:
                snaps[t0] = W.copy()
            t = kernels.ngd_steps(prep.tokens, prep.lengths, prep.targets, prep.weights, prep.E, prep.onehot,
                                  W_ov, W_kq, train_kq, xstar, eta, mode, t0, t1, T, m["loss"], m["accuracy"],
                                  m["attn_opt"], W_hist)
            for j in range((t1 if t < 0 else t + 1) - t0):     # norm and ρ exactly as np.linalg.norm and svm.rho
                nw = np.linalg.norm(W_hist[j])
                m["norm"][t0 + j] = nw
                m["corr"][t0 + j] = 0.0 if nw == 0.0 or star_norm == 0.0 else \
                    float(np.vdot(W_hist[j], W_star)) / (nw * star_norm)
            if t >= 0:
                stop = Stop("zero_gradient", t)
                _pad(m, t)
                snaps.update({s: W.copy() for s in snapshots if s > t})
                break
            if t1 <= T:
                progress(label, t1, T)
        progress(label, T, T)
        return W, m, stop, snaps
    for t in range(T + 1):
        W = W_kq if train_kq else W_ov
        out = model.forward(prep, W_ov, W_kq, backend=backend) if t == T else \
            model.step(prep, W_ov, W_kq, wrt=wrt, method=method, backend=backend)
        m["loss"][t] = out.loss
        m["norm"][t] = np.linalg.norm(W)
        m["corr"][t] = rho(W, W_star)
        m["accuracy"][t], m["attn_opt"][t] = prediction_metrics(prep, out.logits, out.attn, xstar)
        if t in snapshots:
            snaps[t] = W
        if t == T:
            break
        unit = out.direction.unit
        if unit is None:
            stop = Stop("zero_gradient", t)
            _pad(m, t)
            snaps.update({s: W for s in snapshots if s > t})
            break
        if train_kq:
            W_kq = W_kq - eta * unit
        else:
            W_ov = W_ov - eta * unit
        if t % CHUNK == 0:
            progress(label, t, T)
    progress(label, T, T)
    return (W_kq if train_kq else W_ov), m, stop, snaps
