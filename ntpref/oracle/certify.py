"""``ntpref certify``: the oracle's float64 outputs measured against the exact backend (:mod:`ntpref.exact`,
docs/exact.md), for cases of every kind: eval, train (every logged step of every trajectory, and the final
iterates) and the shallow transformer's stored NTK Gram matrix.

A case is run twice from the same float64 inputs: by the oracle (:func:`ntpref.oracle.kinds.compute` of its
kind with the chosen backend, plus the intermediates its stored case keeps: :func:`ntpref.oracle.kinds.intermediates`)
and by ``ntpref.exact.compute`` (mpmath, 50 digits). For every array Q both compute, with Q̂ the oracle's value
and Q the multiprecision one (unrounded), elementwise

    err_k = |Q̂_k − Q_k|,   bound_k = atol + atol_per_step·t + atol_max_scale·max|Q| + rtol·|Q_k|

where t is the element's index along axis 0 (the step of a trajectory) and the tolerance dict is the
case's running error bound (``case.tolerances("float64", "bound")``, docs/tolerance.md), applied by
:meth:`ntpref.tolerance.Tolerance.element_bounds`, the bound ``ntpref compare`` applies. Per array it reports

    err = max_k err_k,   units = err / (u · max|Q|)  (u = 2⁻⁵³),   ratio = max_k err_k / bound_k

and the element ``at`` where the ratio is largest (for a trajectory, ``at[0]`` is the step). The oracle is
certified on a case when every ratio is ≤ 1. ``units`` is how many roundings of the array's largest entry
the error is worth: 0 when the oracle is exact, inf for an error on an array that is exactly 0.

Outputs of the oracle the exact backend does not compute (its models' ``NOT_COMPUTED``, empty today, or any
other output, "not computed by the exact backend") are listed per case as not certified, with the reason;
inputs it does not read
(the two-stage ``direction``: the exact run follows the exact normalized gradient, which every float64
direction approximates within the case's tolerance) are named in the case's notes.

``steps``: a train case is cut to at most that many updates per stage (``T0``, ``T``, ``steps``), and its
tolerances are then the float64 policy's for the cut input (:func:`truncated`).

``timeout``: a time bound in seconds on each case (oracle and exact run; :func:`certify_case` raises
:class:`CaseTimeout` past it, and the command reports the case as not certified, by name, with exit
status 1). While a case runs the command prints a progress line on stderr every :data:`HEARTBEAT` seconds
(``-q`` silences them), with the cases done so far (:class:`ntpref.progress.Progress`).

The exact backend (mpmath) is imported when a certification runs. ``--record`` stores, besides each array's
err/tol, the case's calibrated tolerances (:meth:`Case.calibrate`, from the same exact run), which
``ntpref conformance`` then judges the stored cases by without an exact run of its own.
"""
from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Iterable
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

from ..backend import AUTO, CHOICES
from ..checks import check_backend, did_you_mean, integer_at_least, positive_argument
from ..errors import InputError
from ..progress import Progress
from ..rounding import U
from ..tolerance import Tolerance
from .cases import DEFAULT_RANDOM, TRAJECTORIES, Case, random_cases, stored_cases
from .cases import KINDS as CASE_KINDS
from .exactness import differences, exact_backend
from .kinds import KINDS, compute, intermediates
from .manifest import default_root, record_certified
from .policies.bound import bound_tolerances

_NOT_COMPUTED = "not computed by the exact backend"
#: Seconds between two progress lines of a running case.
HEARTBEAT = 30.0


class CaseTimeout(Exception):
    """A case ran past its time bound (:func:`time_bound`)."""


