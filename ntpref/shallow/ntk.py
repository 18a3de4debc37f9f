"""NTK objects of the shallow transformer (docs/shallow.md §4; the linearisation direction of §5).

Shapes: X [n, T, d] (query q = x_T = X[:, -1]), c [m], U [m, d], W [m, d, d]. Everything is built
from the per-head states of :func:`ntpref.shallow.model.head_states` (s, a, MU = M_i U_i), never from
a d×d×T tensor. With σ_i = σ(s_i), σ'_i = σ'(s_i), the gradient of f(X) = m^{-1/2} Σ_i c_i σ_i
with respect to head i's parameters θ_i = (c_i, U_i, W_i) is (docs/shallow.md §2)

  ∂f/∂c_i = σ_i / √m,   ∂f/∂U_i = c_i σ'_i a_i / √m,   ∂f/∂W_i = c_i σ'_i (M_i U_i) q^T / (τ_att √m).

Objects:
  :func:`tangent_features`   these gradients per sample (∂f/∂W kept factored as W_left ⊗ q)
  :func:`ntk_gram`           K_m(X, X') = Σ_i ⟨∇_{θ_i} f(X), ∇_{θ_i} f(X')⟩
                             = (1/m) Σ_i [σ_i σ_i' + c_i² σ'_i σ'_i' (⟨a_i, a_i'⟩ + τ^{-2} ⟨M_iU_i, M_i'U_i⟩⟨q, q'⟩)]
  :func:`limit_kernel`       Monte-Carlo limit E_{U ~ N(0, I), W_kl ~ N(0, 1)} of the same with c² = 1
  :func:`min_eigenvalue`     smallest eigenvalue of a Gram matrix
  :func:`jvp`, :func:`linearized_f`   Σ_i ⟨∇_{θ_i} f(X; θ0), Δθ_i⟩ without forming the features
  :func:`transport_map`, :func:`transport`   the transport map v of docs/shallow.md §4 / the teacher of §5
  :func:`attention_weights`  W or diag(W) for the teacher's "diagonal" attention (docs/shallow.md §5)
  :func:`worst_case_delta`   the worst-case direction on the boundary of Ω_ρ (docs/shallow.md §5)

Heads are processed in chunks of ``block`` heads (memory O(n · block · d) for the states, plus the
n × n' output for the Gram matrix; never n × m × d²). In the Numba backend every output entry is a
sum over heads in index order, accumulated in place across chunks, so any ``block`` gives bitwise the
same numbers, and the kernels write only per-entry / per-sample / per-head slots, so any thread count
does too (no BLAS; only :func:`min_eigenvalue` calls LAPACK). The NumPy backend (``np.einsum``
without ``optimize``, per chunk) is the readable reference; it agrees to rounding (its chunk sums
depend on ``block``)."""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from ..blas import one_blas_thread
from ..checks import as_float, as_scalar, check_backend
from ..errors import InputError
from .activation import activation_code, dsigma, dsigma_np, sigma, sigma_np
from .evaluation import check_X
from .model import Batch, check_heads, check_params, head_states, prepare

ATTENTIONS = ("full", "diagonal")

# Gram tiles: _TILE_J rows × _TILE_L columns of the output per inner step (cache blocking only; the
# arithmetic per entry does not depend on them).
_TILE_J = 16
_TILE_L = 256


# ----------------------------------------------------------------------------------------------------
# Numba kernels


@njit(cache=True, parallel=True)
def _activation_kernel(s, code, sig, dsig):
    """sig = σ(s), dsig = σ'(s) elementwise for s [n, b]."""
    n, b = s.shape
    for j in prange(n):
        for i in range(b):
            sig[j, i] = sigma(s[j, i], code)
            dsig[j, i] = dsigma(s[j, i], code)


