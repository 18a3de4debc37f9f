"""Numba kernels of the shallow multi-head transformer (docs/shallow.md §1–§2).

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

Determinism: every kernel splits the samples into :data:`N_BLOCKS` fixed contiguous blocks
(boundaries depend on n only, never on the thread count) and runs ``prange`` over the blocks, with
scratch arrays allocated once per block. The forward/state kernels write only the rows j of their
block. The gradient kernel writes one partial gradient per block, then adds the blocks serially in
index order. Results are bitwise identical for any number of threads.

Speed: every sum runs left to right, but four terms at a time: ``acc = (((acc + t0) + t1) + t2) + t3``
keeps the running value in a register across four rows (of W for v, of x_t for z and p, of α and γ
for a and M U, of :data:`GROUP` samples for the gradients), so the vectorized loops over heads load
and store the accumulator a quarter as often. The order of the additions is exactly that of the
plain loop, so the results are too.
"""
import math

import numpy as np
from numba import njit, prange

from .. import vmath
from .activation import dsigma, sigma

GROUP = 4  # samples per accumulation step of the gradient kernel (_accumulate adds exactly four)
N_BLOCKS = 32  # sample blocks of the gradient kernel (fixed, so results do not depend on threads)


@njit(cache=True, error_model="numpy")
def _states(X, j, Wr, UT, inv_tau, n_keys, v, alpha, p, s):
    """Sample j, all heads: fill v [d, m], α [T, m] (normalised over t < n_keys), p [T, m], s [m]."""
    d, m = UT.shape
    T = X.shape[1]
    for k in range(d):
        for i in range(m):
            v[k, i] = 0.0
    l = 0
    while l + 4 <= d:
        q0, q1, q2, q3 = X[j, T - 1, l], X[j, T - 1, l + 1], X[j, T - 1, l + 2], X[j, T - 1, l + 3]
        for k in range(d):
            w0, w1, w2, w3, vk = Wr[l, k], Wr[l + 1, k], Wr[l + 2, k], Wr[l + 3, k], v[k]
            for i in range(m):
                vk[i] = (((vk[i] + q0 * w0[i]) + q1 * w1[i]) + q2 * w2[i]) + q3 * w3[i]
        l += 4
    while l < d:
        ql = X[j, T - 1, l]
        for k in range(d):
            for i in range(m):
                v[k, i] += ql * Wr[l, k, i]
        l += 1
    for t in range(n_keys):
        at, pt = alpha[t], p[t]
        for i in range(m):
            at[i] = 0.0
            pt[i] = 0.0
        k = 0
        while k + 4 <= d:
            x0, x1, x2, x3 = X[j, t, k], X[j, t, k + 1], X[j, t, k + 2], X[j, t, k + 3]
            v0, v1, v2, v3 = v[k], v[k + 1], v[k + 2], v[k + 3]
            u0, u1, u2, u3 = UT[k], UT[k + 1], UT[k + 2], UT[k + 3]
            for i in range(m):
                at[i] = (((at[i] + x0 * v0[i]) + x1 * v1[i]) + x2 * v2[i]) + x3 * v3[i]
                pt[i] = (((pt[i] + x0 * u0[i]) + x1 * u1[i]) + x2 * u2[i]) + x3 * u3[i]
            k += 4
        while k < d:
            xk = X[j, t, k]
            for i in range(m):
                at[i] += xk * v[k, i]
                pt[i] += xk * UT[k, i]
            k += 1
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
    for t in range(n_keys):
        for i in range(m):
            p[t, i] = alpha[t, i] * (p[t, i] - s[i])
    for k in range(d):
        ak, muk = a[k], mu[k]
        for i in range(m):
            ak[i] = 0.0
            muk[i] = 0.0
        t = 0
        while t + 4 <= n_keys:
            x0, x1, x2, x3 = X[j, t, k], X[j, t + 1, k], X[j, t + 2, k], X[j, t + 3, k]
            a0, a1, a2, a3 = alpha[t], alpha[t + 1], alpha[t + 2], alpha[t + 3]
            g0, g1, g2, g3 = p[t], p[t + 1], p[t + 2], p[t + 3]
            for i in range(m):
                ak[i] = (((ak[i] + a0[i] * x0) + a1[i] * x1) + a2[i] * x2) + a3[i] * x3
                muk[i] = (((muk[i] + g0[i] * x0) + g1[i] * x1) + g2[i] * x2) + g3[i] * x3
            t += 4
        while t < n_keys:
            xk = X[j, t, k]
            for i in range(m):
                ak[i] += alpha[t, i] * xk
                muk[i] += p[t, i] * xk
            t += 1


