"""Shallow multi-head transformer of paper (2): outputs, loss, closed-form gradients (docs/shallow.md §1–§2).

Shapes: X [n, T, d] (row t is token x_t, the query q = x_T is row T − 1), y [n], c [m], U [m, d],
W [m, d, d]. For head i and sample X:
  z_{i,t} = x_t^T W_i q / τ_att,  α_i = softmax_t(z_i)  (mask_last_key: t < T only, α_{i,T} = 0),
  a_i = Σ_t α_{i,t} x_t,  s_i = U_i^T a_i,  f(X) = m^{-1/2} Σ_i c_i σ(s_i).

Loss convention (κ ∈ {1, 2}): with r_j = f(X_j) − y_j,
  loss = (κ / 2n) Σ_j r_j²       κ = 2: the paper's mean squared error (1/n) Σ r²;  κ = 1: half of it,
so that ∂loss/∂f_j = g_j = κ r_j / n exactly (docs/shallow.md §2) and every gradient returned here is the exact
gradient of the loss returned with it.

Both backends ("numba": :mod:`ntpref.shallow.kernels`; "numpy": the vectorised formulas below) share
validation and agree to rtol 1e-12. Head outputs are summed in the pair order (i, i + ⌊m/2⌋) so the
paired initialisation gives f = 0 exactly.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ..checks import as_float, as_scalar, check_backend, require_finite
from ..errors import InputError
from . import kernels
from .activation import activation_code, dsigma_np, sigma_np


class Batch(NamedTuple):
    """Validated data and options of the transformer, from :func:`batch`: X [n, T, d] float64, y [n] or
    None, τ_att > 0, n_keys = T (T − 1 with the last key masked), the activation name and the backend.
    A trainer validates its data once and then calls :func:`batch_forward` /
    :func:`batch_loss_and_grad` every step with new parameters."""
    X: np.ndarray
    y: np.ndarray | None
    tau_att: float
    n_keys: int
    activation: str
    backend: str


class _Inputs(NamedTuple):
    """A :class:`Batch` and validated parameters c [m] (or None), U [m, d], W [m, d, d]."""
    b: Batch
    c: np.ndarray | None
    U: np.ndarray
    W: np.ndarray


def check_X(X, name: str = "X") -> np.ndarray:
    """X as float64 [n, T, d] with n, T, d ≥ 1 and finite entries (InputError naming ``name``)."""
    X = as_float(name, X, (None, None, None))
    if 0 in X.shape:
        raise InputError(f"array '{name}': expected shape [n, T, d] with n, T, d >= 1, got {list(X.shape)}")
    return X


def check_kappa(kappa) -> float:
    """κ ∈ {1, 2} (the loss scale, see the module docstring)."""
    kappa = as_scalar("kappa", kappa)
    if kappa not in (1.0, 2.0):
        raise InputError(f"array 'kappa': must be 1 or 2, got {kappa}")
    return kappa


def batch(X, y=None, *, tau_att=1.0, mask_last_key=False, activation="tanh", backend="numba") -> Batch:
    """Validate X [n, T, d] (finite), y [n] (optional) and the options once (:class:`Batch`)."""
    check_backend(backend)
    activation_code(activation)
    X = check_X(X)
    if y is not None:
        y = as_float("y", y, (X.shape[0],))
    tau_att = as_scalar("tau_att", tau_att, low=0.0, low_open=True)
    mask = as_scalar("mask_last_key", mask_last_key, kind="bool")
    T = X.shape[1]
    if mask and T < 2:
        raise InputError("mask_last_key needs T >= 2 tokens (the last key is excluded), got T = 1")
    return Batch(X, y, tau_att, T - 1 if mask else T, activation, backend)


def _inputs(b: Batch, U, W, c=None) -> _Inputs:
    """Validate the parameters against the batch's token dimension d."""
    d = b.X.shape[2]
    U = as_float("U", U, (None, d))
    m = U.shape[0]
    if m == 0:
        raise InputError(f"array 'U': expected at least one head (m >= 1), got shape [0, {d}]")
    W = as_float("W", W, (m, d, d))
    if c is not None:
        c = as_float("c", c, (m,))
    return _Inputs(b, c, U, W)


