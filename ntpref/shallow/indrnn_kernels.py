"""Numba kernels of the IndRNN (:mod:`ntpref.shallow.indrnn`, docs/shallow.md §6): forward and closed-form
BPTT, parallel over fixed blocks of :data:`BLOCK` samples, each block writing its own gradient slot, then
a serial reduction over the blocks in order, so results are bitwise identical for any number of threads."""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from .. import vmath
from .activation import dsigma, sigma

BLOCK = 16
"""Samples per parallel work item (fixed, so results never depend on threads)."""


# --------------------------------------------------------------------------------------------------
# Numba backend. W_in enters transposed (WT [d, m]) so that the inner loops run over units with
# unit stride and no reductions (they vectorise without reordering any sum). tanh is
# ntpref.vmath.tanh (inlined, vectorizable; ≤ 2 ulp from np.tanh), so the per-step loop over units
# vectorizes too; the kernels use error_model="numpy" so that divisions do not block vectorization.
# The two contractions (W_in x_t over k, and ∂W_in = Σ_t ε_t x_t^T over t = T..1) add four terms per
# pass over the units, acc = (((acc + t0) + t1) + t2) + t3, in the plain loop's order (same bits), so
# the accumulator is loaded and stored a quarter as often.
# --------------------------------------------------------------------------------------------------

@njit(cache=True, error_model="numpy")
def _unit_states(x, WT, u, code, H, D):
    """One sample x [T, d]: H[t] = h_t (t = 0..T, H[0] = 0), D[t] = σ'(p_{t+1}) (t = 0..T−1).
    (W_in x_t)_i is summed over k left to right, four terms per pass over the units."""
    T, d = x.shape
    m = u.shape[0]
    for i in range(m):
        H[0, i] = 0.0
    for t in range(T):
        Dt = D[t]
        for i in range(m):
            Dt[i] = 0.0
        k = 0
        while k + 4 <= d:
            x0, x1, x2, x3 = x[t, k], x[t, k + 1], x[t, k + 2], x[t, k + 3]
            w0, w1, w2, w3 = WT[k], WT[k + 1], WT[k + 2], WT[k + 3]
            for i in range(m):
                Dt[i] = (((Dt[i] + w0[i] * x0) + w1[i] * x1) + w2[i] * x2) + w3[i] * x3
            k += 4
        while k < d:
            xk = x[t, k]
            for i in range(m):
                Dt[i] += WT[k, i] * xk                       # (W_in x_{t+1})_i
            k += 1
        for i in range(m):
            Dt[i] += u[i] * H[t, i]                          # p_{t+1}
        if code == 0:
            # tanh (vectorizable, :mod:`ntpref.vmath`): σ'(p) = 1 − tanh(p)² from the same value
            for i in range(m):
                h = vmath.tanh(Dt[i])
                H[t + 1, i] = h
                Dt[i] = 1.0 - h * h
        else:
            for i in range(m):
                p = Dt[i]
                H[t + 1, i] = sigma(p, code)
                Dt[i] = dsigma(p, code)


@njit(cache=True, error_model="numpy")
def _readout(c, h):
    """m^{−1/2} Σ_i c_i h_i, pairs (i, i + ⌊m/2⌋) added first (module docstring)."""
    m = c.shape[0]
    half = m // 2
    s = 0.0
    for i in range(half):
        s += c[i] * h[i] + c[i + half] * h[i + half]
    if m % 2:
        s += c[m - 1] * h[m - 1]
    return s / math.sqrt(m)


@njit(cache=True, parallel=True, error_model="numpy")
def forward_kernel(X, c, u, WT, code, f):
    """f[j] for every sample; blocks of BLOCK samples in parallel, each writing its own f[j]."""
    n, T, _ = X.shape
    m = u.shape[0]
    nblocks = (n + BLOCK - 1) // BLOCK
    for b in prange(nblocks):
        H = np.empty((T + 1, m))
        D = np.empty((T, m))
        for j in range(b * BLOCK, min(n, (b + 1) * BLOCK)):
            _unit_states(X[j], WT, u, code, H, D)
            f[j] = _readout(c, H[T])


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_kernel(X, y, c, u, WT, code, kappa, f, grad_c, grad_u, grad_WT):
    """Forward and BPTT for every sample. Writes f [n], grad_c [m], grad_u [m], grad_WT [d, m].

    Block b accumulates its samples, in order, into slot b; the slots are then summed serially in
    block order, so the result does not depend on the number of threads.
    """
    n, T, d = X.shape
    m = u.shape[0]
    sqrt_m = math.sqrt(m)
    nblocks = (n + BLOCK - 1) // BLOCK
    slot_c = np.zeros((nblocks, m))
    slot_u = np.zeros((nblocks, m))
    slot_W = np.zeros((nblocks, d, m))
    for b in prange(nblocks):
        H = np.empty((T + 1, m))
        D = np.empty((T, m))
        delta = np.empty(m)
        sc, su, sW = slot_c[b], slot_u[b], slot_W[b]
        for j in range(b * BLOCK, min(n, (b + 1) * BLOCK)):
            x = X[j]
            _unit_states(x, WT, u, code, H, D)
            f[j] = _readout(c, H[T])
            g = kappa * (f[j] - y[j]) / n
            for i in range(m):
                sc[i] += g * H[T, i]
                delta[i] = g * c[i] / sqrt_m                 # δ_T
            for t in range(T - 1, -1, -1):                   # step t + 1 of the recurrence
                for i in range(m):
                    e = delta[i] * D[t, i]                   # ε_{t+1}
                    su[i] += e * H[t, i]
                    delta[i] = e * u[i]
                    D[t, i] = e
            t = T - 1                                        # ∂W_in += Σ_t ε_t x_t, t = T..1 in order
            while t >= 3:
                e0, e1, e2, e3 = D[t], D[t - 1], D[t - 2], D[t - 3]
                for k in range(d):
                    x0, x1, x2, x3, sWk = x[t, k], x[t - 1, k], x[t - 2, k], x[t - 3, k], sW[k]
                    for i in range(m):
                        sWk[i] = (((sWk[i] + e0[i] * x0) + e1[i] * x1) + e2[i] * x2) + e3[i] * x3
                t -= 4
            while t >= 0:
                for k in range(d):
                    xk = x[t, k]
                    for i in range(m):
                        sW[k, i] += D[t, i] * xk
                t -= 1
    for i in range(m):
        grad_c[i] = 0.0
        grad_u[i] = 0.0
    for k in range(d):
        for i in range(m):
            grad_WT[k, i] = 0.0
    for b in range(nblocks):
        for i in range(m):
            grad_c[i] += slot_c[b, i]
            grad_u[i] += slot_u[b, i]
        for k in range(d):
            for i in range(m):
                grad_WT[k, i] += slot_W[b, k, i]
    for i in range(m):
        grad_c[i] /= sqrt_m
