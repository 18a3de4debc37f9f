"""The backend choice ``auto`` of the commands (``ntpref eval``, ``train``, ``gradcheck``, ``certify`` and the
oracle runs of ``ntpref conformance``'s random cases): the NumPy backend for a small run, the Numba backend
otherwise.

A first Numba run compiles its kernels (seconds to tens of seconds of CPU on an empty Numba cache,
docs/performance.md); a small input costs the NumPy backend milliseconds. ``auto`` estimates the NumPy
backend's run time from the input's sizes alone, so the choice is deterministic for a given input:

    seconds = passes × (PASS_SECONDS + per_pass)

where the model's specification gives (passes, per_pass) (``numpy_cost(kind, arrays)``: one pass for an
evaluation, one per training step; per_pass from the sizes, e.g. N · Lmax · K · d for the two-stage model),
and picks "numpy" when seconds ≤ :data:`SMALL_SECONDS`, else "numba". Each backend is bitwise deterministic
for a given input, so an ``auto`` run gives the bits of the backend it chose; the commands say which one
that was. An input whose sizes cannot be read is left to the NumPy backend, whose validation rejects it
without compiling anything.

The module imports neither NumPy nor Numba until a choice is made: the ``ntpref`` command reads its
constants before it configures the process (:mod:`ntpref.numba_target`).
"""
from __future__ import annotations

from collections.abc import Mapping

AUTO = "auto"
#: What ``--backend`` accepts.
CHOICES = (AUTO, "numba", "numpy")
#: The NumPy backend's estimated run time up to which ``auto`` picks it (seconds).
SMALL_SECONDS = 0.1
#: The NumPy backend's fixed cost of one pass (its Python overhead on a small input, rounded up).
PASS_SECONDS = 5e-4
#: ``--help`` text of the commands' ``--backend``.
HELP = (f"'auto' (the default): numpy when the NumPy backend's run is estimated at <= {SMALL_SECONDS:g} s from "
        "the input's sizes (no Numba compilation), else numba; each gives its own backend's bits")


def numpy_seconds(kind: str, arrays: Mapping) -> float | None:
    """The estimated run time of the NumPy backend on an ``eval`` / ``train`` input (module docstring); None
    when the input's model or sizes cannot be read."""
    import numpy as np

    from .models import SPECS

    if not isinstance(arrays, Mapping):
        return None
    spec = SPECS.get(str(np.asarray(arrays.get("model", ""))))
    if spec is None:
        return None
    try:
        passes, per_pass = spec.numpy_cost(kind, arrays)
    except (KeyError, TypeError, ValueError, IndexError, OverflowError):
        return None
    return float(passes) * (PASS_SECONDS + float(per_pass))


def resolve(backend: str, kind: str, arrays: Mapping) -> str:
    """The backend that runs ``arrays`` (an ``eval`` / ``train`` input with ``model``): ``backend`` itself
    when it is "numba" or "numpy", the module docstring's choice for "auto"; InputError for anything else."""
    return _choice(backend, kind, arrays)[0]


def describe(backend: str, kind: str, arrays: Mapping) -> str:
    """What computed a run, on one line: "numba", "numpy", or for "auto" the choice and why ("numpy (auto:
    NumPy run estimated at 0.0012 s <= 0.1 s)")."""
    chosen, seconds = _choice(backend, kind, arrays)
    if backend != AUTO:
        return chosen
    if seconds is None:
        return f"{chosen} (auto: the input's sizes do not read)"
    return f"{chosen} (auto: NumPy run estimated at {seconds:.2g} s {'<=' if chosen == 'numpy' else '>'} " \
           f"{SMALL_SECONDS:g} s)"


def _choice(backend: str, kind: str, arrays: Mapping) -> tuple[str, float | None]:
    """(the backend :func:`resolve` picks, the NumPy estimate it used: None for an explicit backend or an
    input whose sizes do not read)."""
    from .checks import check_backend

    if backend != AUTO:
        return check_backend(backend), None
    seconds = numpy_seconds(kind, arrays)
    return ("numpy" if seconds is None or seconds <= SMALL_SECONDS else "numba"), seconds
