"""Numba kernels of the shallow multi-head transformer (docs/shallow.md §1–§2).

Inputs (converted once by :mod:`ntpref.shallow.model`): X [n, T, d] (row T−1 is the query q),
c [m], ``Wr`` [d, d, m] with Wr[l, k, i] = W[i, k, l], ``UT`` [d, m] = U^T (heads last),
``inv_tau`` = 1/τ_att, ``n_keys`` = T (T − 1 when the last key is masked), ``code`` = activation code
(:func:`ntpref.shallow.activation.activation_code`).

Per sample j, for all heads i at once (O(m (d² + T d)) work, no d×d×T tensor):
  :func:`_states`   v_i = W_i q,  score_{t,i} = x_t^T v_i,  α_{·,i} = softmax_{t < n_keys}(score_{·,i} / τ_att),
                    p_{t,i} = x_t^T U_i,  s_i = Σ_t α_{t,i} p_{t,i}  (= U_i^T a_i);
  :func:`_activate` h_i = σ(s_i), and f = m^{-1/2} Σ_i c_i h_i by :func:`ntpref.shallow.readout.readout`;
  :func:`_moments`  γ_{t,i} = α_{t,i} (p_{t,i} − s_i),  a_i = Σ_t α_{t,i} x_t,  (M U)_i = Σ_t γ_{t,i} x_t.
The gradient (docs/shallow.md §2), with g_j = g_scale (f_j − y_j) and e_ji = g_j c_i σ'(s_ji)/√m:
  grad_c_i = m^{-1/2} Σ_j g_j h_ji,  grad_U_i = Σ_j e_ji a_ji,  grad_W_i = τ_att^{-1} Σ_j e_ji (M U)_ji q_j^T.
The softmax exponentials and tanh are :func:`ntpref.vmath.exp` and :func:`ntpref.vmath.tanh` (≤ 1 and ≤ 2
ulp); σ' of tanh is 1 − h² from the same h.

Determinism: every sum runs left to right in index order, in steps of
:func:`ntpref.shallow.summation.add4` (four terms) followed by single terms. Every kernel splits the
samples into :data:`N_BLOCKS` fixed contiguous blocks (boundaries depend on n only, never on the thread
count) and runs ``prange`` over the blocks. The forward and state kernels write only the rows j of their
block. The gradient kernel adds each block's samples, in order and in groups of four, into that block's
partial gradient, then adds the partial gradients in block order
(:func:`ntpref.shallow.summation.sum_blocks`). Results are bitwise identical for any number of threads.
"""
import math

import numpy as np
from numba import njit, prange

from .. import vmath
from .activation import dsigma, sigma
from .readout import readout
from .summation import add4, sum_blocks

N_BLOCKS = 32  # sample blocks of every kernel (fixed, so results do not depend on threads)


@njit(cache=True, error_model="numpy")
def _states(X, j, Wr, UT, inv_tau, n_keys, v, score_max, exp_sum, inv_exp_sum, alpha, p, s):
    """Sample j, all heads (module docstring), each buffer overwritten: v [d, m] = W_i q;
    alpha [T, m] (rows t < n_keys) = α, computed in place: the scores x_t^T v_i, then their exponentials
    exp((score − score_max)/τ), then those times inv_exp_sum; score_max [m] = max_t score;
    exp_sum [m] = Σ_t of the exponentials; inv_exp_sum [m] = 1 / exp_sum; p [T, m] = x_t^T U_i;
    s [m] = Σ_t α_t p_t."""
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
                vk[i] = add4(vk[i], q0 * w0[i], q1 * w1[i], q2 * w2[i], q3 * w3[i])
        l += 4
    while l < d:
        ql = X[j, T - 1, l]
        for k in range(d):
            for i in range(m):
                v[k, i] += ql * Wr[l, k, i]
        l += 1
    for t in range(n_keys):                          # the scores (into alpha) and p
        score_t, pt = alpha[t], p[t]
        for i in range(m):
            score_t[i] = 0.0
            pt[i] = 0.0
        k = 0
        while k + 4 <= d:
            x0, x1, x2, x3 = X[j, t, k], X[j, t, k + 1], X[j, t, k + 2], X[j, t, k + 3]
            v0, v1, v2, v3 = v[k], v[k + 1], v[k + 2], v[k + 3]
            u0, u1, u2, u3 = UT[k], UT[k + 1], UT[k + 2], UT[k + 3]
            for i in range(m):
                score_t[i] = add4(score_t[i], x0 * v0[i], x1 * v1[i], x2 * v2[i], x3 * v3[i])
                pt[i] = add4(pt[i], x0 * u0[i], x1 * u1[i], x2 * u2[i], x3 * u3[i])
            k += 4
        while k < d:
            xk = X[j, t, k]
            for i in range(m):
                score_t[i] += xk * v[k, i]
                pt[i] += xk * UT[k, i]
            k += 1
    for i in range(m):                               # softmax over t, in place in alpha
        score_max[i] = alpha[0, i]
        exp_sum[i] = 0.0
    for t in range(1, n_keys):
        for i in range(m):
            score_max[i] = max(score_max[i], alpha[t, i])
    for t in range(n_keys):
        for i in range(m):
            alpha[t, i] = vmath.exp((alpha[t, i] - score_max[i]) * inv_tau)
            exp_sum[i] += alpha[t, i]
    for i in range(m):
        inv_exp_sum[i] = 1.0 / exp_sum[i]
        s[i] = 0.0
    for t in range(n_keys):
        for i in range(m):
            alpha[t, i] *= inv_exp_sum[i]
            s[i] += alpha[t, i] * p[t, i]


