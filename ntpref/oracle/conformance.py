"""``ntpref conformance``: check any implementation of the three models against the oracle (docs/conformance.md).

An **adapter** is a Python file (or module, object or dict) that defines one or both of

    evaluate(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]   # ntpref eval outputs
    train(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]      # ntpref train outputs

``model`` is a model of the registry (:mod:`ntpref.models`: "twostage", "shallow", "indrnn"); ``inputs`` are the arrays of an ``ntpref eval`` /
``ntpref train`` input (docs/contract.md) without ``model``, copies the adapter may keep or modify.
Every case of :mod:`ntpref.oracle.cases` is run through the function of its kind and the returned
arrays are compared with the oracle's outputs under the float64 policy (docs/tolerance.md) or, with
``precision="float32"``, the float32 envelope (:mod:`ntpref.oracle.envelope`):

* an array the oracle does not output fails (a misspelt name is never ignored); an output the
  adapter does not return is listed in its case, not failed; a case whose outputs the adapter returns
  none of fails;
* a run passes only if every **required** output of its cases was compared in at least one case:
  every output except the :data:`OPTIONAL` diagnostics of the models' specifications (the two-stage
  max-margin solutions ``W_ov_star``, ``W_kq_star`` and the correlations with them, ``stage1_corr``,
  ``stage2_corr``, which need a QP solver). So the loss, the model output and every gradient of an eval case, the trained parameters,
  ``loss_floor`` and the per-step logs of a train case are required; a required output that no case
  returned fails the run unless it is named in ``skip_outputs`` (``--skip-output NAME``);
* ``NotImplementedError`` raised by the adapter marks the case skipped, with its message; anything
  else it raises while it loads or runs (any exception, also ``SystemExit`` and ``KeyboardInterrupt``)
  is an :class:`AdapterError` carrying the adapter's own traceback (exit status 2). Only a signal is
  an interruption: one that :mod:`ntpref.interrupt` recorded (the command's handlers), or, under
  Python's default SIGINT handler, a KeyboardInterrupt (a Ctrl-C cannot be told from a raised one);
* the report names the failing quantity the run computes first (the model's ``timeline``: stage 1 before
  stage 2; at a step the loss, the gradient and its logged norm, then the update and the validation loss;
  the forward pass before the gradients), for a per-step log with the first step where the adapter leaves
  tolerance.

Python API (e.g. in a pytest suite)::

    from ntpref.oracle.conformance import cases, check
    @pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
    def test_oracle(case):
        report = check(my_adapter_module, case)
        assert report.ok, report
"""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .. import interrupt
from ..checks import integer_at_least
from ..errors import InputError, NtprefError
from ..models import NAMES, SPECS
from .cases import DEFAULT_RANDOM, PRECISIONS, TRAJECTORIES, Case, cases
from .compare import Row, compare_arrays, compare_one

__all__ = ["Adapter", "AdapterError", "CaseReport", "OPTIONAL", "RunReport", "cases", "check", "load_adapter", "run"]

LABELS = ("oracle", "adapter")
#: The adapter function of each kind of case.
FUNCTIONS = {"eval": "evaluate", "train": "train"}
#: Outputs a run passes without: every model's diagnostics (the two-stage max-margin solutions and the
#: correlations with them, a QP solver's).
OPTIONAL = frozenset(name for spec in SPECS.values() for name in spec.diagnostics)


class AdapterError(NtprefError):
    """The adapter raised (other than NotImplementedError) or returned something that is not a dict of arrays.
    ``__cause__`` holds the adapter's own exception, when there is one."""


def _interruption(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a signal rather than from the adapter: :mod:`ntpref.interrupt` recorded
    one, or ``exc`` is a KeyboardInterrupt while SIGINT has Python's default handler (which makes a Ctrl-C
    one, indistinguishable from a raised one)."""
    return interrupt.received() is not None or (
        isinstance(exc, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is signal.default_int_handler)


def _raised(exc: BaseException) -> str:
    """What the adapter raised: ``KeyError: 'x'`` for an exception, ``SystemExit(0)`` or
    ``KeyboardInterrupt()`` for the others (their text alone says nothing)."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else repr(exc)


@contextmanager
def _adapter_code(where: str):
    """Run adapter code: whatever it raises, a signal's interruption excepted, becomes the AdapterError
    ``{where} raised {what}``."""
    try:
        yield
    except BaseException as exc:
        if _interruption(exc):
            raise
        raise AdapterError(f"{where} raised {_raised(exc)}") from exc


