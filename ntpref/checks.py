"""Boundary validation shared by every public entry point.

Each helper converts once (C-contiguous float64 / int64, so every Numba kernel compiles one
signature) and raises :class:`ntpref.errors.InputError` with a message that names the array.
"""
from __future__ import annotations

import argparse
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from numba import njit

from .errors import InputError, NonFiniteError

BACKENDS = ("numba", "numpy")
#: Largest step count accepted from an input file (T0, T, steps): the per-step logs hold one float64 per step.
MAX_STEPS = 10**8
_FLOAT64 = np.dtype(np.float64)   # the native float64 dtype, compared by identity


def check_backend(backend: str) -> str:
    """Return ``backend`` if it is one of :data:`BACKENDS`, else raise InputError."""
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend


def integer_at_least(lowest: int, why: str = ""):
    """An argparse type: a whole number >= ``lowest`` (``why`` explains the bound in the message)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < lowest:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {lowest}{why}, got {text!r}")
        return value
    return parse


#: A command-line count (workers, seeds, repeats, threads) as an argparse type: a whole number >= 1.
count_argument = integer_at_least(1)


def positive_argument(text: str) -> float:
    """An argparse type: a finite number > 0 (a step size, a timeout in seconds)."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _shape_ok(shape: tuple, expected: tuple) -> bool:
    return shape == expected or (len(shape) == len(expected)
                                 and all(e is None or s == e for s, e in zip(shape, expected)))


@njit(cache=True)
def _all_finite(flat: np.ndarray) -> bool:
    """True when every entry of the float64 vector ``flat`` [n] is finite: x - x is 0 for finite x and NaN for
    ±inf and NaN. An integer or-reduction has no order, so the loop vectorises. Callers pass arrays of any
    rank flattened (``reshape(-1)``, a view of a C-contiguous array), so one compilation serves them all."""
    bad = 0
    for i in range(flat.size):
        bad |= np.int64(flat[i] - flat[i] != 0.0)
    return bad == 0


def _fmt_shape(expected: tuple) -> str:
    return "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"


def _to_float64(name: str, a: np.ndarray) -> np.ndarray:
    """``a`` (real dtype) as a C-contiguous float64 array; InputError naming the array for a finite value
    beyond the float64 range (|x| > 1.8e308, possible in a longdouble array), which would become inf."""
    with np.errstate(over="ignore"):
        out = np.asarray(a, dtype=np.float64, order="C")
    if a.dtype.kind == "f" and a.dtype.itemsize > 8 and a.size:
        beyond = np.isinf(out) & np.isfinite(a)
        if beyond.any():
            idx = tuple(int(i) for i in np.argwhere(beyond)[0])
            where = f" at index {idx}" if idx else ""
            raise InputError(f"array '{name}': value {str(a[idx])}{where} is beyond the float64 range "
                             f"(|x| <= {np.finfo(np.float64).max:.4g})")
    return out


def as_float(name: str, x, shape: tuple | None = None, finite: bool = True) -> np.ndarray:
    """``x`` as a C-contiguous float64 array.

    shape: expected shape, ``None`` entries are free (rank is always checked when given).
    Rejects complex, object, string and boolean data; with ``finite`` also NaN and inf. A native
    C-contiguous float64 array (what a training loop passes every step) is checked without a conversion.
    """
    a = np.asarray(x)
    plain = a.dtype is _FLOAT64 and a.flags.c_contiguous
    if not plain and a.dtype.kind not in "fiu":
        raise InputError(f"array '{name}': expected real numbers, got dtype {a.dtype}")
    if shape is not None and a.shape != shape and not _shape_ok(a.shape, shape):
        raise InputError(f"array '{name}': expected shape {_fmt_shape(shape)}, got {list(a.shape)}")
    if not plain:
        a = _to_float64(name, a)
    if finite and a.size and not _all_finite(a.reshape(-1)):
        bad = np.argwhere(~np.isfinite(a))[0]
        raise InputError(f"array '{name}': non-finite value {a[tuple(bad)]} at index {tuple(int(i) for i in bad)}")
    return a


