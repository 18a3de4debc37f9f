"""Numba kernels of the IndRNN (:mod:`ntpref.shallow.indrnn`, docs/shallow.md §6): forward and closed-form
backprop through time.

Inputs (converted once by :mod:`ntpref.shallow.indrnn`): X [n, T, d], c [m], u [m], ``WT`` [d, m] = W_in^T
(units last), ``code`` = activation code (:func:`ntpref.shallow.activation.activation_code`). Per sample x:

    p_t = W_in x_t + u ⊙ h_{t−1},  h_t = σ(p_t)  (h_0 = 0, t = 1..T),  f = m^{−1/2} Σ_i c_i h_{T,i}
    δ_T = g c / √m;  for t = T..1:  ε_t = δ_t ⊙ σ'(p_t),  δ_{t−1} = ε_t ⊙ u
    ∂c += g h_T / √m,  ∂u += Σ_t ε_t ⊙ h_{t−1},  ∂W_in += Σ_t ε_t x_t^T

with g = κ (f − y) / n; the readout is :func:`ntpref.shallow.readout.readout`. tanh is
:func:`ntpref.vmath.tanh` (≤ 2 ulp), and σ' of tanh is 1 − h² from the same h.

Determinism: every sum runs in a fixed order (over k and t in steps of
:func:`ntpref.shallow.summation.add4`, four terms, followed by single terms). The kernels run ``prange``
over fixed blocks of :data:`BLOCK` samples; the gradient kernel adds each block's samples, in order, into
that block's partial gradient, then adds the partial gradients in block order
(:func:`ntpref.shallow.summation.sum_blocks`), so results are bitwise identical for any number of threads.
"""
import math

import numpy as np
from numba import njit, prange

from .. import vmath
from .activation import dsigma, sigma
from .readout import readout
from .summation import add4, sum_blocks

BLOCK = 16
"""Samples per parallel work item (fixed, so results never depend on threads)."""


@njit(cache=True, error_model="numpy")
def _unit_states(x, WT, u, code, p, H, D):
    """One sample x [T, d]: H [T + 1, m] with H[t] = h_t (H[0] = 0) and D [T, m] with D[t] = σ'(p_{t+1});
    p [m] holds the current pre-activation. (W_in x_{t+1})_i is summed over k left to right."""
    T, d = x.shape
    m = u.shape[0]
    for i in range(m):
        H[0, i] = 0.0
    for t in range(T):
        for i in range(m):
            p[i] = 0.0
        k = 0
        while k + 4 <= d:
            x0, x1, x2, x3 = x[t, k], x[t, k + 1], x[t, k + 2], x[t, k + 3]
            w0, w1, w2, w3 = WT[k], WT[k + 1], WT[k + 2], WT[k + 3]
            for i in range(m):
                p[i] = add4(p[i], w0[i] * x0, w1[i] * x1, w2[i] * x2, w3[i] * x3)
            k += 4
        while k < d:
            xk = x[t, k]
            for i in range(m):
                p[i] += WT[k, i] * xk                        # (W_in x_{t+1})_i
            k += 1
        for i in range(m):
            p[i] += u[i] * H[t, i]                           # p_{t+1}
        if code == 0:                                        # tanh: σ'(p) = 1 − h²
            for i in range(m):
                h = vmath.tanh(p[i])
                H[t + 1, i] = h
                D[t, i] = 1.0 - h * h
        else:
            for i in range(m):
                H[t + 1, i] = sigma(p[i], code)
                D[t, i] = dsigma(p[i], code)


@njit(cache=True, parallel=True, error_model="numpy")
def forward_kernel(X, c, u, WT, code, f):
    """f [n] for every sample, written in place (blocks of :data:`BLOCK` samples in parallel)."""
    n, T, _ = X.shape
    m = u.shape[0]
    nblocks = (n + BLOCK - 1) // BLOCK
    for b in prange(nblocks):
        p, H, D = np.empty(m), np.empty((T + 1, m)), np.empty((T, m))
        for j in range(b * BLOCK, min(n, (b + 1) * BLOCK)):
            _unit_states(X[j], WT, u, code, p, H, D)
            f[j] = readout(c, H[T])


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_kernel(X, y, c, u, WT, code, kappa, f, grad_c, grad_u, grad_WT):
    """Forward and BPTT (module docstring) for every sample. Writes f [n], grad_c [m], grad_u [m],
    grad_WT [d, m]. Block b adds its samples, in order, into its partial gradients part_c [m], part_u [m],
    part_W [d, m]. Per sample, delta [m] holds the running δ, and the backward pass multiplies
    D[t] = σ'(p_{t+1}) by δ_{t+1} in place, so that D[t] then holds ε_{t+1}."""
    n, T, d = X.shape
    m = u.shape[0]
    sqrt_m = math.sqrt(m)
    nblocks = (n + BLOCK - 1) // BLOCK
    part_c = np.zeros((nblocks, m))
    part_u = np.zeros((nblocks, m))
    part_W = np.zeros((nblocks, d, m))
    for b in prange(nblocks):
        p, H, D = np.empty(m), np.empty((T + 1, m)), np.empty((T, m))
        delta = np.empty(m)
        pc, pu, pW = part_c[b], part_u[b], part_W[b]
        for j in range(b * BLOCK, min(n, (b + 1) * BLOCK)):
            x = X[j]
            _unit_states(x, WT, u, code, p, H, D)
            f[j] = readout(c, H[T])
            g = kappa * (f[j] - y[j]) / n
            for i in range(m):
                pc[i] += g * H[T, i]
                delta[i] = g * c[i] / sqrt_m                 # δ_T
            for t in range(T - 1, -1, -1):                   # step t + 1 of the recurrence
                for i in range(m):
                    e = delta[i] * D[t, i]                   # ε_{t+1}
                    pu[i] += e * H[t, i]
                    delta[i] = e * u[i]
                    D[t, i] = e
            t = T - 1                                        # ∂W_in += Σ_t ε_t x_t, t = T..1 in order
            while t >= 3:
                e0, e1, e2, e3 = D[t], D[t - 1], D[t - 2], D[t - 3]
                for k in range(d):
                    x0, x1, x2, x3, pWk = x[t, k], x[t - 1, k], x[t - 2, k], x[t - 3, k], pW[k]
                    for i in range(m):
                        pWk[i] = add4(pWk[i], e0[i] * x0, e1[i] * x1, e2[i] * x2, e3[i] * x3)
                t -= 4
            while t >= 0:
                for k in range(d):
                    xk = x[t, k]
                    for i in range(m):
                        pW[k, i] += D[t, i] * xk
                t -= 1
    sum_blocks(part_c, grad_c)
    sum_blocks(part_u, grad_u)
    sum_blocks(part_W, grad_WT)
    for i in range(m):
        grad_c[i] /= sqrt_m