class Row(NamedTuple):
    """One array of one case (module docstring): ``err`` = max |Q̂ − Q|, ``scale`` = max |Q|, ``ratio`` = the
    largest err_k / bound_k, ``bound`` = bound_k at the element ``at`` where it is reached (its index;
    ``()`` for a 0-d array); ``trajectory``: a per-step log, whose ``at[0]`` is the step."""

    case: str
    model: str
    name: str
    err: float
    scale: float
    ratio: float
    bound: float
    at: tuple
    trajectory: bool

    @property
    def units(self) -> float:
        """err / (u · max |Q|): 0 for no error, inf for an error on an array that is exactly 0."""
        return 0.0 if self.err == 0 else (self.err / (U * self.scale) if self.scale > 0 else math.inf)

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    @property
    def where(self) -> str:
        """Where the largest err/tol is: "step t" for a trajectory, the index "(i, j)" of another array, ""
        for a 0-d array or one without error."""
        if self.ratio == 0:
            return ""
        if self.trajectory:
            return f"step {self.at[0]}"
        return str(self.at) if self.at else ""

    def line(self, width: int = 0) -> str:
        """``case  array  err E = N u·max|Q|  err/tol R at WHERE  ok|FAIL``, the case padded to ``width``."""
        return (f"{self.case:<{width}}  {self.name:<11}  err {self.err:.2e} = {self.units:7.3g} u·max|Q|  "
                f"err/tol {self.ratio:.2e}{' at ' + self.where if self.where else ''}  "
                f"{'ok' if self.ok else 'FAIL'}")

    def record(self) -> dict:
        """JSON-ready: err, scale, units, ratio, bound (None for an infinite value), at (a list)."""
        def finite(x):
            return x if math.isfinite(x) else None
        return {"err": self.err, "scale": self.scale, "units": finite(self.units), "ratio": finite(self.ratio),
                "bound": self.bound, "at": list(self.at)}


class CaseResult(NamedTuple):
    """The certification of one case: its ``case`` id, ``model``, ``kind``, the oracle's ``backend``,
    ``steps`` (the cut of a train case, None for the whole run), one :class:`Row` per certified array (in
    the oracle's output order), ``not_certified`` (name → why, the oracle's outputs the exact backend does
    not compute), ``notes`` (inputs the exact backend does not read, and what it does instead),
    ``seconds``, the exact backend's run time, and ``calibrated``, the case's calibrated tolerances measured
    on the way (name → tolerance, :meth:`Case.calibrate`; None for a kind conformance does not check);
    ``over_time``: the time bound the case ran past (then nothing of it is certified and ``rows`` is
    empty), else None (:meth:`timed_out`)."""

    case: str
    model: str
    kind: str
    backend: str
    steps: int | None
    rows: tuple
    not_certified: dict
    notes: tuple
    seconds: float
    calibrated: dict | None = None
    over_time: float | None = None

    @classmethod
    def timed_out(cls, case: Case, backend: str, steps: int | None, bound: float) -> CaseResult:
        """The result of ``case`` stopped at its time bound of ``bound`` seconds: nothing certified."""
        return cls(case.id, case.model, case.kind, backend, steps if case.kind == "train" else None, (), {}, (),
                   bound, None, bound)

    @property
    def ok(self) -> bool:
        return self.over_time is None and all(row.ok for row in self.rows)

    def lines(self, width: int = 0) -> list[str]:
        """A header (kind, cut, run time), the notes, one line per row, the not-certified outputs."""
        cut = f", at most {self.steps} updates per stage" if self.steps is not None else ""
        if self.over_time is not None:
            return [f"{self.case:<{width}}  [{self.kind}{cut}, {self.backend}] not certified: stopped at the time "
                    f"bound of {self.over_time:g} s (--timeout)"]
        out = [f"{self.case:<{width}}  [{self.kind}{cut}, {self.backend}; exact backend {self.seconds:.1f} s]"]
        out += [f"{self.case:<{width}}  note: {note}" for note in self.notes]
        out += [row.line(width) for row in self.rows]
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.not_certified.items():
            by_reason.setdefault(reason, []).append(name)
        out += [f"{self.case:<{width}}  not certified: {', '.join(names)} ({reason})"
                for reason, names in by_reason.items()]
        return out

    def record(self) -> dict:
        """JSON-ready, for storing beside a case: {"kind", "backend", "steps", "seconds", "arrays": {name:
        :meth:`Row.record`}, "not_certified": {name: why}, "notes": [...]}."""
        return {"kind": self.kind, "backend": self.backend, "steps": self.steps, "seconds": self.seconds,
                "arrays": {row.name: row.record() for row in self.rows}, "not_certified": dict(self.not_certified),
                "notes": list(self.notes)}


