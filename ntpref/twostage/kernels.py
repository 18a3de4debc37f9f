"""Numba kernels of paper (1) (docs/twostage.md §2–§4): passes over a weighted sentence set that give the
loss, the per-sentence values and the gradients of W_ov and W_kq, naive or in log scale, and the
normalized-GD loop built on them.

Token space. With B_ov = E^T W_ov E and B_kq = E^T W_kq E (both [K, K]) a sentence τ_1..τ_L with query
q = τ_L has

    s_l = B_kq[τ_l, q],   φ = softmax(s),   z = Σ_l φ_l B_ov[:, τ_l],   ℓ = -log softmax(z)_y

and the gradients are E G_ov E^T, E G_kq E^T with token-space G's (column τ_l of G_ov gets g_z φ_l,
entry [τ_l, q] of G_kq gets g_s,l). For E = I (one-hot) B = W and no transform is needed; otherwise
:func:`congruence` does the two changes of basis (E^T W E and E G E^T). The passes read B_ov as its
transpose BovT and sum G_ov as its transpose GovT (row τ of GovT is column τ of G_ov).

A sentence set carries weights w_i (1/N for Eq. 1; the normalised collocation weights for L0, whose
sentences are the one-token sentences [x] with target n(x)). :func:`pass_serial` (one call; or
:func:`sentences_parallel` then :func:`reduce`) handles all modes:

    MODE_FORWARD   loss, per-sentence losses, logits, attention
    MODE_GRAD      + plain float64 gradients G_ov, G_kq (docs/twostage.md §3, p_y - 1 = -Σ_{v≠y} p_v)
    MODE_KQ_STABLE + the W_kq gradient as exp(log_scale) * G_kq, computed in log scale (docs/twostage.md §4)
    MODE_OV_STABLE + the W_ov gradient as exp(log_scale) * G_ov, computed in log scale

Log scale (per sentence): with margins r_v = z_v - z_y and r_max = max_{v≠y} r_v, p̃_v = e^{r_v - r_max}
(v ≠ y) and S = Σ_{v≠y} p̃_v (summed in v order) give p_v = e^m p̃_v, m = max_{v≠y} log p_v =
r_max - log(1 + e^{r_max} S), so g_z = e^m g̃ with g̃ = p̃ - S e_y (no cancellation, no underflow).
The attention part (docs/twostage.md §4) uses u_l = e^{s_l - s_1} (s_1 = s_{l1}, l1 the first arg max of the scores,
U = Σ_l u_l, so φ = u/U), the class A = {l : a_l = a_{l1}} of the arg max, D_l = a_l - a_{l1} (0 on A),
s_2 = max_{l∉A} s_l and v_l = e^{s_l - s_2} (l ∉ A); every u_l, v_l ≤ 1. Exactly,

    g_s,l = e^σ g̃_l,   σ = log φ_{l1} + log φ_{k1} = (s_2 - s_1) - 2 log U   (k1 an arg max outside A)
    g̃_l = -u_l Σ_{k∉A} v_k D_k          for l ∈ A      (the term on the arg max, no cancellation)
    g̃_l = v_l (D_l U - Σ_{k∉A} u_k D_k)  for l ∉ A

(the sums in position order). This is φ_l (a_l - φ·a) = Σ_k φ_l φ_k (a_l - a_k) with φ_l φ_k = e^σ u_l v_k
(l ∈ A) or e^σ v_l u_k (l ∉ A) and σ the largest log φ_l + log φ_k over pairs with a_l ≠ a_k; 2L
exponentials per sentence (u, v) instead of one per pair (the NumPy backend's ``_np_kq_stable`` is this
algorithm, vectorised over sentences). When all a_l are equal, g_s = 0 exactly and σ = -inf. ã = X^T W_ov^T E g̃ (a = e^m ã). Each sentence's log scale
λ_i = σ + m + log w_i; the sum over sentences is shifted by Λ = max λ_i, which is returned.

Work slots. A pass keeps every per-sentence quantity in its own array with one row per sentence, [N],
[N, K] or [N, Lmax], the fields of :class:`Slots` (from :func:`slots`):

    forward          l1 (the first arg max, int64), u = u_l, attn = φ, logits = z, rmax = r_max,
                     e_rmax = e^{-|r_max|}, gzt = g̃, losses = ℓ_i, m = m_i
    MODE_GRAD        e_m = e^{m_i}, gz = g_z = e^m g̃, a = X^T W_ov^T E g_z, gs = g_s = φ ⊙ (a - (φ·a) 1)
    MODE_KQ_STABLE   a = ã, D = D_l, gap = s_2 - s_1 (= σ + 2 log U), v = v_l, gst = g̃_s, lam = λ_i
    MODE_OV_STABLE   lam = λ_i

The reduction sums (gz, gs) in MODE_GRAD and (gzt, gst) in the stable modes (:class:`Results`, from
:func:`_results`), with a factor c_i per sentence: w_i in MODE_GRAD, e^{λ_i - Λ} in the stable modes. A
parallel loop cannot receive a named tuple (numba issue #10139: its gufunc does not know the class), so
the parallel driver hands :func:`_rows` the plain tuple of the slots, which it names again.

Phases and the exponential loop. A pass runs in phases over a range of sentences (:func:`_rows`); each
phase first does the per-sentence work of all its sentences, then takes every exponential that work
needs in one loop over all their rows. This is the one idiom of the module: the per-sentence loop writes
the exponents into the array named for their exponentials (u, gzt, e_rmax, e_m, v, c), and
:func:`_exp_rows` / :func:`_exp_inplace` replace them by their exponentials in place (:func:`ntpref.vmath.exp`,
≤ 1 ulp, the same bits in a vector lane as in a scalar call). A lane that carries no value (a padding
position, the y logit, a position in A) gets the exponent 0 and is set after the loop; no exponent is
-inf. docs/performance.md explains the choice of this order and layout.

    1. l1, u ← s_l - s_1 (padding 0)                               then u ← e^u
    2. U, attn, logits; gzt ← r_v - r_max (y: 0), rmax, e_rmax ← -|r_max|    then gzt ← e^gzt, e_rmax ← e^e_rmax
    3. S, gzt[y] = -S (gzt = g̃), losses, m
    MODE_GRAD:      e_m ← m   then e_m ← e^e_m;   per sentence gz, a, gs
    MODE_KQ_STABLE: per sentence a = ã, D, s_2, gap, v ← s_l - s_2 (A and padding 0)   then v ← e^v;
                    per sentence the sums, gst and lam
    MODE_OV_STABLE: per sentence lam
    reduction (serial, sentence order): c ← λ_i - Λ then c ← e^c (stable modes; c = w in MODE_GRAD);
                    GovT[τ_l, :] += c_i φ_l g_z (or g̃), Gkq[τ_l, q] += c_i g_s,l (or g̃_l)

Determinism. Every value of a sentence is computed by the same operations in the same order whichever
driver runs it: sums over positions run in position order, sums over logits in v order, and the sum over
sentences is serial in sentence order; no kernel uses fastmath. The serial driver (:func:`pass_serial`,
and :func:`ngd_steps`) runs the phases once over all N sentences; the parallel driver
(:func:`sentences_parallel`) runs the same :func:`_rows` on blocks of BLOCK sentences spread over
threads (prange), each block writing only its own rows. So results are bitwise identical for either
driver and any thread count. :func:`ngd_steps` runs whole stretches of Algorithm 1 (update and per-step
metrics) on the serial pass, so a training loop makes one compiled call per chunk of steps.

Compilation. :func:`_rows` and :func:`_pass` are inlined into their callers in Numba's IR
(``inline="always"``) instead of being compiled as functions of their own: Numba optimises each compiled
function together with every function it calls, so each level of calls costs another optimisation of the
code below it. The serial results kept their bits (the stored cases, and two-stage training runs compared
bit for bit before and after). The parallel driver's prange loop calls :func:`_block`, :func:`_rows`
compiled on its own: inlined into that loop, :func:`_rows` gave other values than the serial pass, which
tests/test_twostage_model.py compares with the parallel driver bitwise for 1 and 2 threads. The row range
starts as ``np.int64(0)``, not a literal 0, so both drivers call the one compilation of each phase (Numba
compiles a kernel once more for a literal argument).
"""
import math
from collections import namedtuple

