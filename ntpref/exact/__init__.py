"""The exact backend (docs/exact.md): every ``ntpref eval`` output, and the training runs of
``ntpref train``, computed in multiprecision (mpmath, 50 significant digits) by plain Python loops
written from docs/twostage.md and docs/shallow.md, sharing no code with the NumPy and Numba backends.

    evaluate(arrays, as_float=True) -> dict[str, np.ndarray]     the outputs of ``ntpref eval``
    train(arrays, as_float=True) -> dict[str, np.ndarray]        the outputs of ``ntpref train``, the
                                                                 two-stage max-margin solutions and
                                                                 correlations included
    compute(kind, arrays, as_float=True) -> dict[str, np.ndarray]
        everything it computes of a stored case of kind "eval" | "train" | "ntk" (the shallow
        transformer's NTK Gram matrix): the outputs and the intermediates kept beside them

Each model's module (:data:`MODELS`) also lists ``KINDS`` and ``INTERMEDIATES`` (kind → function),
``STEPS`` (the inputs counting a train run's updates), ``NOT_COMPUTED`` (the oracle's outputs it does not
compute, name → why) and ``IGNORED`` (the inputs it does not read, name → what it does instead).

``arrays`` is the input dict of :func:`ntpref.oracle.contract.evaluate` / ``train`` (a 0-d string
``model`` and the model's arrays), expected to be valid (the oracle validates it). The outputs have the
oracle's names and shapes: float64, each entry the nearest float64 to the multiprecision value, or with
``as_float=False`` object arrays of the ``mpmath.mpf`` values themselves (to measure a float64 result's
error without a second rounding). The caller's mpmath context is left as it was.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..checks import as_scalar
from ..errors import InputError
from . import indrnn, shallow, twostage

MODELS = {"twostage": twostage, "shallow": shallow, "indrnn": indrnn}


def _module(arrays: Mapping[str, np.ndarray]):
    model = as_scalar("model", arrays["model"], kind="str")
    if model not in MODELS:
        raise InputError(f"array 'model': unknown model {model!r}; known: {', '.join(MODELS)}")
    return MODELS[model]


def evaluate(arrays: Mapping[str, np.ndarray], as_float: bool = True) -> dict[str, np.ndarray]:
    """The outputs of ``ntpref eval`` for an input dict (docs/contract.md), in multiprecision."""
    return _module(arrays).evaluate(arrays, as_float)


def train(arrays: Mapping[str, np.ndarray], as_float: bool = True) -> dict[str, np.ndarray]:
    """The outputs of ``ntpref train`` for an input dict (docs/contract.md), in multiprecision, every output
    of every model (two-stage: W_ov, W_kq, W_ov_star, W_kq_star, loss_floor, stage1_/stage2_ loss, norm and
    corr)."""
    return _module(arrays).train(arrays, as_float)


def compute(kind: str, arrays: Mapping[str, np.ndarray], as_float: bool = True) -> dict[str, np.ndarray]:
    """Every value the exact backend computes for a case of ``kind`` ("eval" | "train" | a model's extra kind,
    "ntk" of the shallow transformer): the outputs, then the intermediates stored beside them (the shallow
    transformer's head_s, head_a, head_MU of an eval or ntk case). InputError for a kind the model lacks."""
    module = _module(arrays)
    if kind not in module.KINDS:
        raise InputError(f"kind must be one of {', '.join(module.KINDS)} for this model, got {kind!r}")
    extra = module.INTERMEDIATES[kind](arrays, as_float) if kind in module.INTERMEDIATES else {}
    return {**module.KINDS[kind](arrays, as_float), **extra}
