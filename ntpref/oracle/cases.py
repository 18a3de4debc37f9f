"""The cases of ``ntpref conformance`` (docs/conformance.md): stored reference cases and fresh random ones.

A :class:`Case` is one ``ntpref eval`` or ``ntpref train`` input of one model. Its expected outputs
are the stored ``expected.npz`` (stored cases, checked against the manifest's hashes) or the
oracle's outputs computed on the spot (random cases); its tolerances are those of the float64
policy (:func:`ntpref.oracle.tolerance.default_tolerances`) or of the float32 envelope
(:func:`ntpref.oracle.envelope.float32_tolerances`). Everything is computed on first use and kept.

The float64 tolerances of a stored case are those recorded in its manifest (the same policy).
Random cases are small (a few sentences or samples, at most 40 steps) and drawn from
``np.random.default_rng([seed, model index, j])`` (the model's index in the registry,
:mod:`ntpref.models`), so case ``j`` of a model is the same whatever ``n`` and whichever models are
selected. Case ``j`` of a model uses the regime ``j mod r`` of the r random regimes of its specification
(``ntpref.twostage.cases``, ``ntpref.shallow.cases``: 5 for twostage, 4 for the others); together they
cover the options and the edge cases.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import cached_property
from pathlib import Path

import numpy as np

from ..checks import as_scalar
from ..errors import InputError
from ..models import NAMES, SPECS, check_models

KINDS = ("eval", "train")
PRECISIONS = ("float64", "float32")
#: The float64 tolerance policies: the running error bound (docs/tolerance.md) and the calibrated one.
POLICIES = ("bound", "calibrated")
#: Random cases per model when not given: enough for every regime of every model.
DEFAULT_RANDOM = max(len(spec.regimes) for spec in SPECS.values())
#: Per-step logs among the train outputs of every model (axis 0 = step).
TRAJECTORIES = frozenset(name for spec in SPECS.values() for name in spec.trajectories)


def check_policy(precision: str, policy: str) -> None:
    """InputError unless ``precision`` is one of :data:`PRECISIONS` and ``policy`` one of :data:`POLICIES`, a
    policy other than "bound" going with float64 only."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if policy not in POLICIES or (policy != "bound" and precision != "float64"):
        raise InputError(f"policy must be one of {', '.join(POLICIES)} (calibrated for float64 only), got "
                         f"{policy!r} with precision {precision}")