import numpy as np
from numba import njit, prange

from .. import vmath

MODE_FORWARD = 0
MODE_GRAD = 1
MODE_KQ_STABLE = 2
MODE_OV_STABLE = 3
BLOCK = 64         # sentences per work item of the parallel driver

#: The work slots of a pass (module docstring): l1 int64 [N]; rmax, e_rmax, losses, m, e_m, gap, lam [N];
#: logits, gzt, gz [N, K]; u, attn, a, gs, D, v, gst [N, Lmax].
Slots = namedtuple("Slots", "l1 u attn logits gzt rmax e_rmax losses m e_m gz a gs D gap v gst lam")
#: What a pass leaves for the reduction: losses, lam [N], logits [N, K], attn [N, Lmax], and the factors of
#: the gradients, gz [N, K] and gs [N, Lmax] (g_z, g_s in MODE_GRAD; g̃, g̃_s in the stable modes).
Results = namedtuple("Results", "losses lam logits gz attn gs")


@njit(cache=True, error_model="numpy")
def congruence(A, M):
    """A^T M A [q, q] for A [p, q], M [p, p] (explicit loops: T = M A, then A^T T). Both changes of basis:
    B = E^T W E is congruence(E, W) (E [d, K]), and E G E^T is congruence(E^T, G)."""
    p, q = A.shape
    T = np.zeros((p, q))
    for a in range(p):
        for b in range(p):
            mab = M[a, b]
            for v in range(q):
                T[a, v] += mab * A[b, v]
    B = np.zeros((q, q))
    for a in range(p):
        for u in range(q):
            aau = A[a, u]
            for v in range(q):
                B[u, v] += aau * T[a, v]
    return B


