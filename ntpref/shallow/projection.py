"""Per-head projection onto Ω_ρ (docs/shallow.md §3), generic over parameter blocks.

A model's parameters are blocks B [m, ...] whose first axis is the head (transformer: c [m], U [m, d],
W [m, d, d]; IndRNN: c [m], u [m], W_in [m, d]). Each block b has a radius ρ_b; head i must stay in
the ball ‖B_i − B0_i‖ ≤ ρ_b / √m around the stored initial value B0 (Frobenius norm over the head's
entries, |·| for scalars). The projection is exact and separable over heads and blocks:
  B_i ← B0_i + Δ_i · min(1, r / ‖Δ_i‖),   Δ_i = B_i − B0_i,   r = ρ_b / √m.
Heads already inside their ball are returned bit for bit unchanged. Radius None (or +inf) means no
projection for that block.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import InputError


def head_radii(rho: Sequence[float | None] | None, m: int, n_blocks: int) -> tuple[float | None, ...]:
    """Per-head radii r_b = ρ_b / √m (None where ρ_b is None or +inf; all None when ``rho`` is None)."""
    if rho is None:
        return (None,) * n_blocks
    rho = list(rho)
    if len(rho) != n_blocks:
        raise InputError(f"array 'rho': expected {n_blocks} radii (one per parameter block), got {len(rho)}")
    radii = []
    for r in rho:
        if r is None or r == math.inf:
            radii.append(None)
        elif not (r >= 0.0):  # also rejects NaN
            raise InputError(f"array 'rho': radii must be >= 0 (or inf / None for no projection), got {r}")
        else:
            radii.append(float(r) / math.sqrt(m))
    return tuple(radii)


def project_block(B: np.ndarray, B0: np.ndarray, radius: float | None) -> np.ndarray:
    """B [m, ...] projected head by head onto the balls of ``radius`` around B0 (a new array)."""
    if radius is None:
        return B.copy()
    delta = (B - B0).reshape(B.shape[0], -1)
    norm = np.sqrt(np.sum(delta * delta, axis=1))
    outside = norm > radius
    scale = np.divide(radius, norm, out=np.ones_like(norm), where=outside)
    moved = B0 + (delta * scale[:, None]).reshape(B.shape)
    return np.where(outside.reshape((-1,) + (1,) * (B.ndim - 1)), moved, B)


def project(params: Sequence[np.ndarray], centre: Sequence[np.ndarray],
            radii: Sequence[float | None]) -> tuple[np.ndarray, ...]:
    """Π_Ω of every block: ``params``, ``centre`` and ``radii`` are aligned sequences of blocks."""
    return tuple(project_block(B, B0, r) for B, B0, r in zip(params, centre, radii, strict=True))