@njit(cache=True, parallel=True)
def _gram_kernel(sig1, ds1, a1, mu1, q1, sig2, ds2, a2, mu2, q2, cc, inv_tau2, upper, out):
    """out[j, l] += Σ_i σ1_ji σ2_il + cc_i (σ'1_ji σ'2_il) (⟨a1_ji, a2_il⟩ + τ^{-2} ⟨mu1_ji, mu2_il⟩ ⟨q1_j, q2_l⟩)
    over the heads i of one chunk, in index order.

    X side row-major: sig1, ds1 [n1, b], a1, mu1 [n1, b, d], q1 [n1, d]. X' side transposed so the
    innermost loop over l is contiguous: sig2, ds2 [b, n2], a2, mu2 [b, d, n2], q2 [d, n2].
    ``upper``: skip tiles strictly below the diagonal (the caller mirrors them). Each row block is
    written by one thread only; rows blocks are interleaved (0, last, 1, last − 1, ...) to balance
    the triangular work."""
    n1, b = sig1.shape
    n2 = sig2.shape[1]
    d = a1.shape[2]
    nJ = (n1 + _TILE_J - 1) // _TILE_J
    nL = (n2 + _TILE_L - 1) // _TILE_L
    for p in prange(nJ):
        jb = p // 2 if p % 2 == 0 else nJ - 1 - p // 2
        j0 = jb * _TILE_J
        nj = min(n1, j0 + _TILE_J) - j0
        u = np.empty(_TILE_L)
        w = np.empty(_TILE_L)
        qq = np.empty((_TILE_J, _TILE_L))
        for lb in range(nL):
            l0 = lb * _TILE_L
            nl = min(n2, l0 + _TILE_L) - l0
            if upper and l0 + nl <= j0:
                continue
            for jj in range(nj):
                for l in range(nl):
                    acc = 0.0
                    for k in range(d):
                        acc += q1[j0 + jj, k] * q2[k, l0 + l]
                    qq[jj, l] = acc
            for i in range(b):
                s2 = sig2[i, l0:l0 + nl]
                d2 = ds2[i, l0:l0 + nl]
                for jj in range(nj):
                    j = j0 + jj
                    for l in range(nl):
                        u[l] = 0.0
                        w[l] = 0.0
                    for k in range(d):
                        ajk = a1[j, i, k]
                        mjk = mu1[j, i, k]
                        a2k = a2[i, k, l0:l0 + nl]
                        m2k = mu2[i, k, l0:l0 + nl]
                        for l in range(nl):
                            u[l] += ajk * a2k[l]
                            w[l] += mjk * m2k[l]
                    sj = sig1[j, i]
                    dj = ds1[j, i]
                    ci = cc[i]
                    row = out[j, l0:l0 + nl]
                    for l in range(nl):
                        row[l] += sj * s2[l] + ci * (dj * d2[l]) * (u[l] + inv_tau2 * (w[l] * qq[jj, l]))


@njit(cache=True, parallel=True)
def _mirror_kernel(out):
    """out[j, l] = out[l, j] for l < j (copy the upper triangle down; row j is written by one thread)."""
    n = out.shape[0]
    for j in prange(n):
        for l in range(j):
            out[j, l] = out[l, j]


@njit(cache=True, parallel=True)
def _jvp_kernel(sig, ds, a, mu, q, c, dc, dU, dW, inv_tau, out):
    """out[j] += Σ_i [σ_ji dc_i + c_i σ'_ji (⟨a_ji, dU_i⟩ + τ^{-1} ⟨mu_ji, dW_i q_j⟩)] over the heads of
    one chunk, in index order (prange over samples)."""
    n, b = sig.shape
    d = a.shape[2]
    for j in prange(n):
        acc = out[j]
        for i in range(b):
            du = 0.0
            for k in range(d):
                du += a[j, i, k] * dU[i, k]
            dw = 0.0
            for k in range(d):
                r = 0.0
                for l in range(d):
                    r += dW[i, k, l] * q[j, l]
                dw += mu[j, i, k] * r
            acc += sig[j, i] * dc[i] + c[i] * ds[j, i] * (du + inv_tau * dw)
        out[j] = acc


