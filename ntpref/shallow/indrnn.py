"""The diagonal RNN (IndRNN, Cayci & Eryilmaz) baseline of paper (2), docs/shallow.md §6.

Model (sample X = [x_1 .. x_T], x_t ∈ R^d; m units; σ = tanh or erf(x/√2))::

    h_0 = 0,   p_t = W_in x_t + u ⊙ h_{t−1},   h_t = σ(p_t)          (t = 1..T)
    f(X) = m^{−1/2} Σ_i c_i h_{T,i}

Loss over n samples, residual r_j = f(X_j) − y_j, with κ ∈ {1, 2}: loss = (κ/2n) Σ_j r_j² and
g_j = κ r_j / n = ∂loss/∂f_j (the convention of :mod:`ntpref.shallow.evaluation`, shared with the
transformer).

Backprop through time in closed form, per unit i (and summed over samples j)::

    δ_T = g c_i / √m
    for t = T..1:  ε_t = δ_t σ'(p_t);  ∂W_in_i += ε_t x_t;  ∂u_i += ε_t h_{t−1};  δ_{t−1} = ε_t u_i
    ∂c_i = m^{−1/2} Σ_j g_j h_{T,i}

Shapes: X [n, T, d] (row t is token x_t), y [n], c [m], u [m], W_in [m, d].

API (the transformer's shape, :mod:`ntpref.shallow.model`): :func:`prepare` validates X, y and the
activation once (:class:`Batch`); :func:`forward` and :func:`loss_and_grad` take the prepared data, the
parameters (c, u, W_in) and the backend: ``"numpy"`` (vectorised over samples and units, a Python loop
over time only; reads like the equations above) or ``"numba"`` (:mod:`ntpref.shallow.indrnn_kernels`:
parallel over fixed blocks of samples, each block writing its own gradient slot, then a serial reduction
over the blocks in order: bitwise identical results for any number of threads). :func:`paired_init`
draws :class:`Params`; :func:`hidden_states` gives every h_t.

The readout sums in the pair order of :mod:`ntpref.shallow.readout`, so the paired initialisation of
:func:`paired_init` gives f = 0 exactly, not merely up to rounding.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..checks import as_float
from ..errors import InputError
from . import evaluation, indrnn_kernels
from .activation import activation_code, activation_name, dsigma_np, sigma_np
from .evaluation import Forward
from .readout import readout_np

__all__ = ["Batch", "Params", "Forward", "LossAndGrad", "prepare", "forward", "loss_and_grad", "paired_init",
           "hidden_states"]


class Batch(NamedTuple):
    """Prepared data of the IndRNN, from :func:`prepare`: X [n, T, d] float64 (finite), y [n] or None and
    the activation name ("tanh" | "erf")."""
    X: np.ndarray
    y: np.ndarray | None
    activation: str


class Params(NamedTuple):
    """The IndRNN's parameters in call order: c [m], u [m], W_in [m, d]."""
    c: np.ndarray
    u: np.ndarray
    W_in: np.ndarray


class LossAndGrad(NamedTuple):
    """loss = (κ/2n) Σ r², its gradients grad_c [m], grad_u [m], grad_W_in [m, d], and f [n]."""
    loss: float
    grad_c: np.ndarray
    grad_u: np.ndarray
    grad_W_in: np.ndarray
    f: np.ndarray


def prepare(X, y=None, *, activation="tanh") -> Batch:
    """Validate X [n, T, d] (finite), y [n] (optional) and the activation once (:class:`Batch`). A training
    loop prepares its data once and then calls :func:`forward` / :func:`loss_and_grad` every step."""
    activation = activation_name(activation)
    X, y = evaluation.check_samples(X, y)
    return Batch(X, y, activation)


def check_params(c, u, W_in, *, d: int) -> Params:
    """(c [m], u [m], W_in [m, d]) as float64 for tokens of dimension d, m ≥ 1 units (from c)."""
    c = as_float("c", c, (None,))
    m = c.shape[0]
    if m == 0:
        raise InputError("array 'c': expected at least one unit (m >= 1), got shape [0]")
    return Params(c, as_float("u", u, (m,)), as_float("W_in", W_in, (m, d)))


def _outputs(data: Batch, p: Params, backend: str) -> np.ndarray:
    """f [n] = m^{−1/2} Σ_i c_i h_{T,i}."""
    if backend == "numpy":
        return readout_np(p.c, _hidden_np(data.X, p.u, p.W_in, data.activation)[-1])
    f = np.empty(data.X.shape[0])
    indrnn_kernels.forward_kernel(data.X, p.c, p.u, np.ascontiguousarray(p.W_in.T), activation_code(data.activation),
                                  f)
    return f


