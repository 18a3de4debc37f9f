"""The float64 tolerance policy (docs/tolerance.md): per output array of a model run, the tolerance
that :func:`ntpref.oracle.compare.compare_arrays` accepts.

Every tolerance comes from the *problem*, not from the array's own values, so outputs that are
exactly zero in exact arithmetic (f at the paired initialisation) get an honest, non-zero bound.

**Evaluation** (kind "eval", and the NTK Gram matrix and head states of kind "ntk"). A first-order
running error bound: any float64 implementation, whatever its summation order, blocking, fused
multiply-adds or libm, returns each output Q with

    |Q_computed − Q| ≤ γ_K · M(Q),    γ_K = K u / (1 − K u),  u = 2⁻⁵³,

where M(Q) is Q evaluated with the absolute value of every term, each intermediate's own
magnitude carried through its derivative (M(σ(s)) = |σ(s)| + |σ'(s)| M(s), M(Σ a_k b_k) =
Σ M(a_k)|b_k| + |a_k| M(b_k), a softmax weight α_t gets α_t (1 + 4 max_t M(z_t))), and K is the total
length of the nested sums plus :data:`TRANSCENDENTAL_ULPS` per exp / log / tanh / erf level. The
oracle's own forward quantities (s, a, M U, attention, logits, hidden states) supply the values.
The tolerance of an array is ``atol = SAFETY · γ_K · max M`` (``rtol = 0``).

**Training** (kind "train"). A difference in the last bits is carried along the trajectory. One
step can differ by at most the rounding of the update plus η times the evaluation bound of the
step direction: the *injection* ε per parameter block. For normalized GD that bound is 2 γ_K ρ,
ρ = ‖M(G)‖/‖G‖ for the computation that forms the direction: the plain float64 gradient for
direction "naive", the log-scale computation for "stable" (:func:`stable_accuracy`). The training
is run again from θ(0) + ε·ξ (ξ = ±1, fixed seed), which measures the response D_q(t) of every
logged quantity q to one such injection. A quantity logged after t updates has t injections
behind it; bounding the response to each by the largest one measured so far (from t = 1 on),

    |q_computed(t) − q(t)| ≤ SAFETY · [γ_K (|q(t)| + M_q) + t · max_{1 ≤ s ≤ t} D_q(s)]

(M_q: the evaluation magnitude of q at the first and the last parameters, whichever is larger;
stage 2 of the two-stage algorithm adds T0 · max_s D1_q(s) for the T0 updates of stage 1). It is
stored as ``rtol = SAFETY γ_K`` and the straight line ``atol + atol_per_step · t`` lying above the
rest. Final iterates get SAFETY · steps · max(D, ε); max-margin solutions the solver certificate's
:data:`QP_REL`. A 1e-6 relative error in any array (unless float64 itself cannot resolve the value
to 1e-6, see docs/tolerance.md), or a 1e-3 relative error in one gradient of a training run, is far
outside these bounds.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ..checks import as_float, as_scalar
from ..errors import InputError

MODELS = ("twostage", "shallow", "indrnn")
KINDS = ("eval", "train")
#: Unit roundoff of float64.
U = 2.0 ** -53
#: Multiplier on every bound (second-order terms, the estimate of the trajectory response).
SAFETY = 4.0
#: ulps counted for each level of exp, log, tanh or erf (libms differ by a few ulps).
TRANSCENDENTAL_ULPS = 8
#: Max-margin solutions W_ov*, W_kq*: a least-norm QP certified to margins >= 1 - 1e-9
#: (docs/twostage.md §5); another solver may stop anywhere within that, relative to max|W*|.
QP_REL = 1e-9
#: Smallest atol: -0.0 and 0.0 agree, and a tolerance is never "exact" (bitwise).
TINY = float(np.finfo(np.float64).smallest_subnormal)
_SEED = 20240917


def gamma(k: int) -> float:
    """γ_k = k u / (1 − k u): the classical bound on the relative rounding error of k operations."""
    return k * U / (1.0 - k * U)


class Scales(NamedTuple):
    """Magnitudes M per output name (arrays shaped like the outputs) and the operation count K."""

    M: dict
    count: int


def eval_tolerance(M: np.ndarray, count: int) -> dict:
    """``atol = SAFETY · γ_K · max M`` for one evaluated array."""
    top = float(np.max(M, initial=0.0))
    return {"rtol": 0.0, "atol": max(SAFETY * gamma(count) * top, TINY), "atol_max_scale": 0.0,
            "atol_per_step": 0.0, "reason": f"float64 policy, evaluation: {SAFETY:g}·γ_{count}·max M, M = {top:.3g}"}


# --- shallow transformer ----------------------------------------------------------------------------
class _Heads(NamedTuple):
    """Per sample j and head i: values and magnitudes of the head states (docs/shallow.md §1–§2)."""

    s: np.ndarray       # [n, m]
    a: np.ndarray       # [n, m, d]
    MU: np.ndarray      # [n, m, d]
    sig: np.ndarray     # σ(s) [n, m]
    dsig: np.ndarray    # σ'(s) [n, m]
    Ms: np.ndarray
    Ma: np.ndarray
    MMU: np.ndarray
    Msig: np.ndarray
    Mdsig: np.ndarray
    q: np.ndarray       # |q| [n, d]
    tau: float
    count: int


def _heads(data, U, W) -> _Heads:
    """Head states from :func:`ntpref.shallow.head_states` on prepared data and their magnitudes.

    A_j = max_t |x_t| over the keys bounds every convex combination Σ_t α_t |x_t|;
    M(z_t) ≤ A^T |W_i| |q| / τ, R = 1 + 4 max M(z) the softmax factor; M(a) = R A, M(s) = R |U_i|^T A,
    M(MU) = R A (A^T |U_i| + |s|) + A (A^T |U_i| + M(s)) (MU = Σ_t α_t x_t (x_t^T U_i − s)),
    M(σ) = |σ| + |σ'| M(s), M(σ') = |σ'| + M(s) (|σ''| ≤ 1).
    """
    from ..shallow import head_states
    from ..shallow.activation import dsigma_np, sigma_np

    s, a, MU = head_states(data, U, W)
    X, tau, n_keys = data.X, data.tau_att, data.n_keys
    A = np.abs(X[:, :n_keys]).max(axis=1)                                   # [n, d]
    q = np.abs(X[:, -1])
    R = 1.0 + 4.0 * np.einsum("jk,ikl,jl->ji", A, np.abs(W), q) / tau      # [n, m]
    AU = A @ np.abs(U).T                                                    # [n, m]
    Ms = R * AU
    Ma = R[:, :, None] * A[:, None, :]
    MMU = Ma * (AU + np.abs(s))[:, :, None] + A[:, None, :] * (AU + Ms)[:, :, None]
    sig, dsig = sigma_np(s, data.activation), dsigma_np(s, data.activation)
    d = X.shape[2]
    count = 2 * n_keys + d * d + 2 * d + 2 * TRANSCENDENTAL_ULPS
    return _Heads(s, a, MU, sig, dsig, Ms, Ma, MMU, np.abs(sig) + np.abs(dsig) * Ms, np.abs(dsig) + Ms, q, tau,
                  count)


def _residual_scales(Mf: np.ndarray, r: np.ndarray, kappa: float):
    """M(loss) and (g, M(g)) of loss = (κ/2n) Σ r², g = κ r / n, r = f − y with M(r) = M(f) + |r|."""
    n = r.shape[0]
    Mr = Mf + np.abs(r)
    Mloss = kappa / (2 * n) * np.sum(r * r + 2 * np.abs(r) * Mr)
    return np.array(Mloss), kappa * r / n, kappa / n * Mr


def shallow_scales(data, c, U, W, kappa: float) -> Scales:
    """Magnitudes of f, loss, grad_c, grad_U, grad_W and the head states (head_s, head_a, head_MU) on
    prepared data with targets (:func:`ntpref.shallow.prepare`)."""
    y = data.y
    h = _heads(data, U, W)
    n, m = h.s.shape
    sm = math.sqrt(m)
    f = h.sig @ c / sm
    Mf = h.Msig @ np.abs(c) / sm
    Mloss, g, Mg = _residual_scales(Mf, f - y, kappa)
    ag = np.abs(g)
    Mgc = (Mg @ np.abs(h.sig) + ag @ h.Msig) / sm
    e = ag[:, None] * np.abs(c * h.dsig) / sm                               # |e_ji| [n, m]
    Me = np.abs(c) / sm * (Mg[:, None] * np.abs(h.dsig) + ag[:, None] * h.Mdsig)
    MgU = np.einsum("ji,jik->ik", Me, np.abs(h.a)) + np.einsum("ji,jik->ik", e, h.Ma)
    left = Me[:, :, None] * np.abs(h.MU) + e[:, :, None] * h.MMU             # [n, m, d]
    MgW = np.einsum("jik,jl->ikl", left, h.q) / h.tau
    M = {"f": Mf, "loss": Mloss, "grad_c": Mgc, "grad_U": MgU, "grad_W": MgW,
         "head_s": h.Ms, "head_a": h.Ma, "head_MU": h.MMU}
    return Scales(M, h.count + n + m)


def ntk_scales(data, c, U, W) -> Scales:
    """Magnitudes of the NTK Gram matrix gram [n, n] and the head states (kind "ntk"):
    K_jl = (1/m) Σ_i [σ_ji σ_li + c_i² σ'_ji σ'_li (⟨a_ji, a_li⟩ + τ^{-2} ⟨MU_ji, MU_li⟩ ⟨q_j, q_l⟩)],
    M of each product = Σ over its factors of M(factor) · Π |other factors| (prepared data, no targets needed)."""
    h = _heads(data, U, W)
    m = h.s.shape[1]
    qq = h.q @ h.q.T / h.tau ** 2

    sig, dsig, a, MU = np.abs(h.sig), np.abs(h.dsig), np.abs(h.a), np.abs(h.MU)
    inner = np.einsum("jik,lik->jli", a, a) + np.einsum("jik,lik->jli", MU, MU) * qq[:, :, None]
    Minner = (np.einsum("jik,lik->jli", h.Ma, a) + np.einsum("jik,lik->jli", a, h.Ma)
              + (np.einsum("jik,lik->jli", h.MMU, MU) + np.einsum("jik,lik->jli", MU, h.MMU)) * qq[:, :, None])
    dd = dsig[:, None, :] * dsig[None, :, :]
    Mdd = h.Mdsig[:, None, :] * dsig[None, :, :] + dsig[:, None, :] * h.Mdsig[None, :, :]
    gram = (h.Msig @ sig.T + sig @ h.Msig.T + np.einsum("i,jli->jl", c * c, Mdd * inner + dd * Minner)) / m
    return Scales({"gram": gram, "head_s": h.Ms, "head_a": h.Ma, "head_MU": h.MMU}, h.count + m + 2 * data.X.shape[2])


# --- IndRNN -----------------------------------------------------------------------------------------
def indrnn_scales(data, c, u, W_in, kappa: float) -> Scales:
    """Magnitudes of f, loss, grad_c, grad_u, grad_W_in (docs/shallow.md §6), from the hidden states
    h_t and pre-activations p_t of the oracle's recurrence: M(p_t) = |W_in| |x_t| + |u| M(h_{t−1}),
    M(h_t) = |h_t| + |σ'(p_t)| M(p_t), and backwards through time M(ε_t) = M(δ_t)|σ'| + |δ_t|(|σ'| + M(p_t))."""
    from ..shallow import indrnn
    from ..shallow.activation import dsigma_np

    X, y, activation = data.X, data.y, data.activation
    n, T, d = X.shape
    m = c.shape[0]
    sm = math.sqrt(m)
    H = indrnn.hidden_states(data, u, W_in)                                 # [T + 1, n, m]
    absW, absu = np.abs(W_in), np.abs(u)
    Mh = [np.zeros((n, m))]
    Mp, dsig = [], []
    for t in range(T):
        Mp.append(np.abs(X[:, t]) @ absW.T + absu * Mh[t])
        dsig.append(np.abs(dsigma_np(X[:, t] @ W_in.T + u * H[t], activation)))
        Mh.append(np.abs(H[t + 1]) + dsig[t] * Mp[t])
    f = H[T] @ c / sm
    Mf = Mh[T] @ np.abs(c) / sm
    Mloss, g, Mg = _residual_scales(Mf, f - y, kappa)
    Mgc = (Mg @ np.abs(H[T]) + np.abs(g) @ Mh[T]) / sm
    delta = np.abs(g)[:, None] * np.abs(c) / sm
    Mdelta = Mg[:, None] * np.abs(c) / sm
    MgW, Mgu = np.zeros((m, d)), np.zeros(m)
    for t in range(T - 1, -1, -1):
        Meps = Mdelta * dsig[t] + delta * (dsig[t] + Mp[t])
        eps = delta * dsig[t]
        MgW += Meps.T @ np.abs(X[:, t])
        Mgu += (Meps * np.abs(H[t]) + eps * Mh[t]).sum(axis=0)
        delta, Mdelta = eps * absu, Meps * absu
    return Scales({"f": Mf, "loss": Mloss, "grad_c": Mgc, "grad_u": Mgu, "grad_W_in": MgW},
                  n + m + T * (d + 2 + TRANSCENDENTAL_ULPS) + 2 * TRANSCENDENTAL_ULPS)


# --- two-stage transformer --------------------------------------------------------------------------
class _Sentences(NamedTuple):
    """Per sentence j and position l of a prepared set (docs/twostage.md §2): the forward values and
    the magnitudes of the evaluation bound (:func:`twostage_scales`)."""

    inside: np.ndarray  # [N, Lmax] bool, positions within the sentence
    tok: np.ndarray     # [N, Lmax] token ids (0 on padding)
    query: np.ndarray   # [N] the query token
    absE: np.ndarray    # |E| [d, K]
    Xabs: np.ndarray    # |x_l| [N, Lmax, d] (0 on padding)
    Ms: np.ndarray      # M(s_l) [N, Lmax]
    phi: np.ndarray     # φ [N, Lmax] (0 on padding)
    Mphi: np.ndarray    # M(φ) [N, Lmax]
    Bt: np.ndarray      # B[k, τ_l] [K, N, Lmax], B = |E|^T |W_ov| |E|
    Mz: np.ndarray      # M(z_k) [N, K]
    fw: object          # the oracle's twostage.Forward (loss, losses, logits, attn)


def _sentences(prep, W_ov: np.ndarray, W_kq: np.ndarray) -> _Sentences:
    """The oracle's forward pass on ``prep`` and the magnitudes of s, φ, z (W_ov, W_kq [d, d])."""
    from .. import twostage

    fw = twostage.forward(prep, W_ov, W_kq)
    E, tokens = prep.E, prep.tokens
    N, Lmax = tokens.shape
    inside = np.arange(Lmax)[None, :] < prep.lengths[:, None]
    tok = np.where(inside, tokens, 0)
    query = tokens[np.arange(N), prep.lengths - 1]
    absE = np.abs(E)
    B = absE.T @ np.abs(W_ov) @ absE                                        # [K, K]
    S = absE.T @ np.abs(W_kq) @ absE
    Ms = np.where(inside, S[tok, query[:, None]], 0.0)                      # [N, Lmax]
    phi = np.where(inside, fw.attn, 0.0)
    Mphi = phi * (1.0 + 4.0 * Ms.max(axis=1))[:, None]
    Bt = B[:, tok]                                                          # [K, N, Lmax]
    Mz = np.einsum("jl,kjl->jk", Mphi, Bt)
    Xabs = absE.T[tok] * inside[:, :, None]
    return _Sentences(inside, tok, query, absE, Xabs, Ms, phi, Mphi, Bt, Mz, fw)


def twostage_scales(prep, W_ov: np.ndarray, W_kq: np.ndarray | None) -> tuple[Scales, float]:
    """Magnitudes of loss, logits, attn, grad_W_ov, grad_W_kq (docs/twostage.md §2–§3) on a prepared,
    weighted sentence set (:func:`ntpref.twostage.prepare` or ``prepare_collocations``), and the
    largest exponent magnitude max M(z) + max M(s) (a floor of ρ for the naive NGD direction).

    With B = |E|^T |W_ov| |E| and S = |E|^T |W_kq| |E| (token space): M(s_l) = S[τ_l, q], M(φ_l) =
    φ_l (1 + 4 max_l M(s_l)), M(z_k) = Σ_l M(φ_l) B[k, τ_l], M(p_k) = p_k (1 + 4 max_k M(z_k)),
    M(ℓ) = ℓ + 1 + 2 max M(z); g_z = p − e_y with M(g_z,y) = Σ_k M(p_k); a_l = Σ_k (E^T W_ov E)[k, τ_l] g_z,k,
    M(g_s,l) = M(φ_l)(|a_l| + |φ·a|) + φ_l (M(a_l) + M(φ·a)).
    """
    W_kq = np.zeros_like(W_ov) if W_kq is None else W_kq
    st = _sentences(prep, W_ov, W_kq)
    E, w, phi, Mphi, Bt, Xabs = prep.E, prep.weights, st.phi, st.Mphi, st.Bt, st.Xabs
    N, Lmax = prep.tokens.shape
    K, d = E.shape[1], E.shape[0]
    Mzmax = st.Mz.max(axis=1)
    z = st.fw.logits
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    Mp = p * (1.0 + 4.0 * Mzmax)[:, None]
    rows = np.arange(N)
    gz = p.copy()
    gz[rows, prep.targets] -= 1.0
    Mgz = Mp.copy()
    Mgz[rows, prep.targets] = Mp.sum(axis=1)
    Mloss = w @ (np.abs(st.fw.losses) + 1.0 + 2.0 * Mzmax)
    MXphi = np.einsum("jl,jlb->jb", Mphi, Xabs)
    Xphi = np.einsum("jl,jlb->jb", phi, Xabs)
    absE = st.absE
    Mgov = np.einsum("ak,jk,jb,j->ab", absE, Mgz, Xphi, w) + np.einsum("ak,jk,jb,j->ab", absE, np.abs(gz), MXphi, w)
    a = np.einsum("kjl,jk->jl", (E.T @ W_ov @ E)[:, st.tok], gz)
    Ma = np.einsum("kjl,jk->jl", Bt, Mgz)
    ca = np.abs((phi * a).sum(axis=1))
    Mca = (Mphi * np.abs(a) + phi * Ma).sum(axis=1)
    Mgs = np.where(st.inside, Mphi * (np.abs(a) + ca[:, None]) + phi * (Ma + Mca[:, None]), 0.0)
    Mgkq = np.einsum("j,jla,jl,jb->ab", w, Xabs, Mgs, absE.T[st.query])
    count = N + 2 * Lmax + 2 * K + 2 * d * d + 2 * d + 3 * TRANSCENDENTAL_ULPS
    M = {"loss": np.array(Mloss), "logits": st.Mz, "attn": Mphi, "grad_W_ov": Mgov, "grad_W_kq": Mgkq}
    return Scales(M, count), float(Mzmax.max(initial=0.0) + st.Ms.max(initial=0.0))


def _log_sum(log_c: np.ndarray, parts: np.ndarray) -> tuple[float, np.ndarray]:
    """(Λ, Σ_j e^{log_c_j − Λ} parts_j) with Λ = max_j log_c_j: a sum of terms of very different scales
    (parts [N, ...]); Λ = −inf and zeros when every log_c_j is −inf."""
    top = float(np.max(log_c, initial=-np.inf))
    if top == -np.inf:
        return top, np.zeros(parts.shape[1:])
    return top, np.einsum("j,j...->...", np.exp(log_c - top), parts)


def stable_accuracy(prep, W_ov: np.ndarray, W_kq: np.ndarray | None, wrt: str) -> float:
    """ρ = ‖M(G)‖_F / ‖G‖_F for the log-scale ("stable") direction of ∇_{W_wrt} (wrt "ov" | "kq",
    docs/twostage.md §4.1): the computed G/‖G‖ is then accurate to 2 γ_K ρ. M(G) is the magnitude of
    that computation, which scales each sentence j by e^{λ_j} and never forms p_y − 1 or a_l − φ·a:

        g̃ = (p̃_v)_{v≠y}, g̃_y = −S:   M(p̃_v) = p̃_v (1 + 4 M(z)_j), M(g̃_y) = Σ_v M(p̃_v)
        ã_l = Σ_v (EᵀW_ovE)[v, τ_l] g̃_v:   M(ã_l) = Σ_v B[v, τ_l] M(g̃_v)
        ov:  G = Σ_j e^{m_j} w_j E g̃_j (Xφ)_jᵀ,
             M = Σ_j e^{m_j} w_j |E| [M(g̃) |Xφ|ᵀ + |g̃| (M(Xφ) + R_j |Xφ|)ᵀ]
        kq:  G = Σ_j e^{m_j} w_j Σ_{l,k} φ_l φ_k (ã_l − ã_k) x_l x_Lᵀ over pairs of different tokens,
             M = Σ_j e^{m_j} w_j Σ_{l,k} φ_l φ_k [M(ã_l) + M(ã_k) + R_j |ã_l − ã_k|] |x_l| |x_L|ᵀ

    with m_j = max_{v≠y} log p_v and R_j = 2 (1 + |log w_j|) + 4 max M(z)_j + 8 max M(s)_j the
    magnitude of the exponents that form the log-scale weights (e^{λ_j − Λ}, e^{log φ_l + log φ_k − σ}).
    The exact values φ, m come from the oracle's logits and scores; ‖G‖ from its stable direction.
    Returns 1 when G = 0 (no step is taken)."""
    from .. import twostage

    W_kq = np.zeros_like(W_ov) if W_kq is None else W_kq
    direction = twostage.direction(prep, W_ov, W_kq, wrt=wrt, method="stable")
    if direction.log_norm == -np.inf:
        return 1.0
    st = _sentences(prep, W_ov, W_kq)
    E, w = prep.E, prep.weights
    N = w.shape[0]
    rows = np.arange(N)
    y = prep.targets
    z = st.fw.logits
    other = np.arange(z.shape[1])[None, :] != y[:, None]
    r = np.where(other, z - z[rows, y][:, None], -np.inf)                   # margins r_v = z_v − z_y
    rmax = r.max(axis=1)
    pt = np.exp(r - rmax[:, None])                                          # p̃, 0 at v = y
    Mzmax = st.Mz.max(axis=1)
    Mpt = pt * (1.0 + 4.0 * Mzmax)[:, None]
    g = pt.copy()
    g[rows, y] = -pt.sum(axis=1)
    Mg = Mpt.copy()
    Mg[rows, y] = Mpt.sum(axis=1)
    zmax = z.max(axis=1)
    lse = zmax + np.log(np.exp(z - zmax[:, None]).sum(axis=1))
    log_w = np.log(np.where(w > 0, w, 1.0))
    m = np.where(w > 0, rmax + z[rows, y] - lse + log_w, -np.inf)           # log (w_j max_{v≠y} p_v)
    R = 2.0 * (1.0 + np.abs(log_w)) + 4.0 * Mzmax + 8.0 * st.Ms.max(axis=1)
    if wrt == "ov":
        Xphi = np.einsum("jl,jlb->jb", st.phi, st.Xabs)
        MXphi = np.einsum("jl,jlb->jb", st.Mphi, st.Xabs)
        parts = (np.einsum("jk,jb->jkb", Mg, Xphi)
                 + np.einsum("jk,jb->jkb", np.abs(g), MXphi + R[:, None] * Xphi))
        top, Mt = _log_sum(m, parts)
        Mt = st.absE @ Mt
    else:
        s = (E.T @ W_kq @ E)[st.tok, st.query[:, None]]
        s = np.where(st.inside, s, -np.inf)
        smax = s.max(axis=1)
        lphi = s - (smax + np.log(np.exp(s - smax[:, None]).sum(axis=1)))[:, None]
        a = np.einsum("kjl,jk->jl", (E.T @ W_ov @ E)[:, st.tok], g)
        Ma = np.einsum("kjl,jk->jl", st.Bt, Mg)
        pairs = [(st.inside & st.inside[:, k:k + 1] & (st.tok != st.tok[:, k:k + 1]), k) for k in range(s.shape[1])]
        sigma = np.max([np.where(valid, lphi + lphi[:, k:k + 1], -np.inf).max(axis=1) for valid, k in pairs], axis=0)
        shift = np.where(sigma > -np.inf, sigma, 0.0)[:, None]
        inner = np.zeros_like(a)
        for valid, k in pairs:
            weight = np.exp(np.where(valid, lphi + lphi[:, k:k + 1] - shift, -np.inf))
            inner += weight * (Ma + Ma[:, k:k + 1] + R[:, None] * np.abs(a - a[:, k:k + 1]))
        parts = np.einsum("jla,jl,jb->jab", st.Xabs, inner, st.absE.T[st.query])
        top, Mt = _log_sum(m + sigma, parts)
    if top == -np.inf:
        return 1.0
    return float(np.exp(top + np.log(np.linalg.norm(Mt)) - direction.log_norm)) if np.any(Mt) else 1.0


def _twostage_data(inputs: Mapping[str, np.ndarray]):
    """(Dataset, W_ov, W_kq) of a two-stage input (validated by the model's contract)."""
    from ..twostage.contract import input_dataset

    ds = input_dataset(inputs)
    return ds, as_float("W_ov", inputs["W_ov"], (ds.d, ds.d)), as_float("W_kq", inputs["W_kq"], (ds.d, ds.d))


def _twostage_eval(inputs: Mapping[str, np.ndarray]) -> dict[str, tuple[np.ndarray, int]]:
    from .. import twostage

    ds, W_ov, W_kq = _twostage_data(inputs)
    sc, _ = twostage_scales(twostage.prepare(ds), W_ov, W_kq)
    out = {k: (v, sc.count) for k, v in sc.M.items()}
    if ds.succ is not None:
        sc0, _ = twostage_scales(twostage.prepare_collocations(ds.E, ds.succ), W_ov, None)
        out.update(loss0=(sc0.M["loss"], sc0.count), grad0_W_ov=(sc0.M["grad_W_ov"], sc0.count))
    return out


# --- evaluation: one entry point per model ------------------------------------------------------------
def eval_scales(model: str, inputs: Mapping[str, np.ndarray], kind: str = "eval") -> dict[str, tuple[np.ndarray, int]]:
    """name → (M, K) for every output (and intermediate) of an eval input of ``model`` (kind "eval"),
    or of a shallow NTK input (kind "ntk"): M is the evaluation magnitude of the output, an array
    shaped like it (0-d for a loss), K the operation count, so that any float64 implementation
    computes the output to within γ_K · M elementwise (module docstring, docs/tolerance.md)."""
    if model == "twostage":
        return _twostage_eval(inputs)
    from ..shallow.contract import input_data, input_kappa
    from ..shallow.projgd import model_named

    spec = model_named(model)
    data = input_data(model, inputs)
    params = spec.check_params(*(inputs[b] for b in spec.blocks), d=data.X.shape[2])
    if kind == "ntk":
        sc = ntk_scales(data, *params)
    elif model == "shallow":
        sc = shallow_scales(data, *params, input_kappa(inputs))
    else:
        sc = indrnn_scales(data, *params, input_kappa(inputs))
    return {k: (v, sc.count) for k, v in sc.M.items()}


def _check(model: str, kind: str, allowed=KINDS) -> None:
    if model not in MODELS:
        raise InputError(f"model must be one of {', '.join(MODELS)}, got {model!r}")
    if kind not in allowed:
        raise InputError(f"kind must be one of {', '.join(allowed)}, got {kind!r}")


def _known(model: str, kind: str, names, known) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"array '{unknown[0]}': not an output of a {model} {kind} run "
                         f"(outputs: {', '.join(known)}); no tolerance policy for it")