class Adapter(NamedTuple):
    """An implementation under test: its ``name`` and its ``evaluate`` / ``train`` functions (None if absent)."""

    name: str
    evaluate: Callable | None
    train: Callable | None

    def function(self, kind: str) -> Callable | None:
        """The function that runs cases of ``kind`` ("eval" | "train")."""
        return getattr(self, FUNCTIONS[kind])


def load_adapter(adapter) -> Adapter:
    """An :class:`Adapter` from a path to a .py file (a file inside a package is imported as that package's
    module, any other file like a script), a module or object with ``evaluate`` / ``train`` attributes,
    or a dict of them.

    InputError when the file is missing or defines neither function; AdapterError when loading it raises."""
    if isinstance(adapter, Adapter):
        return adapter
    if isinstance(adapter, (str, os.PathLike)):
        name, found = str(adapter), _load_file(Path(adapter)).__dict__
    elif isinstance(adapter, Mapping):
        name, found = "adapter", adapter
    else:
        name, found = getattr(adapter, "__name__", type(adapter).__name__), {
            k: getattr(adapter, k) for k in FUNCTIONS.values() if hasattr(adapter, k)}
    functions = {k: found.get(k) for k in FUNCTIONS.values()}
    for key, fn in functions.items():
        if fn is not None and not callable(fn):
            raise InputError(f"{name}: '{key}' is not a function")
    if not any(functions.values()):
        raise InputError(f"{name}: defines neither evaluate(model, inputs) nor train(model, inputs)")
    return Adapter(name, functions["evaluate"], functions["train"])


def _load_file(path: Path):
    """The adapter file, executed afresh, as a module. A file inside a package (its folder holds an
    ``__init__.py``) is that package's module, as Python would import it: examples/adapters/torch_float64.py
    is ``examples.adapters.torch_float64`` and imports its sibling relatively. Any other file is loaded
    like a script. The folder above the outermost package (for a script: the file's own folder) is on
    sys.path while it loads."""
    if not path.is_file():
        raise InputError(f"{path}: no such adapter file")
    file = path.resolve()
    packages, folder = [], file.parent
    while (folder / "__init__.py").is_file():
        packages.insert(0, folder.name)
        folder = folder.parent
    package = ".".join(packages)
    name = f"{package}.{file.stem}" if package else f"ntpref_adapter_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise InputError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    if package:
        sys.modules[name] = module
    sys.path.insert(0, str(folder))
    try:
        with _adapter_code(f"{path}: loading the adapter"):
            spec.loader.exec_module(module)
    except BaseException:
        if package:
            sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(str(folder))
    if package in sys.modules:       # imported by the adapter's relative imports: it must be the file's own
        home = getattr(sys.modules[package], "__file__", None)
        if home is None or Path(home).resolve().parent != file.parent:
            raise InputError(f"{path}: package {package} is already imported from elsewhere ({home})")
    return module


