"""Training runs of the two-stage model under any update rule of :mod:`.updates`, with their metrics on a
time grid: the runs of the ``joint`` and ``optimizers`` targets.

Problem (one seed): Figure 2's data set ``random_realizable(K, N, seed)`` (lengths 2..6, E = I, d = K), its
Eq. 1 set D (weights 1/N), the collocation set D0 of L0, the optimal tokens x*, the max-margin solutions
W_ov*, W_kq* (docs/twostage.md §5) and the constraints (e_u − e_v)^T W e_q ≥ 1 of both problems.

A run is a list of :class:`Phase`\\ s, each training some blocks (W_ov, W_kq) on one loss by one rule for a
number of updates, from where the previous phase ended. Gradients are the closed forms of
:func:`ntpref.twostage.loss_and_grad` (Numba backend, float64). Algorithm 1 is two phases (W_ov on L0 by
normalized GD, then W_kq on L); joint training is one phase of both blocks on L.

Metrics after t updates (t on the grid; :data:`METRICS`):

  loss      L(W_ov, W_kq), Eq. 1 on D
  floor     L*(W_ov) = mean_i −log softmax(E^T W_ov e_{x*_i})_{y_i}: Eq. 1 with all attention on x*, at the
            current W_ov (Figure 2's L*, :func:`ntpref.twostage.loss_floor`; constant while W_ov is frozen)
  excess    L − L*(W_ov): what the attention still loses at this W_ov
  accuracy  fraction of sentences whose target logit is strictly the largest;  attn_opt: mean attention on x*
  corr_ov, corr_kq   ρ(W_ov, W_ov*), ρ(W_kq, W_kq*);  norm_ov, norm_kq: Frobenius norms
  l2_ov, l2_kq       normalized ℓ2 margin over its optimum: γ₂(W)/γ₂* = min_margin(W) ‖W*‖_F / ‖W‖_F (1 only on
                     the ray of W*, < 0 while a constraint is violated)
  linf_ov, linf_kq   normalized ℓ∞ margin over its optimum: γ∞(W)/γ∞* = min_margin(W) t* / max|W|, t* = min
                     max|W| subject to every margin ≥ 1 (:func:`linf_norm_star`)
  sign_ov            ρ(W_ov, S_ov), S_ov[v, x] = 1 if v = n(x) else −1 (x in C): the unique ℓ∞ max-margin
                     solution of the W_ov problem (every column is pinned: m_{n(x)} − m_v ≥ 1, |m| ≤ ½)

The ℓ∞ max-margin solution of the W_kq problem is not unique (only the columns with the longest chains are
pinned), so W_kq is compared with the ℓ∞ geometry through its normalized margin only.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import InputError
from ..sweep import CellArray
from ..twostage import (W_kq_star, W_ov_star, direction, forward, loss_and_grad, observed_relations,
                        optimal_tokens, prepare, prepare_collocations, random_realizable, rho)
from ..twostage.orders import optimal_token_sentences
from ..twostage.two_stage import prediction_metrics
from .updates import Rule, Updater, frobenius

BLOCKS = ("ov", "kq")
METRICS = ("loss", "floor", "excess", "accuracy", "attn_opt", "corr_ov", "corr_kq", "norm_ov", "norm_kq",
           "l2_ov", "l2_kq", "linf_ov", "linf_kq", "sign_ov")


#: Metrics with a range a check can use (low, high); the others (correlations, margins, L − L*) have none.
BOUNDS = {"loss": (0.0, np.inf), "floor": (0.0, np.inf), "accuracy": (0.0, 1.0), "norm_ov": (0.0, np.inf),
          "norm_kq": (0.0, np.inf)}


def series_arrays(n: int) -> dict[str, CellArray]:
    """The :data:`METRICS` series of one run over a grid of ``n`` steps, as the targets' ``cell_arrays`` declare
    them (:class:`ntpref.sweep.CellArray`)."""
    return {name: CellArray("f8", (n,), *BOUNDS.get(name, ())) for name in METRICS}


def linf_norm_star(U, V, Q, K: int) -> float:
    """t* = min max|M| over M [K, K] subject to M[u, q] − M[v, q] ≥ 1 for every triple (u, v, q) (the W
    problems with E = I): h/2, h the most relations in a chain u0 > u1 > … > uh of one column q.

    A chain forces M[u0, q] − M[uh, q] ≥ h, so max|M| ≥ h/2; M[u, q] = depth(u) − h/2, depth(u) the longest
    chain below u in column q, meets every constraint within [−h/2, h/2]. The relations must be acyclic
    (Assumption 1)."""
    depth = np.zeros((K, K))
    for _ in range(K + 1):
        new = depth.copy()
        np.maximum.at(new, (U, Q), depth[V, Q] + 1.0)
        if np.array_equal(new, depth):
            return float(depth.max()) / 2.0
        depth = new
    raise InputError("linf_norm_star: the relations have a cycle (no W meets every margin)")


@dataclass(frozen=True, eq=False)
class Margins:
    """The constraints (e_U − e_V)^T W e_Q ≥ 1 of one max-margin problem (E = I: W[U, Q] − W[V, Q] ≥ 1),
    ‖W*‖_F of its ℓ2 solution and t* of its ℓ∞ solution."""

    U: np.ndarray
    V: np.ndarray
    Q: np.ndarray
    norm_star: float
    linf_star: float

    def min_margin(self, W: np.ndarray) -> float:
        return float(np.min(W[self.U, self.Q] - W[self.V, self.Q]))

    def ratios(self, W: np.ndarray) -> tuple[float, float]:
        """(γ₂(W)/γ₂*, γ∞(W)/γ∞*) of the module docstring; (0, 0) for W = 0."""
        amax = float(np.max(np.abs(W)))
        if amax == 0.0:
            return 0.0, 0.0
        m = self.min_margin(W)
        return m * self.norm_star / frobenius(W), m * self.linf_star / amax


def _margins(U, V, Q, W_star: np.ndarray) -> Margins:
    U, V, Q = (np.asarray(a, dtype=np.int64) for a in (U, V, Q))
    return Margins(U, V, Q, float(np.linalg.norm(W_star)), linf_norm_star(U, V, Q, W_star.shape[0]))


@dataclass(frozen=True, eq=False)
class Problem:
    """One seed's data set and everything a run measures against (module docstring). prep, prep0, prep_star:
    the prepared sets D, D0 and {([x*_i], y_i)} (whose Eq. 1 loss at W_ov is L*(W_ov))."""

    seed: int
    prep: object
    prep0: object
    prep_star: object
    xstar: np.ndarray
    W_ov_star: np.ndarray
    W_kq_star: np.ndarray
    ov: Margins
    kq: Margins
    S_ov: np.ndarray


def problem(seed: int, K: int, N: int) -> Problem:
    """Figure 2's data set of ``seed`` (``random_realizable(K, N, seed)``, one-hot E) and its references."""
    ds = random_realizable(K=K, N=N, seed=seed).dataset
    if not ds.onehot:
        raise InputError("trajectory.problem: the margin measures need one-hot embeddings (E = I)")
    succ = ds.succ
    xstar = optimal_tokens(ds)
    W_ov_s, _ = W_ov_star(ds.E, succ)
    W_kq_s, _ = W_kq_star(ds)
    C = np.flatnonzero(succ >= 0)
    X, Vall = np.repeat(C, K), np.tile(np.arange(K), C.size)
    keep = Vall != succ[X]
    triples = np.array(sorted((q, u, v) for q, pairs in observed_relations(ds).items() for u, v in pairs),
                       dtype=np.int64).reshape(-1, 3)
    S_ov = np.zeros((K, K))
    S_ov[:, C] = -1.0
    S_ov[succ[C], C] = 1.0
    return Problem(seed, prepare(ds), prepare_collocations(ds.E, succ), prepare(optimal_token_sentences(ds, xstar)),
                   xstar, W_ov_s, W_kq_s, _margins(succ[X][keep], Vall[keep], X[keep], W_ov_s),
                   _margins(triples[:, 1], triples[:, 2], triples[:, 0], W_kq_s), S_ov)


