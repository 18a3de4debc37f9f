"""Broken implementations: the PyTorch restatement of the shipped adapters (examples/adapters/
torch_restatement.py), in float64 or float32, with one textbook formula that is exact in real arithmetic but
not stabilised in floating point:

    softmax        every attention softmax as exp(s) / Σ exp(s), without subtracting the largest score
                   (the two-stage φ and the shallow transformer's α; the IndRNN has none): overflows to
                   inf / inf = NaN once a score exceeds log(max float), 709.78 in float64, 88.72 in float32
    cross-entropy  the two-stage loss (Eq. 1, L0 and the logged stage losses) as −log(exp(z_y) / Σ_v exp(z_v)),
                   not log(1 + Σ_{v≠y} e^{z_v − z_y}): NaN or inf once a logit passes the same threshold, and
                   0 where p_y rounds to 1

The restatement is not edited: the formula is switched in only while the adapter runs, by a patch of the
restatement module (its ``torch`` for the softmax, its ``cross_entropy`` for the loss).

    naive_adapter("softmax", torch.float32)   # {"evaluate": ..., "train": ...}
"""
from __future__ import annotations

import types
from unittest import mock

import torch

from examples.adapters import torch_restatement as tr


def naive_softmax(s: torch.Tensor, dim: int) -> torch.Tensor:
    """exp(s) / Σ exp(s) along ``dim``, the largest score not subtracted."""
    e = torch.exp(s)
    return e / e.sum(dim=dim, keepdim=True)


def naive_cross_entropy(z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per row −log(exp(z_y) / Σ_v exp(z_v)), z [B, K], y [B] → [B]."""
    e = torch.exp(z)
    return -torch.log(e.gather(1, y[:, None])[:, 0] / e.sum(dim=1))


class _NaiveTorch(types.ModuleType):
    """The torch module with :func:`naive_softmax` as ``torch.softmax``."""

    softmax = staticmethod(naive_softmax)

    def __getattr__(self, name):
        return getattr(torch, name)


#: formula → the patch that switches it into the restatement.
PATCHES = {"softmax": lambda: mock.patch.object(tr, "torch", _NaiveTorch("torch")),
           "cross-entropy": lambda: mock.patch.object(tr, "cross_entropy", naive_cross_entropy)}


def naive_adapter(formula: str, dtype: torch.dtype) -> dict:
    """The adapter (``evaluate``, ``train``) of the restatement in ``dtype`` with ``formula`` (a key of
    :data:`PATCHES`) naive."""
    models = tr.TorchModels(dtype)

    def run(method):
        def call(model, inputs):
            with PATCHES[formula]():
                return method(model, inputs)
        return call
    return {"evaluate": run(models.evaluate), "train": run(models.train)}
