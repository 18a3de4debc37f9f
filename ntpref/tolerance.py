"""A tolerance: the bound every element of a computed array must meet against the expected one
(docs/tolerance.md). One type, :class:`Tolerance`, validated when it is made, with its operations: the bound
of every element, the sum of two tolerances, a head of its own on the first rows, the straight line above a
running maximum along a per-step log, the short text, and the JSON form stored per array in
``reference_runs/manifest.json``.

An element at row t (its index along axis 0; t = 0 for a 0-d array) of an array whose expected value is e
passes when

    |actual − e| ≤ atol + atol_per_step · t + atol_max_scale · max|e| + rtol · |e|

(``max|e|`` over the finite entries of the whole array). All bounds 0 means *exact*: the same values (equal
numbers, and zeros of the same sign). A ``head`` applies its own bounds to the first ``n`` rows.

Where the tolerances come from, and which a user chooses, is :mod:`ntpref.oracle.policies`; how arrays are
compared under one, :mod:`ntpref.oracle.compare`.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from .errors import InputError

#: The four bounds of a tolerance (and of its head), in their JSON order.
BOUND_KEYS = ("rtol", "atol", "atol_max_scale", "atol_per_step")
#: Every key of a tolerance's JSON form.
KEYS = BOUND_KEYS + ("reason", "head")
#: The smallest subnormal float64: an atol of this alone is shown as "exact" (only -0.0 and 0.0 agree beyond it).
TINY = float(np.finfo(np.float64).smallest_subnormal)
#: The largest float64: a bound this large admits every finite value.
HUGE = float(np.finfo(np.float64).max)
#: The head of the reason of a bound that overflowed float64 (:meth:`Tolerance.saturated`).
OVERFLOW = ("float64 policy: the rounding bound overflows float64 (magnitudes beyond 1.8e308), so only non-finite "
            "values fail; ")


def _bound(key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"'{key}' must be a finite number >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Head:
    """The bounds on the first ``n`` rows of a tolerance (validated: n an integer ≥ 0, bounds finite ≥ 0)."""

    n: int
    rtol: float = 0.0
    atol: float = 0.0
    atol_max_scale: float = 0.0
    atol_per_step: float = 0.0

    def __post_init__(self):
        if isinstance(self.n, (bool, np.bool_)) or not isinstance(self.n, (int, np.integer)) or self.n < 0:
            raise InputError(f"head 'n' must be an integer >= 0, got {self.n!r}")
        object.__setattr__(self, "n", int(self.n))
        for key in BOUND_KEYS:
            try:
                object.__setattr__(self, key, _bound(key, getattr(self, key)))
            except InputError as exc:
                raise InputError(f"head: {exc}") from None

    def to_json(self) -> dict:
        """``{"n", "rtol", "atol", "atol_max_scale", "atol_per_step"}``."""
        return {"n": self.n, **{k: getattr(self, k) for k in BOUND_KEYS}}


@dataclass(frozen=True)
class Tolerance:
    """A validated tolerance (module docstring); ``Tolerance()`` is exact. Raises InputError for a bound that
    is negative, non-finite or not a number, a reason that is not a string, a head that is not a :class:`Head`
    (a mapping is read as one)."""

    rtol: float = 0.0
    atol: float = 0.0
    atol_max_scale: float = 0.0
    atol_per_step: float = 0.0
    reason: str = ""
    head: Head | None = None

    def __post_init__(self):
        for key in BOUND_KEYS:
            object.__setattr__(self, key, _bound(key, getattr(self, key)))
        if not isinstance(self.reason, str):
            raise InputError("'reason' must be a string")
        if isinstance(self.head, Mapping):
            if set(self.head) - {"n", *BOUND_KEYS}:
                raise InputError(f"'head' must be an object with keys n, {', '.join(BOUND_KEYS)}")
            object.__setattr__(self, "head", Head(**{"n": self.head.get("n"), **{
                k: v for k, v in self.head.items() if k != "n"}}))
        elif self.head is not None and not isinstance(self.head, Head):
            raise InputError(f"'head' must be an object with keys n, {', '.join(BOUND_KEYS)}")

    @classmethod
    def saturated(cls, reason: str = "", head: Head | None = None, **bounds) -> Tolerance:
        """A tolerance of computed ``bounds`` (keys of :data:`BOUND_KEYS`), every one that overflowed float64
        (inf, or NaN from inf·0: inputs of size ~1e300 whose outputs are finite but whose magnitudes are not)
        set to :data:`HUGE` and the reason saying so: such an array can only refuse non-finite values."""
        if all(np.isfinite(v) for v in bounds.values()):
            return cls(reason=reason, head=head, **bounds)
        return cls(reason=OVERFLOW + reason, head=head,
                   **{k: v if np.isfinite(v) else HUGE for k, v in bounds.items()})

    # --- the JSON form ------------------------------------------------------------------------------
    @classmethod
    def from_json(cls, what: str, data) -> Tolerance:
        """The tolerance of a JSON object (a tolerance file, a manifest record's tolerance); missing keys are
        0 ("" for the reason). InputError naming ``what`` on unknown keys or invalid values."""
        if isinstance(data, Tolerance):
            return data
        if not isinstance(data, Mapping):
            raise InputError(f"{what}: a tolerance must be an object with keys {', '.join(KEYS)}, got {data!r}")
        unknown = sorted(set(data) - set(KEYS))
        if unknown:
            raise InputError(f"{what}: unknown tolerance key '{unknown[0]}'; allowed: {', '.join(KEYS)}")
        try:
            return cls(**{k: data[k] for k in KEYS if k in data and not (k == "head" and data[k] is None)})
        except InputError as exc:
            raise InputError(f"{what}: {exc}") from None

    def to_json(self) -> dict:
        """``{"rtol", "atol", "atol_max_scale", "atol_per_step", "reason"[, "head"]}``: every bound, as the
        manifest's array records hold them."""
        out = {**{k: getattr(self, k) for k in BOUND_KEYS}, "reason": self.reason}
        if self.head is not None:
            out["head"] = self.head.to_json()
        return out

    # --- what it admits -----------------------------------------------------------------------------
    @property
    def exact(self) -> bool:
        """All bounds 0 and no head: the same values only."""
        return self.head is None and not any(getattr(self, k) for k in BOUND_KEYS)

    def bounds(self, mag: np.ndarray, t: np.ndarray, scale: float, head: bool = True) -> np.ndarray:
        """atol + atol_per_step·t + atol_max_scale·scale + rtol·mag for entries of magnitude ``mag`` at rows
        ``t`` (same shape) of an array whose largest finite magnitude is ``scale``; the head's bounds on rows
        t < n when ``head``."""
        def line(b):
            return b.atol + b.atol_per_step * t + b.atol_max_scale * scale + b.rtol * mag

        out = line(self)
        if head and self.head is not None:
            out = np.where(t < self.head.n, line(self.head), out)
        return out

    def element_bounds(self, e: np.ndarray) -> np.ndarray:
        """The bound every element of an array must meet against the expected array ``e`` (float), shaped
        like ``e`` and in its dtype (module docstring)."""
        e = np.asarray(e)
        flat = np.abs(e.reshape(-1))
        per_row = int(np.prod(e.shape[1:], dtype=np.int64)) if e.ndim else 1
        t = (np.arange(flat.size) // max(per_row, 1)).astype(e.dtype)
        scale = float(np.max(flat[np.isfinite(flat)], initial=0.0))
        with np.errstate(all="ignore"):
            return np.asarray(self.bounds(flat, t, scale, e.ndim >= 1), dtype=e.dtype).reshape(e.shape)

    def admits_every_value(self, e: np.ndarray) -> bool:
        """True when no value of the quantity can fail this tolerance on the expected array ``e`` (a float
        array): the array is *unchecked* (docs/tolerance.md). That is, every entry's bound is at or above
        the array's own scale max|e| (0 everywhere passes, and so does any value of that size), or, for an
        array that is 0 everywhere, at the largest float64 (only a non-finite value fails). An empty array
        is never unchecked."""
        e = np.asarray(e)
        if e.dtype.kind != "f" or not e.size or not np.all(np.isfinite(e)):
            return False
        bounds = self.element_bounds(e.astype(np.float64))
        scale = float(np.max(np.abs(e)))
        return bool(np.all(bounds >= (scale if scale > 0 else HUGE)))

    # --- making one from others ---------------------------------------------------------------------
    def plus(self, other: Tolerance, reason: str) -> Tolerance:
        """A tolerance whose bound on every element is at least the sum of this one's and ``other``'s: their
        bounds added key by key; where either has a head, a head on the first max(n) rows whose bounds add
        each tolerance's larger one, key by key, of its head and main bounds (a bound is linear in its keys
        with coefficients ≥ 0, so that covers both)."""
        def larger(tol):
            return {k: max(getattr(tol, k), getattr(tol.head, k)) if tol.head else getattr(tol, k)
                    for k in BOUND_KEYS}

        heads = [tol.head.n for tol in (self, other) if tol.head is not None]
        head = None
        if heads:
            mine, theirs = larger(self), larger(other)
            head = Head(max(heads), **{k: mine[k] + theirs[k] for k in BOUND_KEYS})
        return Tolerance(**{k: getattr(self, k) + getattr(other, k) for k in BOUND_KEYS}, reason=reason, head=head)

    def with_head(self, n: int, kept: Tolerance, reason: str) -> Tolerance:
        """This tolerance with ``kept``'s bounds on its first ``n`` rows, and ``reason``."""
        return dataclasses.replace(self, head=Head(n, **{k: getattr(kept, k) for k in BOUND_KEYS}), reason=reason)

    def replace(self, **changes) -> Tolerance:
        """A copy with ``changes`` (validated)."""
        return dataclasses.replace(self, **changes)

    @staticmethod
    def running_max(values: np.ndarray, first: int = 0) -> np.ndarray:
        """max_{first ≤ s ≤ t} values(s) for every t (0 before ``first``): ``values`` [steps]."""
        values = np.asarray(values, dtype=np.float64)
        if first:
            values = np.where((np.arange(values.shape[0]) >= first).reshape((-1,) + (1,) * (values.ndim - 1)),
                              values, 0.0)
        return np.maximum.accumulate(values) if values.size else values

    @staticmethod
    def line_above(values: np.ndarray, floor: float = 0.0) -> tuple[float, float]:
        """(atol, atol_per_step): the straight line ``atol + atol_per_step · t`` with atol = max(values[0],
        ``floor``) that lies on or above every entry of ``values`` (shape (T,), indexed by the step t; a
        running maximum, :meth:`running_max`, so the line follows the largest value so far)."""
        values = np.asarray(values, dtype=np.float64)
        atol = max(float(values[0]), floor)
        t = np.arange(1, values.size)
        return atol, max(float(np.max((values[1:] - atol) / t, initial=0.0)), 0.0)

    # --- text -----------------------------------------------------------------------------------------
    def text(self) -> str:
        """Short human form, e.g. ``rtol 1e-12 atol 1e-14·max``, ``atol 3e-15 +2e-17·t``, ``exact`` (an atol
        of :data:`TINY` alone, the policy's floor, is "exact"), with a head ``[:n] ...; rest ...``."""
        if self.head is not None:
            return f"[:{self.head.n}] {_bounds_text(self.head)}; rest {_bounds_text(self)}"
        return _bounds_text(self)


def _bounds_text(b) -> str:
    if not any(getattr(b, k) for k in BOUND_KEYS) or (b.atol == TINY and not any(
            getattr(b, k) for k in BOUND_KEYS if k != "atol")):
        return "exact"
    parts = [f"rtol {b.rtol:.0e}"] if b.rtol else []
    if b.atol and b.atol != TINY:
        parts.append(f"atol {b.atol:.0e}")
    if b.atol_per_step:
        parts.append(f"+{b.atol_per_step:.0e}·t")
    if b.atol_max_scale:
        parts.append(f"atol {b.atol_max_scale:.0e}·max")
    return " ".join(parts)


#: The same values.
EXACT = Tolerance(reason="exact")
