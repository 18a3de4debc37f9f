"""Numba kernels of the shallow multi-head transformer (spec/shallow.md §1–§2).

Inputs (converted once by :mod:`ntpref.shallow.model`): X [n, T, d] (row T−1 is the query q),
c [m], ``Wr`` [d, d, m] with Wr[l, k, i] = W[i, k, l], ``UT`` [d, m] = U^T (heads last, so every inner
loop runs over the m heads with unit stride), ``inv_tau`` = 1/τ_att, ``n_keys`` = T (T − 1 when the
last key is masked), ``code`` = activation code (:func:`ntpref.shallow.activation.activation_code`).

Per sample j, :func:`_states` computes for all heads i with O(m (d² + T d)) work and O(m (T + d))
scratch
  v_i = W_i q,  z_{t,i} = x_t^T v_i / τ_att,  α_{·,i} = softmax_{t < n_keys}(z_{·,i}),
  p_{t,i} = x_t^T U_i,  s_i = Σ_t α_{t,i} p_{t,i}  (= U_i^T a_i),
and :func:`_moments` adds a_i = Σ_t α_{t,i} x_t and (M U)_i = Σ_t α_{t,i} (p_{t,i} − s_i) x_t.
No d×d×T tensor is formed. The softmax exponentials and tanh come from :mod:`ntpref.vmath`
(vectorizable, ≤ 1 and ≤ 2 ulp), so the loops over heads vectorize; σ' of tanh is 1 − h² from the
same h. Head outputs are summed in the fixed pair order (i, i + ⌊m/2⌋), so the
paired initialisation (second half = first half with c flipped) gives f = 0 exactly.

Determinism: the forward/state kernels run ``prange`` over samples and write only row j. The
gradient kernel splits the samples into :data:`N_BLOCKS` fixed contiguous blocks (boundaries depend
on n only, never on the thread count), runs ``prange`` over blocks writing one partial gradient
per block, then adds the blocks serially in index order. Results are bitwise identical for any
number of threads.
"""
import math

import numpy as np
from numba import njit, prange

from .. import vmath
from .activation import dsigma, sigma

N_BLOCKS = 32  # sample blocks of the gradient kernel (fixed, so results do not depend on threads)


@njit(cache=True, error_model="numpy")
def _states(X, j, Wr, UT, inv_tau, n_keys, v, alpha, p, s):
    """Sample j, all heads: fill v [d, m], α [T, m] (normalised over t < n_keys), p [T, m], s [m]."""
    d, m = UT.shape
    for k in range(d):
        for i in range(m):
            v[k, i] = 0.0
    for l in range(d):
        ql = X[j, X.shape[1] - 1, l]
        for k in range(d):
            for i in range(m):
                v[k, i] += ql * Wr[l, k, i]
    for t in range(n_keys):
        for i in range(m):
            alpha[t, i] = 0.0
            p[t, i] = 0.0
        for k in range(d):
            xk = X[j, t, k]
            for i in range(m):
                alpha[t, i] += xk * v[k, i]
                p[t, i] += xk * UT[k, i]
    # softmax over t for every head: v[0] holds the running max, s the normaliser
    for i in range(m):
        v[0, i] = alpha[0, i]
        s[i] = 0.0
    for t in range(1, n_keys):
        for i in range(m):
            v[0, i] = max(v[0, i], alpha[t, i])
    for t in range(n_keys):
        for i in range(m):
            alpha[t, i] = vmath.exp((alpha[t, i] - v[0, i]) * inv_tau)
            s[i] += alpha[t, i]
    for i in range(m):
        v[0, i] = 1.0 / s[i]
        s[i] = 0.0
    for t in range(n_keys):
        for i in range(m):
            alpha[t, i] *= v[0, i]
            s[i] += alpha[t, i] * p[t, i]


@njit(cache=True, error_model="numpy")
def _output(s, c, code, h):
    """Fill h [m] = σ(s) (tanh: the vectorizable :func:`ntpref.vmath.tanh`); return
    f = m^{-1/2} Σ_i c_i h_i, summed in the pair order (i, i + ⌊m/2⌋), then the odd head."""
    m = c.shape[0]
    if code == 0:
        for i in range(m):
            h[i] = vmath.tanh(s[i])
    else:
        for i in range(m):
            h[i] = sigma(s[i], code)
    half = m // 2
    acc = 0.0
    for i in range(half):
        acc += c[i] * h[i] + c[i + half] * h[i + half]
    for i in range(2 * half, m):
        acc += c[i] * h[i]
    return acc / math.sqrt(m)


