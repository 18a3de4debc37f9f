"""Generalization of a trained model to unseen sentences (docs/twostage.md §6, §7 "generalization").

The sentences come from :func:`ntpref.twostage.unseen.unseen_sentences`, split into

  determined     the extended order >_q^ext (transitive closure of the observed relations) makes one token x̂
                 of the sentence greater than every other one; target n(x̂). Theory: attention concentrates
                 on x̂ and the model predicts n(x̂).
  closure_only   the determined sentences in which x̂ is above at least one other token v only through the
                 closure: (x̂, v) is not an observed relation of R_q, so deciding the maximum needs at least one
                 transitive step x̂ > w > ... > v (:func:`needs_transitive_step`). The others are decided by
                 pairs observed directly in training.
  noncomparable  the closure leaves the maximum open; x̂ is the token the split chose (the hidden-order
                 maximum when ``orders`` was given, else the leftmost closure-maximal token). No guarantee.

For each part: accuracy (the target logit n(x̂) strictly the largest), attention mass on x̂ (all its copies)
and the mean predicted probability p(n(x̂) | X) = exp(−ℓ). x̂ is recovered as the token whose successor is the
target (unique when the successors are distinguishable, e.g. n a permutation).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import as_int, check_backend
from ..progress import silent
from . import model
from .dataset import Dataset
from .orders import observed_relations, optimal_tokens
from .two_stage import TwoStageResult, prediction_metrics, train
from .unseen import UnseenSplit

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


def evaluate_part(ds: Dataset, W_ov, W_kq, *, backend: str = "numba") -> PartMetrics:
    """:class:`PartMetrics` of W_ov, W_kq [d, d] on the sentences of ``ds`` (x̂ = token with successor = target)."""
    check_backend(backend)
    return _part_metrics(model.prepare(ds), optimal_tokens(ds), W_ov, W_kq, backend)


def _part_metrics(prep: model.Prepared, xhat: np.ndarray, W_ov, W_kq, backend: str) -> PartMetrics:
    """:class:`PartMetrics` on the prepared sentences ``prep`` whose x̂ is ``xhat`` [N] (prepared once by the
    caller, e.g. for every step of a curve)."""
    fw = model.forward(prep, W_ov, W_kq, backend=backend)
    accuracy, mass = prediction_metrics(prep, fw.logits, fw.attn, xhat)
    return PartMetrics(len(xhat), accuracy, mass, float(np.mean(np.exp(-fw.losses))))


def evaluate_unseen(split: UnseenSplit, W_ov, W_kq, *, backend: str = "numba") -> dict[str, PartMetrics | None]:
    """{"determined": PartMetrics | None, "noncomparable": PartMetrics | None} (None for an empty part)."""
    return {part: None if getattr(split, part) is None
            else evaluate_part(getattr(split, part), W_ov, W_kq, backend=backend) for part in PARTS}


def needs_transitive_step(ds: Dataset, part: Dataset) -> np.ndarray:
    """[part.N] bool: sentence i of ``part`` needs a transitive step, i.e. its x̂ (the token whose successor is
    its target) has some other distinct token v of the sentence with (x̂, v) not in R_q, the observed relations
    of the training set ``ds`` for the sentence's query q. On closure-determined sentences (x̂ >_q^ext v for
    every v) these are the ones decided only through the closure."""
    R = observed_relations(ds)
    xhat = optimal_tokens(part)
    queries = part.queries
    return np.array([any((int(xhat[i]), v) not in R.get(int(queries[i]), ()) for v in
                         np.unique(part.sentence(i)).tolist() if v != xhat[i]) for i in range(part.N)], dtype=bool)


def unseen_parts(ds: Dataset, split: UnseenSplit, prefix: str = "") -> dict[str, Dataset | None]:
    """{prefix + "determined", prefix + "closure_only", prefix + "noncomparable"}: the parts of ``split`` (unseen
    sentences of the training set ``ds``) with the closure-only subset of the determined ones; None for an
    empty part."""
    closure_only = None
    if split.determined is not None:
        mask = needs_transitive_step(ds, split.determined)
        closure_only = split.determined.subset(mask) if mask.any() else None
    return {f"{prefix}determined": split.determined, f"{prefix}closure_only": closure_only,
            f"{prefix}noncomparable": split.noncomparable}


@dataclass(frozen=True, eq=False)
class GeneralizationCurve:
    """Generalization metrics over stage-2 training time.

    steps    [n] int64 stage-2 steps t (W_kq after t updates, W_ov frozen)
    curves   {part: {metric: [n] float64}} for part in "train" (the training sentences, x̂ = x*) and the
             parts of the split ("determined", "noncomparable" for an UnseenSplit, else the names given), and
             metric in "accuracy", "attn_max", "p_target"; a part without sentences is absent
    sizes    {part: number of sentences}
    result   the :class:`~ntpref.twostage.two_stage.TwoStageResult` of the run (W_kq snapshots at ``steps``)
    """

    steps: np.ndarray
    curves: dict
    sizes: dict
    result: TwoStageResult


def generalization_curve(ds: Dataset, split: UnseenSplit | Mapping[str, Dataset | None], steps: Sequence[int], *,
                         backend: str = "numba", progress: Callable[[str, int, int], None] = silent,
                         **train_options) -> GeneralizationCurve:
    """Train with :func:`~ntpref.twostage.two_stage.train` on ``ds`` and evaluate the training sentences and the
    parts of ``split`` at every stage-2 step in ``steps`` (0..T). ``split``: an UnseenSplit (its two parts) or
    {name: Dataset | None} (e.g. from :func:`unseen_parts`; None parts are skipped). ``train_options`` go to
    train (eta0, eta, T0, T, direction, ...)."""
    steps = np.unique(as_int("steps", np.asarray(list(steps), dtype=np.int64), (None,), low=0))
    result = train(ds, snapshots=steps.tolist(), backend=backend, progress=progress, **train_options)
    named = {p: getattr(split, p) for p in PARTS} if isinstance(split, UnseenSplit) else dict(split)
    parts = {"train": ds, **{p: part for p, part in named.items() if part is not None}}
    curves = {p: {k: np.empty(steps.size) for k in METRICS} for p in parts}
    prepared = {p: (model.prepare(part), optimal_tokens(part)) for p, part in parts.items()}
    for j, t in enumerate(steps.tolist()):
        for p, (prep, xhat) in prepared.items():
            metrics = _part_metrics(prep, xhat, result.W_ov, result.snapshots[t], backend)
            for k in METRICS:
                curves[p][k][j] = getattr(metrics, k)
    return GeneralizationCurve(steps, curves, {p: part.N for p, part in parts.items()}, result)