@njit(cache=True, error_model="numpy")
def _activate(s, code, h):
    """h [m] = σ(s) for s [m] (tanh: :func:`ntpref.vmath.tanh`)."""
    m = s.shape[0]
    if code == 0:
        for i in range(m):
            h[i] = vmath.tanh(s[i])
    else:
        for i in range(m):
            h[i] = sigma(s[i], code)


@njit(cache=True, error_model="numpy")
def _moments(X, j, n_keys, alpha, p, s, a, mu):
    """Sample j, all heads, from :func:`_states`' alpha, p, s: a [d, m] = Σ_t α_t x_t and
    mu [d, m] = M U = Σ_t γ_t x_t (both overwritten), with γ_t = α_t (p_t − s) replacing p_t in place."""
    d, m = a.shape
    for t in range(n_keys):
        for i in range(m):
            p[t, i] = alpha[t, i] * (p[t, i] - s[i])      # γ
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
                ak[i] = add4(ak[i], a0[i] * x0, a1[i] * x1, a2[i] * x2, a3[i] * x3)
                muk[i] = add4(muk[i], g0[i] * x0, g1[i] * x1, g2[i] * x2, g3[i] * x3)
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
        score_max, exp_sum, inv_exp_sum, s, h = np.empty(m), np.empty(m), np.empty(m), np.empty(m), np.empty(m)
        for j in range(b * n // nb, (b + 1) * n // nb):
            _states(X, j, Wr, UT, inv_tau, n_keys, v, score_max, exp_sum, inv_exp_sum, alpha, p, s)
            _activate(s, code, h)
            f[j] = readout(c, h)


@njit(cache=True, parallel=True, error_model="numpy")
def head_states_kernel(X, Wr, UT, inv_tau, n_keys, s, a, MU):
    """s [n, m], a [n, d, m], MU [n, d, m] (heads last) of every sample, written in place (blocks as in
    :func:`forward_kernel`)."""
    n, T, d = X.shape
    m = UT.shape[1]
    nb = min(N_BLOCKS, n)
    for b in prange(nb):
        v, alpha, p = np.empty((d, m)), np.empty((T, m)), np.empty((T, m))
        score_max, exp_sum, inv_exp_sum = np.empty(m), np.empty(m), np.empty(m)
        for j in range(b * n // nb, (b + 1) * n // nb):
            _states(X, j, Wr, UT, inv_tau, n_keys, v, score_max, exp_sum, inv_exp_sum, alpha, p, s[j])
            _moments(X, j, n_keys, alpha, p, s[j], a[j], MU[j])


@njit(cache=True, parallel=True, error_model="numpy")
def loss_grad_kernel(X, y, c, Wr, UT, inv_tau, n_keys, code, g_scale, f, grad_c, grad_U, grad_W):
    """One fused pass (module docstring; docs/shallow.md §2), g_scale = κ/n.
    Outputs (overwritten): f [n], grad_c [m], grad_U [d, m], grad_W [d, d, m] (heads last).

    Block b takes its samples in groups of four r = 0..3 (a short last group is padded with zero terms,
    which add nothing) and fills, per group, gh [4, m] = g_r h_r, ea [4, d, m] = e_r a_r and
    emu [4, d, m] = e_r (M U)_r (:func:`_moments` writes a_r and (M U)_r, scaled by e_r in place), and
    q [4, d] = q_r; :func:`_accumulate` adds them to the block's partial gradients part_c [m],
    part_U [d, m], part_W [d, d, m]."""
    n, T, d = X.shape
    m = c.shape[0]
    nb = min(N_BLOCKS, n)
    part_c = np.zeros((nb, m))
    part_U = np.zeros((nb, d, m))
    part_W = np.zeros((nb, d, d, m))
    scale = 1.0 / math.sqrt(m)
    for b in prange(nb):
        v, alpha, p = np.empty((d, m)), np.empty((T, m)), np.empty((T, m))
        score_max, exp_sum, inv_exp_sum = np.empty(m), np.empty(m), np.empty(m)
        s, h, e = np.empty(m), np.empty(m), np.empty(m)
        gh, ea, emu, q = np.empty((4, m)), np.empty((4, d, m)), np.empty((4, d, m)), np.empty((4, d))
        hi = (b + 1) * n // nb
        for j0 in range(b * n // nb, hi, 4):
            for r in range(4):
                j = j0 + r
                if j >= hi:
                    gh[r], ea[r], emu[r], q[r] = 0.0, 0.0, 0.0, 0.0
                    continue
                _states(X, j, Wr, UT, inv_tau, n_keys, v, score_max, exp_sum, inv_exp_sum, alpha, p, s)
                _activate(s, code, h)
                f[j] = readout(c, h)
                g = g_scale * (f[j] - y[j])
                _moments(X, j, n_keys, alpha, p, s, ea[r], emu[r])
                if code == 0:                        # tanh: σ' = 1 − h²
                    for i in range(m):
                        e[i] = g * c[i] * (1.0 - h[i] * h[i]) * scale
                else:
                    for i in range(m):
                        e[i] = g * c[i] * dsigma(s[i], code) * scale
                for i in range(m):
                    gh[r, i] = g * h[i]
                for k in range(d):
                    q[r, k] = X[j, T - 1, k]
                    for i in range(m):
                        ea[r, k, i] *= e[i]
                        emu[r, k, i] *= e[i]
            _accumulate(gh, ea, emu, q, part_c[b], part_U[b], part_W[b])
    sum_blocks(part_c, grad_c)
    sum_blocks(part_U, grad_U)
    sum_blocks(part_W, grad_W)
    for i in range(m):
        grad_c[i] *= scale
        for k in range(d):
            for l in range(d):
                grad_W[k, l, i] *= inv_tau


@njit(cache=True, error_model="numpy")
def _accumulate(gh, ea, emu, q, pc, pu, pw):
    """Add a group of four samples r (in order) to the partial gradients of one block, one
    :func:`ntpref.shallow.summation.add4` step per entry:
    pc [m] += Σ_r g_r h_r, pu [d, m] += Σ_r e_r a_r, pw [d, d, m] += Σ_r (e_r M U_r) q_r^T."""
    d, m = pu.shape
    for i in range(m):
        pc[i] = add4(pc[i], gh[0, i], gh[1, i], gh[2, i], gh[3, i])
    for k in range(d):
        puk, a0, a1, a2, a3 = pu[k], ea[0, k], ea[1, k], ea[2, k], ea[3, k]
        for i in range(m):
            puk[i] = add4(puk[i], a0[i], a1[i], a2[i], a3[i])
        u0, u1, u2, u3 = emu[0, k], emu[1, k], emu[2, k], emu[3, k]
        for l in range(d):
            q0, q1, q2, q3, pwl = q[0, l], q[1, l], q[2, l], q[3, l], pw[k, l]
            for i in range(m):
                pwl[i] = add4(pwl[i], u0[i] * q0, u1[i] * q1, u2[i] * q2, u3[i] * q3)
