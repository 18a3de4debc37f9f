"""Numba kernels of paper (1) (spec/twostage.md §2–§4), all in one module.

Every kernel works in *token space*: with B_ov = E^T W_ov E and B_kq = E^T W_kq E (both [K, K]) a
sentence τ_1..τ_L with query q = τ_L has

    s_l = B_kq[τ_l, q],   φ = softmax(s),   z = Σ_l φ_l B_ov[:, τ_l],   ℓ = -log softmax(z)_y

and the gradients are E G_ov E^T, E G_kq E^T with token-space G's (column τ_l of G_ov gets g_z φ_l,
entry [τ_l, q] of G_kq gets g_s,l). For E = I (one-hot) B = W and no transform is needed; otherwise
:func:`token_matrix` / :func:`embed_matrix` do the two changes of basis.

A sentence set carries weights w_i (1/N for Eq. 1; the normalised collocation weights for L0, whose
sentences are the one-token sentences [x] with target n(x)). :func:`pass_serial` (one call; or
:func:`sentences_parallel` then :func:`reduce`) handles all modes:

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
thread count. :func:`ngd_steps` runs whole stretches of Algorithm 1 (update and per-step metrics) on the
serial pass, so a training loop makes one compiled call per chunk of steps instead of one per step. Never fastmath. Exponentials come from :mod:`ntpref.vmath` (inlined, vectorizable, ≤ 1
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


@njit(cache=True, error_model="numpy", inline="always")
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
    for v in range(K):
        logits[i, v] = 0.0
    for l in range(L):
        t = tokens[i, l]
        f = attn[i, l]
        for v in range(K):
            logits[i, v] += f * BovT[t, v]
    zy = logits[i, y]
    rmax = -np.inf
    for v in range(K):
        if v != y and logits[i, v] - zy > rmax:
            rmax = logits[i, v] - zy
    if K == 1:
        gz[i, 0] = 0.0
        return 0.0, -np.inf
    for v in range(K):
        gz[i, v] = vmath.exp((logits[i, v] - zy) - rmax)
    S = 0.0
    for v in range(K):
        if v != y:
            S += gz[i, v]
    gz[i, y] = -S
    if rmax > 0.0:
        m = -math.log(vmath.exp(-rmax) + S)
        return rmax - m, m
    loss = math.log1p(vmath.exp(rmax) * S)
    return loss, rmax - loss


@njit(cache=True, error_model="numpy", inline="always")
def _sentence_a(i, tokens, lengths, BovT, gz, a):
    """a[i, l] = Σ_v gz[i, v] B_ov[v, τ_l]   (a = X^T W_ov^T E g; BovT = B_ov^T)."""
    K = BovT.shape[0]
    for l in range(lengths[i]):
        t = tokens[i, l]
        acc = 0.0
        for v in range(K):
            acc += gz[i, v] * BovT[t, v]
        a[i, l] = acc


@njit(cache=True, error_model="numpy", inline="always")
def _sentence_gs_naive(i, lengths, attn, a, gs):
    """g_s = φ ⊙ (a - (φ·a) 1) (spec §3)."""
    L = lengths[i]
    pa = 0.0
    for l in range(L):
        pa += attn[i, l] * a[i, l]
    for l in range(L):
        gs[i, l] = attn[i, l] * (a[i, l] - pa)


@njit(cache=True, error_model="numpy", inline="always")
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


@njit(cache=True, error_model="numpy", inline="always")
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
def slots(N, Lmax, K):
    """Per-sentence work slots of a pass: losses, lam [N]; logits, gz [N, K]; attn, lphi, a, gs [N, Lmax]
    (allocated once per training loop and reused by every step)."""
    return (np.empty(N), np.empty(N), np.empty((N, K)), np.empty((N, K)), np.zeros((N, Lmax)),
            np.empty((N, Lmax)), np.empty((N, Lmax)), np.empty((N, Lmax)))


@njit(cache=True, parallel=True, error_model="numpy")
def sentences_parallel(tokens, lengths, targets, weights, Bov, Bkq, mode):
    """The per-sentence part of :func:`pass_serial` with the sentences spread over threads (prange; each
    iteration writes only its own slots, so the result is bitwise the same). Returns the slots (losses,
    lam, logits, gz, attn, gs) that :func:`reduce` sums. Called from Python only: a cached njit caller
    of a parallel function segfaults when loaded from Numba's cache (numba issue #8578)."""
    N, Lmax = tokens.shape
    losses, lam, logits, gz, attn, lphi, a, gs = slots(N, Lmax, Bov.shape[0])
    BovT = Bov.T.copy()
    for i in prange(N):
        _one(i, mode, tokens, lengths, targets, weights, BovT, Bkq, losses, lam, logits, gz, attn, lphi, a, gs)
    return losses, lam, logits, gz, attn, gs