def as_int(name: str, x, shape: tuple | None = None, low: int | None = None, high: int | None = None) -> np.ndarray:
    """``x`` as a C-contiguous int64 array with every entry in ``[low, high]`` (bounds inclusive).

    Float arrays are rejected even when integral (token ids must be stored as integers).
    """
    a = np.asarray(x)
    if a.dtype.kind not in "iu":
        raise InputError(f"array '{name}': expected integers, got dtype {a.dtype}")
    if shape is not None and not _shape_ok(a.shape, shape):
        raise InputError(f"array '{name}': expected shape {_fmt_shape(shape)}, got {list(a.shape)}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise InputError(f"array '{name}': value {a.max()} does not fit int64")
    a = np.asarray(a, dtype=np.int64, order="C")
    if a.size:
        if low is not None and a.min() < low:
            idx = tuple(int(i) for i in np.argwhere(a < low)[0])
            raise InputError(f"array '{name}': value {a[idx]} at index {idx} is below {low}")
        if high is not None and a.max() > high:
            idx = tuple(int(i) for i in np.argwhere(a > high)[0])
            raise InputError(f"array '{name}': value {a[idx]} at index {idx} is above {high}")
    return a


def step_set(name: str, steps, high: int) -> set[int]:
    """The steps t of a sequence (list, tuple or 1-d integer array, e.g. the iterates a trainer keeps) as a set
    of ints, each in [0, high]; InputError for a scalar, non-integers or a step out of range."""
    try:
        items = list(steps)
    except TypeError:
        raise InputError(f"array '{name}': expected a sequence of steps, got {type(steps).__name__}") from None
    a = np.asarray(items) if items else np.zeros(0, dtype=np.int64)
    return set(as_int(name, a, (None,), low=0, high=high).tolist())


def as_scalar(name: str, x, kind: str = "float", low: float | None = None, high: float | None = None,
              low_open: bool = False) -> float | int | bool | str:
    """A 0-d value (Python scalar or 0-d / 1-element array) as float, int, bool or str.

    kind: "float" | "int" | "bool" | "str" (a unicode string, or ASCII bytes decoded). ``low_open`` makes the
    lower bound strict (x > low).
    """
    a = np.asarray(x)
    if a.ndim != 0:
        raise InputError(f"array '{name}': expected a 0-d scalar, got shape {list(a.shape)}")
    if kind == "str":
        if a.dtype.kind == "S":  # bytes, e.g. written by np.savez from a bytes value: ASCII text is accepted
            try:
                return a.item().decode("ascii")
            except UnicodeDecodeError:
                raise InputError(f"array '{name}': expected a string, got bytes that are not ASCII "
                                 f"({a.item()!r})") from None
        if a.dtype.kind != "U":
            raise InputError(f"array '{name}': expected a string, got dtype {a.dtype}")
        return str(a)
    if kind == "bool":
        if a.dtype.kind == "b" or (a.dtype.kind in "iu" and int(a) in (0, 1)):
            return bool(a)
        raise InputError(f"array '{name}': expected a boolean, got {a!r}")
    if kind == "int":
        if a.dtype.kind not in "iu":
            raise InputError(f"array '{name}': expected an integer, got dtype {a.dtype}")
        v = int(a)
    else:
        if a.dtype.kind not in "fiu":
            raise InputError(f"array '{name}': expected a real number, got dtype {a.dtype}")
        v = float(_to_float64(name, a))
        if not np.isfinite(v):
            raise InputError(f"array '{name}': expected a finite number, got {v}")
    if low is not None and (v <= low if low_open else v < low):
        raise InputError(f"array '{name}': must be {'>' if low_open else '>='} {low}, got {v}")
    if high is not None and v > high:
        raise InputError(f"array '{name}': must be <= {high}, got {v}")
    return v


def did_you_mean(name: str, choices: Iterable[str], ignore_case: bool = False) -> str:
    """" (did you mean 'W_kq'?)" for the choice closest to a mistyped ``name`` (difflib), or "" when none is
    close; ``ignore_case`` matches ``W_KQ`` to ``W_kq``."""
    import difflib

    choices = list(choices)
    fold = (lambda t: t.lower()) if ignore_case else (lambda t: t)
    by_key = {fold(c): c for c in choices}
    close = difflib.get_close_matches(fold(name), sorted(by_key), n=1)
    return f" (did you mean '{by_key[close[0]]}'?)" if close else ""


def require_mapping(name: str, value) -> Mapping:
    """``value`` if it is a mapping (a dict of arrays), else InputError naming ``name`` and the type given."""
    if not isinstance(value, Mapping):
        raise InputError(f"{name}: expected a dict of arrays (name -> array), got {type(value).__name__}")
    return value


def require_sequence(name: str, value, what: str = "a list") -> Sequence:
    """``value`` if it is a list, tuple, array or other sequence (anything with a length and items but a
    string or a mapping), else InputError naming ``name``."""
    if isinstance(value, (str, bytes, Mapping)) or not (hasattr(value, "__len__") and hasattr(value, "__getitem__")) \
            or (isinstance(value, np.ndarray) and value.ndim == 0):
        raise InputError(f"{name}: expected {what}, got {type(value).__name__}")
    return value


def check_names(arrays: Mapping, required: Iterable[str], optional: Iterable[str] = (), what: str = "input",
                train_names: Iterable[str] = ()) -> None:
    """Raise InputError for a missing required name or any name outside required ∪ optional.

    Unknown names are errors so that a typo (``W_KQ`` for ``W_kq``) is never silently ignored; they are
    reported before missing ones, so a typo reads "unknown array 'W_KQ' (did you mean 'W_kq'?)". An
    unknown name among ``train_names`` (the inputs only training reads, given to an eval input) says to
    use ``ntpref train``. Every missing name is listed.
    """
    required, allowed = list(required), set(required) | set(optional)
    unknown = sorted(n for n in arrays if n not in allowed)
    if unknown:
        if unknown[0] in set(train_names):
            raise InputError(f"{what}: unknown array '{unknown[0]}', an input of training: run it with "
                             "'ntpref train' (ntpref eval evaluates at the given parameters)")
        raise InputError(f"{what}: unknown array '{unknown[0]}'{did_you_mean(unknown[0], allowed, ignore_case=True)}"
                         + f"; allowed: {', '.join(sorted(allowed))}")
    missing = [n for n in required if n not in arrays]
    if missing:
        names = ", ".join(f"'{n}'" for n in missing)
        raise InputError(f"{what}: missing array{'s' if len(missing) > 1 else ''} {names}")


def require_finite(**outputs) -> None:
    """Raise NonFiniteError (an InputError) naming the first output array holding NaN or inf.

    A finite input can still overflow float64 (entries around 1e300); the result is then refused rather
    than returned as inf or NaN.
    """
    for name, value in outputs.items():
        a = np.asarray(value)
        if a.dtype.kind in "fc" and not np.isfinite(a).all():
            raise NonFiniteError(f"output '{name}': {int(a.size - np.isfinite(a).sum())} non-finite value(s) "
                             "(overflow: the inputs are too large to compute in float64)")
