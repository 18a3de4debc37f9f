"""Shallow multi-head transformer of paper (2): outputs, loss, closed-form gradients (docs/shallow.md §1–§2).

Shapes: X [n, T, d] (row t is token x_t, the query q = x_T is row T − 1), y [n], c [m], U [m, d],
W [m, d, d]. For head i and sample X:
  z_{i,t} = x_t^T W_i q / τ_att,  α_i = softmax_t(z_i)  (mask_last_key: t < T only, α_{i,T} = 0),
  a_i = Σ_t α_{i,t} x_t,  s_i = U_i^T a_i,  f(X) = m^{-1/2} Σ_i c_i σ(s_i).
The loss (κ/2n) Σ_j (f(X_j) − y_j)², κ ∈ {1, 2}, is the convention of :mod:`ntpref.shallow.evaluation`.

API: :func:`prepare` validates X, y and the options once (:class:`Batch`); :func:`forward`,
:func:`loss_and_grad` and :func:`head_states` take the prepared data and the parameters (c, U, W), and the
backend ("numba": :mod:`ntpref.shallow.kernels`; "numpy": the vectorised formulas below; they agree to
rtol 1e-12). :func:`paired_init` / :func:`iid_init` draw :class:`Params`. Head outputs are summed in the
pair order of :mod:`ntpref.shallow.readout`, so the paired initialisation gives f = 0 exactly.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..checks import as_float, as_scalar, check_backend
from ..errors import InputError
from . import evaluation, kernels
from .activation import activation_code, activation_name, dsigma_np, sigma_np
from .evaluation import Forward
from .readout import readout_np


class Batch(NamedTuple):
    """Prepared data of the transformer, from :func:`prepare`: X [n, T, d] float64 (finite), y [n] or None,
    and the options τ_att > 0, mask_last_key and the activation name ("tanh" | "erf")."""
    X: np.ndarray
    y: np.ndarray | None
    tau_att: float
    mask_last_key: bool
    activation: str

    @property
    def n_keys(self) -> int:
        """The number of keys each query attends to: T, or T − 1 with the last key masked."""
        return self.X.shape[1] - 1 if self.mask_last_key else self.X.shape[1]


class Params(NamedTuple):
    """The transformer's parameters in call order: c [m], U [m, d], W [m, d, d]."""
    c: np.ndarray
    U: np.ndarray
    W: np.ndarray


class LossAndGrad(NamedTuple):
    """loss = (κ/2n) Σ r², its gradients grad_c [m], grad_U [m, d], grad_W [m, d, d], and f [n]."""
    loss: float
    grad_c: np.ndarray
    grad_U: np.ndarray
    grad_W: np.ndarray
    f: np.ndarray


class HeadStates(NamedTuple):
    """Per-head states: s [n, m] = U_i^T a_i (pre-activation), a [n, m, d] = Σ_t α_t x_t and
    MU [n, m, d] = M_i U_i = Σ_t α_t x_t (x_t^T U_i − s_i)."""
    s: np.ndarray
    a: np.ndarray
    MU: np.ndarray


def prepare(X, y=None, *, tau_att=1.0, mask_last_key=False, activation="tanh") -> Batch:
    """Validate X [n, T, d] (finite), y [n] (optional) and the options once (:class:`Batch`). A training
    loop prepares its data once and then calls :func:`forward` / :func:`loss_and_grad` every step."""
    activation = activation_name(activation)
    X, y = evaluation.check_samples(X, y)
    tau_att = as_scalar("tau_att", tau_att, low=0.0, low_open=True)
    mask = as_scalar("mask_last_key", mask_last_key, kind="bool")
    T = X.shape[1]
    if mask and T < 2:
        raise InputError("mask_last_key needs T >= 2 tokens (the last key is excluded), got T = 1")
    return Batch(X, y, tau_att, mask, activation)


