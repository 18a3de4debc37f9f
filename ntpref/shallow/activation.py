"""Activations σ of paper (2) and their derivatives: one table, :data:`ACTIVATIONS`.

  "tanh": σ(x) = tanh(x),          σ'(x) = 1 − tanh(x)²,          sup |σ''| = 4/(3√3) ≈ 0.770
  "erf":  σ(x) = erf(x/√2),        σ'(x) = √(2/π) exp(−x²/2),     sup |σ''| = √(2/π) e^{−1/2} ≈ 0.484

Each entry (:class:`Activation`) holds the name, the int code the Numba kernels branch on (one compiled
signature serves every activation), the NumPy forms of σ and σ', and ``d2_bound`` ≥ sup |σ''|, which the
float64 tolerance policy's magnitude of σ'(s) uses (M(σ') = |σ'| + d2_bound · M(s)). The Numba scalar
functions :func:`sigma` and :func:`dsigma` have one branch per code and return NaN for a code without one
(a result the contract refuses), never another activation's value. An unknown name is an InputError
(:func:`activation_code`, :func:`activation_name`). Adding an activation: its entry here, its branches in
:func:`sigma` and :func:`dsigma` (tests/test_shallow_model.py checks every entry's kernel forms against
its NumPy forms), its line in docs/shallow.md.
Note: Numba's on-disk cache does not notice edits to this file from kernels in other modules; clear
``__pycache__`` after changing it.
"""
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
from numba import njit

from ..checks import as_scalar
from ..errors import InputError

_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _erf_np(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(np.asarray(x) * _SQRT_HALF)


class Activation(NamedTuple):
    """One activation: ``name``, the kernels' ``code``, ``sigma_np`` / ``dsigma_np`` (NumPy σ and σ' of an
    array) and ``d2_bound`` ≥ sup |σ''| (the tolerance policy's)."""

    name: str
    code: int
    sigma_np: Callable[[np.ndarray], np.ndarray]
    dsigma_np: Callable[[np.ndarray], np.ndarray]
    d2_bound: float


#: name → :class:`Activation`; the bound 1.0 lies above both sup |σ''| (module docstring).
ACTIVATIONS = {a.name: a for a in (
    Activation("tanh", 0, np.tanh, lambda x: 1.0 - np.tanh(x) ** 2, 1.0),
    Activation("erf", 1, _erf_np, lambda x: _SQRT_2_OVER_PI * np.exp(-0.5 * np.asarray(x) ** 2), 1.0),
)}


def activation(name: str) -> Activation:
    """The table entry of an activation name; InputError for an unknown one."""
    if name not in ACTIVATIONS:
        raise InputError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def activation_code(name: str) -> int:
    """The int code of an activation name ("tanh" | "erf"); InputError otherwise."""
    return activation(name).code


def activation_name(activation) -> str:
    """The activation as a str ("tanh" | "erf"; also a 0-d array, as read from a file); InputError otherwise."""
    name = as_scalar("activation", activation, kind="str")
    activation_code(name)
    return name


@njit(cache=True)
def sigma(x, code):
    """σ(x) for activation ``code`` (0 = tanh, 1 = erf(x/√2)); NaN for a code without a branch."""
    if code == 0:
        return math.tanh(x)
    if code == 1:
        return math.erf(x * _SQRT_HALF)
    return math.nan


@njit(cache=True)
def dsigma(x, code):
    """σ'(x) for activation ``code``; NaN for a code without a branch."""
    if code == 0:
        t = math.tanh(x)
        return 1.0 - t * t
    if code == 1:
        return _SQRT_2_OVER_PI * math.exp(-0.5 * x * x)
    return math.nan


def sigma_np(x: np.ndarray, name: str) -> np.ndarray:
    """Vectorised σ for the NumPy backend (the table's form)."""
    return activation(name).sigma_np(x)


def dsigma_np(x: np.ndarray, name: str) -> np.ndarray:
    """Vectorised σ' for the NumPy backend."""
    return activation(name).dsigma_np(x)