@njit(cache=True, error_model="numpy")
def _exp_inplace(x):
    """x ← e^x elementwise for a contiguous 1-D x, as one loop over it (module docstring: the exponential loop)."""
    for j in range(x.shape[0]):
        x[j] = vmath.exp(x[j])


@njit(cache=True, error_model="numpy")
def _exp_rows(X, i0, i1):
    """Rows i0..i1-1 of a C-contiguous 2-D X exponentiated in place, as one loop over their entries."""
    _exp_inplace(X[i0:i1].reshape((i1 - i0) * X.shape[1]))


@njit(cache=True, error_model="numpy")
def _first_argmax_score(i, tokens, lengths, Bkq):
    """(l1, s_l1): the first arg max of the scores s_l = B_kq[τ_l, q] of sentence i and its score."""
    q = tokens[i, lengths[i] - 1]
    l1 = 0
    s1 = Bkq[tokens[i, 0], q]
    for l in range(1, lengths[i]):
        s = Bkq[tokens[i, l], q]
        if s > s1:
            s1 = s
            l1 = l
    return l1, s1


@njit(cache=True, error_model="numpy")
def _forward_rows(i0, i1, tokens, lengths, targets, BovT, Bkq, ws):
    """Forward pass of sentences i0..i1-1, phases 1–3 of the module docstring, into the slots ``ws``.

    Writes l1[i] (the first arg max of the scores, s_1 its score), u[i] = e^{s_l - s_1} (1 on padding),
    attn[i] = φ = u/U with U = Σ_l u_l (position order; 0 on padding), logits[i] = z = Σ_l φ_l B_ov[:, τ_l],
    rmax[i] = r_max, e_rmax[i] = e^{-|r_max|}, gzt[i] = g̃ = p̃ - S e_y (g_z = e^m g̃), losses[i] = ℓ_i and
    m[i] = m_i.
    """
    l1, u, attn, logits, gzt, rmax, e_rmax, losses, m = (ws.l1, ws.u, ws.attn, ws.logits, ws.gzt, ws.rmax,
                                                         ws.e_rmax, ws.losses, ws.m)
    Lmax = u.shape[1]
    K = logits.shape[1]
    for i in range(i0, i1):
        l1[i], s1 = _first_argmax_score(i, tokens, lengths, Bkq)
        L = lengths[i]
        q = tokens[i, L - 1]
        for l in range(L):
            u[i, l] = Bkq[tokens[i, l], q] - s1
        for l in range(L, Lmax):
            u[i, l] = 0.0                    # padding
    _exp_rows(u, i0, i1)
    for i in range(i0, i1):
        L = lengths[i]
        y = targets[i]
        U = 0.0
        for l in range(L):
            U += u[i, l]
        for l in range(L):
            attn[i, l] = u[i, l] / U
        for l in range(L, Lmax):
            attn[i, l] = 0.0
        for v in range(K):
            logits[i, v] = 0.0
        for l in range(L):
            t = tokens[i, l]
            f = attn[i, l]
            for v in range(K):
                logits[i, v] += f * BovT[t, v]
        zy = logits[i, y]
        for v in range(K):
            gzt[i, v] = logits[i, v] - zy    # margins r_v, shifted by r_max below: the exponents of p̃
        gzt[i, y] = -np.inf
        r_max = -np.inf                      # max_{v≠y} r_v
        for v in range(K):
            r_max = gzt[i, v] if gzt[i, v] > r_max else r_max
        gzt[i, y] = 0.0                      # not -inf − r_max: NaN when K = 1 (r_max = -inf)
        for v in range(K):
            gzt[i, v] = gzt[i, v] - r_max
        gzt[i, y] = 0.0                      # no value: set in phase 3
        rmax[i] = r_max
        e_rmax[i] = -abs(r_max)              # e^{-r_max} if r_max > 0, else e^{r_max}
    _exp_rows(gzt, i0, i1)
    _exp_inplace(e_rmax[i0:i1])
    for i in range(i0, i1):
        y = targets[i]
        gzt[i, y] = 0.0
        S = 0.0
        for v in range(K):
            S += gzt[i, v]
        gzt[i, y] = -S
        r_max = rmax[i]
        if r_max > 0.0:
            m[i] = -math.log(e_rmax[i] + S)
            losses[i] = r_max - m[i]
        else:
            losses[i] = math.log1p(e_rmax[i] * S)
            m[i] = r_max - losses[i]


