"""Activations σ of paper (2) and their derivatives, as Numba scalar functions selected by an int code.

  "tanh": σ(x) = tanh(x),          σ'(x) = 1 − tanh(x)²
  "erf":  σ(x) = erf(x/√2),        σ'(x) = √(2/π) exp(−x²/2)

Kernels take the code (an int, so one compiled signature serves both) from :func:`activation_code`;
:func:`activation_name` validates a user's choice.
Note: Numba's on-disk cache does not notice edits to this file from kernels in other modules; clear
``__pycache__`` after changing it.
"""
import math

import numpy as np
from numba import njit

from ..checks import as_scalar
from ..errors import InputError

ACTIVATIONS = {"tanh": 0, "erf": 1}
_SQRT_HALF = math.sqrt(0.5)
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def activation_code(name: str) -> int:
    """The int code of an activation name ("tanh" | "erf"); InputError otherwise."""
    if name not in ACTIVATIONS:
        raise InputError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")
    return ACTIVATIONS[name]


def activation_name(activation) -> str:
    """The activation as a str ("tanh" | "erf"; also a 0-d array, as read from a file); InputError otherwise."""
    name = as_scalar("activation", activation, kind="str")
    activation_code(name)
    return name


@njit(cache=True)
def sigma(x, code):
    """σ(x) for activation ``code`` (0 = tanh, 1 = erf(x/√2))."""
    if code == 0:
        return math.tanh(x)
    return math.erf(x * _SQRT_HALF)


@njit(cache=True)
def dsigma(x, code):
    """σ'(x) for activation ``code``."""
    if code == 0:
        t = math.tanh(x)
        return 1.0 - t * t
    return _SQRT_2_OVER_PI * math.exp(-0.5 * x * x)


def sigma_np(x: np.ndarray, name: str) -> np.ndarray:
    """Vectorised σ for the NumPy backend (same formulas)."""
    if activation_code(name) == 0:
        return np.tanh(x)
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(np.asarray(x) * _SQRT_HALF)


def dsigma_np(x: np.ndarray, name: str) -> np.ndarray:
    """Vectorised σ' for the NumPy backend."""
    if activation_code(name) == 0:
        return 1.0 - np.tanh(x) ** 2
    return _SQRT_2_OVER_PI * np.exp(-0.5 * np.asarray(x) ** 2)
