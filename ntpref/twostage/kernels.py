"""Numba kernels of paper (1) (spec/twostage.md §2–§4), all in one module.

Every kernel works in *token space*: with B_ov = E^T W_ov E and B_kq = E^T W_kq E (both [K, K]) a
sentence τ_1..τ_L with query q = τ_L has

    s_l = B_kq[τ_l, q],   φ = softmax(s),   z = Σ_l φ_l B_ov[:, τ_l],   ℓ = -log softmax(z)_y

and the gradients are E G_ov E^T, E G_kq E^T with token-space G's (column τ_l of G_ov gets g_z φ_l,
entry [τ_l, q] of G_kq gets g_s,l). For E = I (one-hot) B = W and no transform is needed; otherwise
:func:`token_matrix` / :func:`embed_matrix` do the two changes of basis.

A sentence set carries weights w_i (1/N for Eq. 1; the normalised collocation weights for L0, whose
sentences are the one-token sentences [x] with target n(x)). :func:`sentences_serial` (or
:func:`sentences_parallel`) then :func:`reduce` handle all modes:

    MODE_FORWARD   loss, per-sentence losses, logits, attention
    MODE_GRAD      + plain float64 gradients G_ov, G_kq (spec §3, p_y - 1 = -Σ_{v≠y} p_v)
    MODE_KQ_STABLE + the W_kq gradient as exp(log_scale) * G_kq, computed in log scale (spec §4)
    MODE_OV_STABLE + the W_ov gradient as exp(log_scale) * G_ov, computed in log scale

Log scale (per sentence): with margins r_v = z_v - z_y and r_max = max_{v≠y} r_v, p̃_v = e^{r_v - r_max}
(v ≠ y) and S = Σ_{v≠y} p̃_v give p_v = e^m p̃_v, m = max_{v≠y} log p_v = r_max - log(1 + e^{r_max} S),
so g_z = e^m g̃ with g̃ = p̃ - S e_y (no cancellation, no underflow). The attention part uses the exact
identity g_s,l = φ_l (a_l - φ·a) = Σ_k φ_l φ_k (a_l - a_k): with log φ from the scores and
σ = max{log φ_l + log φ_k : a_l ≠ a_k}, g_s,l = e^{σ + m} Σ_k e^{log φ_l + log φ_k - σ} (ã_l - ã_k),
every exponent ≤ 0 (ã = X^T W_ov^T E g̃). Each sentence's log scale λ_i = σ + m + log w_i; the sum over
sentences is shifted by Λ = max λ_i, which is returned.

Per-sentence work runs serially or in parallel over sentences (prange, writing only per-sentence slots);
the reduction is serial in sentence order, so results are bitwise identical for either driver and any
thread count. Never fastmath. Exponentials come from :mod:`ntpref.vmath` (inlined, vectorizable, ≤ 1
ulp); the drivers transpose B_ov once (BovT) and :func:`reduce` accumulates G_ov transposed, so the
loops over the K logits run with unit stride.
"""
import math

import numpy as np
from numba import njit, prange

from .. import vmath

MODE_FORWARD = 0
MODE_GRAD = 1
MODE_KQ_STABLE = 2
MODE_OV_STABLE = 3


@njit(cache=True, error_model="numpy")
def token_matrix(E, W):
    """E^T W E [K, K] for E [d, K], W [d, d] (explicit loops)."""
    d, K = E.shape
    T = np.zeros((d, K))
    for a in range(d):
        for b in range(d):
            wab = W[a, b]
            for v in range(K):
                T[a, v] += wab * E[b, v]
    B = np.zeros((K, K))
    for a in range(d):
        for u in range(K):
            eau = E[a, u]
            for v in range(K):
                B[u, v] += eau * T[a, v]
    return B


@njit(cache=True, error_model="numpy")
def embed_matrix(E, G):
    """E G E^T [d, d] for E [d, K], G [K, K] (explicit loops)."""
    d, K = E.shape
    T = np.zeros((d, K))
    for a in range(d):
        for u in range(K):
            eau = E[a, u]
            for v in range(K):
                T[a, v] += eau * G[u, v]
    out = np.zeros((d, d))
    for a in range(d):
        for b in range(d):
            acc = 0.0
            for v in range(K):
                acc += T[a, v] * E[b, v]
            out[a, b] = acc
    return out