@njit(cache=True, error_model="numpy")
def _sentence_a(i, tokens, lengths, BovT, g, a):
    """a[i, l] = Σ_v g[i, v] B_ov[v, τ_l], v = 0..K-1 in order (a = X^T W_ov^T E g; BovT = B_ov^T): a from
    g = g_z, ã from g = g̃."""
    for l in range(lengths[i]):
        t = tokens[i, l]
        acc = 0.0
        for v in range(g.shape[1]):
            acc += g[i, v] * BovT[t, v]
        a[i, l] = acc


@njit(cache=True, error_model="numpy")
def _naive_rows(i0, i1, tokens, lengths, BovT, ws):
    """Plain float64 gradients of sentences i0..i1-1 (docs/twostage.md §3) into the slots ``ws``:
    e_m[i] = e^{m_i} (one exponential loop), gz[i] = g_z = e^m g̃, a[i] = X^T W_ov^T E g_z,
    gs[i] = g_s = φ ⊙ (a - (φ·a) 1)."""
    m, gzt, attn, e_m, gz, a, gs = ws.m, ws.gzt, ws.attn, ws.e_m, ws.gz, ws.a, ws.gs
    for i in range(i0, i1):
        e_m[i] = m[i]
    _exp_inplace(e_m[i0:i1])
    for i in range(i0, i1):
        em = e_m[i]
        for v in range(gz.shape[1]):
            gz[i, v] = gzt[i, v] * em
        _sentence_a(i, tokens, lengths, BovT, gz, a)
        L = lengths[i]
        pa = 0.0
        for l in range(L):
            pa += attn[i, l] * a[i, l]
        for l in range(L):
            gs[i, l] = attn[i, l] * (a[i, l] - pa)


