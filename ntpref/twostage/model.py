"""One-layer transformer of paper (1): forward pass, Eq. 1 loss, closed-form gradients, collocation loss
L0, the ideal feed-forward closed form and the normalized-GD directions (docs/twostage.md §2–§4).

Per sentence X = [e_τ1 .. e_τL] (query x_L = e_q, target y):

    s = X^T W_kq x_L,  φ = softmax(s),  z = E^T W_ov X φ,  p = softmax(z),  ℓ = -log p_y
    L(W_ov, W_kq) = mean_i ℓ_i                                                     (Eq. 1)
    g_z = p - e_y  (p_y - 1 = -Σ_{v≠y} p_v),  ∂ℓ/∂W_ov = E g_z (Xφ)^T
    a = X^T W_ov^T E g_z,  g_s = φ ⊙ (a - (φ·a) 1),  ∂ℓ/∂W_kq = X g_s x_L^T           (§3)
    L0(W_ov) = Σ_{x∈C} w_x ℓ([x], n(x)),  w_x = 1/|C| or weights normalised over C

Data: a :class:`Prepared` weighted sentence set, validated once. :func:`prepare` gives the Eq. 1 set of a
Dataset (weights 1/N); :func:`prepare_collocations` the collocation set D0 = {([x], n(x)) : x ∈ C} of L0
(weights w_x), so that ``loss_and_grad(prepare_collocations(E, succ), W_ov, None)`` is (L0, ∇L0, 0).
:func:`forward`, :func:`loss_and_grad`, :func:`step` and :func:`direction` take a Prepared set (what a
training loop passes every step) or a Dataset (prepared on each call) and W_ov, W_kq [d, d]; W_kq may be
None for a set of one-token sentences (Lmax = 1, such as D0), whose attention is 1 whatever W_kq.

Backends (keyword ``backend`` of every call): ``"numba"`` (token-space kernels in :mod:`.kernels`, one-hot
fast path when E = I) and ``"numpy"`` (vectorised, in the X-form above; its stable attention direction,
``_np_kq_stable``, is the kernels' algorithm line by line). Both are numerically stable for any finite
input (log-sum-exp everywhere, margins r_v = z_v - z_y instead of p_y - 1).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..checks import as_float, as_int, as_scalar, check_backend
from ..errors import InputError
from . import kernels
from .dataset import Dataset, check_dataset, collocation_set

METHODS = ("stable", "naive")
"""How a direction G/‖G‖_F is computed: "stable" (in log scale, docs/twostage.md §4) or "naive" (from the
float64 gradient)."""
WRT = ("kq", "ov")
"""The matrix whose gradient a direction normalises: "kq" (W_kq, stage 2) or "ov" (W_ov, stage 1)."""
PARALLEL_MIN_WORK = 1 << 20
"""The Numba backend runs the sentences in parallel (prange) only when N * Lmax * K reaches this; a smaller
set runs in one serial pass, so a small run never compiles the parallel driver (results are bitwise the
same either way). Not a measured break-even: at N * Lmax * K = 24,000 two quiet cores already ran the
parallel driver faster than the serial pass (docs/performance.md, "The two-stage step against one core")."""

class Forward(NamedTuple):
    """loss (Eq. 1; the weighted loss of a Prepared set), losses [N] (ℓ_i), logits [N, K] (z),
    attn [N, Lmax] (φ, 0 on padding)."""

    loss: float
    losses: np.ndarray
    logits: np.ndarray
    attn: np.ndarray


class LossAndGrad(NamedTuple):
    """loss (Eq. 1; the weighted loss of a Prepared set), grad_W_ov [d, d] and grad_W_kq [d, d] (the
    closed forms of docs/twostage.md §3)."""

    loss: float
    grad_W_ov: np.ndarray
    grad_W_kq: np.ndarray


class Direction(NamedTuple):
    """unit = G/‖G‖_F [d, d] (None when G is exactly zero); log_norm = log ‖G‖_F (-inf when zero)."""

    unit: np.ndarray | None
    log_norm: float


class Step(NamedTuple):
    """The pass of one normalized-GD step (docs/twostage.md §4) at the current iterate: loss, logits [N, K],
    attn [N, Lmax] as in :class:`Forward`, and the :class:`Direction` of the trained matrix's gradient."""

    loss: float
    logits: np.ndarray
    attn: np.ndarray
    direction: Direction