@njit(cache=True, parallel=True)
def _head_grad_kernel(ds, a, mu, q, gU, gW):
    """gU_i = Σ_j σ'_ji a_ji and gW_i = Σ_j σ'_ji mu_ji q_j^T (prange over heads, j summed in order)."""
    n, b = ds.shape
    d = a.shape[2]
    for i in prange(b):
        for k in range(d):
            gU[i, k] = 0.0
            for l in range(d):
                gW[i, k, l] = 0.0
        for j in range(n):
            e = ds[j, i]
            for k in range(d):
                gU[i, k] += e * a[j, i, k]
                t = e * mu[j, i, k]
                for l in range(d):
                    gW[i, k, l] += t * q[j, l]


# ----------------------------------------------------------------------------------------------------
# Validation and shared pieces


def _prepare(X, tau_att, mask_last_key, activation, name="X", d: int | None = None) -> Batch:
    """X [n, T, d] (:func:`ntpref.shallow.evaluation.check_X`, errors name ``name``) and the options, prepared
    by :func:`ntpref.shallow.model.prepare`."""
    return prepare(check_X(X, name, d), tau_att=tau_att, mask_last_key=mask_last_key, activation=activation)


def _check_block(block) -> int:
    return as_scalar("block", block, kind="int", low=1)


def _activations(s: np.ndarray, activation: str, backend: str):
    """(σ(s), σ'(s)) for states s [n, b]."""
    if backend == "numpy":
        return sigma_np(s, activation), dsigma_np(s, activation)
    sig, ds = np.empty_like(s), np.empty_like(s)
    _activation_kernel(s, activation_code(activation), sig, ds)
    return sig, ds


def _chunk_states(data: Batch, U, W, backend: str):
    """(σ [n, b], σ' [n, b], a [n, b, d], MU [n, b, d]) of the heads (U, W) on the prepared data."""
    states = head_states(data, U, W, backend=backend)
    sig, ds = _activations(np.ascontiguousarray(states.s), data.activation, backend)
    return sig, ds, np.ascontiguousarray(states.a), np.ascontiguousarray(states.MU)


def _chunks(m: int, block: int):
    return [(i0, min(m, i0 + block)) for i0 in range(0, m, block)]


# ----------------------------------------------------------------------------------------------------
# Tangent features and the finite-width NTK


@dataclass(frozen=True)
class TangentFeatures:
    """Per-sample gradients ∇_θ f(X_j) (docs/shallow.md §2), ∂f/∂W kept factored:
    c [n, m] = σ/√m,  U [n, m, d] = c_i σ' a/√m,  W_left [n, m, d] = c_i σ' (M U)/(τ_att √m),  q [n, d];
    ∂f(X_j)/∂W_i = W_left[j, i] q_j^T (see :meth:`W`)."""
    c: np.ndarray
    U: np.ndarray
    W_left: np.ndarray
    q: np.ndarray

    def W(self) -> np.ndarray:
        """∂f/∂W as a dense [n, m, d, d] array (small problems only)."""
        return self.W_left[:, :, :, None] * self.q[:, None, None, :]


def tangent_features(X, c, U, W, *, tau_att=1.0, mask_last_key=False, activation="tanh",
                     backend="numba") -> TangentFeatures:
    """The gradient of f(X_j) with respect to every head's (c_i, U_i, W_i), as :class:`TangentFeatures`."""
    check_backend(backend)
    data = _prepare(X, tau_att, mask_last_key, activation)
    c, U, W = check_params(c, U, W, d=data.X.shape[2])
    sig, ds, a, MU = _chunk_states(data, U, W, backend)
    r = 1.0 / math.sqrt(U.shape[0])
    e = c * ds * r
    return TangentFeatures(sig * r, e[:, :, None] * a, e[:, :, None] * MU / data.tau_att,
                           np.ascontiguousarray(data.X[:, -1, :]))


