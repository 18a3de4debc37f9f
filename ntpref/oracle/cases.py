"""The cases of ``ntpref conformance`` (docs/conformance.md): stored reference cases and fresh random ones.

A :class:`Case` is one ``ntpref eval`` or ``ntpref train`` input of one model. Its expected outputs
are the stored ``expected.npz`` (stored cases, checked against the manifest's hashes) or the
oracle's outputs computed on the spot (random cases); its tolerances are those of a policy at a precision
(:func:`ntpref.oracle.policies.case_tolerances`): the calibrated ones by default, or the running error bound
(float64) and the float32 envelope. Everything is computed on first use and kept.

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

from ..backend import AUTO, resolve
from ..checks import as_scalar
from ..errors import InputError
from ..models import NAMES, SPECS, check_models
from ..spec import ModelSpec
from ..tolerance import Tolerance
from .contract import oracle_outputs
from .manifest import calibrated_of, check_file, default_root, load_cases, tolerances_of
from .policies import case_tolerances, check_policy
from .policies.calibrated import calibrated_tolerances
from .policies.envelope import measured

KINDS = ("eval", "train")
#: Random cases per model when not given: enough for every regime of every model.
DEFAULT_RANDOM = max(len(spec.regimes) for spec in SPECS.values())
#: Per-step logs among the train outputs of every model (axis 0 = step).
TRAJECTORIES = frozenset(name for spec in SPECS.values() for name in spec.trajectories)


class Case:
    """One conformance case: ``id``, ``model``, ``kind`` ("eval" | "train"), ``source`` ("stored" |
    "random"), ``description``; ``inputs`` (the input dict, with ``model``), ``expected`` (the oracle's
    outputs) and :meth:`tolerances` are computed on first use. ``load()`` returns (inputs, the stored
    expected outputs or None); ``recorded``: the float64 tolerances stored with the case, if any;
    ``calibrated``: its recorded calibrated tolerances, if any; ``backend``: the oracle's backend ("numba" |
    "numpy") that computed the expected outputs (a stored case's: "numba") and that every further oracle run
    of the case's tolerance policies uses, so that they measure the backend behind the expected values."""

    def __init__(self, id: str, model: str, kind: str, source: str, description: str,
                 load: Callable[[], tuple[dict, dict | None]], recorded: dict[str, Tolerance] | None = None,
                 calibrated: dict[str, Tolerance] | None = None, backend: str = "numba"):
        self.id, self.model, self.kind, self.source, self.description = id, model, kind, source, description
        self.backend = backend
        self._load = load
        self._tolerances: dict[tuple[str, str], dict[str, Tolerance]] = {}     # (precision, policy) → tolerances
        if recorded is not None:
            self._tolerances[("float64", "bound")] = recorded
        if calibrated is not None:
            self._tolerances[("float64", "calibrated")] = calibrated

    def __repr__(self) -> str:
        return f"Case({self.id!r})"

    @property
    def spec(self) -> ModelSpec:
        """The model's specification (:mod:`ntpref.models`)."""
        return SPECS[self.model]

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
        stored = self._data[1]
        return stored if stored is not None else oracle_outputs(self.kind, self.inputs, self.backend)

    def tolerances(self, precision: str = "float64", policy: str | None = None) -> dict[str, Tolerance]:
        """name → tolerance of every expected array under ``policy`` at ``precision``
        (:func:`ntpref.oracle.policies.case_tolerances`), computed once: "calibrated" (the default), in float64
        recorded with a stored case or measured by one run of the exact backend, in float32 scaled from
        float64's; "bound", the running error bound in float64 (recorded with a stored case) and the float32
        envelope in float32."""
        key = (precision, check_policy(precision, policy))
        if key not in self._tolerances:
            self._tolerances[key] = case_tolerances(self, *key)
        return self._tolerances[key]

    @cached_property
    def float32_terms(self) -> tuple[dict, dict]:
        """The float32 envelope's measured terms (:func:`ntpref.oracle.policies.envelope.measured`), which both
        float32 policies read."""
        return measured(self.spec, self.kind, self.inputs, self.expected, self.backend)

    def calibrate(self, exact_values: dict[str, np.ndarray]) -> dict[str, Tolerance]:
        """The calibrated float64 tolerances (:func:`ntpref.oracle.policies.calibrated.calibrated_tolerances`)
        from ``exact_values``, the exact backend's outputs (object arrays of mpf) of this case's input, kept as
        the case's; returned."""
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
def random_cases(models: Iterable[str] | None = None, n: int = DEFAULT_RANDOM, seed: int = 0,
                 backend: str = AUTO) -> list[Case]:
    """``n`` random cases per model from ``seed`` (module docstring); the oracle's outputs, computed by
    ``backend`` (:func:`random_case`), are the expected. A case is made once per process, so what it computes
    on first use (the oracle's outputs, the exact run of its calibrated tolerances) serves every later run of it."""
    models = check_models(models)
    n = as_scalar("random", n, kind="int", low=0)
    seed = as_scalar("seed", seed, kind="int", low=0)
    return [random_case(model, j, seed, backend) for model in models for j in range(n)]


@lru_cache(maxsize=1024)
def random_case(model: str, j: int, seed: int, backend: str = AUTO) -> Case:
    """Random case ``j`` of ``model`` from ``seed``: the regime ``j mod r`` of the model's r regimes, drawn
    from ``np.random.default_rng([seed, model index, j])``; its oracle runs use ``backend`` ("auto": the one
    :func:`ntpref.backend.resolve` picks for its input, the NumPy backend at these sizes)."""
    regimes = list(SPECS[model].regimes.items())
    name, make = regimes[j % len(regimes)]
    kind, inputs, description = make(np.random.default_rng([seed, NAMES.index(model), j]))
    arrays = {"model": np.array(model), **inputs}
    return Case(f"r{seed}_{model}_{j}_{name}", model, kind, "random", description, lambda: (arrays, None),
                backend=resolve(backend, kind, arrays))


def cases(models: Iterable[str] | None = None, random: int = DEFAULT_RANDOM, seed: int = 0, stored: bool = True,
          root: str | os.PathLike | None = None, backend: str = AUTO) -> list[Case]:
    """The stored eval/train cases of ``models`` (unless ``stored`` is False), then ``random`` random cases per
    model from ``seed`` whose oracle runs use ``backend``. Cheap: inputs, expected outputs and tolerances are
    computed when first used."""
    return (stored_cases(models, root) if stored else []) + random_cases(models, random, seed, backend)
