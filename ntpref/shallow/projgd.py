"""ProjGD and ProjSGD (docs/shallow.md §3) for the transformer ("shallow") and the IndRNN ("indrnn").

  θ(t+1) = Π_Ω(θ(t) − η ∇L(θ(t)))      plain step, no momentum; Ω = per-head balls of radius ρ_b/√m
                                        around θ(0) (:mod:`ntpref.shallow.projection`).

:func:`train` takes prepared data (a :class:`ntpref.shallow.model.Batch` or an
:class:`ntpref.shallow.indrnn.Batch`: the type says which model is trained, the data carries its options)
and the initial parameters. ProjGD uses the full training set. ProjSGD (``batch_size`` = B, 1 ≤ B ≤ n)
draws, at every step, B sample indices uniformly *with replacement* by ``rng.integers(0, n, size=B)``
from ``np.random.default_rng(seed)`` and steps along the minibatch gradient (loss (κ/2B) Σ_{j∈batch} r_j²),
then projects the same way.

Logs per step t = 0..steps−1:
  train_loss[t]  L_train(θ(t)) on the whole training set, before the update (for ProjSGD this is an
                 extra forward pass, so that the log means the same thing for both methods);
  val_loss[t]    L_val(θ(t+1)) after the update (only with validation data);
  grad_norms[b][t]  Frobenius norm of the gradient block b actually used for the step;
  projected[b][t]   the number of heads of block b whose value the projection changed at that step (heads
                 inside their ball are kept bit for bit, so all zeros means θ(t+1) = θ(t) − η g exactly:
                 the run is plain (S)GD up to that step).
``snapshots`` (steps 0 ≤ t ≤ steps) keeps the iterates θ(t) themselves.
The loss is the models' (κ/2n) Σ r² (κ = 2: the paper's mean squared error).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import as_scalar, check_backend, require_sequence, step_set
from ..errors import InputError, NonFiniteError
from ..progress import silent
from . import indrnn
from . import model as transformer
from .evaluation import Model, check_kappa, checked_params, forward_checked, loss_and_grad_checked
from .projection import head_radii, project


MODELS = {spec.name: spec for spec in (transformer.MODEL, indrnn.MODEL)}


def model_named(name: str) -> Model:
    """The :class:`ntpref.shallow.evaluation.Model` called ``name`` ("shallow" | "indrnn")."""
    if name not in MODELS:
        raise InputError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[name]


def model_of(data) -> Model:
    """The :class:`ntpref.shallow.evaluation.Model` of prepared data, by its type."""
    for spec in MODELS.values():
        if isinstance(data, spec.Batch):
            return spec
    raise InputError(f"data: expected prepared data ({' or '.join(s.prepare_name for s in MODELS.values())}), "
                     f"got {type(data).__module__}.{type(data).__qualname__}")


def check_minibatch(batch_size, seed, n: int, names=("batch_size", "seed")) -> tuple[int | None, int | None]:
    """(B, seed) of ProjSGD, 1 ≤ B ≤ n and seed ≥ 0, or (None, None) for ProjGD; a seed without a batch
    size, or the converse, is an error. ``names`` name the two arguments in errors."""
    b, s = names
    if batch_size is None:
        if seed is not None:
            raise InputError(f"array '{s}': only used by ProjSGD (give '{b}' too, or drop '{s}')")
        return None, None
    batch_size = as_scalar(b, batch_size, kind="int", low=1)
    if batch_size > n:
        raise InputError(f"array '{b}': must be between 1 and n = {n} (the number of training samples), "
                         f"got {batch_size}")
    if seed is None:
        raise InputError(f"ProjSGD ('{b}' given) needs '{s}'")
    return batch_size, as_scalar(s, seed, kind="int", low=0)


@dataclass(frozen=True)
class TrainResult:
    """Final parameters (block name → array), the per-step logs described in the module docstring and the
    kept iterates (step → block name → array); model: "shallow" | "indrnn"."""
    model: str
    params: dict[str, np.ndarray]
    train_loss: np.ndarray
    val_loss: np.ndarray | None
    grad_norms: dict[str, np.ndarray]
    final_train_loss: float
    projected: dict[str, np.ndarray]
    snapshots: dict[int, dict[str, np.ndarray]]

    @property
    def min_train_loss(self) -> float:
        """min_t L_train(θ(t)) over the logged (pre-update) losses: the experiments' metric."""
        return float(self.train_loss.min())

    @property
    def final_val_loss(self) -> float | None:
        """L_val(θ(steps)), or None without validation data."""
        return None if self.val_loss is None else float(self.val_loss[-1])


