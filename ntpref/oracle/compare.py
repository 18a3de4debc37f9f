"""Array-by-array comparison of two result sets (``ntpref compare``, spec/interchange.md).

A **tolerance** is a plain dict (JSON-friendly, stored per array in ``reference_runs/manifest.json``)::

    {"rtol": float, "atol": float, "atol_max_scale": float, "reason": str,
     "head": {"n": int, "rtol": float, "atol": float, "atol_max_scale": float}}   # "head" optional

An element passes when ``|actual - expected| <= atol + atol_max_scale * max|expected| + rtol * |expected|``
(``max|expected|`` over the finite entries of the whole array). ``rtol = atol = atol_max_scale = 0``
means *exact*: the bits must be equal (so a NaN equals a NaN with the same bits, and -0.0 differs from
0.0). With a non-zero tolerance a NaN matches a NaN and an infinity the same infinity. The optional
``head`` applies its own (usually tighter) bounds to the first ``n`` entries along axis 0, e.g. the
first 50 steps of a trajectory; the main bounds then cover the rest.

Arrays that are not real floating point (integers, booleans, strings) always compare exactly. Numeric
dtypes must agree exactly (float32 against float64 is a failure, not a tolerance question); string
arrays only need to both be strings. A shape mismatch is a failure of that array.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import InputError

_BOUND_KEYS = ("rtol", "atol", "atol_max_scale")
_KEYS = _BOUND_KEYS + ("reason", "head")

#: Used by ``ntpref compare`` when no tolerance is given: another float64 framework on one
#: evaluation (spec/interchange.md, "Tolerances").
FRAMEWORK_FLOAT64 = {"rtol": 1e-10, "atol": 0.0, "atol_max_scale": 1e-12,
                     "reason": "another float64 framework on one evaluation (spec default)"}
#: Bitwise equality.
EXACT = {"rtol": 0.0, "atol": 0.0, "atol_max_scale": 0.0, "reason": "exact (bitwise)"}


def tolerance(rtol: float = 0.0, atol: float = 0.0, atol_max_scale: float = 0.0, reason: str = "",
              head: Mapping | None = None) -> dict:
    """A validated tolerance dict (see the module docstring); all zeros means exact."""
    return check_tolerance("tolerance", {"rtol": rtol, "atol": atol, "atol_max_scale": atol_max_scale,
                                         "reason": reason, **({"head": dict(head)} if head is not None else {})})


def _bounds(what: str, spec: Mapping, keys: Iterable[str]) -> dict:
    out = {}
    for key in keys:
        value = spec.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise InputError(f"{what}: '{key}' must be a finite number >= 0, got {value!r}")
        out[key] = float(value)
    return out


def check_tolerance(what: str, spec) -> dict:
    """Validate a tolerance given as a mapping (e.g. read from JSON); missing bounds default to 0.

    Raises InputError naming ``what`` on unknown keys, negative or non-finite bounds, a bad ``head``.
    """
    if not isinstance(spec, Mapping):
        raise InputError(f"{what}: a tolerance must be an object with keys {', '.join(_KEYS)}, got {spec!r}")
    unknown = sorted(set(spec) - set(_KEYS))
    if unknown:
        raise InputError(f"{what}: unknown tolerance key '{unknown[0]}'; allowed: {', '.join(_KEYS)}")
    out = _bounds(what, spec, _BOUND_KEYS)
    reason = spec.get("reason", "")
    if not isinstance(reason, str):
        raise InputError(f"{what}: 'reason' must be a string")
    out["reason"] = reason
    if spec.get("head") is not None:
        head = spec["head"]
        if not isinstance(head, Mapping) or set(head) - {"n", *_BOUND_KEYS}:
            raise InputError(f"{what}: 'head' must be an object with keys n, {', '.join(_BOUND_KEYS)}")
        n = head.get("n")
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise InputError(f"{what}: head 'n' must be an integer >= 0, got {n!r}")
        out["head"] = {"n": n, **_bounds(f"{what} (head)", head, _BOUND_KEYS)}
    return out


def _is_exact(bounds: Mapping) -> bool:
    return all(bounds[k] == 0.0 for k in _BOUND_KEYS)


def _bounds_text(b: Mapping) -> str:
    if _is_exact(b):
        return "exact"
    parts = [f"rtol {b['rtol']:.0e}"] if b["rtol"] else []
    if b["atol"]:
        parts.append(f"atol {b['atol']:.0e}")
    if b["atol_max_scale"]:
        parts.append(f"atol {b['atol_max_scale']:.0e}·max")
    return " ".join(parts)


def tolerance_text(tol: Mapping) -> str:
    """Short human form of a tolerance, e.g. ``rtol 1e-12 atol 1e-14·max`` or ``exact``."""
    if "head" in tol:
        h = tol["head"]
        return f"[:{h['n']}] {_bounds_text(h)}; rest {_bounds_text(tol)}"
    return _bounds_text(tol)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}"


class Row(NamedTuple):
    """One compared array. Errors are ``None`` when they cannot be computed (shape mismatch, strings)."""

    name: str
    shape: tuple
    max_abs_err: float | None
    max_rel_err: float | None
    tolerance: str
    ok: bool
    note: str = ""
    ratio: float | None = None   # max |actual - expected| / allowed bound (< 1 passes; None when exact)


class Missing(NamedTuple):
    """An array present on one side only: ``side`` is where it *is* (a label, or "neither")."""

    name: str
    side: str


class Report:
    """Result of :func:`compare_arrays`: ``rows``, ``missing``, ``ok`` and a printable ``table()``."""

    def __init__(self, rows: list[Row], missing: list[Missing], labels: tuple[str, str] = ("expected", "actual")):
        self.rows, self.missing, self.labels = rows, missing, labels

    @property
    def ok(self) -> bool:
        """True when every array passed and none is missing on either side."""
        return all(r.ok for r in self.rows) and not self.missing

    @property
    def failures(self) -> list[str]:
        """Names of the failing arrays (including the missing ones)."""
        return [r.name for r in self.rows if not r.ok] + [m.name for m in self.missing]

    def table(self) -> str:
        """One tabulated row per array, then one line per side listing arrays missing from the other."""
        from tabulate import tabulate

        body = [(r.name, "[" + ", ".join(map(str, r.shape)) + "]", _fmt(r.max_abs_err), _fmt(r.max_rel_err),
                 r.tolerance, "-" if r.ratio is None else f"{r.ratio:.1e}",
                 ("ok" if r.ok else "FAIL") + (f" ({r.note})" if r.note else "")) for r in self.rows]
        text = tabulate(body, headers=("array", "shape", "max abs err", "max rel err", "tolerance", "err/tol",
                                       "status"),
                        disable_numparse=True) if body else "(no arrays in common)"
        for side, other in (self.labels, self.labels[::-1]):
            names = [m.name for m in self.missing if m.side == side]
            if names:
                text += f"\nmissing from {other} (only in {side}): {', '.join(names)}"
        both = [m.name for m in self.missing if m.side == "neither"]
        if both:
            text += f"\nmissing from both sides: {', '.join(both)}"
        return text

    def summary(self) -> str:
        """One line: how many arrays passed, which failed."""
        n_ok = sum(r.ok for r in self.rows)
        if self.ok:
            return f"ok: {n_ok} arrays agree"
        return f"FAIL: {n_ok}/{len(self.rows)} arrays agree; failing: {', '.join(self.failures)}"

    def __str__(self) -> str:
        return self.table() + "\n" + self.summary()


def _errors(e: np.ndarray, a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Elementwise |a - e|, |a - e|/|e| and a mask of positions where both are the same non-finite value."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        same_nonfinite = (np.isnan(e) & np.isnan(a)) | (np.isinf(e) & (e == a))
        diff = np.abs(a - e)
        diff = np.where(same_nonfinite, 0.0, np.where(np.isnan(diff), np.inf, diff))
        rel = np.where(diff == 0, 0.0, diff / np.abs(e))
        rel = np.where(np.isnan(rel), np.inf, rel)
    return diff, rel, same_nonfinite


def _allowed(e: np.ndarray, tol: Mapping) -> np.ndarray:
    """Per-element bound atol + atol_max_scale·max|e| + rtol·|e| (head bounds on the first n rows).

    ``bound`` is an array so that the head can be assigned; non-finite expected entries get -1.
    """
    finite = np.abs(e[np.isfinite(e)])
    scale = float(finite.max()) if finite.size else 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        bound = tol["atol"] + tol["atol_max_scale"] * scale + tol["rtol"] * np.abs(e)
        if "head" in tol and e.ndim >= 1:
            h = tol["head"]
            bound[: h["n"]] = h["atol"] + h["atol_max_scale"] * scale + h["rtol"] * np.abs(e[: h["n"]])
    return np.where(np.isfinite(e), bound, -1.0)  # a non-finite expected entry needs the same value


def _bits_equal(e: np.ndarray, a: np.ndarray) -> np.ndarray:
    uint = np.dtype(f"u{e.dtype.itemsize}")
    return np.ascontiguousarray(e).view(uint) == np.ascontiguousarray(a).view(uint)


def compare_one(name: str, expected: np.ndarray, actual: np.ndarray, tol: Mapping) -> Row:
    """Compare one pair of arrays under ``tol`` (a dict as in :func:`tolerance`)."""
    e, a = np.asarray(expected), np.asarray(actual)
    text = tolerance_text(tol)
    strings = e.dtype.kind in "US" and a.dtype.kind in "US"
    if not strings and e.dtype != a.dtype:
        return Row(name, e.shape, None, None, text, False, f"dtype {a.dtype} != expected {e.dtype}")
    if e.shape != a.shape:
        return Row(name, e.shape, None, None, text, False, f"shape {list(a.shape)} != expected {list(e.shape)}")
    if e.dtype.kind not in "fiu":
        equal = bool(np.array_equal(e, a))
        return Row(name, e.shape, None, None, "exact", equal, "" if equal else f"{int(np.sum(e != a))} entries differ")
    if e.dtype.kind in "iu":
        ok = bool(np.array_equal(e, a))
        diff = np.abs(e.astype(np.float64) - a.astype(np.float64))
        rel = np.divide(diff, np.abs(e.astype(np.float64)), out=np.where(diff == 0, 0.0, np.inf), where=e != 0)
        return Row(name, e.shape, float(diff.max(initial=0.0)), float(rel.max(initial=0.0)), "exact", ok,
                   "" if ok else f"{int(np.sum(e != a))} entries differ")
    diff, rel, same_nonfinite = _errors(e, a)
    max_abs, max_rel = float(diff.max(initial=0.0)), float(rel.max(initial=0.0))
    ratio = None
    if _is_exact(tol) and "head" not in tol:
        bad = ~_bits_equal(e, a)
        note = f"{int(bad.sum())} entries differ in their bits" if bad.any() else ""
    else:
        allowed = _allowed(e, tol)
        bad = ~(same_nonfinite | (diff <= allowed))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = float(np.where(same_nonfinite | (diff == 0), 0.0,
                                   np.where(allowed > 0, diff / allowed, np.inf)).max(initial=0.0))
        note = ""
        if bad.any():
            worst = np.unravel_index(int(np.argmax(np.where(bad, diff, -1.0))), e.shape) if e.ndim else ()
            note = f"{int(bad.sum())} entries outside; worst at {tuple(int(i) for i in worst)}"
    return Row(name, e.shape, max_abs, max_rel, text, not bad.any(), note, ratio)


def compare_arrays(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                   tolerances: Mapping[str, Mapping] | None = None, default: Mapping | None = None,
                   names: Iterable[str] | None = None, labels: tuple[str, str] = ("expected", "actual")) -> Report:
    """Compare every array of ``expected`` with the same-named array of ``actual``.

    tolerances: name → tolerance dict; names not listed use ``default`` (exact when None).
    names: restrict the comparison to these names (a name absent from a side is reported missing).
    labels: how the two sides are called in the report.
    Returns a :class:`Report`; nothing is raised for a failed comparison.
    """
    tolerances = dict(tolerances or {})
    default = check_tolerance("default tolerance", default) if default is not None else EXACT
    if names is None:
        names = list(expected) + [n for n in actual if n not in expected]
    names = list(names)
    rows, missing = [], []
    for name in names:
        if name not in expected or name not in actual:
            side = labels[0] if name in expected else labels[1] if name in actual else "neither"
            missing.append(Missing(name, side))
            continue
        tol = check_tolerance(f"tolerance of '{name}'", tolerances[name]) if name in tolerances else default
        rows.append(compare_one(name, expected[name], actual[name], tol))
    return Report(rows, missing, labels)


def load_tolerances(path) -> tuple[dict[str, dict], dict | None]:
    """Read a tolerance file: ``{NAME: {rtol, atol, atol_max_scale}, "default": {...}}``.

    A file with a top-level ``"tolerances"`` object (the ``case.json`` written by ``ntpref export``)
    is read through that object. Returns (per-array tolerances, default or None).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a JSON tolerance file ({exc})") from None
    if isinstance(data, Mapping) and isinstance(data.get("tolerances"), Mapping) and not (
            set(data["tolerances"]) & set(_KEYS)):
        data = data["tolerances"]
    if not isinstance(data, Mapping):
        raise InputError(f"{path}: expected a JSON object mapping array names to tolerances")
    tols = {name: check_tolerance(f"{path}: '{name}'", spec) for name, spec in data.items()}
    return tols, tols.pop("default", None)