@njit(cache=True, error_model="numpy")
def _sentence(i, tokens, lengths, targets, BovT, Bkq, attn, lphi, logits, gz):
    """Forward pass of sentence i into its slots; returns (ℓ_i, m_i). BovT = B_ov^T (row τ = column τ
    of B_ov, so the loops over the K logits run with unit stride).

    attn[i, :L] = φ, lphi[i, :L] = log φ (exact from the scores, never log of an underflowed φ),
    logits[i] = z, gz[i] = g̃ = p̃ - S e_y (the log-scaled p - e_y; g_z = e^m g̃).
    """
    L = lengths[i]
    K = BovT.shape[0]
    q = tokens[i, L - 1]
    y = targets[i]
    smax = -np.inf
    for l in range(L):
        s = Bkq[tokens[i, l], q]
        lphi[i, l] = s
        if s > smax:
            smax = s
    Z = 0.0
    for l in range(L):
        u = lphi[i, l] - smax
        e = vmath.exp(u)
        lphi[i, l] = u
        attn[i, l] = e
        Z += e
    logZ = math.log(Z)
    for l in range(L):
        attn[i, l] = attn[i, l] / Z
        lphi[i, l] = lphi[i, l] - logZ
    z = logits[i]
    for v in range(K):
        z[v] = 0.0
    for l in range(L):
        row = BovT[tokens[i, l]]
        f = attn[i, l]
        for v in range(K):
            z[v] += f * row[v]
    zy = z[y]
    rmax = -np.inf
    for v in range(K):
        if v != y and z[v] - zy > rmax:
            rmax = z[v] - zy
    if K == 1:
        gz[i, 0] = 0.0
        return 0.0, -np.inf
    g = gz[i]
    for v in range(K):
        g[v] = vmath.exp((z[v] - zy) - rmax)
    S = 0.0
    for v in range(K):
        if v != y:
            S += g[v]
    g[y] = -S
    if rmax > 0.0:
        m = -math.log(vmath.exp(-rmax) + S)
        return rmax - m, m
    loss = math.log1p(vmath.exp(rmax) * S)
    return loss, rmax - loss


@njit(cache=True, error_model="numpy")
def _sentence_a(i, tokens, lengths, BovT, gz, a):
    """a[i, l] = Σ_v gz[i, v] B_ov[v, τ_l]   (a = X^T W_ov^T E g; BovT = B_ov^T)."""
    K = BovT.shape[0]
    g = gz[i]
    for l in range(lengths[i]):
        row = BovT[tokens[i, l]]
        acc = 0.0
        for v in range(K):
            acc += g[v] * row[v]
        a[i, l] = acc


@njit(cache=True, error_model="numpy")
def _sentence_gs_naive(i, lengths, attn, a, gs):
    """g_s = φ ⊙ (a - (φ·a) 1) (spec §3)."""
    L = lengths[i]
    pa = 0.0
    for l in range(L):
        pa += attn[i, l] * a[i, l]
    for l in range(L):
        gs[i, l] = attn[i, l] * (a[i, l] - pa)


@njit(cache=True, error_model="numpy")
def _sentence_gs_stable(i, lengths, lphi, a, gs):
    """gs[i, l] = Σ_k e^{log φ_l + log φ_k - σ} (a_l - a_k); returns σ (-inf when g_s = 0 exactly).

    The weight of a pair is symmetric, so each unordered pair {l, k} is visited once."""
    L = lengths[i]
    sigma = -np.inf
    for l in range(L):
        gs[i, l] = 0.0
        for k in range(l + 1, L):
            if a[i, l] != a[i, k] and lphi[i, l] + lphi[i, k] > sigma:
                sigma = lphi[i, l] + lphi[i, k]
    if sigma == -np.inf:
        return sigma
    for l in range(L):
        for k in range(l + 1, L):
            dlk = a[i, l] - a[i, k]
            if dlk != 0.0:
                t = vmath.exp((lphi[i, l] + lphi[i, k]) - sigma) * dlk
                gs[i, l] += t
                gs[i, k] -= t
    return sigma


@njit(cache=True, error_model="numpy")
def _one(i, mode, tokens, lengths, targets, weights, BovT, Bkq, losses, lam, logits, gz, attn, lphi, a, gs):
    """All per-sentence work of a pass for sentence i (writes only row / slot i; BovT = B_ov^T)."""
    K = BovT.shape[0]
    loss_i, m = _sentence(i, tokens, lengths, targets, BovT, Bkq, attn, lphi, logits, gz)
    losses[i] = loss_i
    if mode == MODE_GRAD:
        scale = vmath.exp(m)
        for v in range(K):
            gz[i, v] *= scale
        _sentence_a(i, tokens, lengths, BovT, gz, a)
        _sentence_gs_naive(i, lengths, attn, a, gs)
    elif mode == MODE_KQ_STABLE:
        _sentence_a(i, tokens, lengths, BovT, gz, a)
        sigma = _sentence_gs_stable(i, lengths, lphi, a, gs)
        lam[i] = sigma + m + math.log(weights[i]) if weights[i] > 0.0 and sigma > -np.inf else -np.inf
    elif mode == MODE_OV_STABLE:
        lam[i] = m + math.log(weights[i]) if weights[i] > 0.0 and m > -np.inf else -np.inf