@njit(cache=True, parallel=True, error_model="numpy")
def forward_kernel(X, c, Wr, UT, inv_tau, n_keys, code, f):
    """Outputs f [n], written in place (the :data:`N_BLOCKS` sample blocks in parallel, scratch per block)."""
    n, T, d = X.shape
    m = c.shape[0]
    nb = min(N_BLOCKS, n)
    for b in prange(nb):
        v, alpha, p = np.empty((d, m)), np.empty((T, m)), np.empty((T, m))
        s, h = np.empty(m), np.empty(m)
        for j in range(b * n // nb, (b + 1) * n // nb):
            _states(X, j, Wr, UT, inv_tau, n_keys, v, alpha, p, s)
            f[j] = _output(s, c, code, h)


@njit(cache=True, parallel=True, error_model="numpy")
def head_states_kernel(X, Wr, UT, inv_tau, n_keys, s, a, MU):
    """s [n, m], a [n, d, m], MU [n, d, m] (heads last) of every sample, written in place (blocks as in
    :func:`forward_kernel`)."""
    n, T, d = X.shape
    m = UT.shape[1]
    nb = min(N_BLOCKS, n)
    for b in prange(nb):
        v, alpha, p = np.empty((d, m)), np.empty((T, m)), np.empty((T, m))
        for j in range(b * n // nb, (b + 1) * n // nb):
            _states(X, j, Wr, UT, inv_tau, n_keys, v, alpha, p, s[j])
            _moments(X, j, n_keys, alpha, p, s[j], a[j], MU[j])


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_kernel(X, y, c, Wr, UT, inv_tau, n_keys, code, g_scale, f, grad_c, grad_U, grad_W):
    """One fused pass (docs/shallow.md §2). Per sample: f_j, g_j = g_scale (f_j − y_j) (g_scale = κ/n), and
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
        gh, ea, emu, qg = np.empty((GROUP, m)), np.empty((GROUP, d, m)), np.empty((GROUP, d, m)), np.empty((GROUP, d))
        hi = (b + 1) * n // nb
        for j0 in range(b * n // nb, hi, GROUP):
            for r in range(GROUP):
                j = j0 + r
                if j >= hi:                          # a short last group: zero terms add nothing
                    gh[r], ea[r], emu[r], qg[r] = 0.0, 0.0, 0.0, 0.0
                    continue
                _states(X, j, Wr, UT, inv_tau, n_keys, v, alpha, p, s)
                f[j] = _output(s, c, code, h)
                g = g_scale * (f[j] - y[j])
                _moments(X, j, n_keys, alpha, p, s, ea[r], emu[r])
                if code == 0:                        # tanh: σ' = 1 − h², h from _output
                    for i in range(m):
                        e[i] = g * c[i] * (1.0 - h[i] * h[i]) * scale
                else:
                    for i in range(m):
                        e[i] = g * c[i] * dsigma(s[i], code) * scale
                for i in range(m):
                    gh[r, i] = g * h[i]
                for k in range(d):                   # ea = e a, emu = e M U
                    qg[r, k] = X[j, T - 1, k]
                    for i in range(m):
                        ea[r, k, i] *= e[i]
                        emu[r, k, i] *= e[i]
            _accumulate(gh, ea, emu, qg, part_c[b], part_U[b], part_W[b])
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


@njit(cache=True, error_model="numpy")
def _accumulate(gh, ea, emu, qg, pc, pu, pw):
    """Add a group of GROUP samples r (in order) to the partial gradients of one block:
    pc [m] += g_r h_r, pu [d, m] += e_r a_r, pw [d, d, m] += (e_r M U_r) q_r^T, each sum left to right."""
    d, m = pu.shape
    for i in range(m):
        pc[i] = (((pc[i] + gh[0, i]) + gh[1, i]) + gh[2, i]) + gh[3, i]
    for k in range(d):
        puk, a0, a1, a2, a3 = pu[k], ea[0, k], ea[1, k], ea[2, k], ea[3, k]
        for i in range(m):
            puk[i] = (((puk[i] + a0[i]) + a1[i]) + a2[i]) + a3[i]
        u0, u1, u2, u3 = emu[0, k], emu[1, k], emu[2, k], emu[3, k]
        for l in range(d):
            q0, q1, q2, q3, pwl = qg[0, l], qg[1, l], qg[2, l], qg[3, l], pw[k, l]
            for i in range(m):
                pwl[i] = (((pwl[i] + u0[i] * q0) + u1[i] * q1) + u2[i] * q2) + u3[i] * q3