def _handle(args) -> int:
    from .npzio import load_npz

    if args.tolerances and any(v is not None for v in (args.rtol, args.atol, args.atol_max_scale)):
        raise InputError("give either --tolerances or --rtol/--atol/--atol-max-scale, not both")
    tols, default = ({}, None)
    if args.tolerances:
        tols, default = load_tolerances(args.tolerances)
    elif any(v is not None for v in (args.rtol, args.atol, args.atol_max_scale)):
        default = tolerance(rtol=args.rtol or 0.0, atol=args.atol or 0.0, atol_max_scale=args.atol_max_scale or 0.0)
    expected, actual = load_npz(args.expected), load_npz(args.actual)
    report = compare_arrays(expected, actual, tols, default if default is not None else FRAMEWORK_FLOAT64)
    print(report)
    return 0 if report.ok else 1


def register(subparsers) -> None:
    """Add ``ntpref compare EXPECTED.npz ACTUAL.npz [--rtol R --atol A | --tolerances FILE.json]``."""
    text = "compare two npz result files array by array (exit 0 all agree, 1 any difference, 2 bad input)"
    p = subparsers.add_parser("compare", help=text, description=text + ". Without tolerance options: "
                              "rtol 1e-10 and atol 1e-12·max|expected| (another float64 framework). "
                              "--rtol 0 --atol 0 compares bits.")
    p.add_argument("expected", metavar="EXPECTED.npz")
    p.add_argument("actual", metavar="ACTUAL.npz")
    p.add_argument("--rtol", type=float, help="relative tolerance for every float array (default 0 when any bound is given)")
    p.add_argument("--atol", type=float, help="absolute tolerance")
    p.add_argument("--atol-max-scale", type=float, help="absolute tolerance as a multiple of max|expected| per array")
    p.add_argument("--tolerances", metavar="FILE.json",
                   help='JSON {NAME: {"rtol": .., "atol": .., "atol_max_scale": ..}, "default": {..}} '
                        "(or a case.json from ntpref export)")
    p.set_defaults(func=_handle)
