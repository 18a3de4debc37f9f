"""The ``eval`` / ``train`` contract (docs/contract.md) of models "shallow" and "indrnn".

Inputs: ``X`` [n, T, d], ``y`` [n] and the parameter blocks (shallow: ``c`` [m], ``U`` [m, d],
``W`` [m, d, d]; indrnn: ``c`` [m], ``u`` [m], ``W_in`` [m, d]); optional ``kappa`` (2.0) and the
model's options (shallow: ``tau_att`` (1.0), ``mask_last_key`` (False), ``activation`` ("tanh" |
"erf"); indrnn: ``activation``; attention options are not accepted for the RNN).
eval outputs: ``f`` [n], ``loss`` (0-d, = (κ/2n) Σ r²), ``grad_<block>`` per block.
train inputs (in addition): ``eta``, ``steps``, optional ``rho`` [3] (ρ per block; inf = that block
unprojected; absent = no projection), ``X_val`` + ``y_val``, ``batch`` (1 ≤ batch ≤ n) + ``seed`` (ProjSGD).
train outputs: the final blocks, ``train_loss`` [steps], ``val_loss`` [steps] (with validation data),
``grad_norm_W`` (shallow) / ``grad_norm_u`` (indrnn) [steps]. Unknown array names are errors.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..checks import MAX_STEPS, as_float, as_scalar, check_names
from ..progress import silent
from .train import adapter, proj_gd

_OPTION_KINDS = {"kappa": "float", "tau_att": "float", "mask_last_key": "bool", "activation": "str"}
_TRAIN_REQUIRED = ("eta", "steps")
_TRAIN_OPTIONAL = ("rho", "X_val", "y_val", "batch", "seed")


def _parse(model: str, arrays: Mapping[str, np.ndarray], required=(), optional=(), what="eval"):
    """(adapter, X, y, params, kappa, options) after checking the names of ``arrays``."""
    spec = adapter(model)
    required = ("X", "y") + spec.blocks + tuple(required)
    optional = ("kappa",) + spec.options + tuple(optional)
    what = f"{what} input of model {model!r}"
    check_names(arrays, required, optional, what)
    options = {k: as_scalar(k, arrays[k], kind=_OPTION_KINDS[k]) for k in spec.options if k in arrays}
    kappa = as_scalar("kappa", arrays["kappa"]) if "kappa" in arrays else 2.0
    return spec, arrays["X"], arrays["y"], [arrays[b] for b in spec.blocks], kappa, options


def evaluate(model: str, arrays: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, np.ndarray]:
    """``ntpref eval``: f, loss and the gradient of every block."""
    spec, X, y, params, kappa, options = _parse(model, arrays)
    f, loss, *grads = spec.loss_and_grad(spec.batch(X, y, backend=backend, **options), *params, kappa=kappa)
    out = {"f": f, "loss": np.array(loss)}
    out.update({f"grad_{b}": g for b, g in zip(spec.blocks, grads)})
    return out


def train(model: str, arrays: Mapping[str, np.ndarray], backend: str = "numba",
          progress: Callable[[str, int, int], None] = silent) -> dict[str, np.ndarray]:
    """``ntpref train``: ProjGD / ProjSGD from the given parameters; final blocks and per-step logs."""
    spec, X, y, params, kappa, options = _parse(model, arrays, _TRAIN_REQUIRED, _TRAIN_OPTIONAL, "train")
    rho = None
    if "rho" in arrays:
        rho = as_float("rho", arrays["rho"], (len(spec.blocks),), finite=False)
    ints = {k: as_scalar(k, arrays[k], kind="int") for k in ("steps", "batch", "seed") if k in arrays}
    as_scalar("steps", ints["steps"], kind="int", high=MAX_STEPS)
    result = proj_gd(model, X, y, params, eta=as_scalar("eta", arrays["eta"]), rho=rho,
                     X_val=arrays.get("X_val"), y_val=arrays.get("y_val"), kappa=kappa, backend=backend,
                     progress=progress, **ints, **options)
    out = dict(result.params)
    out["train_loss"] = result.train_loss
    if result.val_loss is not None:
        out["val_loss"] = result.val_loss
    out[f"grad_norm_{spec.logged}"] = result.grad_norms[spec.logged]
    return out
