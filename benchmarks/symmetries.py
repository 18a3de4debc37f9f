"""Correct float64 implementations with other summation orders, for the mutation benchmark: the oracle's
NumPy backend (``ntpref.oracle.contract.evaluate / train(inputs, backend="numpy")``) run on an input moved
by an exact symmetry of the model, its outputs moved back.

  samples  twostage: the sentences permuted (tokens, lengths, targets together); logits and attn rows
           moved back. shallow, indrnn: the samples permuted (X, y) and the validation samples
           (X_val, y_val); f moved back. A ProjSGD run (``batch``) draws sample indices, so there only
           the validation samples are permuted.
  heads    shallow: the heads permuted with their parameters (rows of c, U, W); indrnn: the units (rows
           of c, u, W_in); the gradients and trained parameters moved back.
  keys     shallow: the non-query keys x_1..x_{T-1} of every sample (X and X_val) permuted, each sample by
           its own permutation; twostage: the non-query positions 0..L-2 of every sentence; attn moved back.
           (The IndRNN is a recurrence: no such symmetry.)

Each permutation leaves the mathematical outputs unchanged (up to the moves back) and changes the order
of the sums the oracle forms, and, at the paired initialisation, the pairing of heads whose contributions
cancel exactly. Permutations are drawn from ``np.random.default_rng(seed)`` afresh for every call.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from ntpref.models import SPECS
from ntpref.oracle import contract

Undo = Callable[[dict], dict]


class Symmetry(NamedTuple):
    """``name``, the ``models`` it applies to, and ``apply(model, inputs, rng) -> (moved inputs, undo)``
    with ``undo(outputs)`` the outputs of the moved input moved back."""

    name: str
    models: tuple[str, ...]
    apply: Callable[[str, dict, np.random.Generator], tuple[dict, Undo]]


def _unchanged(out: dict) -> dict:
    """The outputs of a symmetry that moves no output."""
    return out


def _rows_back(names: Sequence[str], order: np.ndarray) -> Undo:
    """Undo a row permutation ``order`` (moved[i] = original[order[i]]) of the outputs ``names``."""
    def undo(out: dict) -> dict:
        back = dict(out)
        for name in names:
            if name in out:
                back[name] = np.empty_like(out[name])
                back[name][order] = out[name]
        return back
    return undo


def _permute_samples(model: str, inputs: dict, rng: np.random.Generator) -> tuple[dict, Undo]:
    """The ``samples`` symmetry (module docstring)."""
    moved = dict(inputs)
    if model == "twostage":
        order = rng.permutation(len(inputs["lengths"]))
        moved.update({k: np.asarray(inputs[k])[order] for k in ("tokens", "lengths", "targets")})
        return moved, _rows_back(("logits", "attn"), order)
    if "X_val" in inputs:
        val = rng.permutation(len(inputs["y_val"]))
        moved.update(X_val=np.asarray(inputs["X_val"])[val], y_val=np.asarray(inputs["y_val"])[val])
    if "batch" in inputs:
        return moved, _unchanged
    order = rng.permutation(len(inputs["X"]))
    moved.update(X=np.asarray(inputs["X"])[order], y=np.asarray(inputs["y"])[order])
    return moved, _rows_back(("f",), order)


def _permute_heads(model: str, inputs: dict, rng: np.random.Generator) -> tuple[dict, Undo]:
    """The ``heads`` symmetry (module docstring)."""
    blocks = tuple(SPECS[model].blocks)
    order = rng.permutation(len(inputs[blocks[0]]))
    moved = {**inputs, **{b: np.asarray(inputs[b])[order] for b in blocks}}
    return moved, _rows_back(blocks + tuple(f"grad_{b}" for b in blocks), order)


def _shuffle_keys(X: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """X [n, T, d] with positions 0..T-2 of every sample permuted (each by its own permutation)."""
    X = np.array(X)
    order = np.argsort(rng.random((X.shape[0], X.shape[1] - 1)), axis=1)
    X[:, :-1] = np.take_along_axis(X[:, :-1], order[:, :, None], axis=1)
    return X


def _permute_keys(model: str, inputs: dict, rng: np.random.Generator) -> tuple[dict, Undo]:
    """The ``keys`` symmetry (module docstring)."""
    if model == "shallow":
        return {**inputs, **{k: _shuffle_keys(inputs[k], rng) for k in ("X", "X_val") if k in inputs}}, _unchanged
    tokens, lengths = np.array(inputs["tokens"]), np.asarray(inputs["lengths"])
    orders = [rng.permutation(int(L) - 1) for L in lengths]
    for j, order in enumerate(orders):
        tokens[j, :len(order)] = tokens[j, order]

    def undo(out: dict) -> dict:
        if "attn" not in out:
            return out
        attn = np.array(out["attn"])
        for j, order in enumerate(orders):
            attn[j, order] = out["attn"][j, :len(order)]
        return {**out, "attn": attn}
    return {**inputs, "tokens": tokens}, undo


SAMPLES = Symmetry("samples", ("twostage", "shallow", "indrnn"), _permute_samples)
HEADS = Symmetry("heads", ("shallow", "indrnn"), _permute_heads)
KEYS = Symmetry("keys", ("twostage", "shallow"), _permute_keys)
SYMMETRIES = (SAMPLES, HEADS, KEYS)


def applicable(symmetries: Sequence[Symmetry]) -> tuple[str, ...]:
    """The models every one of ``symmetries`` applies to, in registry order."""
    return tuple(m for m in SPECS if all(m in s.models for s in symmetries))


def adapter(symmetries: Sequence[Symmetry], seed: int = 0) -> dict:
    """evaluate / train: the oracle's NumPy backend on the input moved by ``symmetries`` (in turn), the
    outputs moved back (in reverse); NotImplementedError for a model one of them does not apply to."""
    models = applicable(symmetries)

    def run(compute):
        def call(model: str, inputs: dict) -> dict:
            if model not in models:
                raise NotImplementedError(f"{' + '.join(s.name for s in symmetries)}: no such symmetry of {model}")
            rng, undos = np.random.default_rng(seed), []
            for symmetry in symmetries:
                inputs, undo = symmetry.apply(model, inputs, rng)
                undos.append(undo)
            out = compute({"model": model, **inputs}, backend="numpy")
            for undo in reversed(undos):
                out = undo(out)
            return out
        return call
    return {"evaluate": run(contract.evaluate), "train": run(contract.train)}