def _gradients(data: Batch, p: Params, kappa: float, backend: str):
    """(f [n], Params(c=grad_c [m], u=grad_u [m], W_in=grad_W_in [m, d])) by the BPTT of the module docstring,
    each block's gradient in that block's field."""
    X, y = data.X, data.y
    if backend == "numpy":
        f, grad_c, grad_u, grad_W_in = _loss_grad_np(X, y, p.c, p.u, p.W_in, kappa, data.activation)
        return f, Params(c=grad_c, u=grad_u, W_in=grad_W_in)
    n, _, d = X.shape
    m = p.c.shape[0]
    f, grad_c, grad_u, grad_WT = np.empty(n), np.empty(m), np.empty(m), np.empty((d, m))
    indrnn_kernels.loss_grad_kernel(X, y, p.c, p.u, np.ascontiguousarray(p.W_in.T), activation_code(data.activation),
                                    kappa, f, grad_c, grad_u, grad_WT)
    return f, Params(c=grad_c, u=grad_u, W_in=np.ascontiguousarray(grad_WT.T))


#: The IndRNN as the shared evaluation, the trainer and the file contract see it (evaluation.Model).
MODEL = evaluation.Model("indrnn", "ntpref.shallow.indrnn.prepare", prepare, Batch, Params, check_params, _outputs,
                         _gradients, LossAndGrad, logged="u",
                         block_shapes=("[m]", "[m]", "[m, d]"))


def forward(data: Batch, c, u, W_in, *, kappa=2.0, backend="numba") -> Forward:
    """Forward(loss, f): the IndRNN outputs f [n] = m^{−1/2} Σ_i c_i h_{T,i} for every sample and, when the
    data has targets, loss = (κ/2n) Σ_j (f_j − y_j)² (else None)."""
    return evaluation.forward(MODEL, data, (c, u, W_in), kappa=kappa, backend=backend)


def loss_and_grad(data: Batch, c, u, W_in, *, kappa=2.0, backend="numba") -> LossAndGrad:
    """LossAndGrad(loss, grad_c [m], grad_u [m], grad_W_in [m, d], f [n]) of loss = (κ/2n) Σ_j (f_j − y_j)².

    κ = 2 (default) is the mean squared error; κ = 1 is half of it. The gradients are the exact
    gradients of the returned loss (output gradient g_j = κ r_j / n), by closed-form BPTT. The data must
    have targets y.
    """
    return evaluation.loss_and_grad(MODEL, data, (c, u, W_in), kappa=kappa, backend=backend)


def paired_init(m, d, seed) -> Params:
    """Params(c [m], u [m], W_in [m, d]): paired initialisation, so f ≡ 0 at init (docs/shallow.md §6).

    For i < m/2: W_in_i ~ N(0, I_d), u_i = ±1.5 and c_i = ±1 with independent fair signs; the second
    half (rows m/2..m−1) copies W_in and u and flips c. m must be even. Draws, from
    ``np.random.default_rng(seed)`` in this order: W_in half, u signs, c signs.
    """
    m, d, rng = evaluation.check_init(m, d, seed, paired=True)
    half = m // 2
    W_half = rng.standard_normal((half, d))
    u_half = 1.5 * (2.0 * rng.integers(0, 2, half) - 1.0)
    c_half = 2.0 * rng.integers(0, 2, half) - 1.0
    W_in = np.ascontiguousarray(np.concatenate([W_half, W_half]))
    u = np.concatenate([u_half, u_half])
    c = np.concatenate([c_half, -c_half])
    return Params(c, u, W_in)


def hidden_states(data: Batch, u, W_in) -> np.ndarray:
    """H [T+1, n, m]: H[t] = h_t of every sample (H[0] = 0), by the NumPy recurrence of the module
    docstring (u [m], W_in [m, d])."""
    evaluation.check_data(MODEL, data)
    u = as_float("u", u, (None,))
    return _hidden_np(data.X, u, as_float("W_in", W_in, (u.shape[0], data.X.shape[2])), data.activation)


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


def _loss_grad_np(X, y, c, u, W_in, kappa, activation):
    """(f, grad_c, grad_u, grad_W_in) by the BPTT of the module docstring, all samples at once."""
    n, T, _ = X.shape
    sqrt_m = math.sqrt(c.shape[0])
    H = _hidden_np(X, u, W_in, activation)
    f = readout_np(c, H[T])
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