@njit(cache=True, error_model="numpy")
def _moments(X, j, n_keys, alpha, p, s, a, mu):
    """a [d, m] = Σ_t α_t x_t and mu [d, m] = M U = Σ_t γ_t x_t, γ_t = α_t (p_t − s), for sample j and
    all heads (p is overwritten with γ)."""
    d, m = a.shape
    for k in range(d):
        for i in range(m):
            a[k, i] = 0.0
            mu[k, i] = 0.0
    for t in range(n_keys):
        for i in range(m):
            p[t, i] = alpha[t, i] * (p[t, i] - s[i])
        for k in range(d):
            xk = X[j, t, k]
            for i in range(m):
                a[k, i] += alpha[t, i] * xk
                mu[k, i] += p[t, i] * xk


@njit(cache=True, parallel=True, error_model="numpy")
def forward_kernel(X, c, Wr, UT, inv_tau, n_keys, code, f):
    """Outputs f [n], written in place."""
    n, T, d = X.shape
    m = c.shape[0]
    for j in prange(n):
        v, alpha, p = np.empty((d, m)), np.empty((T, m)), np.empty((T, m))
        s, h = np.empty(m), np.empty(m)
        _states(X, j, Wr, UT, inv_tau, n_keys, v, alpha, p, s)
        f[j] = _output(s, c, code, h)


@njit(cache=True, parallel=True, error_model="numpy")
def head_states_kernel(X, Wr, UT, inv_tau, n_keys, s, a, MU):
    """s [n, m], a [n, d, m], MU [n, d, m] (heads last) of every sample, written in place."""
    n, T, d = X.shape
    m = UT.shape[1]
    for j in prange(n):
        v, alpha, p = np.empty((d, m)), np.empty((T, m)), np.empty((T, m))
        _states(X, j, Wr, UT, inv_tau, n_keys, v, alpha, p, s[j])
        _moments(X, j, n_keys, alpha, p, s[j], a[j], MU[j])


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_kernel(X, y, c, Wr, UT, inv_tau, n_keys, code, g_scale, f, grad_c, grad_U, grad_W):
    """One fused pass (spec §2). Per sample: f_j, g_j = g_scale (f_j − y_j) (g_scale = κ/n), and
      e_ji = g_j c_i σ'(s_ji)/√m,  grad_c_i += g_j σ(s_ji)/√m,  grad_U_i += e_ji a_ji,
      grad_W_i += e_ji (M U)_ji q_j^T / τ_att.
    Outputs (overwritten): f [n], grad_c [m], grad_U [d, m], grad_W [d, d, m] (heads last)."""
    n, T, d = X.shape
    m = c.shape[0]
    nb = min(N_BLOCKS, n)
    part_c = np.zeros((nb, m))
    part_U = np.zeros((nb, d, m))
    part_W = np.zeros((nb, d, d, m))
    scale = 1.0 / math.sqrt(m)
    for b in prange(nb):
        v, alpha, p = np.empty((d, m)), np.empty((T, m)), np.empty((T, m))
        s, h, e = np.empty(m), np.empty(m), np.empty(m)
        a, mu = np.empty((d, m)), np.empty((d, m))
        for j in range(b * n // nb, (b + 1) * n // nb):
            _states(X, j, Wr, UT, inv_tau, n_keys, v, alpha, p, s)
            f[j] = _output(s, c, code, h)
            g = g_scale * (f[j] - y[j])
            _moments(X, j, n_keys, alpha, p, s, a, mu)
            for i in range(m):
                part_c[b, i] += g * h[i]
            if code == 0:                            # tanh: σ' = 1 − h², h from _output
                for i in range(m):
                    e[i] = g * c[i] * (1.0 - h[i] * h[i]) * scale
            else:
                for i in range(m):
                    e[i] = g * c[i] * dsigma(s[i], code) * scale
            for k in range(d):
                pu, ak, muk = part_U[b, k], a[k], mu[k]
                for i in range(m):
                    pu[i] += e[i] * ak[i]
                    muk[i] *= e[i]
                for l in range(d):
                    ql = X[j, T - 1, l]
                    pw = part_W[b, k, l]
                    for i in range(m):
                        pw[i] += muk[i] * ql
    for i in range(m):
        grad_c[i] = 0.0
        for k in range(d):
            grad_U[k, i] = 0.0
            for l in range(d):
                grad_W[k, l, i] = 0.0
    for b in range(nb):
        for i in range(m):
            grad_c[i] += part_c[b, i]
        for k in range(d):
            for i in range(m):
                grad_U[k, i] += part_U[b, k, i]
            for l in range(d):
                for i in range(m):
                    grad_W[k, l, i] += part_W[b, k, l, i]
    for i in range(m):
        grad_c[i] *= scale
        for k in range(d):
            for l in range(d):
                grad_W[k, l, i] *= inv_tau
