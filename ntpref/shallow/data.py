"""Data of paper (2)'s experiments (docs/shallow.md §5): the teacher–student task and the scalar
autoregressive forecasting task. Arrays follow the model's layout X [n, T, d] (row t is token x_t,
the last row is the query), y [n]. Everything is drawn from ``np.random.default_rng(seed)`` in a fixed,
documented order, so a (config, seed) pair reproduces the data bitwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import as_scalar, check_backend
from ..errors import InputError
from .activation import activation_code
from .ntk import ATTENTIONS, attention_weights, jvp, transport_map


def scale_tokens(X: np.ndarray) -> np.ndarray:
    """Each token x_t (last axis) scaled by min(1, 1/‖x_t‖), so ‖x_t‖ ≤ 1 (docs/shallow.md §1, §5)."""
    norms = np.sqrt(np.einsum("...k,...k->...", X, X))
    return X / np.maximum(norms, 1.0)[..., None]


def _readonly(*arrays):
    for a in arrays:
        a.flags.writeable = False


# ----------------------------------------------------------------------------------------------------
# Teacher–student


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
    activation_code(activation)
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
    _readonly(*parts)
    return TeacherStudent(*parts, config)


# ----------------------------------------------------------------------------------------------------
# Autoregressive forecasting

N_FREQ = 8
BASE_PERIOD = 32.0


def positional_channels(T: int) -> np.ndarray:
    """P [T, 16]: P[t] = (sin(ω_0 t), .., sin(ω_7 t), cos(ω_0 t), .., cos(ω_7 t)), ω_k = 2π/(32·2^k),
    at the window position t = 0, 1, .., T − 1 (t = 0 the oldest token, t = T − 1 the query)."""
    t = np.arange(T, dtype=np.float64)[:, None]
    omega = 2.0 * math.pi / (BASE_PERIOD * 2.0 ** np.arange(N_FREQ))
    return np.concatenate([np.sin(t * omega), np.cos(t * omega)], axis=1)


@dataclass(frozen=True)
class AutoregressiveConfig:
    lag: int
    n: int
    n_train: int
    burn_in: int
    coef: float
    noise_var: float
    normalize_tokens: bool
    seed: int

    @property
    def T(self) -> int:
        return self.lag + 1

    @property
    def d(self) -> int:
        return 1 + 2 * N_FREQ


@dataclass(frozen=True)
class Autoregressive:
    """Windows of the series (docs/shallow.md §5). Window w (w = 0..n−1) starts at time s_w = burn_in + w:
    token t (t = 0..T−1, T = lag + 1) is (x_{s_w + t}, P[t]) with P = :func:`positional_channels`,
    and its raw target is x_{s_w + T} = coef · x_{s_w + 1} + innovations[s_w + T] (token 1 is lag L
    before the target). y = (raw target − y_mean)/y_std with the training windows' mean and population
    standard deviation.

    X_train [n_train, T, 17], y_train, X_val [n − n_train, T, 17], y_val; train_index, val_index: the
    window numbers w of each split (increasing); series [burn_in + n + T] = x_0.., innovations (same
    length: x_t = innovations[t] for t < lag, x_t = coef · x_{t−lag} + innovations[t] after);
    y_mean, y_std; config. Arrays are read-only."""
    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    train_index: np.ndarray
    val_index: np.ndarray
    series: np.ndarray
    innovations: np.ndarray
    y_mean: float
    y_std: float
    config: AutoregressiveConfig


def ar_series(innovations: np.ndarray, lag: int, coef: float) -> np.ndarray:
    """x_t = innovations[t] for t < lag, x_t = coef · x_{t−lag} + innovations[t] afterwards
    (computed lag values at a time; each value is the same two-operation expression)."""
    x = innovations.copy()
    for t0 in range(lag, x.shape[0], lag):
        t1 = min(x.shape[0], t0 + lag)
        x[t0:t1] = coef * x[t0 - lag:t1 - lag] + innovations[t0:t1]
    return x


def autoregressive(lag, n=5000, n_train=4000, burn_in=800, coef=0.9, noise_var=0.1, normalize_tokens=False,
                   seed=0) -> Autoregressive:
    """The autoregressive forecasting task of docs/shallow.md §5: one series x_t = coef · x_{t−L} + ε_t with
    ε_t ~ N(0, noise_var) (noise_var is the variance: 0.1, i.e. standard deviation √0.1 as in the
    authors' code), x_0..x_{L−1} ~ N(0, 1); windows of T = L + 1 values (token features d = 17: the
    value and 16 positional channels) predict the next value; see :class:`Autoregressive`.

    normalize_tokens: scale each token by min(1, 1/‖x_t‖) (the model's assumption ‖x_t‖ ≤ 1, docs/shallow.md §1).
    Off by default: the authors' experiment does not scale (token norms are about 3, the 16 positional
    channels alone have norm √8).
    Draw order from ``np.random.default_rng(seed)``: the L initial values, then the burn_in + n + T − L
    innovations ε (standard normals times √noise_var), then a permutation of the n windows whose first
    n_train entries (sorted) are the training windows — a random split like the authors' (theirs is
    80/20 by a random permutation)."""
    lag = as_scalar("lag", lag, kind="int", low=1)
    n = as_scalar("n", n, kind="int", low=2)
    n_train = as_scalar("n_train", n_train, kind="int", low=1, high=n - 1)
    burn_in = as_scalar("burn_in", burn_in, kind="int", low=0)
    coef = as_scalar("coef", coef)
    noise_var = as_scalar("noise_var", noise_var, low=0.0)
    normalize_tokens = as_scalar("normalize_tokens", normalize_tokens, kind="bool")
    seed = as_scalar("seed", seed, kind="int", low=0)
    config = AutoregressiveConfig(lag, n, n_train, burn_in, coef, noise_var, normalize_tokens, seed)
    T, d = config.T, config.d

    rng = np.random.default_rng(seed)
    length = burn_in + n + T
    innovations = np.empty(length)
    innovations[:lag] = rng.standard_normal(lag)
    innovations[lag:] = math.sqrt(noise_var) * rng.standard_normal(length - lag)
    series = ar_series(innovations, lag, coef)
    perm = rng.permutation(n)
    train_index, val_index = np.sort(perm[:n_train]), np.sort(perm[n_train:])

    starts = burn_in + np.arange(n)
    X = np.empty((n, T, d))
    X[:, :, 0] = series[starts[:, None] + np.arange(T)]
    X[:, :, 1:] = positional_channels(T)
    if normalize_tokens:
        X = scale_tokens(X)
    target = series[starts + T]
    y_mean = float(target[train_index].mean())
    y_std = float(target[train_index].std())
    if y_std == 0.0:
        raise InputError("autoregressive: the training targets are constant (noise_var = 0?), cannot standardise")
    y = (target - y_mean) / y_std
    parts = (X[train_index], y[train_index], X[val_index], y[val_index], train_index, val_index, series,
             innovations)
    parts = tuple(np.ascontiguousarray(p) for p in parts)
    _readonly(*parts)
    return Autoregressive(*parts, y_mean, y_std, config)
