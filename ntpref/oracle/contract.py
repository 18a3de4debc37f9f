"""The ``eval`` / ``train`` contract of docs/contract.md: a dict of arrays in, a dict of arrays out.

Every input holds a 0-d string array ``model`` naming a model of the registry (:mod:`ntpref.models`); the
rest is handled by that model's specification (``evaluate(arrays, backend)``, ``train(arrays, backend,
progress)``, returning ``dict[str, np.ndarray]``), whose contract validates names (unknown ones are
errors), shapes, dtypes and values.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..backend import describe, resolve
from ..checks import as_scalar, require_finite, require_mapping
from ..errors import InputError, NtprefError
from ..models import NAMES, spec_named
from ..progress import silent
from ..spec import ModelSpec


def model_of(arrays: Mapping[str, np.ndarray]) -> ModelSpec:
    """The specification of the model an input names in its 0-d string array ``model``."""
    require_mapping("inputs", arrays)
    if "model" not in arrays:
        raise InputError("missing array 'model' (a 0-d string: " + " | ".join(f'"{m}"' for m in NAMES) + ")")
    name = as_scalar("model", arrays["model"], kind="str")
    try:
        return spec_named(name)
    except InputError as exc:
        raise InputError(f"array 'model': {exc}") from None


def _split(arrays: Mapping[str, np.ndarray]) -> tuple[ModelSpec, dict]:
    return model_of(arrays), {k: v for k, v in arrays.items() if k != "model"}


def _finite_outputs(compute: Callable[[], dict]) -> dict[str, np.ndarray]:
    """``compute()`` under NumPy floating-point traps, then every output checked finite.

    Finite inputs so large that a result overflows float64 (e.g. X ~ 1e300) are an InputError naming the
    output, never a quiet inf or NaN in the result file."""
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"):  # whatever np.seterr says
            out = compute()
    except FloatingPointError as exc:
        raise InputError(f"floating-point error ({exc}): the inputs are too large to compute in float64") from None
    require_finite(**out)
    return out


def evaluate(arrays: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, np.ndarray]:
    """Outputs of ``ntpref eval`` for an input dict (see docs/contract.md); ``backend`` "numba", "numpy" or
    "auto" (:func:`ntpref.backend.resolve`: the bits of the backend it picks)."""
    spec, rest = _split(arrays)
    backend = resolve(backend, "eval", arrays)
    return _finite_outputs(lambda: spec.evaluate(rest, backend))


def train(arrays: Mapping[str, np.ndarray], backend: str = "numba",
          progress: Callable[[str, int, int], None] = silent) -> dict[str, np.ndarray]:
    """Outputs of ``ntpref train`` for an input dict (see docs/contract.md); ``backend`` as for :func:`evaluate`."""
    spec, rest = _split(arrays)
    backend = resolve(backend, "train", arrays)
    return _finite_outputs(lambda: spec.train(rest, backend, progress))


def oracle_outputs(kind: str, arrays: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, np.ndarray]:
    """The outputs of an eval / train input (with ``model``) and the intermediates its model keeps beside
    them (the shallow transformer's head states of an evaluation), which a conformance adapter may return,
    computed by ``backend`` ("numba" | "numpy")."""
    out = evaluate(arrays, backend) if kind == "eval" else train(arrays, backend)
    return {**out, **model_of(arrays).intermediates(kind, arrays, backend)}


def run_file(kind: str, input_path, output_path, backend: str = "numba",
             progress: Callable[[str, int, int], None] = silent,
             announce: Callable[[str], None] = lambda text: None) -> dict[str, np.ndarray]:
    """Read ``input_path``, run ``kind`` ("eval" | "train"), write ``output_path`` atomically; then ``announce``
    is called with the backend that computed it (:func:`ntpref.backend.describe`: for "auto", its choice), so
    that a failing run's stderr stays its one error line.

    Errors (InputError, InfeasibleError) are re-raised with the same type, prefixed with the input file's name.
    """
    from ..npzio import load_npz, save_npz

    arrays = load_npz(input_path)
    try:
        out = evaluate(arrays, backend) if kind == "eval" else train(arrays, backend, progress)
    except NtprefError as exc:
        raise type(exc)(f"{input_path}: {exc}") from None
    save_npz(output_path, out)
    announce(describe(backend, kind, arrays))
    return out
