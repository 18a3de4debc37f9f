"""Array-by-array comparison of two result sets (``ntpref compare``, docs/contract.md).

Each array is compared under a :class:`ntpref.tolerance.Tolerance` (its bound on every element, its head,
its JSON form: docs/tolerance.md); a plain mapping in that JSON form is read as one. An element at row t
passes when

    |actual - expected| <= atol + atol_per_step * t + atol_max_scale * max|expected| + rtol * |expected|

All bounds 0 means *exact*: the same values (equal numbers, and zeros of the same sign).

What decides a verdict is values, never storage: arrays are compared in native byte order, and
dtypes only matter through their *category* and precision:

* real floating point against real floating point: compared by value (in the wider of the two
  types), provided the actual array is at least as precise as the expected one (a float32 result
  against float64 expected fails: it cannot meet a float64 policy);
* integers against integers of any width or signedness, booleans against booleans and strings
  against strings: compared exactly, by value (tolerances do not apply); an integer error is the exact
  difference of the two integers, rounded once to a float for the report; a byte string (``S``) is text
  in UTF-8 (of which ASCII is a part), so ``b"max_steps"`` equals ``"max_steps"``, and bytes that are
  not UTF-8 fail against text;
* any other dtype (structured, raw bytes ``V``) against the same dtype: compared exactly, entry by
  entry; against another dtype it fails;
* any other pairing (float against int, ...) fails, as does a shape mismatch.

NaN or an infinity anywhere in a floating-point array, expected or actual, fails that array, and its row
says only that ("non-finite: expected holds NaN at index (3,) (2 non-finite entries)": no error, no err/tol):
no result of the oracle is ever non-finite.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..backend import AUTO, CHOICES, describe, resolve
from ..backend import HELP as BACKEND_HELP
from ..checks import did_you_mean, require_mapping
from ..errors import InputError
from ..jsonio import load_json
from ..npzio import load_npz
from ..tolerance import EXACT, KEYS, Tolerance
from .contract import model_of
from .policies.bound import bound_tolerances, run_kind
from .policies.defaults import FRAMEWORK_FLOAT64, given_bounds

def as_tolerance(what: str, tol) -> Tolerance:
    """``tol`` as a :class:`~ntpref.tolerance.Tolerance`: itself, or a mapping in its JSON form, validated
    (InputError naming ``what``)."""
    return Tolerance.from_json(what, tol)


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3e}"


class Row(NamedTuple):
    """One compared array. Errors are ``None`` when they cannot be computed (shape mismatch, strings)."""

    name: str
    shape: tuple
    max_abs_err: float | None
    max_rel_err: float | None   # over the entries whose expected value is not 0 (None: there are none)
    tolerance: str
    ok: bool
    note: str = ""
    ratio: float | None = None   # max |actual - expected| / allowed bound (< 1 passes; None when exact)


class Missing(NamedTuple):
    """An array present on one side only: ``side`` is where it *is* (a label, or "neither")."""

    name: str
    side: str


class Report:
    """Result of :func:`compare_arrays`: ``rows``, ``missing``, ``ok`` and a printable ``table()``.

    ``counts`` (optional): name → (entries compared, entries in the array), printed under the table.
    """

    def __init__(self, rows: list[Row], missing: list[Missing], labels: tuple[str, str] = ("expected", "actual"),
                 counts: Mapping[str, tuple[int, int]] | None = None):
        self.rows, self.missing, self.labels = rows, missing, labels
        self.counts = dict(counts or {})

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
        if self.counts:
            text += "\nentries checked: " + "; ".join(f"{n} {k} of {size}" for n, (k, size) in self.counts.items())
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


def _category(dtype: np.dtype) -> str:
    """What a dtype's values are, whatever their width and byte order."""
    return {"f": "floating-point", "i": "integer", "u": "integer", "b": "boolean", "U": "string", "S": "string",
            "c": "complex"}.get(dtype.kind, f"'{dtype.kind}'-kind")


def _native(x: np.ndarray) -> np.ndarray:
    """``x`` in native byte order (same values)."""
    return x if x.dtype.isnative else x.astype(x.dtype.newbyteorder("="))