def _gram(data: Batch, c, U, W, data2: Batch | None, backend: str, block: int) -> np.ndarray:
    """K_m for validated inputs; data2 None = symmetric Gram matrix of data.X."""
    m = U.shape[0]
    X = data.X
    Y = X if data2 is None else data2.X
    out = np.zeros((X.shape[0], Y.shape[0]))
    cc = c * c
    inv_tau2 = 1.0 / (data.tau_att * data.tau_att)
    q1, q2 = np.ascontiguousarray(X[:, -1, :]), np.ascontiguousarray(Y[:, -1, :])
    qq = np.einsum("jk,lk->jl", q1, q2) if backend == "numpy" else None
    for i0, i1 in _chunks(m, block):
        st1 = _chunk_states(data, U[i0:i1], W[i0:i1], backend)
        sig1, ds1, a1, mu1 = st1
        sig2, ds2, a2, mu2 = st1 if data2 is None else _chunk_states(data2, U[i0:i1], W[i0:i1], backend)
        if backend == "numpy":
            e1, e2 = cc[i0:i1] * ds1, ds2
            out += np.einsum("ji,li->jl", sig1, sig2)
            out += np.einsum("ji,jik,li,lik->jl", e1, a1, e2, a2)
            out += inv_tau2 * qq * np.einsum("ji,jik,li,lik->jl", e1, mu1, e2, mu2)
        else:
            _gram_kernel(sig1, ds1, a1, mu1, q1, np.ascontiguousarray(sig2.T), np.ascontiguousarray(ds2.T),
                         np.ascontiguousarray(a2.transpose(1, 2, 0)), np.ascontiguousarray(mu2.transpose(1, 2, 0)),
                         np.ascontiguousarray(q2.T), cc[i0:i1], inv_tau2, data2 is None, out)
    if data2 is None and backend == "numba":
        _mirror_kernel(out)
    elif data2 is None:
        out = np.triu(out) + np.triu(out, 1).T
    out /= m
    return out


def ntk_gram(X, c, U, W, X2=None, *, tau_att=1.0, mask_last_key=False, activation="tanh",
             backend="numba", block=64) -> np.ndarray:
    """Finite-width NTK Gram matrix K [n, n'] (n' = n when X2 is None):

      K_m(X_j, X'_l) = Σ_i ⟨∇_{θ_i} f(X_j), ∇_{θ_i} f(X'_l)⟩
        = (1/m) Σ_i [σ_ji σ_li + c_i² σ'_ji σ'_li (⟨a_ji, a_li⟩ + τ_att^{-2} ⟨(MU)_ji, (MU)_li⟩ ⟨q_j, q_l⟩)].

    The c-block term carries no c_i² (∂f/∂c_i does not contain c_i); docs/shallow.md §4 writes the formula for
    c_i² = 1. X2 = None: only the upper triangle is computed and mirrored, so K is exactly symmetric.
    ``block``: heads per chunk (memory), no effect on the result."""
    check_backend(backend)
    block = _check_block(block)
    data = _prepare(X, tau_att, mask_last_key, activation)
    c, U, W = check_params(c, U, W, d=data.X.shape[2])
    data2 = None if X2 is None else _prepare(X2, tau_att, mask_last_key, activation, "X2", data.X.shape[2])
    return _gram(data, c, U, W, data2, backend, block)


def limit_kernel(X, X2=None, *, draws=4096, seed=0, tau_att=1.0, mask_last_key=False, activation="tanh",
                 backend="numba", block=256) -> np.ndarray:
    """Monte-Carlo limit kernel K_∞(X, X') ≈ (1/draws) Σ_k κ(X, X'; U_k, W_k) with U_k ~ N(0, I_d),
    W_k entries N(0, 1), c² = 1: the :func:`ntk_gram` of ``draws`` heads with c = 1. Draws come from
    ``np.random.default_rng(seed)``: U [draws, d] first, then W [draws, d, d]."""
    check_backend(backend)
    block = _check_block(block)
    data = _prepare(X, tau_att, mask_last_key, activation)
    d = data.X.shape[2]
    data2 = None if X2 is None else _prepare(X2, tau_att, mask_last_key, activation, "X2", d)
    draws = as_scalar("draws", draws, kind="int", low=1)
    rng = np.random.default_rng(as_scalar("seed", seed, kind="int", low=0))
    U = rng.standard_normal((draws, d))
    W = rng.standard_normal((draws, d, d))
    return _gram(data, np.ones(draws), U, W, data2, backend, block)