# --- one case -----------------------------------------------------------------------------------------
class CaseReport:
    """The outcome of one case: ``rows`` (one compared array each, :class:`ntpref.oracle.compare.Row`),
    ``unknown`` (returned names the oracle does not output), ``not_returned``, ``skipped`` (the reason,
    or None), ``departure`` ((array, step) of the failing quantity computed first, step None unless it is a
    per-step log; None when nothing failed).
    ``ok`` is True when the case passed or was skipped; ``str(report)`` is its table and summary."""

    def __init__(self, case: Case, precision: str, rows=(), unknown=(), not_returned=(), skipped=None,
                 departure=None, seconds=0.0):
        self.case, self.precision = case, precision
        self.rows, self.unknown, self.not_returned = list(rows), list(unknown), list(not_returned)
        self.skipped, self.departure, self.seconds = skipped, departure, seconds

    @property
    def ok(self) -> bool:
        return self.skipped is not None or (bool(self.rows) and not self.unknown and all(r.ok for r in self.rows))

    @property
    def status(self) -> str:
        return "skip" if self.skipped is not None else "pass" if self.ok else "FAIL"

    def ratio(self, row: Row) -> float | None:
        """err / tol, or in float32 mode err / envelope (= MULTIPLE · err / tol)."""
        if row.ratio is None or self.precision == "float64":
            return row.ratio
        from .envelope import MULTIPLE

        return MULTIPLE * row.ratio

    def table_rows(self, verbose: bool = True) -> list[tuple]:
        """(case, array, max abs err, max rel err, tolerance, err/tol, verdict) of every array (failures
        only unless ``verbose``), then one row per unknown name."""
        out = []
        for r in self.rows:
            if verbose or not r.ok:
                out.append((self.case.id, r.name, _fmt(r.max_abs_err), _fmt(r.max_rel_err), r.tolerance,
                            _fmt(self.ratio(r), ".1e"), ("ok" if r.ok else "FAIL") + (f" ({r.note})" if r.note else "")))
        out += [(self.case.id, n, "-", "-", "-", "-", f"FAIL (not an output of ntpref {self.case.kind})")
                for n in self.unknown]
        return out

    def summary(self) -> str:
        """One line: verdict, case id and what happened."""
        head = f"{self.status:4s}  {self.case.id}"
        if self.skipped is not None:
            return f"{head}: skipped: {self.skipped}"
        n_ok = sum(r.ok for r in self.rows)
        text = f"{head}: {n_ok}/{len(self.rows)} arrays within tolerance"
        failing = [r.name for r in self.rows if not r.ok] + self.unknown
        if not self.rows:
            return text + f" (the adapter returned none of the outputs: {', '.join(self.case.expected)})"
        if failing:
            text += f"; failing: {', '.join(failing)}"
        if self.departure and self.departure[1] is not None:
            text += f"; leaves tolerance first at step {self.departure[1]} of {self.departure[0]}"
        elif self.departure and len(failing) > 1:
            text += f"; first wrong in the order of computation: {self.departure[0]}"
        if self.not_returned:
            text += f"; not returned: {', '.join(self.not_returned)}"
        return text

    def table(self, verbose: bool = True) -> str:
        return _table(self.table_rows(verbose), self.precision)

    def __str__(self) -> str:
        return f"{self.table()}\n{self.summary()}"

    __repr__ = __str__   # what ``assert report.ok, report`` shows in pytest

    def to_dict(self) -> dict:
        """JSON-ready form of the report."""
        rows = [{"array": r.name, "shape": list(r.shape), "max_abs_err": _number(r.max_abs_err),
                 "max_rel_err": _number(r.max_rel_err), "tolerance": r.tolerance,
                 _ratio_name(self.precision): _number(self.ratio(r)), "ok": r.ok, "note": r.note} for r in self.rows]
        return {"case": self.case.id, "model": self.case.model, "kind": self.case.kind, "source": self.case.source,
                "description": self.case.description, "status": self.status, "skipped": self.skipped,
                "rows": rows, "unknown": self.unknown, "not_returned": self.not_returned,
                "departure": None if self.departure is None else {"array": self.departure[0], "step": self.departure[1]},
                "seconds": round(self.seconds, 3)}


def _number(x: float | None) -> float | str | None:
    """A float for JSON: "inf" / "nan" as strings (JSON has no such numbers)."""
    return x if x is None or np.isfinite(x) else str(x)


def _fmt(x, spec: str = ".3e") -> str:
    return "-" if x is None else format(x, spec)


def _ratio_name(precision: str) -> str:
    return "err/tol" if precision == "float64" else "err/env"


def _table(rows: list[tuple], precision: str) -> str:
    from tabulate import tabulate

    headers = ("case", "array", "max abs err", "max rel err", "tolerance", _ratio_name(precision), "verdict")
    return tabulate(rows, headers=headers, disable_numparse=True) if rows else "(no rows)"


def _where(adapter: Adapter, case: Case) -> str:
    """``ADAPTER: evaluate() on case ID``, the head of a message about the adapter's run of ``case``."""
    return f"{adapter.name}: {FUNCTIONS[case.kind]}() on case {case.id}"


def _outputs(returned, adapter: Adapter, case: Case, precision: str) -> dict[str, np.ndarray]:
    """The adapter's return value as NumPy arrays (float32 ones widened in float32 mode)."""
    where = _where(adapter, case)
    if not isinstance(returned, Mapping):
        raise AdapterError(f"{where} returned {type(returned).__name__}, not a dict of arrays")
    out = {}
    for name, value in returned.items():
        try:
            a = np.asarray(value)
        except Exception as exc:
            raise AdapterError(f"{where}: output {name!r} is not an array ({type(exc).__name__}: {exc})") from exc
        out[str(name)] = a.astype(np.float64) if precision == "float32" and a.dtype.kind == "f" else a
    return out


def _first_failing_step(name: str, expected: np.ndarray, actual: np.ndarray, tol: Mapping) -> int:
    """The first step at which a failing per-step log leaves its tolerance: the end of the shortest failing
    prefix, by bisection."""
    lo, hi = 0, len(expected)                   # the prefix of length hi fails, of length lo passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if compare_one(name, expected[:mid], actual[:mid], tol).ok else (lo, mid)
    return hi - 1