# --- training ---------------------------------------------------------------------------------------
def _envelope(D: np.ndarray, first: int) -> np.ndarray:
    """max_{first <= s <= t} D(s) for every t (0 before ``first``)."""
    env = np.where(np.arange(D.shape[0]) >= first, D, 0.0)
    return np.maximum.accumulate(env) if env.size else env


def _trajectory_tolerance(q: np.ndarray, floor: float, count: int, propagated: np.ndarray, what: str) -> dict:
    """A logged trajectory q [steps]: rtol SAFETY·γ_K, and the straight line atol + atol_per_step·t
    lying above SAFETY·(floor + propagated(t)); ``floor`` is q's evaluation bound apart from γ_K |q_t|."""
    line = SAFETY * (floor + propagated)
    atol = max(float(line[0]), TINY)
    t = np.arange(1, q.shape[0])
    slope = max(float(np.max((line[1:] - atol) / t, initial=0.0)), 0.0)
    return {"rtol": SAFETY * gamma(count), "atol": atol, "atol_max_scale": 0.0, "atol_per_step": slope,
            "reason": f"float64 policy, trajectory {what}: {SAFETY:g}·[γ_{count}·|q_t| + {floor:.3g} + "
                      f"propagated rounding, {float(propagated[-1]):.3g} at the last step]"}


