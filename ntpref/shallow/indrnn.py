"""The diagonal RNN (IndRNN, Cayci & Eryilmaz) baseline of paper (2), docs/shallow.md §6.

Model (sample X = [x_1 .. x_T], x_t ∈ R^d; m units; σ = tanh or erf(x/√2))::

    h_0 = 0,   p_t = W_in x_t + u ⊙ h_{t−1},   h_t = σ(p_t)          (t = 1..T)
    f(X) = m^{−1/2} Σ_i c_i h_{T,i}

Loss over n samples, residual r_j = f(X_j) − y_j, with κ ∈ {1, 2}::

    loss = (κ/2n) Σ_j r_j²             κ = 2: the mean squared error (the paper's loss);
                                       κ = 1: half the mean squared error
    g_j  = κ r_j / n                   so that ∂loss/∂f_j = g_j exactly for both values of κ

(the convention, validation of κ and X, and loss formula are shared with the transformer in
:mod:`ntpref.shallow.model`).

Backprop through time in closed form, per unit i (and summed over samples j)::

    δ_T = g c_i / √m
    for t = T..1:  ε_t = δ_t σ'(p_t);  ∂W_in_i += ε_t x_t;  ∂u_i += ε_t h_{t−1};  δ_{t−1} = ε_t u_i
    ∂c_i = m^{−1/2} Σ_j g_j h_{T,i}

Shapes: X [n, T, d] (row t is token x_t), y [n], c [m], u [m], W_in [m, d].

Two backends with the same validation: ``"numpy"`` (vectorised over samples and units, a Python loop
over time only; reads like the equations above) and ``"numba"``
(:mod:`ntpref.shallow.indrnn_kernels`: parallel over fixed blocks of samples, each block writing its own
gradient slot, then a serial reduction over the blocks in order: bitwise identical results for any
number of threads).

Summation order of the readout: unit i and unit i + ⌊m/2⌋ are added first (then the pairs in order,
then the last unit when m is odd), so the paired initialisation of :func:`rnn_paired_init` gives
f = 0 exactly, not merely up to rounding.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..checks import as_float, as_scalar, check_backend, require_finite
from ..errors import InputError
from . import indrnn_kernels
from .activation import activation_code, dsigma_np, sigma_np
from .model import check_kappa, check_X, loss_from_outputs


# --------------------------------------------------------------------------------------------------
# Validation (shared by both backends)
# --------------------------------------------------------------------------------------------------

class RNNBatch(NamedTuple):
    """Validated data of the IndRNN, from :func:`rnn_batch`: X [n, T, d] float64, y [n] or None, the
    activation name and code, the backend. A trainer validates its data once and then calls
    :func:`rnn_batch_forward` / :func:`rnn_batch_loss_and_grad` every step with new parameters."""
    X: np.ndarray
    y: np.ndarray | None
    activation: str
    code: int
    backend: str


def rnn_batch(X, y=None, *, activation="tanh", backend="numba") -> RNNBatch:
    """Validate X [n, T, d] (finite), y [n] (optional), the activation and the backend once."""
    check_backend(backend)
    code = activation_code(as_scalar("activation", activation, kind="str"))
    X = check_X(X)
    if y is not None:
        y = as_float("y", y, (X.shape[0],))
    return RNNBatch(X, y, activation, code, backend)


def _check_params(b: RNNBatch, c, u, W_in):
    """(c [m], u [m], W_in [m, d]) as float64, checked against the batch's d."""
    c = as_float("c", c, (None,))
    m = c.shape[0]
    if m == 0:
        raise InputError("array 'c': expected at least one unit (m >= 1), got shape [0]")
    return c, as_float("u", u, (m,)), as_float("W_in", W_in, (m, b.X.shape[2]))


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------

def rnn_batch_forward(b: RNNBatch, c, u, W_in) -> np.ndarray:
    """:func:`rnn_forward` on a validated :class:`RNNBatch`."""
    c, u, W_in = _check_params(b, c, u, W_in)
    if b.backend == "numpy":
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by require_finite below
            f = _readout_np(c, _hidden_np(b.X, u, W_in, b.activation)[-1])
    else:
        f = np.empty(b.X.shape[0])
        indrnn_kernels.forward_kernel(b.X, c, u, np.ascontiguousarray(W_in.T), b.code, f)
    require_finite(f=f)
    return f


def rnn_batch_loss_and_grad(b: RNNBatch, c, u, W_in, *, kappa=2.0):
    """:func:`rnn_loss_and_grad` on a validated :class:`RNNBatch` (with y)."""
    kappa = check_kappa(kappa)
    if b.y is None:
        raise InputError("array 'y': the loss needs targets y [n]")
    c, u, W_in = _check_params(b, c, u, W_in)
    X, y = b.X, b.y
    if b.backend == "numpy":
        f, grad_c, grad_u, grad_W_in = _loss_grad_np(X, y, c, u, W_in, kappa, b.activation)
    else:
        n, _, d = X.shape
        m = c.shape[0]
        f, grad_c, grad_u, grad_WT = np.empty(n), np.empty(m), np.empty(m), np.empty((d, m))
        indrnn_kernels.loss_grad_kernel(X, y, c, u, np.ascontiguousarray(W_in.T), b.code, kappa, f, grad_c, grad_u,
                                        grad_WT)
        grad_W_in = np.ascontiguousarray(grad_WT.T)
    loss = loss_from_outputs(f, y, kappa)
    require_finite(f=f, loss=loss, grad_c=grad_c, grad_u=grad_u, grad_W_in=grad_W_in)
    return f, loss, grad_c, grad_u, grad_W_in


