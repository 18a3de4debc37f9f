"""The cases of ``ntpref conformance`` (docs/conformance.md): stored reference cases and fresh random ones.

A :class:`Case` is one ``ntpref eval`` or ``ntpref train`` input of one model. Its expected outputs
are the stored ``expected.npz`` (stored cases, checked against the manifest's hashes) or the
oracle's outputs computed on the spot (random cases); its tolerances are those of a policy at a precision:
the calibrated ones (:mod:`ntpref.oracle.calibrated`, float64 and float32) by default, or the running error
bound (float64, :func:`ntpref.oracle.tolerance.default_tolerances`) and the float32 envelope
(:func:`ntpref.oracle.envelope.float32_tolerances`). Everything is computed on first use and kept.

The float64 tolerances of a stored case are those recorded in its manifest, the running bound's and, once
``ntpref certify --record`` has measured them, the calibrated ones; a random case's calibrated tolerances
take one run of the exact backend. The float32 ones take four runs of the oracle (the envelope's).
Random cases are small (a few sentences or samples, at most 40 steps) and drawn from
``np.random.default_rng([seed, model index, j])`` (the model's index in the registry,
:mod:`ntpref.models`), so case ``j`` of a model is the same whatever ``n`` and whichever models are
selected. Case ``j`` of a model uses the regime ``j mod r`` of the r random regimes of its specification
(``ntpref.twostage.cases``, ``ntpref.shallow.cases``: 6 for twostage, 5 for shallow, 4 for indrnn); together they
cover the options and the edge cases.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from functools import cached_property, lru_cache
from pathlib import Path

import numpy as np

from ..checks import as_scalar
from ..errors import InputError
from ..models import NAMES, SPECS, check_models

KINDS = ("eval", "train")
PRECISIONS = ("float64", "float32")
#: The tolerance policies: "bound", the running error bound in float64 (docs/tolerance.md) and the float32
#: envelope in float32 (:mod:`ntpref.oracle.envelope`); "calibrated", the calibrated tolerances of either
#: precision (:mod:`ntpref.oracle.calibrated`).
POLICIES = ("bound", "calibrated")
#: The policy of a check that names none.
DEFAULT_POLICY = "calibrated"
#: Random cases per model when not given: enough for every regime of every model.
DEFAULT_RANDOM = max(len(spec.regimes) for spec in SPECS.values())
#: Per-step logs among the train outputs of every model (axis 0 = step).
TRAJECTORIES = frozenset(name for spec in SPECS.values() for name in spec.trajectories)


def check_policy(precision: str, policy: str | None = None) -> str:
    """The tolerance policy ``policy`` stands for at ``precision`` (one of :data:`PRECISIONS`): None is the
    default, :data:`DEFAULT_POLICY`. InputError for another precision or a policy not in :data:`POLICIES`."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if policy is None:
        return DEFAULT_POLICY
    if policy not in POLICIES:
        raise InputError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    return policy