def _final_tolerance(propagated: float, what: str) -> dict:
    return {"rtol": 0.0, "atol": max(SAFETY * propagated, TINY), "atol_max_scale": 0.0, "atol_per_step": 0.0,
            "reason": f"float64 policy, {what}: {SAFETY:g}·propagated rounding {propagated:.3g}"}


def _qp_tolerance(W_star: np.ndarray) -> dict:
    return {"rtol": 0.0, "atol": max(QP_REL * _max(W_star), TINY), "atol_max_scale": 0.0, "atol_per_step": 0.0,
            "reason": f"max-margin solution: a certified least-norm QP solver, {QP_REL:g}·max|W*|"}


def _max(x) -> float:
    return float(np.max(np.abs(x), initial=0.0))


def _response(inputs: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], eps: Mapping[str, float],
              backend: str) -> dict[str, np.ndarray]:
    """Train again from θ(0) + ε·ξ (ξ = ±1 from a fixed seed, per block of ``eps``) and return
    |rerun − out| per output: the response to one step's worth of rounding."""
    from . import contract

    rng = np.random.default_rng(_SEED)
    moved = {b: as_float(b, inputs[b]) + e * rng.choice((-1.0, 1.0), size=np.shape(inputs[b])) for b, e in eps.items()}
    unbounded = {k: np.full(np.shape(out[k]), np.inf) for k in out}
    if not all(np.isfinite(v).all() for v in moved.values()):
        return unbounded        # the step's rounding itself overflows: no bound (see _representable)
    try:
        other = contract.train({**inputs, **moved}, backend)
    except InputError:          # the moved run overflows where the given one did not: no bound either
        return unbounded
    return {k: np.abs(other[k] - out[k]) for k in out}