def rnn_forward(X, c, u, W_in, *, activation="tanh", backend="numba") -> np.ndarray:
    """f [n]: the IndRNN output m^{−1/2} Σ_i c_i h_{T,i} for every sample of X [n, T, d].

    c [m], u [m], W_in [m, d]; activation "tanh" | "erf"; backend "numba" | "numpy".
    """
    return rnn_batch_forward(rnn_batch(X, activation=activation, backend=backend), c, u, W_in)


def rnn_loss_and_grad(X, y, c, u, W_in, *, kappa=2.0, activation="tanh", backend="numba"):
    """(f [n], loss, grad_c [m], grad_u [m], grad_W_in [m, d]) of loss = (κ/2)(1/n) Σ_j (f_j − y_j)².

    κ = 2 (default) is the mean squared error; κ = 1 is half of it. The gradients are the exact
    gradients of the returned loss (output gradient g_j = κ r_j / n), by closed-form BPTT.
    """
    return rnn_batch_loss_and_grad(rnn_batch(X, y, activation=activation, backend=backend), c, u, W_in,
                                   kappa=kappa)


def rnn_paired_init(m, d, seed):
    """(c [m], u [m], W_in [m, d]): paired initialisation, so f ≡ 0 at init (docs/shallow.md §6).

    For i < m/2: W_in_i ~ N(0, I_d), u_i = ±1.5 and c_i = ±1 with independent fair signs; the second
    half (rows m/2..m−1) copies W_in and u and flips c. m must be even. Draws, from
    ``np.random.default_rng(seed)`` in this order: W_in half, u signs, c signs.
    """
    m = as_scalar("m", m, kind="int", low=2)
    if m % 2:
        raise InputError(f"array 'm': paired initialisation needs an even width, got {m}")
    d = as_scalar("d", d, kind="int", low=1)
    seed = as_scalar("seed", seed, kind="int", low=0)
    rng = np.random.default_rng(seed)
    half = m // 2
    W_half = rng.standard_normal((half, d))
    u_half = 1.5 * (2.0 * rng.integers(0, 2, half) - 1.0)
    c_half = 2.0 * rng.integers(0, 2, half) - 1.0
    W_in = np.ascontiguousarray(np.concatenate([W_half, W_half]))
    u = np.concatenate([u_half, u_half])
    c = np.concatenate([c_half, -c_half])
    return c, u, W_in


# --------------------------------------------------------------------------------------------------
# NumPy backend
# --------------------------------------------------------------------------------------------------

def _hidden_np(X, u, W_in, activation):
    """H [T+1, n, m]: H[t] = h_t for every sample (H[0] = 0)."""
    n, T, _ = X.shape
    H = np.zeros((T + 1, n, u.shape[0]))
    for t in range(T):
        H[t + 1] = sigma_np(X[:, t] @ W_in.T + u * H[t], activation)
    return H


def _readout_np(c, h_T):
    """f = m^{−1/2} Σ_i c_i h_{T,i}, pairs (i, i + ⌊m/2⌋) added first (module docstring)."""
    m = c.shape[0]
    half = m // 2
    pairs = h_T[:, :half] * c[:half] + h_T[:, half:2 * half] * c[half:2 * half]
    s = pairs.sum(axis=1)
    if m % 2:
        s = s + h_T[:, -1] * c[-1]
    return s / math.sqrt(m)


def _loss_grad_np(X, y, c, u, W_in, kappa, activation):
    """(f, grad_c, grad_u, grad_W_in) by the BPTT of the module docstring, all samples at once."""
    n, T, _ = X.shape
    sqrt_m = math.sqrt(c.shape[0])
    H = _hidden_np(X, u, W_in, activation)
    f = _readout_np(c, H[T])
    g = kappa * (f - y) / n
    grad_c = H[T].T @ g / sqrt_m
    grad_u = np.zeros_like(u)
    grad_W_in = np.zeros_like(W_in)
    delta = g[:, None] * c / sqrt_m                          # δ_T [n, m]
    for t in range(T - 1, -1, -1):                           # step t + 1 of the recurrence
        p = X[:, t] @ W_in.T + u * H[t]                      # p_{t+1}, recomputed from h_t
        eps = delta * dsigma_np(p, activation)
        grad_W_in += eps.T @ X[:, t]
        grad_u += (eps * H[t]).sum(axis=0)
        delta = eps * u
    return f, grad_c, grad_u, grad_W_in
