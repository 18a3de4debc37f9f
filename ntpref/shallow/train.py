"""ProjGD and ProjSGD (docs/shallow.md §3) for the transformer ("shallow") and the IndRNN ("indrnn").

  θ(t+1) = Π_Ω(θ(t) − η ∇L(θ(t)))      plain step, no momentum; Ω = per-head balls of radius ρ_b/√m
                                        around θ(0) (:mod:`ntpref.shallow.projection`).

ProjGD uses the full training set. ProjSGD (``batch`` = B, 1 ≤ B ≤ n) draws, at every step, B sample indices
uniformly *with replacement* by ``rng.integers(0, n, size=B)`` from ``np.random.default_rng(seed)``
and steps along the minibatch gradient (loss (κ/2B) Σ_{j∈batch} r_j²), then projects the same way.

Logs per step t = 0..steps−1:
  train_loss[t]  L_train(θ(t)) on the whole training set, before the update (for ProjSGD this is an
                 extra forward pass, so that the log means the same thing for both methods);
  val_loss[t]    L_val(θ(t+1)) after the update (only with validation data);
  grad_norms[b][t]  Frobenius norm of the gradient block b actually used for the step.
The loss is the models' (κ/2n) Σ r² (κ = 2: the paper's mean squared error).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import as_float, as_scalar
from ..errors import InputError, NonFiniteError
from ..progress import silent
from . import model as transformer
from . import indrnn
from .model import check_kappa, check_X, loss_from_outputs
from .projection import head_radii, project


@dataclass(frozen=True)
class ModelAdapter:
    """What the trainer needs to know about a model.

    blocks: parameter names in call order (each [m, ...], head first); options: keyword options of
    ``batch(X, y=None, **options, backend=)``, which validates the data once (a NamedTuple with fields X
    and y, so ProjSGD takes rows of it without validating again); ``forward(batch, *params)``
    gives the outputs f [n] and ``loss_and_grad(batch, *params, kappa=)`` gives (f, loss, *grads) in block
    order; ``logged``: the block whose gradient norm the interchange contract reports.
    """
    name: str
    blocks: tuple[str, ...]
    options: tuple[str, ...]
    batch: Callable
    forward: Callable
    loss_and_grad: Callable
    logged: str


MODELS = {
    "shallow": ModelAdapter("shallow", ("c", "U", "W"), ("tau_att", "mask_last_key", "activation"),
                            transformer.batch, transformer.batch_forward, transformer.batch_loss_and_grad, "W"),
    "indrnn": ModelAdapter("indrnn", ("c", "u", "W_in"), ("activation",),
                           indrnn.rnn_batch, indrnn.rnn_batch_forward, indrnn.rnn_batch_loss_and_grad, "u"),
}


def adapter(model: str) -> ModelAdapter:
    """The :class:`ModelAdapter` of ``model`` ("shallow" | "indrnn")."""
    if model not in MODELS:
        raise InputError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    return MODELS[model]


@dataclass(frozen=True)
class TrainResult:
    """Final parameters (block name → array) and the per-step logs described in the module docstring."""
    model: str
    params: dict[str, np.ndarray]
    train_loss: np.ndarray
    val_loss: np.ndarray | None
    grad_norms: dict[str, np.ndarray]
    final_train_loss: float

    @property
    def min_train_loss(self) -> float:
        """min_t L_train(θ(t)) over the logged (pre-update) losses: the experiments' metric."""
        return float(self.train_loss.min())

    @property
    def final_val_loss(self) -> float | None:
        """L_val(θ(steps)), or None without validation data."""
        return None if self.val_loss is None else float(self.val_loss[-1])