def min_eigenvalue(G) -> float:
    """Smallest eigenvalue of a symmetric Gram matrix G [n, n] (``np.linalg.eigvalsh`` on one BLAS thread:
    the same bits for any thread count, :mod:`ntpref.blas`). G must be
    symmetric to 1e-12 · max|G| (InputError otherwise); its symmetric part is used."""
    G = as_float("G", G, (None, None))
    if G.shape[0] != G.shape[1] or G.shape[0] == 0:
        raise InputError(f"array 'G': expected a non-empty square matrix, got shape {list(G.shape)}")
    asym = float(np.max(np.abs(G - G.T)))
    if asym > 1e-12 * float(np.max(np.abs(G))):
        raise InputError(f"array 'G': not symmetric (max |G - G^T| = {asym:.3g})")
    with one_blas_thread():
        return float(np.linalg.eigvalsh(0.5 * (G + G.T))[0])


# ----------------------------------------------------------------------------------------------------
# Linearisation


def _jvp(data: Batch, c, U, W, dc, dU, dW, backend: str, block: int) -> np.ndarray:
    m = U.shape[0]
    out = np.zeros(data.X.shape[0])
    q = np.ascontiguousarray(data.X[:, -1, :])
    inv_tau = 1.0 / data.tau_att
    for i0, i1 in _chunks(m, block):
        sig, ds, a, MU = _chunk_states(data, U[i0:i1], W[i0:i1], backend)
        if backend == "numpy":
            du = np.einsum("jik,ik->ji", a, dU[i0:i1])
            dw = np.einsum("jik,ikl,jl->ji", MU, dW[i0:i1], q)
            out += (sig * dc[i0:i1] + c[i0:i1] * ds * (du + inv_tau * dw)).sum(axis=1)
        else:
            _jvp_kernel(sig, ds, a, MU, q, c[i0:i1], dc[i0:i1], dU[i0:i1], dW[i0:i1], inv_tau, out)
    out /= math.sqrt(m)
    return out


def jvp(X, c, U, W, dc, dU, dW, *, tau_att=1.0, mask_last_key=False, activation="tanh", backend="numba",
        block=256) -> np.ndarray:
    """Directional derivative [n] of f at θ = (c, U, W) along Δθ = (dc [m], dU [m, d], dW [m, d, d]):

      Σ_i ⟨∇_{θ_i} f(X_j; θ), Δθ_i⟩ = m^{-1/2} Σ_i [σ_ji dc_i + c_i σ'_ji (⟨a_ji, dU_i⟩ + τ^{-1} ⟨(MU)_ji, dW_i q_j⟩)],

    summed over heads in index order, without forming the features."""
    check_backend(backend)
    block = _check_block(block)
    data = _prepare(X, tau_att, mask_last_key, activation)
    d = data.X.shape[2]
    c, U, W = check_params(c, U, W, d=d)
    dc, dU, dW = check_params(dc, dU, dW, d=d, names=("dc", "dU", "dW"), m=U.shape[0])
    return _jvp(data, c, U, W, dc, dU, dW, backend, block)