@njit(cache=True, error_model="numpy")
def _pass(tokens, lengths, targets, weights, BovT, Bkq, mode, ws, GovT, Gkq):
    """One serial pass over a weighted sentence set into the work slots ``ws`` (see :func:`slots`) and
    the zeroed sums GovT = G_ov^T, Gkq [K, K]; returns (loss, log_scale) as :func:`reduce`."""
    losses, lam, logits, gz, attn, lphi, a, gs = ws
    # one loop per mode, each passing the mode as a constant to the inlined _one (its branches fold away)
    if mode == MODE_KQ_STABLE:
        for i in range(tokens.shape[0]):
            _one(i, MODE_KQ_STABLE, tokens, lengths, targets, weights, BovT, Bkq, losses, lam, logits, gz, attn,
                 lphi, a, gs)
    elif mode == MODE_OV_STABLE:
        for i in range(tokens.shape[0]):
            _one(i, MODE_OV_STABLE, tokens, lengths, targets, weights, BovT, Bkq, losses, lam, logits, gz, attn,
                 lphi, a, gs)
    elif mode == MODE_GRAD:
        for i in range(tokens.shape[0]):
            _one(i, MODE_GRAD, tokens, lengths, targets, weights, BovT, Bkq, losses, lam, logits, gz, attn,
                 lphi, a, gs)
    else:
        for i in range(tokens.shape[0]):
            _one(i, MODE_FORWARD, tokens, lengths, targets, weights, BovT, Bkq, losses, lam, logits, gz, attn,
                 lphi, a, gs)
    return _reduce_into(tokens, lengths, weights, mode, losses, lam, gz, attn, gs, GovT, Gkq)


@njit(cache=True, error_model="numpy")
def pass_serial(tokens, lengths, targets, weights, Bov, Bkq, mode):
    """Per-sentence pass over a weighted sentence set in token space (module docstring) and its serial
    reduction, in one call.

    tokens [N, Lmax] int64 (-1 padding), lengths [N], targets [N], weights [N] (sum 1),
    Bov, Bkq [K, K], mode one of MODE_*.
    Returns (loss, log_scale, losses [N], logits [N, K], attn [N, Lmax], G_ov [K, K], G_kq [K, K]) with
    loss, log_scale and the G's as in :func:`reduce`.
    """
    N, Lmax = tokens.shape
    K = Bov.shape[0]
    ws = slots(N, Lmax, K)
    GovT = np.zeros((K, K))
    Gkq = np.zeros((K, K))
    loss, log_scale = _pass(tokens, lengths, targets, weights, Bov.T.copy(), Bkq, mode, ws, GovT, Gkq)
    return loss, log_scale, ws[0], ws[2], ws[4], GovT.T.copy(), Gkq


@njit(cache=True, error_model="numpy")
def _reduce_into(tokens, lengths, weights, mode, losses, lam, gz, attn, gs, GovT, Gkq):
    """Serial sum of the slots in sentence order into the zeroed GovT = G_ov^T and Gkq; returns
    (loss, log_scale) as :func:`reduce`."""
    N = tokens.shape[0]
    K = gz.shape[1]
    loss = 0.0
    for i in range(N):
        loss += weights[i] * losses[i]
    log_scale = 0.0
    if mode == MODE_KQ_STABLE or mode == MODE_OV_STABLE:
        log_scale = -np.inf
        for i in range(N):
            if lam[i] > log_scale:
                log_scale = lam[i]
        if log_scale == -np.inf:
            return loss, log_scale
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
                for v in range(K):
                    GovT[t, v] += gz[i, v] * f
            if c_kq != 0.0:
                Gkq[t, q] += c_kq * gs[i, l]
    return loss, log_scale


@njit(cache=True, error_model="numpy")
def reduce(tokens, lengths, weights, mode, losses, lam, gz, attn, gs):
    """Serial sum of the slots in sentence order. Returns (loss, log_scale, G_ov [K, K], G_kq [K, K]):
    loss = Σ_i w_i ℓ_i; in MODE_GRAD the gradients themselves (log_scale 0); in the stable modes the
    gradient of the named matrix is exp(log_scale) * G (log_scale -inf and G = 0 when it is exactly 0).
    """
    K = gz.shape[1]
    GovT = np.zeros((K, K))          # G_ov^T: row τ collects column τ of G_ov (unit stride)
    Gkq = np.zeros((K, K))
    loss, log_scale = _reduce_into(tokens, lengths, weights, mode, losses, lam, gz, attn, gs, GovT, Gkq)
    return loss, log_scale, GovT.T.copy(), Gkq