@njit(cache=True, error_model="numpy")
def kq_stable_rows(i0, i1, tokens, lengths, weights, BovT, Bkq, ws):
    """Log-scaled attention gradients of sentences i0..i1-1 (module docstring) into the slots ``ws``:
    a[i] = ã from g̃, D[i] = D_l, gap[i] = s_2 - s_1, v[i] = v_l (1 on A and padding), then gst[i] = g̃_s
    and lam[i] = λ_i = σ + m + log w_i (-inf, gst[i] = 0, when g_s = 0 exactly)."""
    l1, u, m, gzt, a, D, gap, v, gst, lam = ws.l1, ws.u, ws.m, ws.gzt, ws.a, ws.D, ws.gap, ws.v, ws.gst, ws.lam
    Lmax = v.shape[1]
    for i in range(i0, i1):
        _sentence_a(i, tokens, lengths, BovT, gzt, a)
        L = lengths[i]
        q = tokens[i, L - 1]
        s1 = Bkq[tokens[i, l1[i]], q]
        a1 = a[i, l1[i]]
        s2 = -np.inf                         # top score outside A = {l : a_l = a_l1}
        for l in range(L):
            D[i, l] = a[i, l] - a1           # 0 exactly on A
            s = Bkq[tokens[i, l], q]
            if D[i, l] != 0.0 and s > s2:
                s2 = s
        for l in range(L):
            v[i, l] = Bkq[tokens[i, l], q] - s2 if D[i, l] != 0.0 else 0.0
        for l in range(L, Lmax):
            v[i, l] = 0.0                    # padding
        gap[i] = s2 - s1                     # -inf when all a_l are equal
    _exp_rows(v, i0, i1)
    for i in range(i0, i1):
        L = lengths[i]
        if gap[i] == -np.inf:
            for l in range(L):
                gst[i, l] = 0.0
            lam[i] = -np.inf
            continue
        U = 0.0
        P = 0.0                              # Σ_{k∉A} u_k D_k
        Pv = 0.0                             # Σ_{k∉A} v_k D_k
        for l in range(L):
            U += u[i, l]
            if D[i, l] != 0.0:
                P += u[i, l] * D[i, l]
                Pv += v[i, l] * D[i, l]
        for l in range(L):
            if D[i, l] != 0.0:
                gst[i, l] = v[i, l] * (D[i, l] * U - P)
            else:
                gst[i, l] = -u[i, l] * Pv
        sigma = gap[i] - 2.0 * math.log(U)
        lam[i] = sigma + m[i] + math.log(weights[i]) if weights[i] > 0.0 else -np.inf


@njit(cache=True, error_model="numpy")
def slots(N, Lmax, K):
    """The :class:`Slots` of a pass over N sentences (module docstring), allocated once per pass or training
    loop and reused by every step. Each is its own array, a row of one allocation per shape."""
    l1 = np.empty(N, dtype=np.int64)
    by_sentence = np.empty((7, N))
    rmax, e_rmax, losses, m, e_m, gap, lam = (by_sentence[0], by_sentence[1], by_sentence[2], by_sentence[3],
                                              by_sentence[4], by_sentence[5], by_sentence[6])
    by_logit = np.empty((3, N, K))
    logits, gzt, gz = by_logit[0], by_logit[1], by_logit[2]
    by_position = np.empty((7, N, Lmax))
    u, attn, a, gs, D, v, gst = (by_position[0], by_position[1], by_position[2], by_position[3], by_position[4],
                                 by_position[5], by_position[6])
    return Slots(l1, u, attn, logits, gzt, rmax, e_rmax, losses, m, e_m, gz, a, gs, D, gap, v, gst, lam)


@njit(cache=True, error_model="numpy", inline="always")
def _rows(i0, i1, mode, tokens, lengths, targets, weights, BovT, Bkq, slot_tuple):
    """All per-sentence work of a pass for sentences i0..i1-1 (writes only their rows of the slots);
    ``slot_tuple`` is the plain tuple of the :class:`Slots` (``ws[:]``: a parallel loop cannot pass the
    named one, module docstring)."""
    ws = Slots(*slot_tuple)
    _forward_rows(i0, i1, tokens, lengths, targets, BovT, Bkq, ws)
    if mode == MODE_GRAD:
        _naive_rows(i0, i1, tokens, lengths, BovT, ws)
    elif mode == MODE_KQ_STABLE:
        kq_stable_rows(i0, i1, tokens, lengths, weights, BovT, Bkq, ws)
    elif mode == MODE_OV_STABLE:
        for i in range(i0, i1):
            ws.lam[i] = ws.m[i] + math.log(weights[i]) if weights[i] > 0.0 and ws.m[i] > -np.inf else -np.inf


@njit(cache=True, error_model="numpy")
def _results(ws, mode):
    """The :class:`Results` of a pass in ``mode`` from its slots ``ws``: what :func:`reduce` sums, with gz,
    gs the factors of the gradients, g_z and g_s in MODE_GRAD, g̃ and g̃_s (slots gzt, gst) in the stable
    modes."""
    if mode == MODE_GRAD:
        return Results(ws.losses, ws.lam, ws.logits, ws.gz, ws.attn, ws.gs)
    return Results(ws.losses, ws.lam, ws.logits, ws.gzt, ws.attn, ws.gst)


