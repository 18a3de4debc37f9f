"""The ``eval`` / ``train`` contract of docs/contract.md: a dict of arrays in, a dict of arrays out.

Every input holds a 0-d string array ``model``; the rest is handled by the model's own contract
module, which validates names (unknown ones are errors), shapes, dtypes and values:

  model = "twostage"           → :mod:`ntpref.twostage.contract`
  model = "shallow" | "indrnn" → :mod:`ntpref.shallow.contract`

Each model module exposes ``evaluate(model, arrays, backend)`` and
``train(model, arrays, backend, progress)`` returning ``dict[str, np.ndarray]``.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping

import numpy as np

from ..checks import as_scalar, check_backend, require_finite
from ..errors import InputError, NtprefError
from ..progress import silent

MODELS = {"twostage": "ntpref.twostage.contract", "shallow": "ntpref.shallow.contract",
          "indrnn": "ntpref.shallow.contract"}


def _split(arrays: Mapping[str, np.ndarray]):
    if "model" not in arrays:
        raise InputError("missing array 'model' (a 0-d string: " + " | ".join(f'"{m}"' for m in MODELS) + ")")
    model = as_scalar("model", arrays["model"], kind="str")
    if model not in MODELS:
        raise InputError(f"array 'model': unknown model {model!r}; known: {', '.join(MODELS)}")
    rest = {k: v for k, v in arrays.items() if k != "model"}
    return model, importlib.import_module(MODELS[model]), rest


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
    """Outputs of ``ntpref eval`` for an input dict (see docs/contract.md)."""
    check_backend(backend)
    model, module, rest = _split(arrays)
    return _finite_outputs(lambda: module.evaluate(model, rest, backend))


def train(arrays: Mapping[str, np.ndarray], backend: str = "numba",
          progress: Callable[[str, int, int], None] = silent) -> dict[str, np.ndarray]:
    """Outputs of ``ntpref train`` for an input dict (see docs/contract.md)."""
    check_backend(backend)
    model, module, rest = _split(arrays)
    return _finite_outputs(lambda: module.train(model, rest, backend, progress))


def run_file(kind: str, input_path, output_path, backend: str = "numba",
             progress: Callable[[str, int, int], None] = silent) -> dict[str, np.ndarray]:
    """Read ``input_path``, run ``kind`` ("eval" | "train"), write ``output_path`` atomically.

    Errors (InputError, InfeasibleError) are re-raised with the same type, prefixed with the input file's name.
    """
    from ..npzio import load_npz, save_npz

    arrays = load_npz(input_path)
    try:
        out = evaluate(arrays, backend) if kind == "eval" else train(arrays, backend, progress)
    except NtprefError as exc:
        raise type(exc)(f"{input_path}: {exc}") from None
    save_npz(output_path, out)
    return out