@njit(cache=True, error_model="numpy")
def _unit_into(G, log_scale, out):
    """out = G/‖G‖_F; returns log_scale + log ‖G‖_F, the norm formed from G/max|G| (no overflow);
    -inf (out untouched) when G = 0 or log_scale = -inf."""
    amax = 0.0
    for x in G.ravel():
        if abs(x) > amax:
            amax = abs(x)
    if amax == 0.0 or log_scale == -np.inf:
        return -np.inf
    acc = 0.0
    for x in G.ravel():
        acc += (x / amax) * (x / amax)
    nrm = math.sqrt(acc)
    c = amax * nrm
    Gf = G.ravel()
    of = out.ravel()
    for j in range(Gf.size):
        of[j] = Gf[j] / c
    return log_scale + math.log(amax) + math.log(nrm)


@njit(cache=True, error_model="numpy")
def unit(G, log_scale):
    """(G/‖G‖_F, log_scale + log ‖G‖_F), the norm formed from G/max|G| (no overflow); (0, -inf) when G = 0."""
    out = np.zeros_like(G)
    log_norm = _unit_into(G, log_scale, out)
    if log_norm == -np.inf:
        out[:] = 0.0
    return out, log_norm


@njit(cache=True, error_model="numpy")
def accuracy_and_mass(logits, attn, tokens, lengths, targets, xstar):
    """(fraction of sentences with logits[y] strictly largest, mean attention mass on the tokens = x*)."""
    N, K = logits.shape
    correct = 0.0
    mass = 0.0
    for i in range(N):
        y = targets[i]
        ok = True
        for v in range(K):
            if v != y and logits[i, v] >= logits[i, y]:
                ok = False
                break
        if ok:
            correct += 1.0
        m = 0.0
        for l in range(lengths[i]):
            if tokens[i, l] == xstar[i]:
                m += attn[i, l]
        mass += m
    return correct / N, mass / N


@njit(cache=True, error_model="numpy")
def _transpose_into(A, out):
    n, m = A.shape
    for r in range(n):
        for c in range(m):
            out[c, r] = A[r, c]


@njit(cache=True, error_model="numpy")
def ngd_steps(tokens, lengths, targets, weights, E, onehot, W_ov, W_kq, train_kq, xstar, eta, mode, t0, t1, T,
              loss, accuracy, attn_opt, W_hist):
    """Steps t = t0..t1-1 of normalized GD (spec §4) on a weighted sentence set, all in compiled code.

    Trains W_kq (``train_kq``, W_ov frozen: stage 2) or W_ov (W_kq unused: stage 1) in place:
    W ← W − η G/‖G‖_F with G the gradient of the trained matrix from a pass in ``mode`` (MODE_GRAD,
    naive, or the stable mode of that matrix). At each t it first records the current iterate W into
    W_hist[t - t0] and its metrics loss, accuracy, attn_opt (mass on ``xstar``) at index t (the caller
    forms norms and correlations from W_hist with NumPy); at t == T it only records them (forward pass). E [d, K] with ``onehot`` (E = I, no basis
    change). Returns the step t at which G was exactly zero (W not updated, loop stopped), else -1.
    """
    N, Lmax = tokens.shape
    d, K = E.shape
    ws = slots(N, Lmax, K)
    logits, attn = ws[2], ws[4]
    W = W_kq if train_kq else W_ov
    BovT = np.empty((K, K))
    Bkq = W_kq if onehot else token_matrix(E, W_kq)
    if train_kq:
        _transpose_into(W_ov if onehot else token_matrix(E, W_ov), BovT)
    GovT = np.empty((K, K))
    Gkq = np.empty((K, K))
    G_ov = np.empty((K, K))
    u = np.empty((d, d))
    for t in range(t0, t1):
        if train_kq and not onehot:
            Bkq = token_matrix(E, W_kq)
        if not train_kq:
            _transpose_into(W_ov if onehot else token_matrix(E, W_ov), BovT)
        GovT[:] = 0.0
        Gkq[:] = 0.0
        m = MODE_FORWARD if t == T else mode
        loss[t], log_scale = _pass(tokens, lengths, targets, weights, BovT, Bkq, m, ws, GovT, Gkq)
        W_hist[t - t0] = W
        accuracy[t], attn_opt[t] = accuracy_and_mass(logits, attn, tokens, lengths, targets, xstar)
        if t == T:
            break
        if train_kq:
            G = Gkq
        else:
            _transpose_into(GovT, G_ov)
            G = G_ov
        if not onehot:
            G = embed_matrix(E, G)
        if _unit_into(G, log_scale, u) == -np.inf:
            return t
        for r in range(d):
            for c in range(d):
                W[r, c] = W[r, c] - eta * u[r, c]
    return -1
