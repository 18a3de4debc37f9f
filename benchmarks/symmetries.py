"""Correct float64 implementations with other summation orders, for the mutation benchmark: one of the
oracle's backends (``ntpref.oracle.contract.evaluate / train(inputs, backend=...)``) run on an input moved
by exact symmetries of the model, its outputs moved back.

  samples   twostage: the sentences permuted (tokens, lengths, targets together); logits and attn rows
            moved back. shallow, indrnn: the samples permuted (X, y) and the validation samples
            (X_val, y_val); f moved back. A ProjSGD run (``batch``) draws sample indices, so there only
            the validation samples are permuted.
  heads     shallow: the heads permuted with their parameters (rows of c, U, W); indrnn: the units (rows
            of c, u, W_in); the gradients and trained parameters moved back.
  keys      shallow: the non-query keys x_1..x_{T-1} of every sample (X and X_val) permuted, each sample by
            its own permutation; twostage: the non-query positions 0..L-2 of every sentence; attn moved back.
            (The IndRNN is a recurrence: no such symmetry.)
  features  the coordinates of the inputs permuted by P, the parameters with them: shallow X → PX,
            U_i → P U_i, W_i → P W_i Pᵀ (head_a, head_MU, grad_U, grad_W, U, W moved back); indrnn X → PX,
            W_in → W_in Pᵀ; twostage E → PE (E = I_K where the input has none: the embeddings given
            explicitly as the permutation), W_ov → P W_ov Pᵀ, W_kq → P W_kq Pᵀ (every d × d output moved
            back).

Each permutation leaves the mathematical outputs unchanged (up to the moves back) and changes the order
of the sums the oracle forms, and, at the paired initialisation, the pairing of heads whose contributions
cancel exactly. :func:`adapter` draws the permutations from ``np.random.default_rng(seed)`` afresh for
every call, or takes every one reversed (``reverse``): the Numba backend sums left to right in index order
(ntpref/shallow/summation.py), so on the input with every symmetry reversed it forms those sums right to
left, save the two-stage softmax over the vocabulary and the IndRNN's recurrence over time.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from ntpref.models import SPECS
from ntpref.oracle import contract

Undo = Callable[[dict], dict]


#: draw(n): a permutation of range(n).
Draw = Callable[[int], np.ndarray]


class Symmetry(NamedTuple):
    """``name``, the ``models`` it applies to, and ``apply(model, inputs, draw) -> (moved inputs, undo)``
    with ``undo(outputs)`` the outputs of the moved input moved back; ``draw`` gives the permutations."""

    name: str
    models: tuple[str, ...]
    apply: Callable[[str, dict, Draw], tuple[dict, Undo]]


def _unchanged(out: dict) -> dict:
    """The outputs of a symmetry that moves no output."""
    return out


def _axes_back(names: dict[str, tuple[int, ...]], order: np.ndarray) -> Undo:
    """Undo the permutation ``order`` (moved[i] = original[order[i]]) along the given axes of the outputs
    ``names`` (name → axes)."""
    def undo(out: dict) -> dict:
        back = dict(out)
        for name, axes in names.items():
            if name in out:
                value = np.asarray(out[name])
                for axis in axes:
                    moved, value = value, np.empty_like(value)
                    index = [slice(None)] * value.ndim
                    index[axis] = order
                    value[tuple(index)] = moved
                back[name] = value
        return back
    return undo


def _rows_back(names: Sequence[str], order: np.ndarray) -> Undo:
    """Undo a row permutation ``order`` of the outputs ``names``."""
    return _axes_back({name: (0,) for name in names}, order)


def _permute_samples(model: str, inputs: dict, draw: Draw) -> tuple[dict, Undo]:
    """The ``samples`` symmetry (module docstring)."""
    moved = dict(inputs)
    if model == "twostage":
        order = draw(len(inputs["lengths"]))
        moved.update({k: np.asarray(inputs[k])[order] for k in ("tokens", "lengths", "targets")})
        return moved, _rows_back(("logits", "attn"), order)
    if "X_val" in inputs:
        val = draw(len(inputs["y_val"]))
        moved.update(X_val=np.asarray(inputs["X_val"])[val], y_val=np.asarray(inputs["y_val"])[val])
    if "batch" in inputs:
        return moved, _unchanged
    order = draw(len(inputs["X"]))
    moved.update(X=np.asarray(inputs["X"])[order], y=np.asarray(inputs["y"])[order])
    return moved, _rows_back(("f",), order)


def _permute_heads(model: str, inputs: dict, draw: Draw) -> tuple[dict, Undo]:
    """The ``heads`` symmetry (module docstring)."""
    blocks = tuple(SPECS[model].blocks)
    order = draw(len(inputs[blocks[0]]))
    moved = {**inputs, **{b: np.asarray(inputs[b])[order] for b in blocks}}
    return moved, _rows_back(blocks + tuple(f"grad_{b}" for b in blocks), order)


def _shuffle_keys(X: np.ndarray, draw: Draw) -> np.ndarray:
    """X [n, T, d] with positions 0..T-2 of every sample permuted (each by its own permutation)."""
    X = np.array(X)
    n, keys = X.shape[0], X.shape[1] - 1
    order = np.array([draw(keys) for _ in range(n)], dtype=np.intp).reshape(n, keys)
    X[:, :-1] = np.take_along_axis(X[:, :-1], order[:, :, None], axis=1)
    return X


def _permute_keys(model: str, inputs: dict, draw: Draw) -> tuple[dict, Undo]:
    """The ``keys`` symmetry (module docstring)."""
    if model == "shallow":
        return {**inputs, **{k: _shuffle_keys(inputs[k], draw) for k in ("X", "X_val") if k in inputs}}, _unchanged
    tokens, lengths = np.array(inputs["tokens"]), np.asarray(inputs["lengths"])
    orders = [draw(int(L) - 1) for L in lengths]
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


#: The outputs a features permutation moves, and their feature axes.
FEATURE_OUTPUTS = {
    "shallow": {"U": (1,), "W": (1, 2), "grad_U": (1,), "grad_W": (1, 2), "head_a": (2,), "head_MU": (2,)},
    "indrnn": {"W_in": (1,), "grad_W_in": (1,)},
    "twostage": {name: (0, 1) for name in ("W_ov", "W_kq", "grad_W_ov", "grad_W_kq", "grad0_W_ov", "W_ov_star",
                                           "W_kq_star")}}


def _permute_features(model: str, inputs: dict, draw: Draw) -> tuple[dict, Undo]:
    """The ``features`` symmetry (module docstring)."""
    moved = dict(inputs)
    if model == "twostage":
        E = np.asarray(inputs["E"]) if "E" in inputs else np.eye(int(inputs["K"]))
        order = draw(E.shape[0])
        moved.pop("K", None)
        moved.update(E=E[order], **{k: np.asarray(inputs[k])[order][:, order] for k in ("W_ov", "W_kq")})
    else:
        order = draw(np.asarray(inputs["X"]).shape[-1])
        moved.update({k: np.asarray(inputs[k])[..., order] for k in ("X", "X_val") if k in inputs})
        if model == "shallow":
            moved.update(U=np.asarray(inputs["U"])[:, order], W=np.asarray(inputs["W"])[:, order][:, :, order])
        else:
            moved.update(W_in=np.asarray(inputs["W_in"])[:, order])
    return moved, _axes_back(FEATURE_OUTPUTS[model], order)


SAMPLES = Symmetry("samples", ("twostage", "shallow", "indrnn"), _permute_samples)
HEADS = Symmetry("heads", ("shallow", "indrnn"), _permute_heads)
KEYS = Symmetry("keys", ("twostage", "shallow"), _permute_keys)
FEATURES = Symmetry("features", ("twostage", "shallow", "indrnn"), _permute_features)
SYMMETRIES = (SAMPLES, HEADS, KEYS, FEATURES)


def applicable(symmetries: Sequence[Symmetry], where_applicable: bool = False) -> tuple[str, ...]:
    """The models every one of ``symmetries`` applies to (``where_applicable``: any one), in registry order."""
    test = any if where_applicable else all
    return tuple(m for m in SPECS if test(m in s.models for s in symmetries))


def reversal(n: int) -> np.ndarray:
    """The permutation n-1, ..., 0."""
    return np.arange(n)[::-1]


def adapter(symmetries: Sequence[Symmetry], seed: int = 0, backend: str = "numpy", reverse: bool = False,
            where_applicable: bool = False) -> dict:
    """evaluate / train: the oracle's ``backend`` on the input moved by ``symmetries`` (in turn; random
    permutations of ``seed``, or with ``reverse`` every one reversed), the outputs moved back (in reverse).
    A model one of them does not apply to: NotImplementedError, or with ``where_applicable`` the others."""
    models = applicable(symmetries, where_applicable)

    def run(compute):
        def call(model: str, inputs: dict) -> dict:
            if model not in models:
                raise NotImplementedError(f"{' + '.join(s.name for s in symmetries)}: no such symmetry of {model}")
            draw, undos = reversal if reverse else np.random.default_rng(seed).permutation, []
            for symmetry in symmetries:
                if model in symmetry.models:
                    inputs, undo = symmetry.apply(model, inputs, draw)
                    undos.append(undo)
            out = compute({"model": model, **inputs}, backend=backend)
            for undo in reversed(undos):
                out = undo(out)
            return out
        return call
    return {"evaluate": run(contract.evaluate), "train": run(contract.train)}