@njit(cache=True, error_model="numpy")
def _block(i0, i1, mode, tokens, lengths, targets, weights, BovT, Bkq, slot_tuple):
    """:func:`_rows` compiled as a function of its own, for the parallel driver's prange loop (module
    docstring, Compilation)."""
    _rows(i0, i1, mode, tokens, lengths, targets, weights, BovT, Bkq, slot_tuple)


@njit(cache=True, parallel=True, error_model="numpy")
def sentences_parallel(tokens, lengths, targets, weights, Bov, Bkq, mode):
    """The per-sentence part of :func:`pass_serial` with blocks of BLOCK sentences spread over threads
    (prange; each block writes only its own rows, so the result is bitwise the same). Returns the
    :class:`Results` of :func:`_results`, which :func:`reduce` sums. Called from
    Python only: a cached njit caller of a parallel function segfaults when loaded from Numba's cache
    (numba issue #8578)."""
    N, Lmax = tokens.shape
    ws = slots(N, Lmax, Bov.shape[0])
    slot_tuple = ws[:]
    BovT = Bov.T.copy()
    for b in prange((N + BLOCK - 1) // BLOCK):
        _block(b * BLOCK, min(N, (b + 1) * BLOCK), mode, tokens, lengths, targets, weights, BovT, Bkq, slot_tuple)
    return _results(ws, mode)


@njit(cache=True, error_model="numpy", inline="always")
def _pass(tokens, lengths, targets, weights, BovT, Bkq, mode, ws, c, GovT, Gkq):
    """One serial pass over a weighted sentence set into the work slots ``ws`` (see :func:`slots`), with
    c [N] for the factors c_i and the zeroed sums GovT = G_ov^T, Gkq [K, K]; returns (loss, log_scale) as
    :func:`reduce`."""
    _rows(np.int64(0), tokens.shape[0], mode, tokens, lengths, targets, weights, BovT, Bkq, ws[:])   # not a literal 0
    r = _results(ws, mode)
    return reduce_into(tokens, lengths, weights, mode, r.losses, r.lam, r.gz, r.attn, r.gs, c, GovT, Gkq)


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
    loss, log_scale = _pass(tokens, lengths, targets, weights, Bov.T.copy(), Bkq, mode, ws, np.empty(N), GovT, Gkq)
    return loss, log_scale, ws.losses, ws.logits, ws.attn, GovT.T.copy(), Gkq


@njit(cache=True, error_model="numpy")
def reduce_into(tokens, lengths, weights, mode, losses, lam, gz, attn, gs, c, GovT, Gkq):
    """Serial sum of the slots in sentence order into the zeroed GovT = G_ov^T and Gkq, with c [N] for the
    factors c_i (w_i, or e^{λ_i - Λ} in one exponential loop in the stable modes); returns
    (loss, log_scale) as :func:`reduce`."""
    N = tokens.shape[0]
    loss = 0.0
    for i in range(N):
        loss += weights[i] * losses[i]
    if mode == MODE_FORWARD:
        return loss, 0.0
    log_scale = 0.0
    if mode == MODE_KQ_STABLE or mode == MODE_OV_STABLE:
        log_scale = -np.inf
        for i in range(N):
            if lam[i] > log_scale:
                log_scale = lam[i]
        if log_scale == -np.inf:
            return loss, log_scale
        for i in range(N):
            c[i] = lam[i] - log_scale if lam[i] > -np.inf else 0.0
        _exp_inplace(c)
    else:
        for i in range(N):
            c[i] = weights[i]
    for i in range(N):
        if mode != MODE_GRAD and lam[i] == -np.inf:
            continue
        c_ov = c[i] if mode != MODE_KQ_STABLE else 0.0
        c_kq = c[i] if mode != MODE_OV_STABLE else 0.0
        L = lengths[i]
        q = tokens[i, L - 1]
        for l in range(L):
            t = tokens[i, l]
            if c_ov != 0.0:
                f = c_ov * attn[i, l]
                for v in range(gz.shape[1]):
                    GovT[t, v] += gz[i, v] * f
            if c_kq != 0.0:
                Gkq[t, q] += c_kq * gs[i, l]
    return loss, log_scale


@njit(cache=True, error_model="numpy")
def reduce(tokens, lengths, weights, mode, losses, lam, gz, attn, gs):
    """Serial sum of the slots of :func:`sentences_parallel` in sentence order. Returns (loss, log_scale,
    G_ov [K, K], G_kq [K, K]): loss = Σ_i w_i ℓ_i; in MODE_GRAD the gradients themselves (log_scale 0);
    in the stable modes the gradient of the named matrix is exp(log_scale) * G (log_scale -inf and G = 0
    when it is exactly 0).
    """
    K = gz.shape[1]
    GovT = np.zeros((K, K))          # G_ov^T: row τ collects column τ of G_ov
    Gkq = np.zeros((K, K))
    loss, log_scale = reduce_into(tokens, lengths, weights, mode, losses, lam, gz, attn, gs,
                                  np.empty(tokens.shape[0]), GovT, Gkq)
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
        mass_i = 0.0
        for l in range(lengths[i]):
            if tokens[i, l] == xstar[i]:
                mass_i += attn[i, l]
        mass += mass_i
    return correct / N, mass / N


@njit(cache=True, error_model="numpy")
def _transpose_into(A, out):
    """out = A^T for a square A."""
    for r in range(A.shape[0]):
        for c in range(A.shape[1]):
            out[c, r] = A[r, c]


@njit(cache=True, error_model="numpy")
def _copy_into(A, out):
    """out = A for two arrays of the same 2-D shape (a loop: Numba's array assignment compiles an error
    message of many string operations)."""
    for r in range(A.shape[0]):
        for c in range(A.shape[1]):
            out[r, c] = A[r, c]


@njit(cache=True, error_model="numpy")
def ngd_steps(tokens, lengths, targets, weights, E, onehot, W_ov, W_kq, train_kq, xstar, eta, mode, t0, t1, T,
              loss, accuracy, attn_opt, W_hist):
    """Steps t = t0..t1-1 of normalized GD (docs/twostage.md §4) on a weighted sentence set, all in compiled code.

    Trains W_kq (``train_kq``, W_ov frozen: stage 2) or W_ov (W_kq unused: stage 1) in place:
    W ← W − η G/‖G‖_F with G the gradient of the trained matrix from a pass in ``mode`` (MODE_GRAD,
    naive, or the stable mode of that matrix). At each t it first records the current iterate W into
    W_hist[t - t0] and its metrics loss, accuracy, attn_opt (mass on ``xstar``) at index t (the caller
    forms norms and correlations from W_hist with NumPy); at t == T it only records them (forward
    pass). E [d, K] with ``onehot`` (E = I, no basis change). Returns the step t at which G was exactly
    zero (W not updated, loop stopped), else -1.
    """
    N, Lmax = tokens.shape
    d, K = E.shape
    ET = E.T.copy()                          # E^T [K, d]: G → E G E^T = congruence(E^T, G)
    ws = slots(N, Lmax, K)
    c = np.empty(N)
    W = W_kq if train_kq else W_ov
    BovT = np.empty((K, K))
    Bkq = W_kq if onehot else congruence(E, W_kq)
    if train_kq:
        _transpose_into(W_ov if onehot else congruence(E, W_ov), BovT)
    GovT = np.empty((K, K))
    Gkq = np.empty((K, K))
    G_ov = np.empty((K, K))
    step = np.empty((d, d))                  # G/‖G‖_F
    for t in range(t0, t1):
        if train_kq and not onehot:
            Bkq = congruence(E, W_kq)
        if not train_kq:
            _transpose_into(W_ov if onehot else congruence(E, W_ov), BovT)
        GovT[:] = 0.0
        Gkq[:] = 0.0
        pass_mode = MODE_FORWARD if t == T else mode
        loss[t], log_scale = _pass(tokens, lengths, targets, weights, BovT, Bkq, pass_mode, ws, c, GovT, Gkq)
        _copy_into(W, W_hist[t - t0])
        accuracy[t], attn_opt[t] = accuracy_and_mass(ws.logits, ws.attn, tokens, lengths, targets, xstar)
        if t == T:
            break
        if train_kq:
            G = Gkq
        else:
            _transpose_into(GovT, G_ov)
            G = G_ov
        if not onehot:
            G = congruence(ET, G)
        if _unit_into(G, log_scale, step) == -np.inf:
            return t
        for r in range(d):
            for col in range(d):
                W[r, col] = W[r, col] - eta * step[r, col]
    return -1