def linearized_f(X, theta0, theta, *, tau_att=1.0, mask_last_key=False, activation="tanh", backend="numba",
                 block=256) -> np.ndarray:
    """f_lin(X; θ) = ⟨∇f(X; θ0), θ − θ0⟩ [n] (docs/shallow.md §4; equals the linearised model when f(θ0) = 0, as
    for the paired initialisation — f(θ0) is not added). theta0, theta: (c [m], U [m, d], W [m, d, d])."""
    check_backend(backend)
    block = _check_block(block)
    data = _prepare(X, tau_att, mask_last_key, activation)
    d = data.X.shape[2]
    if len(theta0) != 3 or len(theta) != 3:
        raise InputError("theta0 and theta must be (c, U, W) triples")
    c0, U0, W0 = check_params(*theta0, d=d, names=("c0", "U0", "W0"))
    c1, U1, W1 = check_params(*theta, d=d, m=U0.shape[0])
    return _jvp(data, c0, U0, W0, c1 - c0, U1 - U0, W1 - W0, backend, block)


def worst_case_delta(X, U, W, rho=3.0, *, tau_att=1.0, mask_last_key=False, activation="tanh",
                     backend="numba", block=256):
    """Worst-case perturbation on the boundary of Ω_ρ (docs/shallow.md §5, "Linearisation error vs m"):
    per head, ΔU_i and ΔW_i point along the gradient of h_i = Σ_j σ(s_i(X_j)),
      g_U,i = Σ_j σ'(s_ji) a_ji,   g_W,i ∝ Σ_j σ'(s_ji) (MU)_ji q_j^T   (τ_att > 0 only rescales it),
    ΔU_i = (ρ_u/√m) g_U,i/‖g_U,i‖, ΔW_i = (ρ_w/√m) g_W,i/‖g_W,i‖_F, Δc_i = +ρ_c/√m. A zero gradient
    gets the first basis direction (e_1, resp. E_11), as in the authors' code.
    rho: a number (all blocks) or (ρ_c, ρ_u, ρ_w). Returns (dc [m], dU [m, d], dW [m, d, d])."""
    check_backend(backend)
    block = _check_block(block)
    data = _prepare(X, tau_att, mask_last_key, activation)
    d = data.X.shape[2]
    U, W = check_heads(U, W, d=d)
    rho_c, rho_u, rho_w = _three("rho", rho)
    m = U.shape[0]
    gU, gW = np.empty((m, d)), np.empty((m, d, d))
    q = np.ascontiguousarray(data.X[:, -1, :])
    for i0, i1 in _chunks(m, block):
        _, ds, a, MU = _chunk_states(data, U[i0:i1], W[i0:i1], backend)
        if backend == "numpy":
            gU[i0:i1] = np.einsum("ji,jik->ik", ds, a)
            gW[i0:i1] = np.einsum("ji,jik,jl->ikl", ds, MU, q)
        else:
            _head_grad_kernel(ds, a, MU, q, gU[i0:i1], gW[i0:i1])
    r = 1.0 / math.sqrt(m)
    return np.full(m, rho_c * r), _to_radius(gU, rho_u * r), _to_radius(gW, rho_w * r)


def _to_radius(g: np.ndarray, radius: float) -> np.ndarray:
    """Each head's g_i scaled to norm ``radius`` (Frobenius for matrices); zero → first basis element."""
    flat = g.reshape(g.shape[0], -1).copy()
    norms = np.sqrt(np.einsum("ik,ik->i", flat, flat))
    zero = norms == 0.0
    flat[zero, 0] = 1.0
    norms[zero] = 1.0
    return (flat * (radius / norms)[:, None]).reshape(g.shape)


def _three(name: str, value) -> tuple[float, float, float]:
    """A non-negative number or a (c, u, w) triple of them."""
    a = as_float(name, value)
    if a.shape not in ((), (3,)):
        raise InputError(f"array '{name}': expected a number or three numbers (c, u, w), got shape {list(a.shape)}")
    if (a < 0).any():
        raise InputError(f"array '{name}': radii must be >= 0, got {a.tolist()}")
    return tuple(float(v) for v in np.broadcast_to(a, (3,)))


# ----------------------------------------------------------------------------------------------------
# Transport


