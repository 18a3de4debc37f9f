"""The readout f = m^{-1/2} Σ_i c_i h_i of the shallow transformer (h_i = σ(s_i), docs/shallow.md §1) and
of the IndRNN (h_i = h_{T,i}, docs/shallow.md §6), for the Numba kernels (:func:`readout`) and the NumPy
backends (:func:`readout_np`).

Summation order (both functions): with half = ⌊m/2⌋, head i is paired with head i + half and each pair
c_i h_i + c_{i+half} h_{i+half} is formed first; the pair sums are then added (:func:`readout`: left to
right from 0.0; :func:`readout_np`: by ``np.sum`` over the heads), then the last head when m is odd, and
the total is divided by √m. The paired initialisation (heads half.. copy heads ..half with c flipped)
makes every pair x + (−x) = +0 exactly, so f = 0 exactly, not merely up to rounding.

Note: Numba's on-disk cache does not notice edits to this file from the kernels that call
:func:`readout`; clear the ``__pycache__`` directories after changing it.
"""
import math

import numpy as np
from numba import njit


@njit(cache=True, error_model="numpy")
def readout(c, h):
    """f = m^{-1/2} Σ_i c_i h_i for one sample: c [m], h [m] (module docstring for the order)."""
    m = c.shape[0]
    half = m // 2
    f = 0.0
    for i in range(half):
        f += c[i] * h[i] + c[i + half] * h[i + half]
    for i in range(2 * half, m):
        f += c[i] * h[i]
    return f / math.sqrt(m)


def readout_np(c: np.ndarray, H: np.ndarray) -> np.ndarray:
    """f [n] = m^{-1/2} Σ_i c_i H[:, i] for c [m], H [n, m] (module docstring for the order)."""
    m = c.shape[0]
    half = m // 2
    ch = c * H
    return ((ch[:, :half] + ch[:, half:2 * half]).sum(axis=1) + ch[:, 2 * half:].sum(axis=1)) / math.sqrt(m)
