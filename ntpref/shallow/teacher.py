"""The teacher–student task of paper (2)'s experiments (docs/shallow.md §5): tokens drawn and scaled into
the unit ball, labels from a kernel-machine teacher, y(X) = (1/K) Σ_k ⟨φ(X; θ_k), v(θ_k)⟩, the transformer's
NTK features φ along the transport map v of :mod:`ntpref.shallow.ntk` over K random heads (so this data
module sits above the NTK). Everything is drawn from ``np.random.default_rng(seed)`` in a fixed, documented
order, so a (config, seed) pair reproduces the data bitwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import as_scalar, check_backend
from ..errors import InputError
from .activation import activation_name
from .data import readonly, scale_tokens
from .ntk import ATTENTIONS, attention_weights, jvp, transport_map


@dataclass(frozen=True)
class TeacherStudentConfig:
    n: int
    d: int
    T: int
    R: int
    K: int
    nu: float
    n_train: int
    teacher_attention: str
    activation: str
    seed: int


@dataclass(frozen=True)
class TeacherStudent:
    """X_train [n_train, T, d], y_train [n_train], X_val [n − n_train, T, d], y_val; anchors [R, T, d]
    (= X[anchor_index] of the full sample before the split), alpha [R]; config. Arrays are read-only."""
    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    anchors: np.ndarray
    anchor_index: np.ndarray
    alpha: np.ndarray
    config: TeacherStudentConfig


def teacher_labels(X, anchors, alpha, U, W, nu=3.0, *, teacher_attention="full", activation="tanh",
                   backend="numba", block=256) -> np.ndarray:
    """Teacher outputs y [n] (docs/shallow.md §5) with the K draws (U [K, d], W [K, d, d]):

      y(X) = (1/K) Σ_k Σ_r α_r [ν_c φ_c(X)φ_c(X_r) + ν_u ⟨φ_u(X), φ_u(X_r)⟩ + ⟨φ_w(X), φ_w(X_r)⟩_F s_rk]
           = (1/K) Σ_k ⟨φ(X; θ_k), v(θ_k)⟩,

    φ_c = σ(s), φ_u = σ'(s) a, φ_w = σ'(s) M U q^T, v = :func:`ntpref.shallow.ntk.transport_map`;
    computed as :func:`ntpref.shallow.ntk.jvp` with c = 1 (c² = 1) divided by √K, in chunks of
    ``block`` draws. τ_att = 1, no masking. teacher_attention = "diagonal" computes the attention logits
    of X and of the anchors with diag(W_k) only (z_t = Σ_k x_{t,k} W_kk q_k, the authors' code)."""
    v_c, v_u, v_w = transport_map(U, W, anchors, alpha, nu, attention=teacher_attention, activation=activation,
                                  backend=backend)
    K = v_c.shape[0]
    out = jvp(X, np.ones(K), U, attention_weights(W, teacher_attention), v_c, v_u, v_w, activation=activation,
              backend=backend, block=block)
    return out / math.sqrt(K)


def teacher_student(n=5000, d=8, T=16, R=16, K=8192, nu=3.0, n_train=4000, teacher_attention="full",
                    activation="tanh", seed=0, *, backend="numba", block=256) -> TeacherStudent:
    """The teacher–student data set of docs/shallow.md §5.

    Draw order from ``np.random.default_rng(seed)``: tokens X [n, T, d] i.i.d. N(0, 1) (then each
    token scaled by min(1, 1/‖x_t‖)); anchor indices (R of range(n), without replacement, from the whole
    sample as in the authors' code); g [R] ~ N(0, I) (α = g/Σ|g|); U [K, d]; W [K, d, d] (i.i.d. N(0, 1)).
    Labels by :func:`teacher_labels`. The first n_train samples are the training set, the rest
    validation. teacher_attention: "full" (default, the theory's) | "diagonal" (the authors' labels)."""
    n = as_scalar("n", n, kind="int", low=2)
    d = as_scalar("d", d, kind="int", low=1)
    T = as_scalar("T", T, kind="int", low=1)
    R = as_scalar("R", R, kind="int", low=1, high=n)
    K = as_scalar("K", K, kind="int", low=1)
    nu = as_scalar("nu", nu, low=0.0)
    n_train = as_scalar("n_train", n_train, kind="int", low=1, high=n - 1)
    seed = as_scalar("seed", seed, kind="int", low=0)
    if teacher_attention not in ATTENTIONS:
        raise InputError(f"teacher_attention must be one of {', '.join(ATTENTIONS)}, got {teacher_attention!r}")
    activation = activation_name(activation)
    check_backend(backend)
    config = TeacherStudentConfig(n, d, T, R, K, nu, n_train, teacher_attention, activation, seed)

    rng = np.random.default_rng(seed)
    X = scale_tokens(rng.standard_normal((n, T, d)))
    anchor_index = rng.choice(n, size=R, replace=False)
    g = rng.standard_normal(R)
    alpha = g / np.abs(g).sum()
    U = rng.standard_normal((K, d))
    W = rng.standard_normal((K, d, d))
    anchors = X[anchor_index]
    y = teacher_labels(X, anchors, alpha, U, W, nu, teacher_attention=teacher_attention, activation=activation,
                       backend=backend, block=block)
    parts = (X[:n_train], y[:n_train], X[n_train:], y[n_train:], anchors, anchor_index, alpha)
    parts = tuple(np.ascontiguousarray(p) for p in parts)
    readonly(*parts)
    return TeacherStudent(*parts, config)