class Prepared(NamedTuple):
    """A validated weighted sentence set, built by :func:`prepare` (Eq. 1) or :func:`prepare_collocations` (L0).

    tokens [N, Lmax] int64 (-1 padding), lengths [N], targets [N] int64; weights [N] float64 summing
    to 1 (the loss is Σ_i w_i ℓ_i); E [d, K] float64; onehot: E is the identity (the Numba backend then
    skips the basis change). Every array is a private writable C-contiguous copy, so each Numba kernel
    compiles one signature (Numba types read-only arrays, such as a Dataset's, separately). Built by hand it
    is not validated.
    """

    tokens: np.ndarray
    lengths: np.ndarray
    targets: np.ndarray
    weights: np.ndarray
    E: np.ndarray
    onehot: bool

    @property
    def d(self) -> int:
        return self.E.shape[0]

    @property
    def K(self) -> int:
        return self.E.shape[1]


# ---- validation and preparation -------------------------------------------------------------------

def check_method(method, what: str = "method") -> str:
    """``method`` if it is one of :data:`METHODS`, else InputError "<what> must be one of stable, naive, ..."."""
    if method not in METHODS:
        raise InputError(f"{what} must be one of {', '.join(METHODS)}, got {method!r}")
    return method


def kernel_mode(wrt: str, method: str) -> int:
    """The kernels' pass mode (:mod:`.kernels` MODE_*) that gives the gradient of W_wrt (wrt in :data:`WRT`)
    for a direction by ``method`` (:data:`METHODS`): MODE_GRAD for "naive", the log-scale mode of that
    matrix for "stable". InputError for an unknown wrt or method."""
    check_method(method)
    if wrt not in WRT:
        raise InputError(f"wrt must be one of {', '.join(WRT)}, got {wrt!r}")
    if method == "naive":
        return kernels.MODE_GRAD
    return kernels.MODE_KQ_STABLE if wrt == "kq" else kernels.MODE_OV_STABLE


def prepare(ds: Dataset) -> Prepared:
    """The Eq. 1 sentence set of the Dataset ``ds``: its sentences with uniform weights 1/N."""
    ds = check_dataset(ds)
    return Prepared(ds.tokens.copy(), ds.lengths.copy(), ds.targets.copy(), np.full(ds.N, 1.0 / ds.N),
                    ds.E.copy(), ds.onehot)


def prepare_collocations(E, succ, C=None, weights=None) -> Prepared:
    """The collocation set D0 = {([x], n(x)) : x ∈ C} of L0 (docs/twostage.md §2) with weights w_x: uniform
    1/|C|, or ``weights`` [K] (e.g. token frequencies) normalised to sum 1 over C.

    E [d, K]; succ [K] in -1..K-1 (n, -1 = no successor); C: token ids (default: every x with succ >= 0),
    each with a successor, no repeats; weights [K] finite, >= 0, with a positive sum over C. The sentences
    are in the order of C. With it, L0 = loss_and_grad(D0, W_ov, None).loss and ∇L0 its grad_W_ov.
    """
    E = as_float("E", E, (None, None))
    K = E.shape[1]
    succ = as_int("succ", succ, (K,), low=-1, high=K - 1)
    C = collocation_set(succ, C)
    if weights is None:
        w = np.full(C.size, 1.0 / C.size)
    else:
        weights = as_float("weights", weights, (K,))
        if (weights < 0).any():
            raise InputError(f"array 'weights': negative value at index {int(np.flatnonzero(weights < 0)[0])}")
        wmax = weights[C].max()
        if not wmax > 0:
            raise InputError("array 'weights': the weights of the collocation set C sum to 0")
        w = weights[C] / wmax                                  # scaled first: no overflow in the sum
        w = w / w.sum()
    d0 = Dataset(C[:, None], np.ones(C.size, dtype=np.int64), succ[C], E)      # one-token sentences [x]
    return Prepared(d0.tokens.copy(), d0.lengths.copy(), d0.targets.copy(), w, d0.E.copy(), d0.onehot)


def _prepared_of(data) -> Prepared:
    """``data`` as a Prepared set: itself, or the Eq. 1 set of a Dataset."""
    if isinstance(data, Prepared):
        return data
    if isinstance(data, Dataset):
        return prepare(data)
    raise InputError(f"data: expected a ntpref.twostage.Dataset or Prepared, got {type(data).__name__}")


