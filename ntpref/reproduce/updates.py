"""Update rules of the training comparisons (the ``joint`` and ``optimizers`` targets): plain gradient
descent, normalized GD on the joint parameter and per block, Adam and AdamW.

The parameter is a tuple of blocks W_b (here W_ov and/or W_kq, each [d, d]) with gradients G_b; t = 1, 2, …
counts the updates made so far, the current one included. ‖·‖ is the Frobenius norm.

  gd         W_b ← W_b − lr G_b
  ngd        W_b ← W_b − lr G_b / ‖G‖,  ‖G‖ = (Σ_b ‖G_b‖²)^½: one step of length lr along the joint gradient
             (with one block it is the normalized GD of Algorithm 1); G = 0: no update
  ngd-block  W_b ← W_b − lr G_b / ‖G_b‖: every block a step of length lr along its own gradient; a block
             with G_b = 0 stays where it is
  adam       m_b ← β1 m_b + (1 − β1) G_b,  v_b ← β2 v_b + (1 − β2) G_b ⊙ G_b,  m_b = v_b = 0 before t = 1,
             m̂_b = m_b / (1 − β1^t),  v̂_b = v_b / (1 − β2^t),  W_b ← W_b − lr m̂_b / (√v̂_b + ε)
             (element-wise; Kingma and Ba's Adam with its bias correction)
  adamw      Adam with decoupled weight decay λ:  W_b ← (1 − lr λ) W_b − lr m̂_b / (√v̂_b + ε)
             (Loshchilov and Hutter's AdamW, as torch.optim.AdamW applies it)

Adam's first step is −lr G/(|G| + ε) element-wise: −lr sign(G) up to the relative ε/|G| (0 where G = 0).
Every operation is element-wise or a sum of squares in a fixed order, so an update is bitwise the same for
any thread count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import InputError

RULES = ("gd", "ngd", "ngd-block", "adam", "adamw")


@dataclass(frozen=True)
class Rule:
    """An update rule of this module's docstring: ``name`` in :data:`RULES`, step size ``lr`` > 0; Adam's
    β1, β2 in [0, 1), ε > 0 and AdamW's decoupled weight decay λ ≥ 0 (``weight_decay``, used by "adamw"
    only)."""

    name: str
    lr: float
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self):
        if self.name not in RULES:
            raise InputError(f"update rule must be one of {', '.join(RULES)}, got {self.name!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise InputError(f"update rule {self.name}: lr must be finite and > 0, got {self.lr!r}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1 and self.eps > 0 and self.weight_decay >= 0):
            raise InputError(f"update rule {self.name}: need 0 <= beta1, beta2 < 1, eps > 0, weight_decay >= 0")

    def describe(self) -> str:
        """The rule and its hyper-parameters as the summaries print them."""
        if self.name in ("gd", "ngd", "ngd-block"):
            return f"{self.name} (lr = {self.lr:.6g})"
        text = f"{self.name} (lr = {self.lr:.6g}, beta1 = {self.beta1:g}, beta2 = {self.beta2:g}, eps = {self.eps:g}"
        return text + (f", weight decay = {self.weight_decay:g})" if self.name == "adamw" else ")")


def frobenius(G: np.ndarray) -> float:
    """‖G‖_F formed from G / max|G| (no overflow or underflow of the squares), 0 for G = 0."""
    amax = float(np.max(np.abs(G)))
    if amax == 0.0:
        return 0.0
    return amax * math.sqrt(float(np.sum(np.square(G / amax))))


class Updater:
    """Applies a :class:`Rule` to a parameter of ``blocks`` blocks, update after update (it holds t and
    Adam's moments m_b, v_b)."""

    def __init__(self, rule: Rule, blocks: int):
        self.rule = rule
        self.t = 0
        self.m = [None] * blocks
        self.v = [None] * blocks

    def step(self, params: tuple, grads: tuple) -> tuple:
        """The blocks after one update (new arrays; ``params`` and ``grads`` are not modified)."""
        if len(params) != len(grads) or len(params) != len(self.m):
            raise InputError(f"update: {len(self.m)} blocks expected, got {len(params)} parameters and "
                             f"{len(grads)} gradients")
        self.t += 1
        r = self.rule
        if r.name == "gd":
            return tuple(W - r.lr * G for W, G in zip(params, grads))
        if r.name == "ngd":
            norm = math.sqrt(math.fsum(frobenius(G) ** 2 for G in grads))
            return tuple(params) if norm == 0.0 else tuple(W - r.lr * (G / norm) for W, G in zip(params, grads))
        if r.name == "ngd-block":
            norms = [frobenius(G) for G in grads]
            return tuple(W if n == 0.0 else W - r.lr * (G / n) for W, G, n in zip(params, grads, norms))
        return tuple(self._adam(b, W, G) for b, (W, G) in enumerate(zip(params, grads)))

    def _adam(self, b: int, W: np.ndarray, G: np.ndarray) -> np.ndarray:
        r = self.rule
        if self.m[b] is None:
            self.m[b], self.v[b] = np.zeros_like(G), np.zeros_like(G)
        self.m[b] = r.beta1 * self.m[b] + (1.0 - r.beta1) * G
        self.v[b] = r.beta2 * self.v[b] + (1.0 - r.beta2) * (G * G)
        m_hat = self.m[b] / (1.0 - r.beta1 ** self.t)
        v_hat = self.v[b] / (1.0 - r.beta2 ** self.t)
        step = m_hat / (np.sqrt(v_hat) + r.eps)
        if r.name == "adamw":
            return (1.0 - r.lr * r.weight_decay) * W - r.lr * step
        return W - r.lr * step
