"""Generalization of a trained model to unseen sentences (spec/twostage.md §6, §7 "generalization").

The sentences come from :func:`ntpref.twostage.data.unseen_sentences`, split into

  determined     the extended order >_q^ext (transitive closure of the observed relations) makes one token x̂
                 of the sentence greater than every other one; target n(x̂). Theory: attention concentrates
                 on x̂ and the model predicts n(x̂).
  noncomparable  the closure leaves the maximum open; x̂ is the token the split chose (the hidden-order
                 maximum when ``orders`` was given, else the leftmost closure-maximal token). No guarantee.

For each part: accuracy (the target logit n(x̂) strictly the largest), attention mass on x̂ (all its copies)
and the mean predicted probability p(n(x̂) | X) = exp(−ℓ). x̂ is recovered as the token whose successor is the
target (unique when the successors are distinguishable, e.g. n a permutation).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import as_int, check_backend
from ..progress import silent
from . import model
from .data import Dataset, UnseenSplit, optimal_tokens
from .train import TwoStageResult, prediction_metrics, two_stage

PARTS = ("determined", "noncomparable")
METRICS = ("accuracy", "attn_max", "p_target")


@dataclass(frozen=True)
class PartMetrics:
    """Metrics of one part of the split: n sentences, accuracy, attn_max (mean attention on x̂) and
    p_target (mean p(n(x̂) | X))."""

    n: int
    accuracy: float
    attn_max: float
    p_target: float


def evaluate_part(ds: Dataset, W_ov, W_kq, backend: str = "numba") -> PartMetrics:
    """:class:`PartMetrics` of W_ov, W_kq [d, d] on the sentences of ``ds`` (x̂ = token with successor = target)."""
    check_backend(backend)
    xhat = optimal_tokens(ds)
    fw = model.forward(ds, W_ov, W_kq, backend)
    accuracy, mass = prediction_metrics(ds, fw.logits, fw.attn, xhat)
    return PartMetrics(ds.N, accuracy, mass, float(np.mean(np.exp(-fw.losses))))


def evaluate_unseen(split: UnseenSplit, W_ov, W_kq, backend: str = "numba") -> dict[str, PartMetrics | None]:
    """{"determined": PartMetrics | None, "noncomparable": PartMetrics | None} (None for an empty part)."""
    return {part: None if getattr(split, part) is None else evaluate_part(getattr(split, part), W_ov, W_kq, backend)
            for part in PARTS}


@dataclass(frozen=True, eq=False)
class GeneralizationCurve:
    """Generalization metrics over stage-2 training time.

    steps    [n] int64 stage-2 steps t (W_kq after t updates, W_ov frozen)
    curves   {part: {metric: [n] float64}} for part in "determined", "noncomparable", "train" (the training
             sentences, x̂ = x*) and metric in "accuracy", "attn_max", "p_target"; a part without sentences
             is absent
    sizes    {part: number of sentences}
    result   the :class:`~ntpref.twostage.train.TwoStageResult` of the run (W_kq snapshots at ``steps``)
    """

    steps: np.ndarray
    curves: dict
    sizes: dict
    result: TwoStageResult


def generalization_curve(ds: Dataset, split: UnseenSplit, steps: Sequence[int], *, backend: str = "numba",
                         progress: Callable[[str, int, int], None] = silent, **two_stage_options) -> GeneralizationCurve:
    """Train with :func:`~ntpref.twostage.train.two_stage` on ``ds`` and evaluate the training sentences and both
    parts of ``split`` at every stage-2 step in ``steps`` (0..T). ``two_stage_options`` go to two_stage
    (eta0, eta, T0, T, direction, ...)."""
    steps = np.unique(as_int("steps", np.asarray(list(steps), dtype=np.int64), (None,), low=0))
    result = two_stage(ds, snapshots=steps.tolist(), backend=backend, progress=progress, **two_stage_options)
    parts = {"train": ds, **{p: getattr(split, p) for p in PARTS if getattr(split, p) is not None}}
    curves = {p: {k: np.empty(steps.size) for k in METRICS} for p in parts}
    for j, t in enumerate(steps.tolist()):
        for p, part in parts.items():
            metrics = evaluate_part(part, result.W_ov, result.snapshots[t], backend)
            for k in METRICS:
                curves[p][k][j] = getattr(metrics, k)
    return GeneralizationCurve(steps, curves, {p: part.N for p, part in parts.items()}, result)