def loss_from_outputs(f: np.ndarray, y: np.ndarray, kappa: float) -> float:
    """loss = (κ / 2n) Σ_j (f_j − y_j)² for outputs f [n] and targets y [n] (no validation; +inf when
    the residuals overflow, e.g. in a diverging run)."""
    r = f - y
    with np.errstate(over="ignore"):
        return float(kappa / (2.0 * r.shape[0]) * np.sum(r * r))


def _states_np(inp: _Inputs):
    """NumPy: a [n, m, d], s [n, m], MU [n, m, d], q [n, d] (docs/shallow.md §1–§2, O(n m (d² + T d)))."""
    X, U, W = inp.b.X, inp.U, inp.W
    q = X[:, -1, :]
    keys = X[:, :inp.b.n_keys, :]
    v = np.einsum("mkl,nl->nmk", W, q)                      # W_i q
    z = np.einsum("ntk,nmk->nmt", keys, v) / inp.b.tau_att  # x_t^T W_i q / τ
    alpha = np.exp(z - z.max(axis=-1, keepdims=True))
    alpha /= alpha.sum(axis=-1, keepdims=True)
    a = np.einsum("nmt,ntk->nmk", alpha, keys)
    s = np.einsum("nmk,mk->nm", a, U)
    p = np.einsum("ntk,mk->nmt", keys, U)                   # x_t^T U_i
    MU = np.einsum("nmt,ntk->nmk", alpha * (p - s[..., None]), keys)
    return a, s, MU, q


def _output_np(c: np.ndarray, s: np.ndarray, activation: str) -> np.ndarray:
    """f = m^{-1/2} Σ_i c_i σ(s_i) in the pair order (i, i + ⌊m/2⌋), then the odd head."""
    h = c * sigma_np(s, activation)
    half = h.shape[-1] // 2
    return ((h[:, :half] + h[:, half:2 * half]).sum(axis=1) + h[:, 2 * half:].sum(axis=1)) / math.sqrt(len(c))


def _heads_last(inp: _Inputs):
    """(Wr [d, d, m] with Wr[l, k, i] = W[i, k, l], UT [d, m]): the Numba kernels' layout."""
    return np.ascontiguousarray(inp.W.transpose(2, 1, 0)), np.ascontiguousarray(inp.U.T)


def batch_forward(b: Batch, c, U, W) -> np.ndarray:
    """Outputs f [n] = m^{-1/2} Σ_i c_i σ(U_i^T a_i(X_j)) (docs/shallow.md §1) on a validated :class:`Batch`."""
    inp = _inputs(b, U, W, c)
    if b.backend == "numpy":
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by require_finite below
            f = _output_np(inp.c, _states_np(inp)[1], b.activation)
    else:
        f = np.empty(b.X.shape[0])
        kernels.forward_kernel(b.X, inp.c, *_heads_last(inp), 1.0 / b.tau_att, b.n_keys,
                               activation_code(b.activation), f)
    require_finite(f=f)
    return f


def batch_loss_and_grad(b: Batch, c, U, W, *, kappa=2.0):
    """:func:`loss_and_grad` on a validated :class:`Batch` (with y)."""
    kappa = check_kappa(kappa)
    if b.y is None:
        raise InputError("array 'y': the loss needs targets y [n]")
    inp = _inputs(b, U, W, c)
    m = inp.U.shape[0]
    n, _, d = b.X.shape
    if b.backend == "numpy":
        a, s, MU, q = _states_np(inp)
        f = _output_np(inp.c, s, b.activation)
        g = kappa * (f - b.y) / n
        e = g[:, None] * inp.c * dsigma_np(s, b.activation) / math.sqrt(m)
        grad_c = np.einsum("n,nm->m", g, sigma_np(s, b.activation)) / math.sqrt(m)
        grad_U = np.einsum("nm,nmk->mk", e, a)
        grad_W = np.einsum("nm,nmk,nl->mkl", e, MU, q) / b.tau_att
    else:
        f, grad_c, grad_U, grad_W = np.empty(n), np.empty(m), np.empty((d, m)), np.empty((d, d, m))
        kernels.loss_grad_kernel(b.X, b.y, inp.c, *_heads_last(inp), 1.0 / b.tau_att, b.n_keys,
                                 activation_code(b.activation), kappa / n, f, grad_c, grad_U, grad_W)
        grad_U, grad_W = np.ascontiguousarray(grad_U.T), np.ascontiguousarray(grad_W.transpose(2, 0, 1))
    loss = loss_from_outputs(f, b.y, kappa)
    require_finite(f=f, loss=loss, grad_c=grad_c, grad_U=grad_U, grad_W=grad_W)
    return f, loss, grad_c, grad_U, grad_W