def metrics(p: Problem, W_ov: np.ndarray, W_kq: np.ndarray) -> dict[str, float]:
    """The :data:`METRICS` of W_ov, W_kq [d, d] (module docstring)."""
    out = forward(p.prep, W_ov, W_kq)
    floor = forward(p.prep_star, W_ov, None).loss
    accuracy, attn = prediction_metrics(p.prep, out.logits, out.attn, p.xstar)
    l2_ov, linf_ov = p.ov.ratios(W_ov)
    l2_kq, linf_kq = p.kq.ratios(W_kq)
    return {"loss": out.loss, "floor": floor, "excess": out.loss - floor, "accuracy": accuracy, "attn_opt": attn,
            "corr_ov": rho(W_ov, p.W_ov_star), "corr_kq": rho(W_kq, p.W_kq_star),
            "norm_ov": float(np.linalg.norm(W_ov)), "norm_kq": float(np.linalg.norm(W_kq)),
            "l2_ov": l2_ov, "l2_kq": l2_kq, "linf_ov": linf_ov, "linf_kq": linf_kq,
            "sign_ov": rho(W_ov, p.S_ov)}


@dataclass(frozen=True)
class Phase:
    """``steps`` updates by ``rule`` of the blocks ``train`` (a non-empty subset of :data:`BLOCKS`, in that
    order) on ``loss``: "L" (Eq. 1 on D) or "L0" (the collocation loss on D0; W_ov alone)."""

    steps: int
    train: tuple
    loss: str
    rule: Rule

    def __post_init__(self):
        if not self.train or any(b not in BLOCKS for b in self.train) or list(self.train) != sorted(
                self.train, key=BLOCKS.index) or len(set(self.train)) != len(self.train):
            raise InputError(f"phase: train must be a non-empty ordered subset of {BLOCKS}, got {self.train!r}")
        if self.loss not in ("L", "L0") or (self.loss == "L0" and self.train != ("ov",)):
            raise InputError(f"phase: loss must be 'L', or 'L0' training W_ov alone; got {self.loss!r}, {self.train!r}")
        if self.steps < 0:
            raise InputError(f"phase: steps must be >= 0, got {self.steps}")