def _check_val(spec: Model, data, val):
    """The validation data: prepared data of the same model and options as ``data``, with targets."""
    if not isinstance(val, spec.Batch):
        raise InputError(f"val: expected prepared data of the same model as data ({spec.name}), got "
                         f"{type(val).__module__}.{type(val).__qualname__}")
    if val.y is None:
        raise InputError("val: the validation loss needs targets y")
    if val.X.shape[2] != data.X.shape[2]:
        raise InputError(f"val: token dimension {val.X.shape[2]} differs from data's d = {data.X.shape[2]}")
    differ = [k for k in spec.options if getattr(val, k) != getattr(data, k)]
    if differ:
        k = differ[0]
        raise InputError(f"val: prepared with {k} = {getattr(val, k)!r}, data with {k} = {getattr(data, k)!r}")
    return val


def train(data, params: Sequence[np.ndarray], *, eta, steps, rho=None, batch_size=None, seed=None, val=None,
          kappa=2.0, backend="numba", snapshots: Sequence[int] = (),
          progress: Callable[[str, int, int], None] = silent) -> TrainResult:
    """ProjGD (``batch_size`` None) or ProjSGD (``batch_size`` = B, needs ``seed``) from θ(0) = ``params``.

    data: prepared training data with targets (``ntpref.shallow.prepare`` trains the transformer,
    ``ntpref.shallow.indrnn.prepare`` the IndRNN); params: the model's blocks in order (transformer: c, U, W;
    IndRNN: c, u, W_in); θ(0) is also the centre of the projection balls. rho: None (no projection) or one
    radius ρ_b per block (None / inf = that block unprojected). val: prepared validation data of the same
    model and options. snapshots: steps t (0 ≤ t ≤ steps) whose iterates θ(t) the result keeps
    (``snapshots[t]``, block name → array). progress(label, done, total) is called after every step.
    """
    spec = model_of(data)
    kappa = check_kappa(kappa)
    check_backend(backend)
    eta = as_scalar("eta", eta, low=0.0, low_open=True)
    steps = as_scalar("steps", steps, kind="int", low=1)
    if data.y is None:
        raise InputError("array 'y': training needs targets y [n]")
    n = data.X.shape[0]
    require_sequence("params", params, f"the parameter blocks ({', '.join(spec.blocks)})")
    if len(params) != len(spec.blocks):
        raise InputError(f"model {spec.name!r}: expected {len(spec.blocks)} parameter blocks "
                         f"({', '.join(spec.blocks)}), got {len(params)}")
    theta = checked_params(spec, data, params)   # validated once: the steps call the checked forms
    radii = head_radii(rho, theta[0].shape[0], len(spec.blocks))
    if val is not None:
        val = _check_val(spec, data, val)
    batch_size, seed = check_minibatch(batch_size, seed, n)
    keep = step_set("snapshots", snapshots, steps)
    rng = None if batch_size is None else np.random.default_rng(seed)
    label = f"{spec.name} {'ProjGD' if rng is None else 'ProjSGD'}"

    centre = tuple(p.copy() for p in theta)
    train_loss = np.empty(steps)
    val_loss = None if val is None else np.empty(steps)
    norms = np.empty((len(spec.blocks), steps))
    projected = np.zeros((len(spec.blocks), steps), dtype=np.int64)
    kept = {}

    def snapshot(t):
        if t in keep:
            kept[t] = dict(zip(spec.blocks, (p.copy() for p in theta)))

    for t in range(steps):
        snapshot(t)
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported just below
                if rng is None:
                    result = loss_and_grad_checked(spec, data, theta, kappa, backend)
                    train_loss[t] = result.loss
                else:
                    idx = rng.integers(0, n, size=batch_size)
                    mini = data._replace(X=data.X[idx], y=data.y[idx])   # rows of prepared data
                    result = loss_and_grad_checked(spec, mini, theta, kappa, backend)
                    train_loss[t] = forward_checked(spec, data, theta, kappa, backend).loss
                grads = spec.block_gradients(result)
                for b, g in enumerate(grads):
                    norms[b, t] = math.sqrt(np.sum(g * g))
                stepped = [p - eta * g for p, g in zip(theta, grads)]
                theta = spec.Params(*project(stepped, centre, radii))
                for b, (after, before) in enumerate(zip(theta, stepped)):
                    projected[b, t] = np.count_nonzero((after != before).reshape(len(after), -1).any(axis=1))
        except NonFiniteError:
            train_loss[t] = math.inf
        if not (np.isfinite(train_loss[t]) and all(np.isfinite(p).all() for p in theta)):
            raise InputError(f"training diverged at step {t}: non-finite loss or parameters "
                             f"(eta = {eta} too large?)")
        if val_loss is not None:
            val_loss[t] = forward_checked(spec, val, theta, kappa, backend).loss
        progress(label, t + 1, steps)
    snapshot(steps)
    return TrainResult(spec.name, dict(zip(spec.blocks, theta)), train_loss, val_loss,
                       dict(zip(spec.blocks, norms)), forward_checked(spec, data, theta, kappa, backend).loss,
                       dict(zip(spec.blocks, projected)), {t: kept[t] for t in sorted(kept)})