class Case:
    """One conformance case: ``id``, ``model``, ``kind`` ("eval" | "train"), ``source`` ("stored" |
    "random"), ``description``; ``inputs`` (the input dict, with ``model``), ``expected`` (the oracle's
    outputs) and :meth:`tolerances` are computed on first use. ``load()`` returns (inputs, the stored
    expected outputs or None); ``recorded``: the float64 tolerances stored with the case, if any."""

    def __init__(self, id: str, model: str, kind: str, source: str, description: str,
                 load: Callable[[], tuple[dict, dict | None]], recorded: dict[str, dict] | None = None):
        self.id, self.model, self.kind, self.source, self.description = id, model, kind, source, description
        self._load = load
        self._tolerances: dict[str, dict] = {} if recorded is None else {"float64": recorded}

    def __repr__(self) -> str:
        return f"Case({self.id!r})"

    @cached_property
    def _data(self) -> tuple[dict, dict | None]:
        return self._load()

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The ``ntpref eval`` / ``ntpref train`` input arrays, including the 0-d string ``model``."""
        return self._data[0]

    @cached_property
    def expected(self) -> dict[str, np.ndarray]:
        """The oracle's outputs and the intermediates its model keeps (``contract.oracle_outputs``): the
        stored expected.npz and intermediates.npz, or computed now (random cases)."""
        from .contract import oracle_outputs

        stored = self._data[1]
        return stored if stored is not None else oracle_outputs(self.kind, self.inputs)

    def tolerances(self, precision: str = "float64", policy: str = "bound") -> dict[str, dict]:
        """name → tolerance of every expected array: the float64 policy (``policy`` "bound", the running error
        bound; "calibrated", :mod:`ntpref.oracle.calibrated`, which runs the exact backend once), or the
        float32 envelope."""
        check_policy(precision, policy)
        key = precision if policy == "bound" else policy
        if key not in self._tolerances:
            if key == "calibrated":
                from .calibrated import calibrated_tolerances
                from .exactness import exact_backend

                values = exact_backend().compute(self.kind, self.inputs, as_float=False)
                tols = calibrated_tolerances(self.model, self.kind, self.expected, values, self.tolerances("float64"))
            elif precision == "float64":
                from .tolerance import default_tolerances

                outputs = self.expected if self.source == "random" else None   # computed by the oracle here
                tols = default_tolerances(self.model, self.kind, self.inputs, self.expected, outputs=outputs)
            else:
                from .envelope import float32_tolerances

                tols = float32_tolerances(self.kind, self.inputs, self.expected)
            self._tolerances[key] = tols
        return self._tolerances[key]


# --- stored cases -----------------------------------------------------------------------------------
def stored_cases(models: Iterable[str] | None = None, root: str | os.PathLike | None = None,
                 kinds: Iterable[str] = KINDS) -> list[Case]:
    """The stored reference cases of ``kinds`` (default eval and train: the extra kinds, "ntk", take no
    adapter) of ``models``.

    root: a reference directory (default :func:`ntpref.oracle.reference.default_root`); one without cases
    is an InputError, as for ``ntpref verify``. A file that does not match the manifest is an InputError
    naming the case, the file and the array."""
    from .reference import default_root, load_cases, tolerances_of

    models = check_models(models)
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    out = []
    for name, entry in manifest["cases"].items():
        if entry["model"] in models and entry["kind"] in kinds:
            out.append(Case(name, entry["model"], entry["kind"], "stored", entry.get("description", ""),
                            _stored_loader(root, name, entry), tolerances_of(entry)))
    return out


def _stored_loader(root: Path, name: str, entry: dict) -> Callable[[], tuple[dict, dict]]:
    def load():
        from .reference import check_file

        files = {}
        for filename in ("input.npz", "expected.npz", "intermediates.npz"):
            if filename not in entry["files"]:
                continue
            arrays, problems = check_file(root, name, entry, filename)
            if problems:
                raise InputError(f"reference case {problems[0]} ({root})")
            files[filename] = arrays
        return files["input.npz"], {**files["expected.npz"], **files.get("intermediates.npz", {})}
    return load



# --- random cases -----------------------------------------------------------------------------------
def random_cases(models: Iterable[str] | None = None, n: int = DEFAULT_RANDOM, seed: int = 0) -> list[Case]:
    """``n`` random cases per model from ``seed`` (module docstring); the oracle's outputs are the expected."""
    models = check_models(models)
    n = as_scalar("random", n, kind="int", low=0)
    seed = as_scalar("seed", seed, kind="int", low=0)
    out = []
    for model in models:
        regimes = list(SPECS[model].regimes.items())
        for j in range(n):
            name, make = regimes[j % len(regimes)]
            rng = np.random.default_rng([seed, NAMES.index(model), j])
            kind, inputs, description = make(rng)
            out.append(Case(f"r{seed}_{model}_{j}_{name}", model, kind, "random", description,
                            lambda inputs=inputs, model=model: ({"model": np.array(model), **inputs}, None)))
    return out


def cases(models: Iterable[str] | None = None, random: int = DEFAULT_RANDOM, seed: int = 0, stored: bool = True,
          root: str | os.PathLike | None = None) -> list[Case]:
    """The stored eval/train cases of ``models`` (unless ``stored`` is False), then ``random`` random cases per
    model from ``seed``. Cheap: inputs, expected outputs and tolerances are computed when first used."""
    return (stored_cases(models, root) if stored else []) + random_cases(models, random, seed)