def _departure(case: Case, rows: list[Row], expected: Mapping, actual: Mapping,
               tols: Mapping) -> tuple[str, int | None] | None:
    """(array, step) of the failing quantity the run computes first (the model's ``timeline``: stage 1
    before stage 2; at a step the loss, then the gradient and its logged norm, then the update and the
    validation loss; in an evaluation the forward pass before the gradients); step None for an array that
    is not a per-step log. None when nothing failed."""
    timeline = SPECS[case.model].timeline
    first, earliest = None, None
    for r in rows:
        if r.ok or r.max_abs_err is None:
            continue
        times = timeline(r.name, expected)
        step = None
        if r.name in TRAJECTORIES and np.ndim(times):
            step = _first_failing_step(r.name, expected[r.name], actual[r.name], tols[r.name])
        when = float(times[step] if step is not None else times)
        if earliest is None or when < earliest:
            first, earliest = (r.name, step), when
    return first


def check(adapter, case: Case, precision: str = "float64") -> CaseReport:
    """Run ``case`` through the adapter (path, module, object or dict; see :func:`load_adapter`) and
    compare with the oracle under the float64 policy or, ``precision="float32"``, the float32 envelope.

    Raises AdapterError when the adapter raises anything but a signal's interruption (its exception is
    the ``__cause__``) or returns something other than a dict of arrays; NotImplementedError gives a
    skipped report."""
    if precision not in PRECISIONS:
        raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    adapter = load_adapter(adapter)
    start = time.perf_counter()
    fn = adapter.function(case.kind)
    if fn is None:
        return CaseReport(case, precision, skipped=f"the adapter defines no {FUNCTIONS[case.kind]}()")
    expected, tols = case.expected, case.tolerances(precision)
    inputs = {k: np.array(v) for k, v in case.inputs.items() if k != "model"}
    with _adapter_code(_where(adapter, case)):
        try:
            returned = fn(case.model, inputs)
        except NotImplementedError as exc:
            return CaseReport(case, precision, skipped=str(exc) or "NotImplementedError",
                              seconds=time.perf_counter() - start)
    actual = _outputs(returned, adapter, case, precision)
    names = [n for n in expected if n in actual]
    report = compare_arrays(expected, actual, tols, names=names, labels=LABELS)
    return CaseReport(case, precision, rows=report.rows, unknown=[n for n in actual if n not in expected],
                      not_returned=[n for n in expected if n not in actual],
                      departure=_departure(case, report.rows, expected, actual, tols),
                      seconds=time.perf_counter() - start)


# --- a whole run --------------------------------------------------------------------------------------
class RunReport(list):
    """The :class:`CaseReport` of every case of a run, in order, and the verdict of the whole run:
    ``never_compared`` (the required outputs, not in ``skip_outputs``, that no case returned), ``ok``
    and ``total()``."""

    def __init__(self, reports: Iterable[CaseReport] = (), skip_outputs: Iterable[str] = ()):
        super().__init__(reports)
        self.skip_outputs = frozenset(skip_outputs)

    @property
    def never_compared(self) -> list[str]:
        """Outputs of the cases run that no case compared, less the :data:`OPTIONAL` and skipped ones."""
        compared = {row.name for r in self for row in r.rows}
        missing = dict.fromkeys(n for r in self for n in r.not_returned)
        return [n for n in missing if n not in compared and n not in OPTIONAL and n not in self.skip_outputs]

    @property
    def ok(self) -> bool:
        """No case failed, at least one array was compared and every required output was."""
        return all(r.ok for r in self) and any(r.rows for r in self) and not self.never_compared

    def total(self) -> str:
        """One line: the counts of cases and arrays and the verdict, saying what was not checked."""
        counts = {s: sum(r.status == s for r in self) for s in ("pass", "FAIL", "skip")}
        arrays = sum(len(r.rows) for r in self)
        never = self.never_compared
        verdict = "PASS" if self.ok else "FAIL"
        if never:
            verdict += (f": {', '.join(never)} never compared "
                        "(returned by no case; --skip-output NAME to accept)")
        elif not arrays and not counts["FAIL"]:
            verdict += " (nothing was compared)"
        return (f"{len(self)} cases: {counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped; "
                f"{arrays} arrays compared: {verdict}")


def _check_skips(skip_outputs: Iterable[str], selected: list[Case]) -> None:
    """InputError for a name of ``skip_outputs`` that no selected case outputs (a misspelt name is never
    ignored)."""
    outputs = {n for case in selected for n in case.expected}
    unknown = [n for n in skip_outputs if n not in outputs]
    if unknown:
        raise InputError(f"--skip-output {unknown[0]}: not an output of the cases run "
                         f"({', '.join(sorted(outputs)) or 'none'})")