class Report(list):
    """The :class:`CaseResult` of every certified case, in case order."""

    @property
    def rows(self) -> list[Row]:
        return [row for result in self for row in result.rows]

    @property
    def ok(self) -> bool:
        return all(result.ok for result in self)

    def records(self) -> dict[str, dict]:
        """case id → :meth:`CaseResult.record`, JSON-ready (what a manifest writer stores per case)."""
        return {result.case: result.record() for result in self}

    def worst(self) -> dict[tuple[str, str], tuple[Row, Row]]:
        """(model, array) → (the row of the largest err/tol, the row of the largest err/(u·max|Q|)) over
        the cases."""
        out = {}
        for row in self.rows:
            by_ratio, by_units = out.get((row.model, row.name), (row, row))
            out[(row.model, row.name)] = (max(by_ratio, row, key=lambda r: r.ratio),
                                          max(by_units, row, key=lambda r: r.units))
        return out

    def summary(self) -> str:
        """The largest err/tol (and where) and units per model and array, the outputs not certified, the
        verdict."""
        lines = ["largest per model and array:"]
        lines += [f"  {model:<8}  {name:<11}  err/tol {r.ratio:.2e} ({r.case}{', ' + r.where if r.where else ''}),"
                  f"  err {w.units:.3g} u·max|Q| ({w.case})" for (model, name), (r, w) in self.worst().items()]
        missing = {}
        for result in self:
            missing.setdefault(result.model, {}).update(dict.fromkeys(result.not_certified))
        lines += [f"not certified ({model}): {', '.join(names)}" for model, names in missing.items() if names]
        failed = [row for row in self.rows if not row.ok]
        late = [result for result in self if result.over_time is not None]
        if late:
            lines.append(f"not certified, stopped at the time bound of {late[0].over_time:g} s: "
                         f"{', '.join(result.case for result in late)}")
        lines.append(f"{len(self.rows)} arrays of {len(self) - len(late)} cases: " + (
            f"{len(failed)} beyond their float64 tolerance: " + ", ".join(f"{r.case} {r.name}"
                                                                          f"{' ' + r.where if r.where else ''}"
                                                                          for r in failed)
            if failed else "every error within its float64 tolerance"))
        return "\n".join(lines)

    def __str__(self) -> str:
        width = max((len(result.case) for result in self), default=0)
        return "\n".join([line for result in self for line in result.lines(width)] + [self.summary()])


def measure(actual: np.ndarray, exact_values: np.ndarray, tol: Tolerance) -> tuple[float, float, float, float, tuple]:
    """(err, scale, ratio, bound, at) of a float64 array against an object array of mpf of the same shape
    under the tolerance ``tol`` (module docstring); the differences are formed from the unrounded mpf
    values, the bounds by :meth:`~ntpref.tolerance.Tolerance.element_bounds` from the exact values rounded to
    float64."""
    diff, rounded = differences(actual, exact_values)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        bound = tol.element_bounds(rounded)
        ratio = np.where(diff == 0, 0.0, np.where(bound > 0, diff / bound, np.inf))
    k = int(np.argmax(ratio)) if ratio.size else 0
    at = tuple(int(i) for i in np.unravel_index(k, ratio.shape)) if ratio.ndim else ()
    return (float(diff.max(initial=0.0)), float(np.abs(rounded).max(initial=0.0)),
            float(ratio.ravel()[k]) if ratio.size else 0.0, float(bound.ravel()[k]) if bound.size else 0.0, at)


def truncated(case: Case, steps: int) -> Case:
    """A train case cut to at most ``steps`` updates per stage (each input of the model's ``STEPS``: two-stage
    T0 and T, shallow and IndRNN steps, set to min(value, steps)); the case itself when it is not longer.
    The cut case's tolerances are the float64 policy's for the cut input: its trajectories are the first
    rows of the whole run's (for the two-stage model, stage 2 then starts from W_ov after min(T0, steps)
    updates), its final iterates those after the cut."""
    counts = exact_backend().MODELS[case.model].STEPS
    cut = {k: min(int(case.inputs[k]), steps) for k in counts}
    if all(int(case.inputs[k]) == v for k, v in cut.items()):
        return case
    inputs = {**case.inputs, **{k: np.array(v) for k, v in cut.items()}}
    return Case(f"{case.id}[:{steps}]", case.model, case.kind, case.source,
                f"{case.description} (at most {steps} updates per stage)", lambda: (inputs, None), backend=case.backend)


def _tolerances(case: Case, names: list[str]) -> dict[str, Tolerance]:
    """The case's float64 tolerance of every name: its recorded or computed ones, and for an intermediate it
    lacks (a random eval case has none stored) the policy's."""
    tols = dict(case.tolerances("float64", "bound"))
    missing = [n for n in names if n not in tols]
    if missing:
        tols.update(bound_tolerances(case.model, case.kind, case.inputs, dict.fromkeys(missing), backend=case.backend))
    return tols