def _weight(name: str, W, d: int) -> np.ndarray:
    """W as a writable C-contiguous float64 [d, d] array, validated by checks.as_float."""
    W = as_float(name, W, (d, d))
    return W if W.flags.writeable else W.copy()


def _matrices(prep: Prepared, W_ov, W_kq):
    """W_ov, W_kq validated as [d, d] (W_kq None only for one-token sentences)."""
    d = prep.E.shape[0]
    W_ov = _weight("W_ov", W_ov, d)
    if W_kq is None:
        Lmax = prep.tokens.shape[1]
        if Lmax != 1:
            raise InputError(f"array 'W_kq': None is allowed only for one-token sentences (Lmax = 1), "
                             f"got Lmax = {Lmax}")
        return W_ov, None
    return W_ov, _weight("W_kq", W_kq, d)


# ---- NumPy backend (reads like the equations of docs/twostage.md) ---------------------------------------

class _Attention(NamedTuple):
    """The NumPy backend's attention pass over a prepared set (docs/twostage.md §2; the kernels' names)."""

    X: np.ndarray       # [N, Lmax, d] rows x_l (0 on padding)
    xL: np.ndarray      # [N, d] the query x_L
    mask: np.ndarray    # [N, Lmax] positions inside the sentence
    s: np.ndarray       # [N, Lmax] scores s_l = x_l^T W_kq x_L (-inf on padding)
    u: np.ndarray       # [N, Lmax] u_l = e^{s_l - s_1}, s_1 the largest score (0 on padding)
    U: np.ndarray       # [N] Σ_l u_l
    phi: np.ndarray     # [N, Lmax] φ = u / U


def _np_attention(prep: Prepared, W_kq) -> _Attention:
    """The attention of every sentence of ``prep`` at W_kq [d, d]."""
    E = prep.E
    N, Lmax = prep.tokens.shape
    mask = np.arange(Lmax)[None, :] < prep.lengths[:, None]
    X = E.T[np.where(mask, prep.tokens, 0)] * mask[:, :, None]
    xL = E.T[prep.tokens[np.arange(N), prep.lengths - 1]]
    s = np.einsum("nld,de,ne->nl", X, W_kq, xL)                    # s_l = x_l^T W_kq x_L
    s = np.where(mask, s, -np.inf)
    r = s - s.max(axis=1, keepdims=True)
    u = np.exp(r)
    U = u.sum(axis=1)
    return _Attention(X, xL, mask, s, u, U, u / U[:, None])


def _np_output(z, y):
    """From logits z [N, K] and targets y: (ℓ [N], m [N], g̃ [N, K]) with g_z = e^m g̃ (kernels docstring)."""
    N, K = z.shape
    if K == 1:
        return np.zeros(N), np.full(N, -np.inf), np.zeros((N, 1))
    rows = np.arange(N)
    other = np.arange(K)[None, :] != y[:, None]
    r = np.where(other, z - z[rows, y][:, None], -np.inf)          # margins r_v = z_v - z_y, v ≠ y
    rmax = r.max(axis=1)
    g = np.exp(r - rmax[:, None])                                  # p̃_v, 0 at v = y
    S = g.sum(axis=1)
    g[rows, y] = -S
    pos = rmax > 0
    m_pos = -np.log(np.exp(-np.maximum(rmax, 0.0)) + S)
    loss_neg = np.log1p(np.exp(np.minimum(rmax, 0.0)) * S)
    loss = np.where(pos, rmax - m_pos, loss_neg)                   # ℓ = log(1 + Σ_{v≠y} e^{r_v})
    m = np.where(pos, m_pos, rmax - loss_neg)                      # m = max_{v≠y} log p_v
    return loss, m, g


def _np_pass(prep: Prepared, W_ov, W_kq):
    """(attention, Xφ [N, d], logits z [N, K], ℓ [N], m [N], g̃ [N, K]) of the forward pass."""
    att = _np_attention(prep, W_kq)
    h = np.einsum("nl,nld->nd", att.phi, att.X)                    # Xφ
    z = h @ W_ov.T @ prep.E                                        # z = E^T W_ov X φ
    loss, m, g = _np_output(z, prep.targets)
    return att, h, z, loss, m, g