def attention_weights(W, attention: str) -> np.ndarray:
    """The matrices that produce the attention logits: W itself ("full") or diag(diag(W_i)) per head
    ("diagonal": z_t = Σ_k x_{t,k} W_kk q_k). The states a, s, MU depend on W only through these."""
    if attention not in ATTENTIONS:
        raise InputError(f"attention must be one of {', '.join(ATTENTIONS)}, got {attention!r}")
    W = as_float("W", W, (None, None, None))
    return W if attention == "full" else W * np.eye(W.shape[2])


def transport_map(U, W, anchors, alpha, nu=3.0, *, attention="full", activation="tanh", backend="numba"):
    """The teacher's transport map (docs/shallow.md §5) evaluated at heads (U_i, W_i), i = 1..m:

      v_c(θ) = ν_c Σ_r α_r σ(s_r),   v_u(θ) = ν_u Σ_r α_r σ'(s_r) a_r,
      v_w(θ) = Σ_r α_r min(1, ν_w / (‖σ'(s_r) M_r U‖ ‖q_r‖)) σ'(s_r) (M_r U) q_r^T,

    with the states of anchor X_r (anchors [R, T, d], coefficients alpha [R]) under head (U, W),
    τ_att = 1 and no masking (the authors' teacher). With Σ|α_r| ≤ 1 its sup bounds are
    |v_c| ≤ ν_c, ‖v_u‖ ≤ ν_u, ‖v_w‖_F ≤ ν_w (|σ|, |σ'| ≤ 1, ‖a‖ ≤ 1 for tokens of norm ≤ 1). The scale
    is 1 when its denominator is 0. attention = "diagonal": logits z_t = Σ_k x_{t,k} W_kk q_k (diag(W)
    only, the authors' code). nu: a number or (ν_c, ν_u, ν_w).
    Returns (v_c [m], v_u [m, d], v_w [m, d, d]), one row per head — the representation that
    :func:`transport` consumes."""
    check_backend(backend)
    data = _prepare(anchors, 1.0, False, activation, name="anchors")
    d = data.X.shape[2]
    U, W = check_heads(U, W, d=d)
    alpha = as_float("alpha", alpha, (data.X.shape[0],))
    nu_c, nu_u, nu_w = _three("nu", nu)
    sig, ds, a, MU = _chunk_states(data, U, attention_weights(W, attention), backend)
    q = data.X[:, -1, :]
    vec = ds[:, :, None] * MU
    denom = np.sqrt(np.einsum("rik,rik->ri", vec, vec)) * np.sqrt(np.einsum("rk,rk->r", q, q))[:, None]
    clip = np.ones_like(denom)
    pos = denom > 0.0
    clip[pos] = np.minimum(1.0, nu_w / denom[pos])
    v_c = nu_c * np.einsum("r,ri->i", alpha, sig)
    v_u = nu_u * np.einsum("r,ri,rik->ik", alpha, ds, a)
    v_w = np.einsum("r,ri,rik,rl->ikl", alpha, clip, vec, q)
    return v_c, v_u, v_w


def transport(c, U, W, v_c, v_u, v_w):
    """Transported parameters (docs/shallow.md §4): c̄_i = c_i + v_c,i/√m, Ū_i = U_i + c_i v_u,i/√m,
    W̄_i = W_i + c_i v_w,i/√m, where (v_c [m], v_u [m, d], v_w [m, d, d]) is the map v evaluated at
    head i's initial (U_i, W_i) (e.g. from :func:`transport_map`). Returns (c̄, Ū, W̄)."""
    U = as_float("U", U, (None, None))
    d = U.shape[1]
    c, U, W = check_params(c, U, W, d=d)
    v_c, v_u, v_w = check_params(v_c, v_u, v_w, d=d, names=("v_c", "v_u", "v_w"), m=U.shape[0])
    r = 1.0 / math.sqrt(U.shape[0])
    return c + v_c * r, U + c[:, None] * v_u * r, W + c[:, None, None] * v_w * r