def case_backend(case: Case, backend: str) -> str:
    """The oracle's backend certify runs ``case`` on: for "auto" the case's own (:attr:`Case.backend`: a stored
    case's Numba, a random case's the one that computed its expected values), else ``backend``."""
    return case.backend if backend == AUTO else check_backend(backend)


def certify_case(case: Case, backend: str = "numba", steps: int | None = None) -> CaseResult:
    """The certification of one case (module docstring); a train case cut to ``steps`` updates per stage
    (:func:`truncated`) when given, on :func:`case_backend`."""
    backend = case_backend(case, backend)
    exact = exact_backend()
    if case.kind not in KINDS:
        raise InputError(f"case '{case.id}' is of kind {case.kind!r}; certify takes {', '.join(KINDS)}")
    run = truncated(case, steps) if steps is not None and case.kind == "train" else case
    actual = {**compute(run.kind, run.inputs, backend), **intermediates(run.model, run.kind, run.inputs, backend)}
    start = time.perf_counter()
    exact_values = exact.compute(run.kind, run.inputs, as_float=False)
    seconds = time.perf_counter() - start
    module = exact.MODELS[run.model]
    names = [n for n in actual if n in exact_values]
    tols = _tolerances(run, names)
    rows = tuple(Row(case.id, case.model, name, *measure(actual[name], exact_values[name], tols[name]),
                     name in TRAJECTORIES and run.kind == "train") for name in names)
    not_certified = {n: module.NOT_COMPUTED.get(n, _NOT_COMPUTED) for n in actual if n not in exact_values}
    notes = tuple(f"input '{k}' = {np.asarray(run.inputs[k])} is not read: {why}"
                  for k, why in module.IGNORED.items() if k in run.inputs)
    calibrated = run.calibrate(exact_values) if run.kind in CASE_KINDS else None
    return CaseResult(case.id, case.model, case.kind, backend, None if run is case else steps, rows, not_certified,
                      notes, seconds, calibrated)


def certify(cases: Iterable[Case], backend: str = AUTO, steps: int | None = None) -> Report:
    """:func:`certify_case` of every case, in order."""
    return Report(certify_case(case, backend, steps) for case in cases)


def stored(root=None) -> dict[str, Case]:
    """id → every stored case certify takes (eval, train and the models' extra kinds, "ntk"), with their
    recorded tolerances."""
    return {case.id: case for case in stored_cases(root=root, kinds=KINDS)}


def select(names: Iterable[str], random: int, seed: int, root=None, kinds: Iterable[str] = KINDS) -> list[Case]:
    """The stored cases called ``names`` (every stored case of ``kinds`` when none is named), then the cases
    of ``kinds`` among the first ``random`` random cases per model from ``seed``."""
    names, kinds = list(names), tuple(kinds)
    known = stored(root)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"unknown case '{unknown[0]}'{did_you_mean(unknown[0], known)}; known: {', '.join(known)}")
    chosen = [known[n] for n in names] if names else [c for c in known.values() if c.kind in kinds]
    return chosen + [c for c in random_cases(None, random, seed) if c.kind in kinds]


@contextmanager
def time_bound(seconds: float | None):
    """Raise :class:`CaseTimeout` in this (the main) thread once ``seconds`` have passed inside the block (a
    real-time timer signal, SIGALRM: Python code, the exact backend's, stops at its next bytecode; a Numba
    kernel call at its return). None: no bound."""
    if seconds is None:
        yield
        return
    if not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread():
        raise InputError("--timeout needs a POSIX system and the main thread (a real-time timer signal)")

    def expire(signum, frame):
        raise CaseTimeout(seconds)

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, min(max(seconds, 1e-6), 2.0 ** 31))   # 0 would switch it off
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@contextmanager
def heartbeat(progress, case: str, done: int, total: int):
    """Progress of the command while case ``case`` (the ``done + 1``-th of ``total``) runs in the block:
    ``progress("certify", done, total)`` before and ``done + 1`` after it (the cases done, time elapsed and
    left: :class:`ntpref.progress.Progress`), and from a thread, every :data:`HEARTBEAT` seconds while it
    runs, a line ``certify: CASE running for 60 s (case 2 of 7)``, so a long case is never silent."""
    stop, start = threading.Event(), time.perf_counter()

    def beat():
        while not stop.wait(HEARTBEAT):
            progress.note(f"certify: {case} running for {time.perf_counter() - start:.0f} s "
                          f"(case {done + 1} of {total})")

    progress("certify", done, total)
    thread = threading.Thread(target=beat, daemon=True, name="ntpref-certify-progress")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    progress("certify", done + 1, total)


