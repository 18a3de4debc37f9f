"""What the two models of paper (2), the shallow transformer (:mod:`ntpref.shallow.model`) and the IndRNN
(:mod:`ntpref.shallow.indrnn`), share: the samples X [n, T, d] and targets y [n], the loss convention, and
the evaluation of a model's two backends (:func:`forward`, :func:`loss_and_grad`, and their ``_checked`` forms
for arguments validated once, as in a training loop), the check of an initialisation's (m, d, seed)
(:func:`check_init`), and :class:`Model`, the record through which the trainer and the file contract handle
either model.

Loss convention (κ ∈ {1, 2}, docs/shallow.md §2): with outputs f [n] and residuals r_j = f_j − y_j,

  loss = (κ / 2n) Σ_j r_j²       κ = 2: the paper's mean squared error (1/n) Σ r²;  κ = 1: half of it,

so that ∂loss/∂f_j = g_j = κ r_j / n exactly, and every gradient a model returns is the exact gradient of
the loss returned with it.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ..checks import as_float, as_scalar, check_backend, require_finite
from ..errors import InputError


def check_X(X, name: str = "X", d: int | None = None) -> np.ndarray:
    """X as float64 [n, T, d] with n, T, d ≥ 1 and finite entries (InputError naming ``name``); tokens of
    dimension ``d`` when given (that of the samples X it goes with)."""
    X = as_float(name, X, (None, None, None))
    if 0 in X.shape:
        raise InputError(f"array '{name}': expected shape [n, T, d] with n, T, d >= 1, got {list(X.shape)}")
    if d is not None and X.shape[2] != d:
        raise InputError(f"array '{name}': token dimension {X.shape[2]} differs from X's d = {d}")
    return X


def check_samples(X, y=None) -> tuple[np.ndarray, np.ndarray | None]:
    """(X [n, T, d], y [n] or None) as float64, finite (:func:`check_X`)."""
    X = check_X(X)
    return X, None if y is None else as_float("y", y, (X.shape[0],))


def check_kappa(kappa) -> float:
    """κ ∈ {1, 2} (the loss scale of the module docstring)."""
    kappa = as_scalar("kappa", kappa)
    if kappa not in (1.0, 2.0):
        raise InputError(f"array 'kappa': must be 1 or 2, got {kappa}")
    return kappa


def check_init(m, d, seed, *, paired: bool) -> tuple[int, int, np.random.Generator]:
    """(m, d, np.random.default_rng(seed)) of an initialisation of m heads (units) for tokens of dimension d:
    m, d ≥ 1 and seed ≥ 0 as integers; m even when ``paired`` (the second half mirrors the first)."""
    m = as_scalar("m", m, kind="int", low=1)
    d = as_scalar("d", d, kind="int", low=1)
    seed = as_scalar("seed", seed, kind="int", low=0)
    if paired and m % 2:
        raise InputError(f"array 'm': paired initialisation needs an even width (the second half mirrors the first), "
                         f"got {m}")
    return m, d, np.random.default_rng(seed)


def loss_from_outputs(f: np.ndarray, y: np.ndarray, kappa: float) -> float:
    """loss = (κ / 2n) Σ_j (f_j − y_j)² for outputs f [n] and targets y [n] (no validation; +inf when the
    residuals overflow, e.g. in a diverging run)."""
    r = f - y
    with np.errstate(over="ignore"):
        return float(kappa / (2.0 * r.shape[0]) * np.sum(r * r))


class Forward(NamedTuple):
    """The result of a model's ``forward``: loss = (κ/2n) Σ_j (f_j − y_j)² (None when the prepared data
    has no targets y) and the outputs f [n]."""
    loss: float | None
    f: np.ndarray


class Model(NamedTuple):
    """One model of paper (2) as the shared evaluation below, the trainer (:mod:`ntpref.shallow.projgd`) and
    the file contract see it.

    name: the model's name in files and results ("shallow" | "indrnn"); prepare_name: the public name of its
    prepare (for errors); prepare(X, y=None, **options): its prepared data, a ``Batch``, whose fields after
    X and y are those options; Params: the parameter type, whose fields are the blocks in call order (each
    [m, ...], head first); check_params(*params, d=): the parameters validated as float64 for tokens of
    dimension d (a Params); outputs(data, params, backend): f [n]; gradients(data, params, kappa, backend):
    (f [n], a Params holding each block's gradient in its field); LossAndGrad: the model's result, fields
    loss, grad_<block> for every block and f;
    logged: the block whose gradient norm the file contract reports; block_shapes: the shape of each block
    (text, in block order)."""
    name: str
    prepare_name: str
    prepare: Callable
    Batch: type
    Params: type
    check_params: Callable
    outputs: Callable
    gradients: Callable
    LossAndGrad: type
    logged: str
    block_shapes: tuple[str, ...]

    @property
    def blocks(self) -> tuple[str, ...]:
        """The parameter names in call order."""
        return self.Params._fields

    @property
    def options(self) -> tuple[str, ...]:
        """The keyword options of ``prepare`` (shallow: tau_att, mask_last_key, activation; indrnn: activation)."""
        return self.Batch._fields[2:]

    def block_gradients(self, result):
        """The gradients of a LossAndGrad ``result`` as a Params, read by name: block b's field holds
        ``result.grad_<b>``."""
        return self.Params(**{b: getattr(result, f"grad_{b}") for b in self.blocks})


def check_data(model: Model, data) -> None:
    """InputError unless ``data`` is the model's prepared data."""
    if not isinstance(data, model.Batch):
        raise InputError(f"data: expected the prepared data of {model.prepare_name}(X, y), got "
                         f"{type(data).__module__}.{type(data).__qualname__}")


def checked_params(model: Model, data, params):
    """``model.check_params(*params, d=)`` for the tokens of ``data`` (X [n, T, d]); when the parameters fit
    d = T instead, the error adds that X looks transposed (the [n, d, T] layout of other code)."""
    n, T, d = data.X.shape
    try:
        return model.check_params(*params, d=d)
    except InputError as exc:
        if T == d:
            raise
        try:
            model.check_params(*params, d=T)
        except InputError:
            raise exc from None
        raise InputError(f"{exc}; X looks transposed: the parameters fit tokens of dimension {T} = X.shape[1] "
                         f"(X is [n, T, d], token t of input j is X[j, t, :]; give an [n, d, T] array as "
                         "X.transpose(0, 2, 1))") from None


def forward(model: Model, data, params, *, kappa, backend) -> Forward:
    """Forward(loss, f) of ``model`` at ``params`` (its parameters in order), all validated here:
    :func:`forward_checked`."""
    check_data(model, data)
    kappa = check_kappa(kappa)
    check_backend(backend)
    return forward_checked(model, data, checked_params(model, data, params), kappa, backend)


def forward_checked(model: Model, data, params, kappa: float, backend: str) -> Forward:
    """:func:`forward` on validated arguments (``params`` from model.check_params), as a training loop calls
    it every step: f refused (NonFiniteError) when not finite; the loss only when ``data`` has targets."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by require_finite below
        f = model.outputs(data, params, backend)
    require_finite(f=f)
    return Forward(None if data.y is None else loss_from_outputs(f, data.y, kappa), f)


def loss_and_grad(model: Model, data, params, *, kappa, backend):
    """model.LossAndGrad(loss, grad_<block>..., f) at ``params``, all validated here (the data must have
    targets): :func:`loss_and_grad_checked`."""
    check_data(model, data)
    kappa = check_kappa(kappa)
    check_backend(backend)
    if data.y is None:
        raise InputError("array 'y': the loss needs targets y [n]")
    return loss_and_grad_checked(model, data, checked_params(model, data, params), kappa, backend)


def loss_and_grad_checked(model: Model, data, params, kappa: float, backend: str):
    """:func:`loss_and_grad` on validated arguments (``params`` from model.check_params, data with targets),
    as a training loop calls it every step; every output refused (NonFiniteError) when not finite."""
    f, grads = model.gradients(data, params, kappa, backend)
    loss = loss_from_outputs(f, data.y, kappa)
    named = {f"grad_{block}": g for block, g in grads._asdict().items()}
    require_finite(f=f, loss=loss, **named)
    return model.LossAndGrad(loss=loss, f=f, **named)