def _twostage_train(inputs: Mapping[str, np.ndarray], names, backend: str) -> dict[str, dict]:
    """Stage 1 trains W_ov for T0 steps, stage 2 W_kq for T steps with W_ov frozen at the stage-1
    result. Two reruns measure the responses D1 (W_ov(0) moved) and D2 (W_kq(0) moved). After t
    steps of a stage, q has t injections of its own stage behind it (responses max_{1≤s≤t} D(s)), and
    a stage-2 quantity also the T0 of stage 1 (responses max_{s≤t} D1(s)). The injection of a step of
    size η along G/‖G‖ is U·max|W| + η (U + 2 γ_K ρ), ρ the relative accuracy of the direction at
    both ends of the stage: for direction "stable" :func:`stable_accuracy`; for "naive" (the plain
    float64 gradient) the larger of ‖M(G)‖/‖G‖ at the start and 1 + 2·(max M(z) + max M(s))."""
    from . import contract
    from .. import twostage

    ds, W_ov0, W_kq0 = _twostage_data(inputs)
    eta0, eta = as_scalar("eta0", inputs["eta0"]), as_scalar("eta", inputs["eta"])
    T0 = as_scalar("T0", inputs["T0"], kind="int")
    naive = "direction" in inputs and as_scalar("direction", inputs["direction"], kind="str") == "naive"
    out = contract.train(inputs, backend)
    prep, prep0 = twostage.prepare(ds), twostage.prepare_collocations(ds.E, ds.succ)
    W_ov = out["W_ov"]
    stages = {"W_ov": (eta0, prep0, [(W_ov, None) for W_ov in (W_ov0, W_ov)], "ov", 1),
              "W_kq": (eta, prep, [(W_ov, W) for W in (W_kq0, out["W_kq"])], "kq", 2)}
    scales, eps, D = {}, {}, {}
    for block, (step, pset, ends, wrt, g_index) in stages.items():
        sc = [twostage_scales(pset, *e) for e in ends]
        scales[block] = sc
        if naive:
            G = twostage.loss_and_grad(pset, *ends[0])[g_index]
            rel = 1.0 + 2.0 * max(x[1] for x in sc)
            if np.any(G):
                rel = max(rel, float(np.linalg.norm(sc[0][0].M[f"grad_{block}"]) / np.linalg.norm(G)))
        else:
            rel = max(stable_accuracy(pset, *e, wrt) for e in ends)
        largest = max(_max(inputs[block]), _max(out[block]))
        eps[block] = U * largest + step * (U + 2.0 * gamma(sc[0][0].count) * rel)
        D[block] = _response(inputs, out, {block: eps[block]}, backend)
    sf, _ = twostage_scales(twostage.prepare(twostage.optimal_token_sentences(ds)), W_ov, None)
    T = as_scalar("T", inputs["T"], kind="int")
    tols = {}
    for name in names:
        q, D1, D2 = out[name], D["W_ov"][name], D["W_kq"][name]
        if name in ("W_ov_star", "W_kq_star"):
            tols[name] = _qp_tolerance(q)
        elif name == "W_ov":
            tols[name] = _final_tolerance(T0 * max(_max(D1), eps["W_ov"]), "stage-1 result")
        elif name == "W_kq":
            tols[name] = _final_tolerance(T0 * _max(D1) + T * max(_max(D2), eps["W_kq"]), "stage-2 result")
        elif name == "loss_floor":
            tol = eval_tolerance(sf.M["loss"], sf.count)
            tols[name] = {**tol, "atol": tol["atol"] + SAFETY * T0 * _max(D1), "reason": tol["reason"]
                          + f" + {SAFETY:g}·{T0}·response {_max(D1):.3g} of the stage-1 result"}
        else:
            stage, key = name.split("_", 1)
            sc = scales["W_ov" if stage == "stage1" else "W_kq"]
            count = sc[0][0].count
            floor = {"loss": gamma(count) * max(float(x[0].M["loss"]) for x in sc), "norm": 0.0,
                     "corr": gamma(count) + 2.0 * ds.d * QP_REL}[key]                 # ρ against a certified W*
            t = np.arange(q.shape[0])
            if stage == "stage1":
                propagated = t * _envelope(D1, 1)
            else:
                propagated = T0 * _envelope(D1, 0) + t * _envelope(D2, 1)
            tols[name] = _trajectory_tolerance(q, floor, count, propagated, name)
    return tols