def _handle(args) -> int:
    if args.record and (args.steps is not None or args.backend == "numpy"):
        raise InputError("--record stores what certifies the stored files: whole runs of the numba backend "
                         "(no --steps, no --backend numpy)")
    random = args.random if args.random is not None else (0 if args.cases else DEFAULT_RANDOM)
    cases = select(args.cases, random, args.seed, args.root, args.kind or KINDS)
    width = max((len(case.id) for case in cases), default=0)
    report, progress = Report(), Progress(enabled=not args.quiet, every=0.0)   # a line per case
    for i, case in enumerate(cases):
        with heartbeat(progress, case.id, i, len(cases)):
            try:
                with time_bound(args.timeout):
                    result = certify_case(case, args.backend, args.steps)
            except CaseTimeout:
                result = CaseResult.timed_out(case, case_backend(case, args.backend), args.steps, args.timeout)
        report.append(result)
        print("\n".join(result.lines(width)), flush=True)
    print(report.summary())
    if args.record:
        known = stored(args.root)
        ratios = {r.case: {row.name: row.ratio for row in r.rows if math.isfinite(row.ratio)}
                  for r in report if r.case in known and r.over_time is None}
        calibrated = {r.case: r.calibrated for r in report if r.case in known and r.calibrated is not None}
        root = args.root or default_root()
        record_certified(root, ratios, calibrated)
        print(f"recorded the err/tol of {sum(map(len, ratios.values()))} arrays of {len(ratios)} stored cases "
              f"(ntpref verify shows them) and the calibrated tolerances of {len(calibrated)} cases in "
              f"{root}/manifest.json")
    return 0 if report.ok else 1


def register(subparsers) -> None:
    """Add ``ntpref certify [CASE ...] [--kind K] [--steps N] [--random N] [--seed S] [--backend auto|numba|numpy]
    [--root DIR]``."""
    text = "measure the oracle's float64 outputs (eval, train trajectories, NTK) against the exact backend"
    p = subparsers.add_parser("certify", help=text, description=text + " (mpmath, 50 digits, from the same "
                              "float64 inputs): per case and array the largest error in units of u·max|value| "
                              "and as a fraction of the case's float64 tolerance, at every element (every step of "
                              "a trajectory), and where it is largest (docs/exact.md). Exit 0 every error within "
                              "its tolerance, 1 any beyond or a case stopped at --timeout, 2 usage error.")
    p.add_argument("cases", nargs="*", metavar="CASE",
                   help="stored cases (default: every stored case of the selected kinds)")
    p.add_argument("--kind", action="append", choices=KINDS,
                   help="only cases of this kind (repeatable; default every kind)")
    p.add_argument("--steps", type=integer_at_least(1), metavar="N",
                   help="cut train cases to at most N updates per stage (the first N steps; tolerances then "
                        "those of the float64 policy for the cut run). Default: the whole run")
    p.add_argument("--random", type=integer_at_least(0), metavar="N",
                   help=f"the cases among N random cases per model (default {DEFAULT_RANDOM}, 0 when CASE is "
                        "given)")
    p.add_argument("--seed", type=integer_at_least(0), default=0, metavar="S",
                   help="seed of the random cases (default 0)")
    p.add_argument("--backend", choices=CHOICES, default=AUTO,
                   help="the oracle's backend: 'auto' (the default) is each case's own, the stored cases' numba "
                        "(their stored values) and for a random case the one 'ntpref eval --backend auto' picks "
                        "for its input (numpy at their sizes)")
    p.add_argument("--root", metavar="DIR", help="reference directory of the stored cases (default: as ntpref verify)")
    p.add_argument("--timeout", type=positive_argument, metavar="SECONDS",
                   help="time bound of each case: a case still running after it is stopped and reported as not "
                        "certified (exit 1). Default: none")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--record", action="store_true",
                   help="store each stored case's certified err/tol per array in the manifest (ntpref verify "
                        "prints it) and its calibrated tolerances (what ntpref conformance judges by); regen, "
                        "which rewrites values or tolerances, drops both")
    p.set_defaults(func=_handle)