def forward(X, c, U, W, *, tau_att=1.0, mask_last_key=False, activation="tanh", backend="numba") -> np.ndarray:
    """Outputs f [n] = m^{-1/2} Σ_i c_i σ(U_i^T a_i(X_j)) (docs/shallow.md §1)."""
    return batch_forward(batch(X, tau_att=tau_att, mask_last_key=mask_last_key, activation=activation,
                               backend=backend), c, U, W)


def loss_and_grad(X, y, c, U, W, *, kappa=2.0, tau_att=1.0, mask_last_key=False, activation="tanh",
                  backend="numba"):
    """(f [n], loss, grad_c [m], grad_U [m, d], grad_W [m, d, d]) with loss = (κ/2n) Σ_j r_j² and the
    closed-form gradients of docs/shallow.md §2 (g_j = κ r_j / n, e_ji = g_j c_i σ'(s_ji)/√m):
      grad_c_i = m^{-1/2} Σ_j g_j σ(s_ji),  grad_U_i = Σ_j e_ji a_ji,
      grad_W_i = τ_att^{-1} Σ_j e_ji (M U)_ji q_j^T.
    Cost O(n m (d² + T d)); no d×d×T tensor."""
    b = batch(X, y, tau_att=tau_att, mask_last_key=mask_last_key, activation=activation, backend=backend)
    return batch_loss_and_grad(b, c, U, W, kappa=kappa)


def head_states(X, U, W, *, tau_att=1.0, mask_last_key=False, backend="numba"):
    """Per-head states (s [n, m], a [n, m, d], MU [n, m, d]): s = U_i^T a_i (pre-activation),
    a_i = Σ_t α_t x_t, MU = M_i U_i = Σ_t α_t x_t (x_t^T U_i − s_i). Everything the NTK features
    ∂f/∂θ_i and the teacher need (docs/shallow.md §2, §4)."""
    b = batch(X, tau_att=tau_att, mask_last_key=mask_last_key, backend=backend)
    inp = _inputs(b, U, W)
    if backend == "numpy":
        a, s, MU, _ = _states_np(inp)
        return s, a, MU
    n, m, d = b.X.shape[0], inp.U.shape[0], b.X.shape[2]
    s, a, MU = np.empty((n, m)), np.empty((n, d, m)), np.empty((n, d, m))
    kernels.head_states_kernel(b.X, *_heads_last(inp), 1.0 / b.tau_att, b.n_keys, s, a, MU)
    return s, np.ascontiguousarray(a.transpose(0, 2, 1)), np.ascontiguousarray(MU.transpose(0, 2, 1))


def _check_init(m, d, seed, paired: bool):
    m = as_scalar("m", m, kind="int", low=1)
    d = as_scalar("d", d, kind="int", low=1)
    seed = as_scalar("seed", seed, kind="int", low=0)
    if paired and m % 2:
        raise InputError(f"paired_init: m must be even (heads come in pairs), got m = {m}")
    return m, d, np.random.default_rng(seed)


def _draw(rng, k: int, d: int):
    """k heads: W [k, d, d] then U [k, d] i.i.d. N(0, 1), then c [k] = ±1 uniform (in this order)."""
    W = rng.standard_normal((k, d, d))
    U = rng.standard_normal((k, d))
    c = rng.choice(np.array([-1.0, 1.0]), size=k)
    return c, U, W


def paired_init(m, d, seed):
    """Paired initialisation (docs/shallow.md §1): heads i < m/2 drawn by :func:`_draw` from
    ``np.random.default_rng(seed)``; heads m/2.. copy W, U and flip c (stored as the second half),
    so f ≡ 0. Returns (c [m], U [m, d], W [m, d, d])."""
    m, d, rng = _check_init(m, d, seed, paired=True)
    c, U, W = _draw(rng, m // 2, d)
    return np.concatenate([c, -c]), np.concatenate([U, U]), np.concatenate([W, W])


def iid_init(m, d, seed):
    """Independent initialisation: all m heads drawn by :func:`_draw` (f ≠ 0 at init).
    Returns (c [m], U [m, d], W [m, d, d])."""
    m, d, rng = _check_init(m, d, seed, paired=False)
    return _draw(rng, m, d)