def _shallow_train(model: str, inputs: Mapping[str, np.ndarray], names, backend: str) -> dict[str, dict]:
    """ProjGD / ProjSGD: θ(t+1) = Π(θ(t) − η g). The injection per block is U·max|θ| + η γ_K max M(g)
    (M(g) at θ(0) and at the final θ; ×n/B for a minibatch of B); one rerun with every block moved
    measures the responses D. train_loss[t] and grad_norm[t] (at θ(t)) have t injections behind them,
    val_loss[t] (at θ(t+1)) t + 1, the final blocks ``steps``."""
    from ..shallow.projgd import model_named
    from . import contract

    spec = model_named(model)
    blocks, logged = spec.blocks, spec.logged
    train_only = ("eta", "steps", "rho", "X_val", "y_val", "batch", "seed")
    base = {k: v for k, v in inputs.items() if k not in train_only}
    out = contract.train(inputs, backend)
    eta = as_scalar("eta", inputs["eta"])
    steps = as_scalar("steps", inputs["steps"], kind="int")
    n = np.shape(inputs["X"])[0]
    per_batch = n / as_scalar("batch", inputs["batch"], kind="int") if "batch" in inputs else 1.0
    ends = [base, {**base, **{b: out[b] for b in blocks}}]
    train_sc = [eval_scales(model, e) for e in ends]
    count = train_sc[0]["loss"][1]
    eps = {b: U * max(_max(inputs[b]), _max(out[b])) + eta * per_batch * gamma(count) * max(
        _max(sc[f"grad_{b}"][0]) for sc in train_sc) for b in blocks}
    D = _response(inputs, out, eps, backend)
    floors = {"train_loss": max(float(sc["loss"][0]) for sc in train_sc),
              f"grad_norm_{logged}": per_batch * max(float(np.linalg.norm(sc[f"grad_{logged}"][0])) for sc in train_sc)}
    if "X_val" in inputs:
        val = [{**e, "X": inputs["X_val"], "y": inputs["y_val"]} for e in ends]
        floors["val_loss"] = max(float(eval_scales(model, e)["loss"][0]) for e in val)
    tols = {}
    for name in names:
        q = out[name]
        if name in blocks:
            tols[name] = _final_tolerance(steps * max(_max(D[name]), eps[name]), f"final {name}")
        else:
            t = np.arange(q.shape[0]) + (name == "val_loss")
            tols[name] = _trajectory_tolerance(q, gamma(count) * floors[name], count, t * _envelope(D[name], 1), name)
    return tols