def check_heads(U, W, *, d: int, names=("U", "W"), m: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(U [m, d], W [m, d, d]) as float64 for tokens of dimension d, m ≥ 1 heads (or exactly ``m``);
    ``names`` name the arrays in errors."""
    U = as_float(names[0], U, (m, d))
    if U.shape[0] == 0:
        raise InputError(f"array '{names[0]}': expected at least one head (m >= 1), got shape [0, {d}]")
    return U, as_float(names[1], W, (U.shape[0], d, d))


def check_params(c, U, W, *, d: int, names=("c", "U", "W"), m: int | None = None) -> Params:
    """(c [m], U [m, d], W [m, d, d]) as float64 (:func:`check_heads`, then c), as :class:`Params`."""
    U, W = check_heads(U, W, d=d, names=names[1:], m=m)
    return Params(as_float(names[0], c, (U.shape[0],)), U, W)


def _states_np(data: Batch, U: np.ndarray, W: np.ndarray):
    """NumPy: a [n, m, d], s [n, m], MU [n, m, d], q [n, d] (docs/shallow.md §1–§2, O(n m (d² + T d)))."""
    X = data.X
    q = X[:, -1, :]
    keys = X[:, :data.n_keys, :]
    v = np.einsum("mkl,nl->nmk", W, q)                      # W_i q
    z = np.einsum("ntk,nmk->nmt", keys, v) / data.tau_att   # x_t^T W_i q / τ
    alpha = np.exp(z - z.max(axis=-1, keepdims=True))
    alpha /= alpha.sum(axis=-1, keepdims=True)
    a = np.einsum("nmt,ntk->nmk", alpha, keys)
    p = np.einsum("ntk,mk->nmt", keys, U)                   # x_t^T U_i
    s = np.einsum("nmt,nmt->nm", alpha, p)                  # Σ_t α_t x_t^T U_i: p − s is then centred exactly
    MU = np.einsum("nmt,ntk->nmk", alpha * (p - s[..., None]), keys)
    return a, s, MU, q


def _output_np(c: np.ndarray, s: np.ndarray, activation: str) -> np.ndarray:
    """f [n] = m^{-1/2} Σ_i c_i σ(s_i) for s [n, m], in the pair order of :mod:`ntpref.shallow.readout`."""
    return readout_np(c, sigma_np(s, activation))


def _heads_last(U: np.ndarray, W: np.ndarray):
    """(Wr [d, d, m] with Wr[l, k, i] = W[i, k, l], UT [d, m]): the Numba kernels' layout."""
    return np.ascontiguousarray(W.transpose(2, 1, 0)), np.ascontiguousarray(U.T)


def _outputs(data: Batch, p: Params, backend: str) -> np.ndarray:
    """f [n] = m^{-1/2} Σ_i c_i σ(U_i^T a_i(X_j)) (docs/shallow.md §1)."""
    if backend == "numpy":
        return _output_np(p.c, _states_np(data, p.U, p.W)[1], data.activation)
    f = np.empty(data.X.shape[0])
    kernels.forward_kernel(data.X, p.c, *_heads_last(p.U, p.W), 1.0 / data.tau_att, data.n_keys,
                           activation_code(data.activation), f)
    return f


def _gradients(data: Batch, p: Params, kappa: float, backend: str):
    """(f [n], Params(c=grad_c [m], U=grad_U [m, d], W=grad_W [m, d, d])): the closed forms of
    :func:`loss_and_grad`, each block's gradient in that block's field."""
    X, y = data.X, data.y
    n, _, d = X.shape
    m = p.U.shape[0]
    if backend == "numpy":
        a, s, MU, q = _states_np(data, p.U, p.W)
        f = _output_np(p.c, s, data.activation)
        g = kappa * (f - y) / n
        e = g[:, None] * p.c * dsigma_np(s, data.activation) / math.sqrt(m)
        grad_c = np.einsum("n,nm->m", g, sigma_np(s, data.activation)) / math.sqrt(m)
        grad_U = np.einsum("nm,nmk->mk", e, a)
        grad_W = np.einsum("nm,nmk,nl->mkl", e, MU, q) / data.tau_att
        return f, Params(c=grad_c, U=grad_U, W=grad_W)
    f, grad_c, grad_U, grad_W = np.empty(n), np.empty(m), np.empty((d, m)), np.empty((d, d, m))
    kernels.loss_grad_kernel(X, y, p.c, *_heads_last(p.U, p.W), 1.0 / data.tau_att, data.n_keys,
                             activation_code(data.activation), kappa / n, f, grad_c, grad_U, grad_W)
    return f, Params(c=grad_c, U=np.ascontiguousarray(grad_U.T), W=np.ascontiguousarray(grad_W.transpose(2, 0, 1)))


#: The transformer as the shared evaluation, the trainer and the file contract see it (evaluation.Model).
MODEL = evaluation.Model("shallow", "ntpref.shallow.prepare", prepare, Batch, Params, check_params, _outputs,
                         _gradients, LossAndGrad, logged="W",
                         block_shapes=("[m]", "[m, d]", "[m, d, d]"))


def forward(data: Batch, c, U, W, *, kappa=2.0, backend="numba") -> Forward:
    """Forward(loss, f): outputs f [n] = m^{-1/2} Σ_i c_i σ(U_i^T a_i(X_j)) (docs/shallow.md §1) and, when
    the data has targets, loss = (κ/2n) Σ_j (f_j − y_j)² (else None)."""
    return evaluation.forward(MODEL, data, (c, U, W), kappa=kappa, backend=backend)


def loss_and_grad(data: Batch, c, U, W, *, kappa=2.0, backend="numba") -> LossAndGrad:
    """LossAndGrad(loss, grad_c [m], grad_U [m, d], grad_W [m, d, d], f [n]) with loss = (κ/2n) Σ_j r_j²
    and the closed-form gradients of docs/shallow.md §2 (g_j = κ r_j / n, e_ji = g_j c_i σ'(s_ji)/√m):
      grad_c_i = m^{-1/2} Σ_j g_j σ(s_ji),  grad_U_i = Σ_j e_ji a_ji,
      grad_W_i = τ_att^{-1} Σ_j e_ji (M U)_ji q_j^T.
    The data must have targets y. Cost O(n m (d² + T d)); no d×d×T tensor."""
    return evaluation.loss_and_grad(MODEL, data, (c, U, W), kappa=kappa, backend=backend)


def head_states(data: Batch, U, W, *, backend="numba") -> HeadStates:
    """HeadStates(s [n, m], a [n, m, d], MU [n, m, d]): s = U_i^T a_i (pre-activation),
    a_i = Σ_t α_t x_t, MU = M_i U_i = Σ_t α_t x_t (x_t^T U_i − s_i). Everything the NTK features
    ∂f/∂θ_i and the teacher need (docs/shallow.md §2, §4)."""
    evaluation.check_data(MODEL, data)
    check_backend(backend)
    U, W = check_heads(U, W, d=data.X.shape[2])
    if backend == "numpy":
        a, s, MU, _ = _states_np(data, U, W)
        return HeadStates(s, a, MU)
    n, m, d = data.X.shape[0], U.shape[0], data.X.shape[2]
    s, a, MU = np.empty((n, m)), np.empty((n, d, m)), np.empty((n, d, m))
    kernels.head_states_kernel(data.X, *_heads_last(U, W), 1.0 / data.tau_att, data.n_keys, s, a, MU)
    return HeadStates(s, np.ascontiguousarray(a.transpose(0, 2, 1)), np.ascontiguousarray(MU.transpose(0, 2, 1)))


def _draw(rng, k: int, d: int, scale) -> Params:
    """k heads, the one place the initial heads are built: W̃ [k, d, d] then Ũ [k, d] i.i.d. N(0, 1), then
    c̃ [k] = ±1 uniform (drawn in this order), returned as (c, U, W) = s·(c̃, Ũ, W̃): every entry of all three
    blocks multiplied by s = ``scale`` (> 0, finite, and small enough that s·W̃ stays finite; s = 1 returns
    the draws unchanged, bit for bit)."""
    scale = as_scalar("scale", scale, low=0.0, low_open=True)
    W = rng.standard_normal((k, d, d))
    U = rng.standard_normal((k, d))
    c = rng.choice(np.array([-1.0, 1.0]), size=k)
    with np.errstate(over="ignore"):             # an overflow is reported just below
        heads = Params(scale * c, scale * U, scale * W)
    if not all(np.isfinite(b).all() for b in heads):
        raise InputError(f"array 'scale': {scale} makes the initial heads overflow")
    return heads


def paired_init(m, d, seed, scale=1.0) -> Params:
    """Paired initialisation (docs/shallow.md §1): heads i < m/2 drawn by :func:`_draw` from
    ``np.random.default_rng(seed)`` and scaled by s = ``scale``; heads m/2.. copy W, U and flip c (stored as
    the second half), so f ≡ 0: θ_i = s·(c̃_i, Ũ_i, W̃_i), θ_{m/2+i} = s·(−c̃_i, Ũ_i, W̃_i). Returns
    Params(c [m], U [m, d], W [m, d, d])."""
    m, d, rng = evaluation.check_init(m, d, seed, paired=True)
    c, U, W = _draw(rng, m // 2, d, scale)
    return Params(np.concatenate([c, -c]), np.concatenate([U, U]), np.concatenate([W, W]))


def iid_init(m, d, seed, scale=1.0) -> Params:
    """Independent initialisation: all m heads drawn by :func:`_draw` and scaled by s = ``scale``, θ_i =
    s·(c̃_i, Ũ_i, W̃_i) for every i (the same distribution per head as :func:`paired_init`, no pairing, so
    f ≠ 0 at init). Returns Params(c [m], U [m, d], W [m, d, d])."""
    m, d, rng = evaluation.check_init(m, d, seed, paired=False)
    return _draw(rng, m, d, scale)