@njit(cache=True, error_model="numpy")
def _slots(N, Lmax, K):
    """Per-sentence output slots: losses, lam [N]; logits, gz [N, K]; attn, lphi, a, gs [N, Lmax]."""
    return (np.empty(N), np.empty(N), np.empty((N, K)), np.empty((N, K)), np.zeros((N, Lmax)),
            np.empty((N, Lmax)), np.empty((N, Lmax)), np.empty((N, Lmax)))


@njit(cache=True, parallel=True, error_model="numpy")
def sentences_parallel(tokens, lengths, targets, weights, Bov, Bkq, mode):
    """:func:`sentences_serial` with the sentences spread over threads (prange; each iteration writes
    only its own slots, so the result is bitwise the same). Called from Python only: a cached njit
    caller of a parallel function segfaults when loaded from Numba's cache (numba issue #8578)."""
    N, Lmax = tokens.shape
    losses, lam, logits, gz, attn, lphi, a, gs = _slots(N, Lmax, Bov.shape[0])
    BovT = Bov.T.copy()
    for i in prange(N):
        _one(i, mode, tokens, lengths, targets, weights, BovT, Bkq, losses, lam, logits, gz, attn, lphi, a, gs)
    return losses, lam, logits, gz, attn, gs


@njit(cache=True, error_model="numpy")
def sentences_serial(tokens, lengths, targets, weights, Bov, Bkq, mode):
    """Per-sentence pass over a weighted sentence set in token space (module docstring).

    tokens [N, Lmax] int64 (-1 padding), lengths [N], targets [N], weights [N] (sum 1),
    Bov, Bkq [K, K], mode one of MODE_*.
    Returns the slots (losses [N], lam [N], logits [N, K], gz [N, K], attn [N, Lmax], gs [N, Lmax])
    that :func:`reduce` sums.
    """
    N, Lmax = tokens.shape
    losses, lam, logits, gz, attn, lphi, a, gs = _slots(N, Lmax, Bov.shape[0])
    BovT = Bov.T.copy()
    for i in range(N):
        _one(i, mode, tokens, lengths, targets, weights, BovT, Bkq, losses, lam, logits, gz, attn, lphi, a, gs)
    return losses, lam, logits, gz, attn, gs


@njit(cache=True, error_model="numpy")
def reduce(tokens, lengths, weights, mode, losses, lam, gz, attn, gs):
    """Serial sum of the slots in sentence order. Returns (loss, log_scale, G_ov [K, K], G_kq [K, K]):
    loss = Σ_i w_i ℓ_i; in MODE_GRAD the gradients themselves (log_scale 0); in the stable modes the
    gradient of the named matrix is exp(log_scale) * G (log_scale -inf and G = 0 when it is exactly 0).
    """
    N = tokens.shape[0]
    K = gz.shape[1]
    loss = 0.0
    for i in range(N):
        loss += weights[i] * losses[i]
    GovT = np.zeros((K, K))          # G_ov^T: row τ collects column τ of G_ov (unit stride)
    Gkq = np.zeros((K, K))
    log_scale = 0.0
    if mode == MODE_KQ_STABLE or mode == MODE_OV_STABLE:
        log_scale = -np.inf
        for i in range(N):
            if lam[i] > log_scale:
                log_scale = lam[i]
        if log_scale == -np.inf:
            return loss, log_scale, GovT, Gkq
    for i in range(N):
        if mode == MODE_GRAD:
            c_ov = weights[i]
            c_kq = weights[i]
        elif mode == MODE_KQ_STABLE or mode == MODE_OV_STABLE:
            if lam[i] == -np.inf:
                continue
            c = vmath.exp(lam[i] - log_scale)
            c_ov = c if mode == MODE_OV_STABLE else 0.0
            c_kq = c if mode == MODE_KQ_STABLE else 0.0
        else:
            break
        L = lengths[i]
        q = tokens[i, L - 1]
        for l in range(L):
            t = tokens[i, l]
            if c_ov != 0.0:
                f = c_ov * attn[i, l]
                row = GovT[t]
                g = gz[i]
                for v in range(K):
                    row[v] += g[v] * f
            if c_kq != 0.0:
                Gkq[t, q] += c_kq * gs[i, l]
    return loss, log_scale, GovT.T.copy(), Gkq


@njit(cache=True, error_model="numpy")
def unit(G, log_scale):
    """(G/‖G‖_F, log_scale + log ‖G‖_F), the norm formed from G/max|G| (no overflow); (0, -inf) when G = 0."""
    amax = 0.0
    for x in G.ravel():
        if abs(x) > amax:
            amax = abs(x)
    if amax == 0.0 or log_scale == -np.inf:
        return np.zeros_like(G), -np.inf
    acc = 0.0
    for x in G.ravel():
        acc += (x / amax) * (x / amax)
    nrm = math.sqrt(acc)
    return G / (amax * nrm), log_scale + math.log(amax) + math.log(nrm)