TRAIN_OUTPUTS = {
    "twostage": ("W_ov", "W_kq", "W_ov_star", "W_kq_star", "loss_floor", "stage1_loss", "stage1_norm",
                 "stage1_corr", "stage2_loss", "stage2_norm", "stage2_corr"),
    "shallow": ("c", "U", "W", "train_loss", "val_loss", "grad_norm_W"),
    "indrnn": ("c", "u", "W_in", "train_loss", "val_loss", "grad_norm_u"),
}


# --- the policy -------------------------------------------------------------------------------------
def run_kind(inputs: Mapping[str, np.ndarray]) -> str:
    """"train" when the input holds training fields (``eta``), "ntk" for a shallow input without ``y``
    (a stored NTK case), else "eval"."""
    if "eta" in inputs:
        return "train"
    model = inputs.get("model")
    if model is not None and str(np.asarray(model)) == "shallow" and "y" not in inputs:
        return "ntk"
    return "eval"


@np.errstate(all="ignore")   # the user's np.seterr must not change (or break) a bound
def default_tolerances(model: str, kind: str, inputs: Mapping[str, np.ndarray],
                       expected: Mapping[str, np.ndarray], *, backend: str = "numba") -> dict[str, dict]:
    """Per output array of ``expected``, the tolerance spec that
    :func:`ntpref.oracle.compare.compare_arrays` accepts, under the float64 policy (module docstring).

    model in {"twostage", "shallow", "indrnn"}, kind in {"eval", "train"} ("ntk" too for "shallow":
    the stored NTK Gram matrix). ``inputs`` is the run's input dict (validated here by running the
    oracle on it; a train input is trained twice). ``expected`` only supplies the names; its values
    are not used. eval / ntk of a shallow input also cover the intermediates head_s, head_a, head_MU.
    Raises InputError for an unknown model or kind, an invalid input, or a name that is not an output.
    """
    from . import contract

    _check(model, kind, KINDS + (("ntk",) if model == "shallow" else ()))
    names = list(expected)
    if kind == "train":
        _known(model, kind, names, TRAIN_OUTPUTS[model])
        if model == "twostage":
            return _representable(_twostage_train(inputs, names, backend))
        return _representable(_shallow_train(model, inputs, names, backend))
    if kind == "eval":
        contract.evaluate(inputs, backend)                                   # validates the input
    scales = eval_scales(model, inputs, kind)
    _known(model, kind, names, list(scales))
    return _representable({name: eval_tolerance(*scales[name]) for name in names})


def _representable(tolerances: dict[str, dict]) -> dict[str, dict]:
    """``tolerances`` with every bound that overflowed float64 (inf, or NaN from inf·0: inputs of size
    ~1e300 whose outputs are finite but whose magnitudes are not) set to the largest float64, and its
    reason saying so: for such an array the policy can only refuse non-finite values."""
    big = float(np.finfo(np.float64).max)
    for spec in tolerances.values():
        bad = [k for k in ("rtol", "atol", "atol_per_step") if not np.isfinite(spec[k])]
        if bad:
            spec.update({k: big for k in bad})
            spec["reason"] = ("float64 policy: the rounding bound overflows float64 (magnitudes beyond 1.8e308), "
                              "so only non-finite values fail; " + spec["reason"])
    return tolerances