class Case:
    """One conformance case: ``id``, ``model``, ``kind`` ("eval" | "train"), ``source`` ("stored" |
    "random"), ``description``; ``inputs`` (the input dict, with ``model``), ``expected`` (the oracle's
    outputs) and :meth:`tolerances` are computed on first use. ``load()`` returns (inputs, the stored
    expected outputs or None); ``recorded``: the float64 tolerances stored with the case, if any;
    ``calibrated``: its recorded calibrated tolerances, if any."""

    def __init__(self, id: str, model: str, kind: str, source: str, description: str,
                 load: Callable[[], tuple[dict, dict | None]], recorded: dict[str, dict] | None = None,
                 calibrated: dict[str, dict] | None = None):
        self.id, self.model, self.kind, self.source, self.description = id, model, kind, source, description
        self._load = load
        self._tolerances: dict[tuple[str, str], dict] = {}     # (precision, policy) → tolerances
        if recorded is not None:
            self._tolerances[("float64", "bound")] = recorded
        if calibrated is not None:
            self._tolerances[("float64", "calibrated")] = calibrated

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

    def tolerances(self, precision: str = "float64", policy: str | None = None) -> dict[str, dict]:
        """name → tolerance of every expected array under ``policy`` at ``precision`` (:func:`check_policy`):
        "calibrated" (the default, :mod:`ntpref.oracle.calibrated`), in float64 recorded with a stored case or
        measured by one run of the exact backend, in float32 scaled from float64's; "bound", the running error
        bound in float64 and the float32 envelope in float32."""
        key = (precision, check_policy(precision, policy))
        if key not in self._tolerances:
            if key == ("float64", "calibrated"):
                from .exactness import exact_backend

                self.calibrate(exact_backend().compute(self.kind, self.inputs, as_float=False))
            elif key == ("float64", "bound"):
                from .tolerance import default_tolerances

                outputs = self.expected if self.source == "random" else None   # computed by the oracle here
                self._tolerances[key] = default_tolerances(self.model, self.kind, self.inputs, self.expected,
                                                           outputs=outputs)
            elif key == ("float32", "bound"):
                from .envelope import float32_tolerances

                diagnostics = set(SPECS[self.model].diagnostics) & set(self.expected)   # their float64 bound is added
                certified = self.tolerances("float64", "bound") if diagnostics else {}
                self._tolerances[key] = float32_tolerances(self.kind, self.inputs, self.expected, certified,
                                                           self._float32_terms)
            else:
                from .calibrated import float32_tolerances

                self._tolerances[key] = float32_tolerances(
                    self.model, self.kind, self.expected, self.tolerances("float64", "calibrated"),
                    self.tolerances("float64", "bound"), self.tolerances("float32", "bound"), self._float32_terms[0])
        return self._tolerances[key]

    @cached_property
    def _float32_terms(self) -> tuple[dict, dict]:
        """The float32 envelope's measured terms (:func:`ntpref.oracle.envelope.measured`)."""
        from .contract import model_of
        from .envelope import measured

        return measured(model_of(self.inputs), self.kind, self.inputs, self.expected)

    def calibrate(self, exact_values: dict[str, np.ndarray]) -> dict[str, dict]:
        """The calibrated float64 tolerances (:func:`ntpref.oracle.calibrated.calibrated_tolerances`) from
        ``exact_values``, the exact backend's outputs (object arrays of mpf) of this case's input, kept as the
        case's; returned."""
        from .calibrated import calibrated_tolerances

        key = ("float64", "calibrated")
        self._tolerances[key] = calibrated_tolerances(self.model, self.kind, self.expected, exact_values,
                                                      self.tolerances("float64", "bound"))
        return self._tolerances[key]


# --- stored cases -----------------------------------------------------------------------------------
def stored_cases(models: Iterable[str] | None = None, root: str | os.PathLike | None = None,
                 kinds: Iterable[str] = KINDS) -> list[Case]:
    """The stored reference cases of ``kinds`` (default eval and train: the extra kinds, "ntk", take no
    adapter) of ``models``.

    root: a reference directory (default :func:`ntpref.oracle.manifest.default_root`); one without cases
    is an InputError, as for ``ntpref verify``. A file that does not match the manifest is an InputError
    naming the case, the file and the array."""
    from .manifest import calibrated_of, default_root, load_cases, tolerances_of

    models = check_models(models)
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    out = []
    for name, entry in manifest["cases"].items():
        if entry["model"] in models and entry["kind"] in kinds:
            out.append(Case(name, entry["model"], entry["kind"], "stored", entry.get("description", ""),
                            _stored_loader(root, name, entry), tolerances_of(entry), calibrated_of(entry)))
    return out


def _stored_loader(root: Path, name: str, entry: dict) -> Callable[[], tuple[dict, dict]]:
    def load():
        from .manifest import check_file

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
    """``n`` random cases per model from ``seed`` (module docstring); the oracle's outputs are the expected.
    A case is made once per process (:func:`random_case`), so what it computes on first use (the oracle's
    outputs, the exact run of its calibrated tolerances) serves every later run of it."""
    models = check_models(models)
    n = as_scalar("random", n, kind="int", low=0)
    seed = as_scalar("seed", seed, kind="int", low=0)
    return [random_case(model, j, seed) for model in models for j in range(n)]


@lru_cache(maxsize=1024)
def random_case(model: str, j: int, seed: int) -> Case:
    """Random case ``j`` of ``model`` from ``seed``: the regime ``j mod r`` of the model's r regimes, drawn
    from ``np.random.default_rng([seed, model index, j])``."""
    regimes = list(SPECS[model].regimes.items())
    name, make = regimes[j % len(regimes)]
    kind, inputs, description = make(np.random.default_rng([seed, NAMES.index(model), j]))
    return Case(f"r{seed}_{model}_{j}_{name}", model, kind, "random", description,
                lambda: ({"model": np.array(model), **inputs}, None))


def cases(models: Iterable[str] | None = None, random: int = DEFAULT_RANDOM, seed: int = 0, stored: bool = True,
          root: str | os.PathLike | None = None) -> list[Case]:
    """The stored eval/train cases of ``models`` (unless ``stored`` is False), then ``random`` random cases per
    model from ``seed``. Cheap: inputs, expected outputs and tolerances are computed when first used."""
    return (stored_cases(models, root) if stored else []) + random_cases(models, random, seed)