def _np_kq_stable(att: _Attention, a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(g̃_s [N, Lmax], σ [N]) with g_s = e^σ g̃_s: the log-scaled attention gradient of every sentence from
    ã [N, Lmax], by the kernels' algorithm (twostage/kernels.py, ``kq_stable_rows``): l1 the first arg max
    of the scores, the class A = {l : a_l = a_l1}, D_l = a_l − a_l1 (0 on A), s_2 = max_{l∉A} s_l,
    v_l = e^{s_l − s_2} (l ∉ A), P = Σ_{k∉A} u_k D_k, P_v = Σ_{k∉A} v_k D_k; then
    g̃_l = −u_l P_v on A, v_l (D_l U − P) off A, and σ = (s_2 − s_1) − 2 log U; σ = −inf and g̃ = 0 when every
    a_l is equal (g_s = 0 exactly)."""
    rows = np.arange(a.shape[0])
    l1 = np.where(att.mask, att.s, -np.inf).argmax(axis=1)
    D = np.where(att.mask, a - a[rows, l1][:, None], 0.0)
    off = att.mask & (D != 0.0)
    s2 = np.where(off, att.s, -np.inf).max(axis=1)
    gap = s2 - att.s[rows, l1]
    has = gap > -np.inf
    v = np.exp(np.where(off, att.s - np.where(has, s2, 0.0)[:, None], -np.inf))    # 0 on A and padding
    P = (np.where(off, att.u * D, 0.0)).sum(axis=1)
    Pv = (v * D).sum(axis=1)
    gs = np.where(off, v * (D * att.U[:, None] - P[:, None]), np.where(att.mask, -att.u * Pv[:, None], 0.0))
    gs = np.where(has[:, None], gs, 0.0)
    sigma = np.where(has, gap - 2.0 * np.log(att.U), -np.inf)
    return gs, sigma


def _np_log_weights(prep: Prepared):
    w = prep.weights
    return np.where(w > 0, np.log(np.where(w > 0, w, 1.0)), -np.inf)


def _np_run(prep: Prepared, W_ov, W_kq, mode: int):
    """NumPy twin of _numba_pass, returning (loss, log_scale, losses, logits, attn, grad_ov, grad_kq)
    with the gradients already in d-space (E G E^T)."""
    att, h, z, losses, m, g = _np_pass(prep, W_ov, W_kq)
    X, xL, mask, phi = att.X, att.xL, att.mask, att.phi
    w = prep.weights
    loss = float(w @ losses)
    d = prep.d
    G_ov = G_kq = np.zeros((d, d))
    log_scale = 0.0
    if mode == kernels.MODE_GRAD:
        gz = g * np.exp(m)[:, None]
        G_ov = prep.E @ (w[:, None] * gz).T @ h                       # Σ w E g_z (Xφ)^T
        a = np.einsum("nld,nd->nl", X, gz @ prep.E.T @ W_ov)           # a = X^T W_ov^T E g_z
        gs = phi * (a - (phi * a).sum(axis=1, keepdims=True))          # φ ⊙ (a - (φ·a) 1)
        G_kq = np.einsum("nld,nl,ne->de", X, w[:, None] * gs, xL)     # Σ w X g_s x_L^T
    elif mode == kernels.MODE_KQ_STABLE:
        gs, sigma = _np_kq_stable(att, np.einsum("nld,nd->nl", X, g @ prep.E.T @ W_ov))   # from ã
        lam = np.where(sigma > -np.inf, sigma + m, -np.inf) + _np_log_weights(prep)
        log_scale = lam.max()
        if log_scale > -np.inf:
            c = np.exp(lam - log_scale)
            G_kq = np.einsum("nld,nl,ne->de", X, c[:, None] * gs, xL)
    elif mode == kernels.MODE_OV_STABLE:
        lam = m + _np_log_weights(prep)
        log_scale = lam.max()
        if log_scale > -np.inf:
            c = np.exp(lam - log_scale)
            G_ov = prep.E @ (c[:, None] * g).T @ h
    return loss, log_scale, losses, z, np.where(mask, phi, 0.0), G_ov, G_kq


# ---- dispatch ---------------------------------------------------------------------------------------

def runs_parallel(prep: Prepared) -> bool:
    """Whether the Numba backend runs the sentences of ``prep`` in parallel (N * Lmax * K reaches
    :data:`PARALLEL_MIN_WORK`); a smaller set runs in one serial pass (results bitwise the same)."""
    return prep.tokens.size * prep.E.shape[1] >= PARALLEL_MIN_WORK


def _numba_pass(prep: Prepared, Bov, Bkq, mode: int):
    """kernels pass in token space: (loss, log_scale, losses, logits, attn, G_ov [K, K], G_kq [K, K])."""
    if not runs_parallel(prep):
        return kernels.pass_serial(prep.tokens, prep.lengths, prep.targets, prep.weights, Bov, Bkq, mode)
    losses, lam, logits, gz, attn, gs = kernels.sentences_parallel(prep.tokens, prep.lengths, prep.targets,
                                                                   prep.weights, Bov, Bkq, mode)
    loss, log_scale, G_ov, G_kq = kernels.reduce(prep.tokens, prep.lengths, prep.weights, mode,
                                                 losses, lam, gz, attn, gs)
    return loss, log_scale, losses, logits, attn, G_ov, G_kq


def _run(data: Dataset | Prepared, W_ov, W_kq, mode: int, backend: str):
    """The one path of :func:`forward`, :func:`loss_and_grad` and :func:`step`: ``data`` as a Prepared set
    (:func:`_prepared_of`) and W_ov, W_kq validated (:func:`_matrices`), then the pass in ``mode`` (kernels
    MODE_*) on ``backend`` (checked by the caller): (loss, log_scale, losses, logits, attn, G_ov [d, d],
    G_kq [d, d])."""
    prep = _prepared_of(data)
    W_ov, W_kq = _matrices(prep, W_ov, W_kq)
    if W_kq is None:
        W_kq = np.zeros_like(W_ov)
    if backend == "numpy":
        return _np_run(prep, W_ov, W_kq, mode)
    if prep.onehot:
        Bov, Bkq = W_ov, W_kq
    else:
        Bov, Bkq = kernels.congruence(prep.E, W_ov), kernels.congruence(prep.E, W_kq)
    loss, log_scale, losses, logits, attn, G_ov, G_kq = _numba_pass(prep, Bov, Bkq, mode)
    if not prep.onehot:
        ET = np.ascontiguousarray(prep.E.T)
        G_ov, G_kq = kernels.congruence(ET, G_ov), kernels.congruence(ET, G_kq)
    return loss, log_scale, losses, logits, attn, G_ov, G_kq


def unit_direction(G: np.ndarray, log_scale: float = 0.0, *, backend: str = "numba") -> Direction:
    """Direction of the matrix exp(log_scale) * G [d, d] (C-contiguous float64): G/‖G‖_F and
    log_scale + log ‖G‖_F, the norm formed from G/max|G| (no overflow); Direction(None, -inf) when G = 0
    or log_scale = -inf."""
    if backend == "numba":
        u, log_norm = kernels.unit(G, log_scale)
        return Direction(None, -np.inf) if log_norm == -np.inf else Direction(u, log_norm)
    amax = float(np.abs(G).max()) if log_scale > -np.inf else 0.0
    if amax == 0.0:
        return Direction(None, -np.inf)
    nrm = float(np.sqrt(np.sum((G / amax) ** 2)))
    return Direction(G / (amax * nrm), log_scale + float(np.log(amax)) + float(np.log(nrm)))


# ---- public API -------------------------------------------------------------------------------------

def forward(data: Dataset | Prepared, W_ov, W_kq, *, backend: str = "numba") -> Forward:
    """Forward pass and Eq. 1 loss (docs/twostage.md §2) of W_ov, W_kq [d, d] on ``data`` (a Dataset, or a
    Prepared set whose loss is Σ_i w_i ℓ_i): :class:`Forward` (loss, losses [N], logits [N, K], attn [N, Lmax])."""
    loss, _, losses, logits, attn, _, _ = _run(data, W_ov, W_kq, kernels.MODE_FORWARD, check_backend(backend))
    return Forward(float(loss), losses, logits, attn)


def loss_and_grad(data: Dataset | Prepared, W_ov, W_kq, *, backend: str = "numba") -> LossAndGrad:
    """Eq. 1 loss and its closed-form gradients (docs/twostage.md §3) of W_ov, W_kq [d, d] on ``data``:
    :class:`LossAndGrad` (loss, grad_W_ov [d, d], grad_W_kq [d, d]). On prepare_collocations(E, succ, ...)
    with W_kq None it is (L0, ∇L0, 0)."""
    loss, _, _, _, _, G_ov, G_kq = _run(data, W_ov, W_kq, kernels.MODE_GRAD, check_backend(backend))
    return LossAndGrad(float(loss), G_ov, G_kq)


def step(data: Dataset | Prepared, W_ov, W_kq, *, wrt: str, method: str = "stable",
         backend: str = "numba") -> Step:
    """The pass of one normalized-GD step (docs/twostage.md §4) on ``data`` at W_ov, W_kq [d, d]:
    :class:`Step` (loss, logits [N, K], attn [N, Lmax], Direction of G = ∇_{W_wrt} L).

    wrt "kq" (stage 2, on the sentences) or "ov" (stage 1, on prepare_collocations(...): G = ∇L0).
    method "naive": G/‖G‖_F from the float64 gradient of :func:`loss_and_grad`; "stable": computed in log
    scale (docs/twostage.md §4, kernels docstring), equal to the naive one where that is accurate and still
    accurate when p_y - 1 or the attention gradient underflow or cancel. The update is W_wrt ← W_wrt − η unit.
    """
    backend, mode = check_backend(backend), kernel_mode(wrt, method)
    loss, log_scale, _, logits, attn, G_ov, G_kq = _run(data, W_ov, W_kq, mode, backend)
    return Step(float(loss), logits, attn, unit_direction(G_kq if wrt == "kq" else G_ov, log_scale, backend=backend))


def direction(data: Dataset | Prepared, W_ov, W_kq, *, wrt: str, method: str = "stable",
              backend: str = "numba") -> Direction:
    """Normalized-GD direction G/‖G‖_F of G = ∇_{W_wrt} L on ``data`` (W_ov, W_kq [d, d]): the direction of
    :func:`step` (wrt "kq" | "ov", method "stable" | "naive")."""
    return step(data, W_ov, W_kq, wrt=wrt, method=method, backend=backend).direction


def _ideal_ff_tokens(succ: np.ndarray, lam: float) -> np.ndarray:
    """Token-space output matrix of the ideal feed-forward, [K, K]: λ' (1[v = n(x)] - 1/K) for x ∈ C
    (succ[x] >= 0), 0 for x ∉ C, λ' = λ/‖W_ov*‖, ‖W_ov*‖² = |C|(K-1)/K. For orthonormal E it is
    E^T (λ W_ov*/‖W_ov*‖) E."""
    K = succ.size
    inC = succ >= 0
    norm_star = np.sqrt(inC.sum() * (K - 1) / K)
    if norm_star == 0:
        raise InputError("ideal feed-forward: W_ov* is zero (no token has a successor, or K = 1)")
    M = np.zeros((K, K))
    x = np.flatnonzero(inC)
    M[succ[x], x] = 1.0
    M[:, x] -= 1.0 / K
    return (lam / norm_star) * M


def ideal_ff_loss(ds: Dataset, W_kq, lam, *, backend: str = "numba") -> float:
    """Eq. 1 with the ideal feed-forward: z_v = λ' (ψ_v - ψ_C/K), ψ_v = attention mass on tokens whose
    successor is v, ψ_C = mass on tokens with a successor (= 1 when C = V, giving docs/twostage.md's
    λ'(ψ_v - 1/K)), λ' = λ/‖W_ov*‖ with ‖W_ov*‖² = |C|(K-1)/K. Equals Eq. 1 with W_ov = λ W_ov*/‖W_ov*‖
    for orthonormal E; for other E it is this closed form by definition. Needs ds.succ."""
    backend = check_backend(backend)
    prep = prepare(ds)
    succ = ds.require_succ("ideal_ff_loss")
    lam = as_scalar("lam", lam, "float", low=0.0)
    W_kq = _weight("W_kq", W_kq, prep.d)
    B = _ideal_ff_tokens(succ, lam)
    if backend == "numpy":
        att = _np_attention(prep, W_kq)
        mask, phi = att.mask, att.phi
        K = prep.K
        succ_tok = np.where(mask, succ[np.where(mask, prep.tokens, 0)], -1)   # n(τ_l), -1 = none
        psi = np.einsum("nl,nlv->nv", phi, succ_tok[:, :, None] == np.arange(K))
        psi_C = (phi * (succ_tok >= 0)).sum(axis=1, keepdims=True)
        z = lam / np.sqrt((succ >= 0).sum() * (K - 1) / K) * (psi - psi_C / K)   # λ'(ψ_v - ψ_C/K)
        losses = _np_output(z, prep.targets)[0]
        return float(prep.weights @ losses)
    Bkq = W_kq if prep.onehot else kernels.congruence(prep.E, W_kq)
    return float(_numba_pass(prep, B, Bkq, kernels.MODE_FORWARD)[0])