#: Entries per pass of a numeric comparison: its temporaries stay a few times 8 MiB whatever the arrays'
#: size, so comparing two arrays takes little more memory than holding them.
CHUNK = 1 << 20


def _chunks(size: int):
    """Slices of 0..size in :data:`CHUNK` steps (one empty slice for size 0)."""
    return [slice(i, min(i + CHUNK, size)) for i in range(0, max(size, 1), CHUNK)]


def _finite_scale(flat: np.ndarray) -> float:
    """max |x| over the finite entries of a flat array (0 for none), chunk by chunk."""
    top = 0.0
    for part in _chunks(flat.size):
        mag = np.abs(flat[part])
        top = max(top, float(np.max(mag[np.isfinite(mag)], initial=0.0)))
    return top


def _rows(e: np.ndarray, part: slice, dtype) -> np.ndarray:
    """The row (index along axis 0) of each flat entry of ``part`` of an array shaped like ``e``."""
    per_row = int(np.prod(e.shape[1:], dtype=np.int64)) if e.ndim else 1
    return (np.arange(part.start, part.stop) // max(per_row, 1)).astype(dtype)


class _Scan:
    """What one pass over two same-shaped numeric arrays finds, chunk by chunk (:data:`CHUNK`): the largest
    absolute and relative errors, the entries outside the bound and the worst of them, the largest
    err/bound, and the first non-finite entry of each side. ``bounded``: compare under ``tol``'s bounds;
    otherwise entries must be equal (and zeros of the same sign for floats)."""

    def __init__(self, e: np.ndarray, a: np.ndarray, tol: Tolerance, work: np.dtype, bounded: bool):
        fe, fa = e.reshape(-1), a.reshape(-1)
        floating = work.kind == "f"
        scale = _finite_scale(fe) if bounded and floating else 0.0   # exact in e's own dtype
        self.max_abs, self.max_rel, self.any_nonzero, self.n_bad = 0.0, 0.0, False, 0
        self.worst, self.worst_diff, self.ratio = None, -1.0, 0.0
        self.nonfinite = [[0, None, None], [0, None, None]]      # per side: count, first flat index, value
        for part in _chunks(fe.size):
            ce, ca = fe[part].astype(work, copy=False), fa[part].astype(work, copy=False)
            if not floating:
                ce, ca = ce.astype(np.float64), ca.astype(np.float64)
            else:
                for side, x in enumerate((ce, ca)):
                    bad = ~np.isfinite(x)
                    if bad.any():
                        record = self.nonfinite[side]
                        if record[1] is None:
                            first = int(np.argmax(bad))
                            record[1], record[2] = part.start + first, float(x[first])
                        record[0] += int(bad.sum())
            with np.errstate(all="ignore"):     # whatever np.seterr says: subnormal bounds underflow
                finite = np.isfinite(ce) & np.isfinite(ca)
                diff = np.where(finite, np.abs(ca - ce), 0.0)
                rel = np.where((diff == 0) | (ce == 0), 0.0, diff / np.abs(ce))   # relative to 0: undefined
                if bounded:
                    allowed = tol.bounds(np.abs(ce), _rows(e, part, work), scale, e.ndim >= 1)
                    bad = ~(diff <= allowed)
                    ratio = np.where(diff == 0, 0.0, np.where(allowed > 0, diff / allowed, np.inf))
                    self.ratio = max(self.ratio, float(ratio.max(initial=0.0)))
                else:
                    # integers by their own values (a float64 copy would merge those beyond 2^53)
                    bad = (ca != ce) | (np.signbit(ca) != np.signbit(ce)) if floating else fa[part] != fe[part]
                    if not floating:
                        diff, rel = self._integer_errors(fe[part], fa[part], bad)
            self.max_abs = max(self.max_abs, float(diff.max(initial=0.0)))
            self.max_rel = max(self.max_rel, float(rel.max(initial=0.0)))
            self.any_nonzero = self.any_nonzero or bool((ce != 0).any())
            if bad.any():
                self.n_bad += int(bad.sum())
                masked = np.where(bad, diff, -1.0)
                k = int(np.argmax(masked))
                if masked[k] > self.worst_diff:
                    self.worst, self.worst_diff = part.start + k, float(masked[k])

    @staticmethod
    def _integer_errors(e: np.ndarray, a: np.ndarray, differ: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(|a − e|, |a − e| / |e|) of integer arrays, 0 where ``differ`` is False, each computed exactly
        from the integers' own values and rounded once to float64: in float64 where both are within ±2^53
        (exact there), as Python integers elsewhere (a float64 copy merges integers beyond 2^53, and an
        integer dtype's difference can wrap around)."""
        def exact(x):
            return (x >= -2**53) & (x <= 2**53)

        small = differ & exact(e) & exact(a)
        with np.errstate(all="ignore"):
            diff = np.where(small, np.abs(a.astype(np.float64) - e.astype(np.float64)), 0.0)
            rel = np.where(small & (e != 0), diff / np.abs(e.astype(np.float64)), 0.0)
        for k in np.flatnonzero(differ & ~small):
            x, y = int(e[k]), int(a[k])
            diff[k] = float(abs(y - x))
            rel[k] = abs(y - x) / abs(x) if x else 0.0    # int / int: correctly rounded
        return diff, rel

    def nonfinite_text(self, shape: tuple, labels: tuple[str, str]) -> str:
        """"expected holds NaN at index (3,)" for each side with a non-finite entry, joined by "; "."""
        texts = []
        for (count, first, value), label in zip(self.nonfinite, labels):
            if count:
                what = "NaN" if math.isnan(value) else ("inf" if value > 0 else "-inf")
                more = f" ({count} non-finite entries)" if count > 1 else ""
                texts.append(f"{label} holds {what} at index {_unravel(first, shape)}{more}")
        return "; ".join(texts)


def _unravel(flat: int, shape: tuple) -> tuple:
    return tuple(int(i) for i in np.unravel_index(flat, shape)) if shape else ()


#: Largest array whose error's shape :func:`error_shape` looks for (it makes a few copies of a failing one).
SHAPE_MAX_ENTRIES = CHUNK


def error_shape(e: np.ndarray, a: np.ndarray, tol: Tolerance, labels: tuple[str, str] = ("expected", "actual")) -> str:
    """The shape of the error of a finite float array ``a`` that fails its bound against ``e`` (same shape),
    when it has one that explains all of it: ``a`` is 0 everywhere, or meets the bound ``tol`` against
    −e (a sign), c·e with c = ⟨a, e⟩/⟨e, e⟩ (a scale, such as 1/√m for a 1/m; not for a single number, which
    is a multiple of any other), or e with its last two axes swapped (a transpose of square blocks, e.g.
    W [m, d, d]). The report's text for it ("actual = −expected (a sign)"), or "" when none fits or the
    array has more than :data:`SHAPE_MAX_ENTRIES` entries. A single number other than 0 and −expected gets its
    ratio instead ("actual/expected = 12": a sum for a mean over 12)."""
    mine, theirs = labels[1], labels[0]
    if not 0 < e.size <= SHAPE_MAX_ENTRIES:
        return ""
    if e.size == 1 and np.any(a) and np.any(e) and not np.all(a == -e):    # one number: any other is a multiple
        return f"{mine}/{theirs} = {float(a.reshape(-1)[0]) / float(e.reshape(-1)[0]):.6g}"   # of it: the ratio
    if not np.any(a):
        return f"{mine} is 0 everywhere" if np.any(e) else ""
    work = np.result_type(e.dtype, a.dtype)
    e64, a64 = e.astype(work), a.astype(work)
    candidates = []
    with np.errstate(all="ignore"):          # whatever np.seterr says; in units of max|e|, so no overflow
        unit = float(np.max(np.abs(e64))) or 1.0
        norm2 = float(np.vdot(e64 / unit, e64 / unit))
        c = float(np.vdot(a64 / unit, e64 / unit)) / norm2 if 0 < norm2 < math.inf else 0.0
    if abs(c + 1.0) <= 1e-6:
        candidates.append((-e64, f"{mine} = −{theirs} (a sign)"))
    elif e.size > 1 and abs(c - 1.0) > 1e-6 and c != 0.0 and math.isfinite(c):   # one number is any scale
        inverse = f" = {theirs} / {1.0 / c:.6g}" if abs(c) < 1.0 else ""
        with np.errstate(all="ignore"):
            candidates.append((c * e64, f"{mine} = {c:.6g} × {theirs}{inverse} (a scale)"))
    if e.ndim >= 2 and e.shape[-1] == e.shape[-2] > 1:
        candidates.append((np.swapaxes(e64, -1, -2), f"{mine} = {theirs} with its last two axes swapped (a transpose)"))
    for moved, text in candidates:
        if not _Scan(np.ascontiguousarray(moved), a64, tol, work, True).n_bad:
            return text
    return ""


def compare_one(name: str, expected: np.ndarray, actual: np.ndarray, tol: Tolerance | Mapping,
                labels: tuple[str, str] = ("expected", "actual")) -> Row:
    """Compare one pair of arrays under ``tol`` (:func:`as_tolerance`); see the module docstring.
    Numeric arrays are compared :data:`CHUNK` entries at a time."""
    e, a = _native(np.asarray(expected)), _native(np.asarray(actual))
    tol = as_tolerance(f"tolerance of '{name}'", tol)
    text = tol.text()
    ce, ca = _category(e.dtype), _category(a.dtype)
    if ce != ca:
        return Row(name, e.shape, None, None, text, False,
                   f"{labels[1]} is {ca} ({a.dtype}), {labels[0]} {ce} ({e.dtype})")
    if ce == "floating-point" and np.finfo(a.dtype).nmant < np.finfo(e.dtype).nmant:
        return Row(name, e.shape, None, None, text, False,
                   f"{labels[1]} is {a.dtype}, less precise than {labels[0]} {e.dtype}")
    if e.shape != a.shape:
        return Row(name, e.shape, None, None, text, False, f"shape {list(a.shape)} != {labels[0]} {list(e.shape)}")
    if ce not in ("floating-point", "integer"):
        return _compare_exact(name, e, a, labels)
    integer = ce == "integer"
    bounded = not integer and not tol.exact
    scan = _Scan(e, a, tol, np.result_type(e.dtype, a.dtype), bounded)
    max_rel = scan.max_rel if scan.any_nonzero or integer else None
    nonfinite = scan.nonfinite_text(e.shape, labels)
    if not scan.n_bad:
        note = ""
    elif bounded:
        note = f"{scan.n_bad} entries outside; worst at {_unravel(scan.worst, e.shape)}"
        shape = "" if nonfinite else error_shape(e, a, tol, labels)
        note += f"; {shape}" if shape else ""
    else:
        note = f"{scan.n_bad} entries differ"
    if nonfinite:       # what is not finite has no error and no err/tol: say that, and where
        return Row(name, e.shape, None, None, "exact" if integer else text, False, f"non-finite: {nonfinite}")
    return Row(name, e.shape, scan.max_abs, max_rel, "exact" if integer else text,
               not scan.n_bad, note, scan.ratio if bounded else None)


def _as_text(x: np.ndarray, label: str) -> np.ndarray | str:
    """A string array as text: ``S`` bytes decoded as UTF-8 (ASCII included); the reason when they are not
    UTF-8."""
    if x.dtype.kind != "S":
        return x
    try:
        return np.char.decode(x, "utf-8")
    except UnicodeDecodeError as exc:
        return f"{label} holds bytes that are not UTF-8 text ({exc.reason} at byte {exc.start})"


def _compare_exact(name: str, e: np.ndarray, a: np.ndarray, labels: tuple[str, str]) -> Row:
    """The row of two same-shaped arrays of a non-numeric category (booleans, strings, structured or raw
    ``V`` data), compared exactly: strings by their text (:func:`_as_text` when one side is bytes), other
    dtypes only against the same dtype."""
    def row(ok: bool, note: str = "") -> Row:
        return Row(name, e.shape, None, None, "exact", ok, note)

    if _category(e.dtype) == "string" and e.dtype.kind != a.dtype.kind:
        e, a = _as_text(e, labels[0]), _as_text(a, labels[1])
        for side in (e, a):
            if isinstance(side, str):
                return row(False, side)
    elif _category(e.dtype) not in ("string", "boolean") and e.dtype != a.dtype:
        return row(False, f"{labels[1]} is {a.dtype.descr if a.dtype.names else a.dtype}, {labels[0]} "
                          f"{e.dtype.descr if e.dtype.names else e.dtype}: values of different dtypes")
    differ = int(np.count_nonzero(e != a))
    return row(not differ, f"{differ} entries differ" if differ else "")


def compare_arrays(expected: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                   tolerances: Mapping[str, Tolerance | Mapping] | None = None,
                   default: Tolerance | Mapping | None = None,
                   names: Iterable[str] | None = None, labels: tuple[str, str] = ("expected", "actual")) -> Report:
    """Compare every array of ``expected`` with the same-named array of ``actual``.

    tolerances: name → tolerance (:func:`as_tolerance`); names not listed use ``default`` (exact when None).
    names: restrict the comparison to these names (a name absent from a side is reported missing).
    labels: how the two sides are called in the report.
    Returns a :class:`Report`; nothing is raised for a failed comparison.
    """
    require_mapping(labels[0], expected)
    require_mapping(labels[1], actual)
    tolerances = dict(tolerances or {})
    default = as_tolerance("default tolerance", default) if default is not None else EXACT
    if names is None:
        names = list(expected) + [n for n in actual if n not in expected]
    names = list(names)
    rows, missing = [], []
    for name in names:
        if name not in expected or name not in actual:
            side = labels[0] if name in expected else labels[1] if name in actual else "neither"
            missing.append(Missing(name, side))
            continue
        tol = as_tolerance(f"tolerance of '{name}'", tolerances[name]) if name in tolerances else default
        rows.append(compare_one(name, expected[name], actual[name], tol, labels))
    return Report(rows, missing, labels)


def load_tolerances(path, names: list[str] | None = None) -> tuple[dict[str, Tolerance], Tolerance | None]:
    """Read a tolerance file: ``{NAME: {rtol, atol, atol_max_scale}, "default": {...}}``.

    A file with a top-level ``"tolerances"`` object (the ``case.json`` written by ``ntpref export``,
    which covers every output of its case) is read through that object. ``names``: the arrays being
    compared; a NAME of a plain tolerance file that is not one of them is an InputError (a misspelt
    name would leave its array at the default tolerance). Returns (per-array tolerances, default or None).
    """
    path = Path(path)
    data = load_json(path, "a JSON tolerance file")
    exported = isinstance(data, Mapping) and isinstance(data.get("tolerances"), Mapping) and not (
        set(data["tolerances"]) & set(KEYS))
    if exported:
        data = data["tolerances"]
    if not isinstance(data, Mapping):
        raise InputError(f"{path}: expected a JSON object mapping array names to tolerances")
    tols = {name: Tolerance.from_json(f"{path}: '{name}'", spec) for name, spec in data.items()}
    if names is not None and not exported:
        _check_tolerance_names(path, [n for n in tols if n != "default"], names)
    return tols, tols.pop("default", None)


def policy_tolerances(input_path, expected: Mapping[str, np.ndarray],
                      backend: str = AUTO) -> tuple[dict[str, Tolerance], str]:
    """The running error bound's tolerances (docs/tolerance.md) for the arrays of ``expected``, computed from
    the run's input file (model from its ``model`` array; a train input when it holds ``eta``) by running it
    on ``backend`` ("auto": the NumPy backend for a small input, :mod:`ntpref.backend`), and the line
    :func:`ntpref.backend.describe` gives for that choice. InputErrors name the file."""
    inputs = load_npz(input_path)
    try:
        kind = run_kind(inputs)
        chosen = resolve(backend, kind, inputs)
        return (bound_tolerances(model_of(inputs).name, kind, inputs, expected, backend=chosen),
                describe(backend, kind, inputs))
    except InputError as exc:
        raise InputError(f"{input_path}: {exc}") from None


def _check_tolerance_names(path, tolerances: list[str], names: list[str]) -> None:
    """InputError for a tolerance of an array that is not among ``names``, with the closest one."""
    for name in tolerances:
        if name not in names:
            hint = did_you_mean(name, names) or f" (the files hold {', '.join(dict.fromkeys(names))})"
            raise InputError(f"{path}: a tolerance for array '{name}', which neither result file holds{hint}")


def _handle(args) -> int:
    bounds = any(v is not None for v in (args.rtol, args.atol, args.atol_max_scale))
    if sum((bool(args.tolerances), bool(args.input), bounds)) > 1:
        raise InputError("give one of --tolerances, --input or --rtol/--atol/--atol-max-scale")
    if args.backend is not None and not args.input:
        raise InputError("--backend chooses what runs the input of --input; give it only with --input")
    expected, actual = load_npz(args.expected), load_npz(args.actual)
    tols, default = {}, FRAMEWORK_FLOAT64
    if args.tolerances:
        tols, given = load_tolerances(args.tolerances, names=[*expected, *actual])
        default = given if given is not None else default
    elif args.input:
        tols, ran_on = policy_tolerances(args.input, expected, args.backend or AUTO)
        print(f"tolerances: float64 policy for {args.input} (docs/tolerance.md), "
              f"its bounds from a run on {ran_on}")
    elif bounds:
        try:
            default = given_bounds(rtol=args.rtol or 0.0, atol=args.atol or 0.0, atol_max_scale=args.atol_max_scale or 0.0)
        except InputError as exc:
            raise InputError(f"--rtol/--atol/--atol-max-scale: {exc}") from None
    report = compare_arrays(expected, actual, tols, default)
    print(report)
    if not report.ok and not (args.tolerances or args.input or bounds):
        print("(default tolerance rtol 1e-10, atol 1e-12·max|expected|, which scales with the array's own "
              "values; --input INPUT.npz uses the float64 policy, whose bounds come from the problem)")
    return 0 if report.ok else 1


def register(subparsers) -> None:
    """Add ``ntpref compare EXPECTED.npz ACTUAL.npz [--input INPUT.npz | --tolerances FILE.json | --rtol R ...]``."""
    text = "compare two npz result files array by array (exit 0 all agree, 1 any difference, 2 bad input)"
    p = subparsers.add_parser("compare", help=text, description=text + ". "
                              "--input INPUT.npz: the float64 tolerance policy (docs/tolerance.md): each "
                              "array's bound comes from the problem (the magnitudes of the quantities it is "
                              "computed from, a rounding-error bound that holds for any summation order; for "
                              "a train input also the measured growth of rounding along the trajectory), so "
                              "every correct float64 implementation passes, including outputs that are 0 in "
                              "exact arithmetic, and a 1e-6 relative error fails. The same tolerances are "
                              "stored with every reference case (ntpref export writes them into case.json, "
                              "for --tolerances). Without options: rtol 1e-10 and atol 1e-12·max|expected|. "
                              "--rtol 0 --atol 0 requires the same values. Byte order and integer widths do "
                              "not matter; a float array less precise than the expected one, and NaN or inf "
                              "on either side, fail.")
    p.add_argument("expected", metavar="EXPECTED.npz")
    p.add_argument("actual", metavar="ACTUAL.npz")
    p.add_argument("--input", metavar="INPUT.npz",
                   help="the eval/train input the results were computed from: use the float64 policy")
    p.add_argument("--backend", choices=CHOICES, default=None,
                   help=f"with --input: the backend that runs the input to size the bounds; {BACKEND_HELP}")
    p.add_argument("--rtol", type=float,
                   help="relative tolerance for every float array (default 0 when any bound is given)")
    p.add_argument("--atol", type=float, help="absolute tolerance")
    p.add_argument("--atol-max-scale", type=float, help="absolute tolerance as a multiple of max|expected| per array")
    p.add_argument("--tolerances", metavar="FILE.json",
                   help='JSON {NAME: {"rtol": .., "atol": .., "atol_max_scale": .., "atol_per_step": ..}, '
                        '"default": {..}} (or a case.json from ntpref export)')
    p.set_defaults(func=_handle)