def run(adapter, models=None, random: int = DEFAULT_RANDOM, seed: int = 0, precision: str = "float64",
        stored: bool = True, root=None, progress: Callable[[CaseReport], None] | None = None,
        skip_outputs: Iterable[str] = ()) -> RunReport:
    """:func:`check` on every case of ``models`` whose kind the adapter defines: the stored cases (of
    ``root``; none when ``stored`` is False) and ``random`` random cases per model from ``seed``.
    ``progress`` sees each report as it is made. ``skip_outputs`` names required outputs the run passes
    without (InputError for a name no case outputs)."""
    adapter = load_adapter(adapter)
    selected = [case for case in cases(models, random, seed, stored, root) if adapter.function(case.kind)]
    skip_outputs = list(skip_outputs)
    if skip_outputs:
        _check_skips(skip_outputs, selected)
    reports = RunReport(skip_outputs=skip_outputs)
    for case in selected:
        reports.append(check(adapter, case, precision))
        if progress is not None:
            progress(reports[-1])
    return reports


def _adapter_traceback(exc: BaseException) -> str:
    """The traceback of the adapter's exception, from the adapter's first frame on (ntpref's and the
    import machinery's frames dropped)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen")):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _handle(args) -> int:
    from ..npzio import atomic_write, check_output

    if args.json:
        check_output(args.json)      # before the run, not after it
    try:
        adapter = load_adapter(args.adapter)
        defined = [FUNCTIONS[k] for k in FUNCTIONS if adapter.function(k)]
        policy = "float64 policy (docs/tolerance.md)" if args.precision == "float64" else \
            "float32 envelope (docs/conformance.md)"
        print(f"conformance of {args.adapter} ({', '.join(defined)}) under the {policy}; random cases from seed {args.seed}")
        reports = run(adapter, args.model, args.random, args.seed, args.precision, not args.no_stored, args.root,
                      progress=lambda r: print(r.summary(), flush=True), skip_outputs=args.skip_output)
    except AdapterError as exc:
        if exc.__cause__ is not None:
            print(_adapter_traceback(exc.__cause__), end="", file=sys.stderr)
        raise
    rows = [row for r in reports for row in r.table_rows(args.verbose)]
    if rows:
        print(_table(rows, args.precision))
    line, ok = reports.total(), reports.ok
    if args.precision == "float64" and any("less precise" in r.note for rep in reports for r in rep.rows):
        print("(float32 results cannot meet the float64 policy: judge them with --precision float32)")
    print(line)
    if args.json:
        document = {"adapter": str(args.adapter), "precision": args.precision, "seed": args.seed,
                    "random": args.random, "models": list(args.model or NAMES), "total": line, "ok": ok,
                    "cases": [r.to_dict() for r in reports]}
        atomic_write(args.json, lambda fh: fh.write(json.dumps(document, indent=1).encode()))
    return 0 if ok else 1


def register(subparsers) -> None:
    """Add ``ntpref conformance ADAPTER.py [--model ...] [--random N] [--seed S] [--precision ...]
    [--skip-output NAME ...] [--json F] [-v]``."""
    text = "check an implementation (an adapter file defining evaluate and/or train) against the oracle"
    p = subparsers.add_parser("conformance", help=text, description=text + " on every stored eval/train case and "
                              "fresh random cases covering the options and edge regimes (docs/conformance.md). "
                              "Exit 0 all pass, 1 a case failed or a required output was never compared, "
                              "2 adapter or usage error.")
    p.add_argument("adapter", metavar="ADAPTER.py",
                   help="defines evaluate(model, inputs) and/or train(model, inputs) returning dicts of arrays")
    p.add_argument("--model", nargs="+", choices=NAMES, help="only these models (default all)")
    p.add_argument("--random", type=integer_at_least(0), default=DEFAULT_RANDOM, metavar="N",
                   help=f"random cases per model (default {DEFAULT_RANDOM}: every regime of every model)")
    p.add_argument("--seed", type=integer_at_least(0), default=0, metavar="S",
                   help="seed of the random cases (default 0)")
    p.add_argument("--precision", choices=PRECISIONS, default="float64",
                   help="float64: the float64 policy; float32: a multiple of what float32 arithmetic achieves on "
                        "each input (default float64)")
    p.add_argument("--no-stored", action="store_true", help="only the random cases")
    p.add_argument("--root", metavar="DIR", help="reference directory of the stored cases (default: as ntpref verify)")
    p.add_argument("--skip-output", action="append", default=[], metavar="NAME",
                   help="accept that no case returns this output (an eval or train output; repeatable)")
    p.add_argument("--json", metavar="REPORT.json", help="also write the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="every array's row (default: failures only)")
    p.set_defaults(func=_handle)
