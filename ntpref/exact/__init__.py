"""The exact backend (docs/exact.md): every ``ntpref eval`` output, and the training runs of
``ntpref train``, computed in multiprecision (mpmath, 50 significant digits) by plain Python loops
written from docs/twostage.md and docs/shallow.md, sharing no code with the NumPy and Numba backends.

    evaluate(arrays, as_float=True) -> dict[str, np.ndarray]     the outputs of ``ntpref eval``
    train(arrays, as_float=True) -> dict[str, np.ndarray]        the outputs of ``ntpref train`` (two-stage:
                                                                 without the max-margin solutions and
                                                                 correlations)

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
    """The outputs of ``ntpref train`` for an input dict (docs/contract.md), in multiprecision: two-stage
    W_ov, W_kq, stage1_/stage2_ loss and norm, loss_floor; shallow and IndRNN every output."""
    return _module(arrays).train(arrays, as_float)
