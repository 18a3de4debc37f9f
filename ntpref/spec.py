"""The specification of one model: everything the oracle, the command line and the tools know about it.

Each model declares its :class:`ModelSpec` beside its code (``ntpref.twostage.spec``, ``ntpref.shallow.spec``);
the registry :mod:`ntpref.models` lists them, and every other part of ntpref loops over the registry and
names no model. A specification holds

* the file contract: its input arrays (:class:`Input`: name, shape, dtype, when required, the default of an
  absent optional one), its eval and train outputs, which train outputs are per-step logs (trajectories)
  and which are diagnostics an implementation need not return (also intermediates it may return to be
  compared, such as the shallow transformer's head states); ``not_bitwise``, the outputs not promised
  bit-identical across x86-64 CPUs (name → what makes their rounding depend on the CPU: BLAS, LAPACK,
  the QP solver); the entry points ``evaluate(arrays,
  backend)`` and ``train(arrays, backend, progress)``; ``numpy_cost(kind, arrays) -> (passes, seconds per
  pass)``, the NumPy backend's cost from an input's sizes, by which the ``auto`` backend chooses
  (:mod:`ntpref.backend`);
* training: the trained blocks and the input holding each one's step size;
* kinds of stored case beyond eval and train: ``extra_kinds``, kind → ``compute(inputs, backend)`` (the
  shallow transformer's "ntk": its NTK Gram matrix), and ``intermediates(kind, inputs, backend)``, the
  internal states stored beside a case's outputs to help locate a mismatch ({} when there are none);
* the tolerance policy's model knowledge (docs/tolerance.md): ``magnitudes(inputs, kind)`` gives
  name → (M, K) for every evaluated output (kind "eval" and every extra kind, intermediates included); ``train_tolerances(inputs, outputs, names, response)`` the float64 tolerances of a training
  run, where ``response(eps)`` (given by the policy) trains again from θ(0) + ε·ξ per block of ``eps`` and
  returns |rerun − outputs| per output; for the float32 envelope ``float32_scales(inputs, expected)``
  (M_q of the training outputs), ``update_directions(inputs, expected)`` (block → the magnitude of one
  update's direction) and ``roundings_behind(name, inputs, shape)`` (the updates before an output);
* its benchmark (:class:`Bench`): the papers' size, the sizes ``ntpref bench`` times beside it, random inputs
  and the loss-and-gradient step;
* its conformance cases: the random regimes, name → ``make(rng) -> (kind, inputs, description)``, and the
  stored reference cases' definitions (:class:`StoredCase`).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

#: What an input is to a run of one kind: needed, may be given, or not accepted.
REQUIRED, OPTIONAL, ABSENT = "required", "optional", ""


class Input(NamedTuple):
    """One input array of the file contract: ``name``, ``shape`` (text, "[n, T, d]"; "0-d" for a scalar),
    ``dtype`` ("float" | "int" | "str" | "bool"), ``eval`` and ``train``: :data:`REQUIRED`, :data:`OPTIONAL`
    or :data:`ABSENT` for an input of that kind, and ``default``: what an absent optional input means."""

    name: str
    shape: str
    dtype: str
    eval: str
    train: str
    default: str = ""


def names_of(inputs: tuple[Input, ...], kind: str, need: str) -> tuple[str, ...]:
    """The names of the ``inputs`` that a ``kind`` ("eval" | "train") run has as ``need`` (REQUIRED |
    OPTIONAL | ABSENT), in their order."""
    return tuple(i.name for i in inputs if getattr(i, kind) == need)


class StoredCase(NamedTuple):
    """The definition of one stored reference case: its ``name`` (its directory in reference_runs/),
    ``model``, ``kind`` ("eval" | "train" | "ntk"), ``description``, the generating ``config`` and ``seed``,
    and ``build(config, seed)`` → its input arrays (with ``model``)."""

    name: str
    model: str
    kind: str
    description: str
    config: dict
    seed: int
    build: Callable[[dict, int], dict]

    def inputs(self) -> dict:
        """The case's input arrays, built from its configuration and seed."""
        return self.build(self.config, self.seed)


class Bench(NamedTuple):
    """How ``ntpref bench`` times a model: ``size``, the papers' size (keyword arguments of ``inputs``);
    ``variants``, the other sizes timed beside it (changes of ``size``); ``label_keys``, the sizes a row's
    label shows; ``inputs(size, seed) -> dict`` random inputs of a size; ``step(inputs, backend)``, a
    zero-argument call of the model's public ``loss_and_grad`` on data prepared once, as a training loop
    calls it every step."""

    size: dict
    variants: tuple[dict, ...]
    label_keys: tuple[str, ...]
    inputs: Callable[..., dict]
    step: Callable[[dict, str], Callable[[], object]]


@dataclass(frozen=True)
class ModelSpec:
    """One model's specification (module docstring)."""

    name: str
    description: str
    inputs: tuple[Input, ...]
    eval_outputs: tuple[str, ...]
    train_outputs: tuple[str, ...]
    trajectories: tuple[str, ...]
    diagnostics: tuple[str, ...]
    not_bitwise: Mapping[str, str]
    blocks: Mapping[str, str]
    evaluate: Callable
    train: Callable
    numpy_cost: Callable
    timeline: Callable
    extra_kinds: Mapping[str, Callable]
    intermediates: Callable
    magnitudes: Callable
    train_tolerances: Callable
    float32_scales: Callable
    update_directions: Callable
    roundings_behind: Callable
    regimes: Mapping[str, Callable]
    stored: tuple[StoredCase, ...]
    bench: Bench

    def input_names(self, kind: str, need: str) -> tuple[str, ...]:
        """The inputs of a ``kind`` ("eval" | "train") run that are ``need`` (REQUIRED | OPTIONAL | ABSENT)."""
        return names_of(self.inputs, kind, need)

    @property
    def train_only(self) -> tuple[str, ...]:
        """The inputs only training reads; the rest of a train input is an eval input."""
        return self.input_names("eval", ABSENT)

    @property
    def magnitude_kinds(self) -> tuple[str, ...]:
        """The kinds ``magnitudes`` serves: "eval" and the extra kinds."""
        return ("eval", *self.extra_kinds)

    def outputs(self, kind: str) -> tuple[str, ...]:
        """The outputs of a ``kind`` ("eval" | "train") run."""
        return self.eval_outputs if kind == "eval" else self.train_outputs


def normal(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    """``scale`` · standard normal draws of ``shape``: the random regimes' parameters and data."""
    return scale * rng.standard_normal(shape)


def no_intermediates(kind: str, arrays, backend: str = "numba") -> dict:
    """The ``intermediates`` of a model whose stored cases keep none beside their outputs."""
    return {}
