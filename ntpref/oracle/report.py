"""What ``ntpref conformance`` reports (docs/conformance.md, "Reading the report"): a case's outcome
(:class:`CaseReport`: its rows, its one-line summary, its JSON form) and a whole run's verdict
(:class:`RunReport`: the required outputs never compared, the last line of the command)."""
from __future__ import annotations

from collections.abc import Iterable

import numpy as np
from tabulate import tabulate

from ..models import SPECS
from .cases import Case

#: Outputs a run passes without: every model's diagnostics (the two-stage max-margin solutions and the
#: correlations with them, a QP solver's).
OPTIONAL = frozenset(name for spec in SPECS.values() for name in spec.diagnostics)


class CaseReport:
    """The outcome of one case: ``rows`` (one compared array each, :class:`ntpref.oracle.compare.Row`),
    ``unknown`` (returned names the oracle does not output), ``not_returned``, ``skipped`` (the reason,
    or None), ``departure`` ((array, step) of the failing quantity computed first, step None unless it is a
    per-step log; None when nothing failed),
    ``error`` (why the implementation produced no outputs for the case, a :class:`CaseError`, or None),
    ``coarse`` (array → the error its tolerance admits relative to its largest entry, for the compared arrays
    :func:`coarse_arrays` names).
    ``ok`` is True when the case passed or was skipped; ``str(report)`` is its table and summary."""

    def __init__(self, case: Case, precision: str, rows=(), unknown=(), not_returned=(), skipped=None,
                 departure=None, seconds=0.0, error=None, coarse=None):
        self.case, self.precision, self.coarse = case, precision, dict(coarse or {})
        self.rows, self.unknown, self.not_returned = list(rows), list(unknown), list(not_returned)
        self.skipped, self.departure, self.seconds, self.error = skipped, departure, seconds, error

    @property
    def ok(self) -> bool:
        return self.skipped is not None or (self.error is None and bool(self.rows) and not self.unknown
                                            and all(r.ok for r in self.rows))

    @property
    def status(self) -> str:
        return "skip" if self.skipped is not None else "pass" if self.ok else "FAIL"

    def table_rows(self, verbose: bool = True) -> list[tuple]:
        """(case, array, max abs err, max rel err, tolerance, err/tol, verdict) of every array (failures
        only unless ``verbose``), then one row per unknown name."""
        out = []
        for r in self.rows:
            if verbose or not r.ok:
                out.append((self.case.id, r.name, _fmt(r.max_abs_err), _fmt(r.max_rel_err), r.tolerance,
                            _fmt(r.ratio, ".1e"), ("ok" if r.ok else "FAIL") + (f" ({r.note})" if r.note else "")))
        out += [(self.case.id, n, "-", "-", "-", "-", f"FAIL (not an output of ntpref {self.case.kind})")
                for n in self.unknown]
        return out

    def summary(self) -> str:
        """One line: verdict, case id and what happened (for a command's failure, then the last lines of its
        stderr)."""
        head = f"{self.status:4s}  {self.case.id}"
        if self.skipped is not None:
            return f"{head}: skipped: {self.skipped}"
        if self.error is not None:
            return f"{head}: {self.error}"
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
        if self.coarse:
            text += (f"; checked only coarsely (the {self.precision} tolerance admits errors up to this fraction of the array's "
                     f"largest entry): " + ", ".join(f"{n} {r:.1g}" for n, r in self.coarse.items()))
        return text

    def table(self, verbose: bool = True) -> str:
        return table_text(self.table_rows(verbose))

    def __str__(self) -> str:
        return f"{self.table()}\n{self.summary()}"

    __repr__ = __str__   # the whole table wherever the report is shown, e.g. in an assertion message

    def to_dict(self) -> dict:
        """JSON-ready form of the report."""
        rows = [{"array": r.name, "shape": list(r.shape), "max_abs_err": _number(r.max_abs_err),
                 "max_rel_err": _number(r.max_rel_err), "tolerance": r.tolerance,
                 "err/tol": _number(r.ratio), "ok": r.ok, "note": r.note} for r in self.rows]
        return {"case": self.case.id, "model": self.case.model, "kind": self.case.kind, "source": self.case.source,
                "description": self.case.description, "status": self.status, "skipped": self.skipped,
                "error": self.error,
                "rows": rows, "unknown": self.unknown, "not_returned": self.not_returned,
                "departure": None if self.departure is None else {"array": self.departure[0], "step": self.departure[1]},
                "coarse": {n: _number(r) for n, r in self.coarse.items()}, "seconds": round(self.seconds, 3)}


def _number(x: float | None) -> float | str | None:
    """A float for JSON: "inf" / "nan" as strings (JSON has no such numbers)."""
    return x if x is None or np.isfinite(x) else str(x)


def _fmt(x, spec: str = ".3e") -> str:
    return "-" if x is None else format(x, spec)


def table_text(rows: list[tuple]) -> str:
    """The table of conformance rows (:meth:`CaseReport.table_rows`), "(no rows)" when there are none."""
    headers = ("case", "array", "max abs err", "max rel err", "tolerance", "err/tol", "verdict")
    return tabulate(rows, headers=headers, disable_numparse=True) if rows else "(no rows)"


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
        coarse = sum(len(r.coarse) for r in self)
        coarse = f", {coarse} of them only coarsely" if coarse else ""
        return (f"{len(self)} cases: {counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped; "
                f"{arrays} arrays compared{coarse}: {verdict}")