def proj_gd(model: str, X, y, params: Sequence[np.ndarray], *, eta, steps, rho=None, batch=None, seed=None,
            X_val=None, y_val=None, kappa=2.0, backend="numba",
            progress: Callable[[str, int, int], None] = silent, **options) -> TrainResult:
    """ProjGD (``batch=None``) or ProjSGD (``batch`` = B, needs ``seed``) from θ(0) = ``params``.

    params: the model's blocks in order (shallow: c, U, W; indrnn: c, u, W_in); θ(0) is also the centre
    of the projection balls. rho: None (no projection) or one radius ρ_b per block (None / inf = that
    block unprojected). options: the model's keyword options (shallow: tau_att, mask_last_key,
    activation; indrnn: activation). progress(label, done, total) is called after every step.
    """
    spec = adapter(model)
    unknown = sorted(set(options) - set(spec.options))
    if unknown:
        raise InputError(f"model {model!r}: unknown option '{unknown[0]}'; allowed: {', '.join(spec.options)}")
    kappa = check_kappa(kappa)
    eta = as_scalar("eta", eta, low=0.0, low_open=True)
    steps = as_scalar("steps", steps, kind="int", low=1)
    data = spec.batch(X, y, backend=backend, **options)      # X, y and the options, validated once
    n = data.X.shape[0]
    if len(params) != len(spec.blocks):
        raise InputError(f"model {model!r}: expected {len(spec.blocks)} parameter blocks "
                         f"({', '.join(spec.blocks)}), got {len(params)}")
    theta = tuple(as_float(name, p, (None,) if b == 0 else None)
                  for b, (name, p) in enumerate(zip(spec.blocks, params)))
    m = theta[0].shape[0]
    if m == 0:
        raise InputError(f"array '{spec.blocks[0]}': expected at least one head, got shape [0]")
    radii = head_radii(rho, m, len(spec.blocks))
    if (X_val is None) != (y_val is None):
        raise InputError("validation data needs both 'X_val' and 'y_val'")
    val = None
    if X_val is not None:
        X_val = check_X(X_val, "X_val")
        if X_val.shape[2] != data.X.shape[2]:
            raise InputError(f"array 'X_val': tokens have dimension {X_val.shape[2]}, X has {data.X.shape[2]}")
        val = spec.batch(X_val, as_float("y_val", y_val, (X_val.shape[0],)), backend=backend, **options)
    if batch is None:
        if seed is not None:
            raise InputError("array 'seed': only used by ProjSGD (give 'batch' too, or drop 'seed')")
        rng, label = None, f"{model} ProjGD"
    else:
        batch = as_scalar("batch", batch, kind="int", low=1)
        if batch > n:
            raise InputError(f"array 'batch': must be between 1 and n = {n} (the number of training samples), "
                             f"got {batch}")
        if seed is None:
            raise InputError("ProjSGD ('batch' given) needs 'seed'")
        rng, label = np.random.default_rng(as_scalar("seed", seed, kind="int", low=0)), f"{model} ProjSGD"

    def loss_at(b, th):
        return loss_from_outputs(spec.forward(b, *th), b.y, kappa)

    centre = tuple(p.copy() for p in theta)
    train_loss = np.empty(steps)
    val_loss = None if val is None else np.empty(steps)
    norms = np.empty((len(spec.blocks), steps))
    for t in range(steps):
        try:
            with np.errstate(over="ignore", invalid="ignore"):  # divergence is reported just below
                if rng is None:
                    _, train_loss[t], *grads = spec.loss_and_grad(data, *theta, kappa=kappa)
                else:
                    idx = rng.integers(0, n, size=batch)
                    mini = data._replace(X=data.X[idx], y=data.y[idx])   # rows of validated data
                    _, _, *grads = spec.loss_and_grad(mini, *theta, kappa=kappa)
                    train_loss[t] = loss_at(data, theta)
                for b, g in enumerate(grads):
                    norms[b, t] = math.sqrt(np.sum(g * g))
                theta = project([p - eta * g for p, g in zip(theta, grads)], centre, radii)
        except NonFiniteError:
            train_loss[t] = math.inf
        if not (np.isfinite(train_loss[t]) and all(np.isfinite(p).all() for p in theta)):
            raise InputError(f"training diverged at step {t}: non-finite loss or parameters "
                             f"(eta = {eta} too large?)")
        if val_loss is not None:
            val_loss[t] = loss_at(val, theta)
        progress(label, t + 1, steps)
    return TrainResult(model, dict(zip(spec.blocks, theta)), train_loss, val_loss,
                       dict(zip(spec.blocks, norms)), loss_at(data, theta))
