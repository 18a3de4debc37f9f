"""Data of paper (2)'s experiments (docs/shallow.md §5): the scalar autoregressive forecasting task and the
token scaling (the teacher–student task, whose labels need the model, is :mod:`ntpref.shallow.teacher`).
Arrays follow the model's layout X [n, T, d] (row t is token x_t, the last row is the query), y [n].
Everything is drawn from ``np.random.default_rng(seed)`` in a fixed, documented order, so a (config, seed)
pair reproduces the data bitwise.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import as_scalar
from ..errors import InputError


def scale_tokens(X: np.ndarray) -> np.ndarray:
    """Each token x_t (last axis) scaled by min(1, 1/‖x_t‖), so ‖x_t‖ ≤ 1 (docs/shallow.md §1, §5)."""
    norms = np.sqrt(np.einsum("...k,...k->...", X, X))
    return X / np.maximum(norms, 1.0)[..., None]


def readonly(*arrays: np.ndarray) -> None:
    """Mark the arrays of a data set read-only (its users share them)."""
    for a in arrays:
        a.flags.writeable = False


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
    readonly(*parts)
    return Autoregressive(*parts, y_mean, y_std, config)