@dataclass(frozen=True, eq=False)
class Run:
    """A run's :data:`METRICS` as arrays over its grid (``series``), the final W_ov, W_kq [d, d] and the
    ``snapshots`` {t: (W_ov, W_kq) after t updates}."""

    series: dict
    W_ov: np.ndarray
    W_kq: np.ndarray
    snapshots: dict


def run(p: Problem, phases, grid=(), W_ov=None, W_kq=None, snapshots=()) -> Run:
    """Train from W_ov, W_kq (default zero) through ``phases``; the metrics after t updates for every t of
    ``grid`` (sorted steps in 0..Σ steps; t counts the updates of all phases) and the matrices at the steps
    ``snapshots``."""
    K = p.W_ov_star.shape[0]
    W = {"ov": np.zeros((K, K)) if W_ov is None else np.array(W_ov, dtype=np.float64),
         "kq": np.zeros((K, K)) if W_kq is None else np.array(W_kq, dtype=np.float64)}
    grid = np.asarray(grid, dtype=np.int64)
    total = sum(ph.steps for ph in phases)
    if grid.size and (grid[0] < 0 or grid[-1] > total or np.any(np.diff(grid) <= 0)):
        raise InputError(f"run: the grid must be increasing steps in 0..{total}")
    series = {name: np.empty(grid.size) for name in METRICS}
    at, t = {int(s): i for i, s in enumerate(grid)}, 0
    snaps, wanted = {}, {int(s) for s in snapshots}

    def record():
        if t in wanted:
            snaps[t] = (W["ov"].copy(), W["kq"].copy())
        if t in at:
            for name, value in metrics(p, W["ov"], W["kq"]).items():
                series[name][at[t]] = value

    record()
    for ph in phases:
        updater = Updater(ph.rule, len(ph.train))
        for _ in range(ph.steps):
            if ph.loss == "L0":
                grads = (loss_and_grad(p.prep0, W["ov"], None).grad_W_ov,)
            else:
                g = loss_and_grad(p.prep, W["ov"], W["kq"])
                grads = tuple(g.grad_W_ov if b == "ov" else g.grad_W_kq for b in ph.train)
            W.update(zip(ph.train, updater.step(tuple(W[b] for b in ph.train), grads)))
            t += 1
            record()
    return Run(series, W["ov"], W["kq"], snaps)


def gradient_agreement(p: Problem, W_ov: np.ndarray, W_kq: np.ndarray, blocks=BLOCKS) -> float:
    """min over ``blocks`` of the cosine between the float64 gradient of L (:func:`loss_and_grad`, what the
    runs use) and the log-scale direction of docs/twostage.md §4 (:func:`ntpref.twostage.direction`, accurate
    where the float64 gradient cancels or underflows); 1 for a block whose gradient is exactly zero in both."""
    g = loss_and_grad(p.prep, W_ov, W_kq)
    worst = 1.0
    for b in blocks:
        G = g.grad_W_ov if b == "ov" else g.grad_W_kq
        unit = direction(p.prep, W_ov, W_kq, wrt=b).unit
        n = frobenius(G)
        if unit is None or n == 0.0:
            worst = min(worst, 1.0 if unit is None and n == 0.0 else 0.0)
            continue
        worst = min(worst, float(np.sum(unit * G)) / n)
    return worst
