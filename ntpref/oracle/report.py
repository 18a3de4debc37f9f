"""What ``ntpref conformance`` reports (docs/conformance.md, "Reading the report"): a case's outcome
(:class:`CaseReport`: its rows, its one-line summary, its JSON form) and a whole run's verdict
(:class:`RunReport`: the required outputs never compared, the outputs left out of some cases, the arrays
left unchecked, the models never checked, the last line of the command)."""
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
    ``unchecked`` (the compared arrays that passed under a tolerance admitting every value of their quantity:
    a pass says nothing about them, docs/tolerance.md), ``left_out`` (outputs of this case that the adapter
    returned on another case of the same model and kind, name → that case's id: set by the run,
    :meth:`RunReport.settle`; they fail the case).
    ``ok`` is True when the case passed or was skipped; ``str(report)`` is its table and summary."""

    def __init__(self, case: Case, precision: str, rows=(), unknown=(), not_returned=(), skipped=None,
                 departure=None, seconds=0.0, error=None, unchecked=()):
        self.case, self.precision, self.unchecked = case, precision, list(unchecked)
        self.rows, self.unknown, self.not_returned = list(rows), list(unknown), list(not_returned)
        self.skipped, self.departure, self.seconds, self.error = skipped, departure, seconds, error
        self.left_out: dict[str, str] = {}

    @property
    def ok(self) -> bool:
        return self.skipped is not None or (self.error is None and bool(self.rows) and not self.unknown
                                            and not self.left_out and all(r.ok for r in self.rows))

    @property
    def status(self) -> str:
        return "skip" if self.skipped is not None else "pass" if self.ok else "FAIL"

    def table_rows(self, verbose: bool = True) -> list[tuple]:
        """(case, array, max abs err, max rel err, tolerance, err/tol, verdict) of every array (failures
        only unless ``verbose``), then one row per unknown name."""
        out = []
        for r in self.rows:
            if verbose or not r.ok or r.name in self.unchecked:
                verdict = ("unchecked (its tolerance admits every value)" if r.name in self.unchecked
                           else ("ok" if r.ok else "FAIL") + (f" ({r.note})" if r.note else ""))
                out.append((self.case.id, r.name, _fmt(r.max_abs_err), _fmt(r.max_rel_err), r.tolerance,
                            _fmt(r.ratio, ".1e"), verdict))
        out += [(self.case.id, n, "-", "-", "-", "-", f"FAIL (not an output of ntpref {self.case.kind})")
                for n in self.unknown]
        out += [(self.case.id, n, "-", "-", "-", "-", f"FAIL (not returned here; returned on case {other})")
                for n, other in self.left_out.items()]
        return out

    def summary(self) -> str:
        """One line: verdict, case id and what happened (for a command's failure, then the last lines of its
        stderr)."""
        head = f"{self.status:4s}  {self.case.id}"
        if self.skipped is not None:
            return f"{head}: skipped: {self.skipped}"
        if self.error is not None:
            return f"{head}: {self.error}"
        n_ok = sum(r.ok and r.name not in self.unchecked for r in self.rows)
        text = f"{head}: {n_ok}/{len(self.rows)} arrays within tolerance"
        if self.unchecked:
            text += f", {len(self.unchecked)} unchecked ({', '.join(self.unchecked)}: the tolerance admits every value)"
        failing = [r.name for r in self.rows if not r.ok] + self.unknown + list(self.left_out)
        if not self.rows:
            return text + f" (the adapter returned none of the outputs: {', '.join(self.case.expected)})"
        if failing:
            text += f"; failing: {', '.join(failing)}"
        if self.departure and self.departure[1] is not None:
            text += f"; leaves tolerance first at step {self.departure[1]} of {self.departure[0]}"
        elif self.departure and len(failing) > 1:
            text += f"; first wrong in the order of computation: {self.departure[0]}"
        if self.left_out:
            text += "; left out here, returned on another case: " + ", ".join(
                f"{n} (case {other})" for n, other in self.left_out.items())
        others = [n for n in self.not_returned if n not in self.left_out]
        if others:
            text += f"; not returned: {', '.join(others)}"
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
                "description": self.case.description, "backend": self.case.backend, "status": self.status, "skipped": self.skipped,
                "error": self.error,
                "rows": rows, "unknown": self.unknown, "not_returned": self.not_returned, "left_out": self.left_out,
                "departure": None if self.departure is None else {"array": self.departure[0], "step": self.departure[1]},
                "unchecked": self.unchecked, "seconds": round(self.seconds, 3)}


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
    ``never_compared`` (the required outputs, not in ``skip_outputs``, that no case returned), ``unaccepted``
    (the outputs compared only under tolerances that admit every value, not in ``accept_unchecked``),
    ``never_checked`` (the models and kinds whose every case was skipped), ``ok`` and ``total()``."""

    def __init__(self, reports: Iterable[CaseReport] = (), skip_outputs: Iterable[str] = (),
                 accept_unchecked: Iterable[str] = ()):
        super().__init__(reports)
        self.skip_outputs = frozenset(skip_outputs)
        self.accept_unchecked = frozenset(accept_unchecked)

    def settle(self) -> list[CaseReport]:
        """Fail every case that leaves out an output the adapter returned on another case of the same model and
        kind (its ``left_out``), and return the reports this changed."""
        returned: dict[tuple[str, str], dict[str, str]] = {}
        for r in self:
            for row in r.rows:
                returned.setdefault((r.case.model, r.case.kind), {}).setdefault(row.name, r.case.id)
        changed = []
        for r in self:
            there = returned.get((r.case.model, r.case.kind), {})
            left_out = {n: there[n] for n in r.not_returned if n in there}
            if left_out != r.left_out:
                r.left_out = left_out
                changed.append(r)
        return changed

    @property
    def never_compared(self) -> list[str]:
        """Outputs of the cases run that no case compared, less the :data:`OPTIONAL` and skipped ones."""
        compared = {row.name for r in self for row in r.rows}
        missing = dict.fromkeys(n for r in self for n in r.not_returned)
        return [n for n in missing if n not in compared and n not in OPTIONAL and n not in self.skip_outputs]

    @property
    def unchecked(self) -> dict[str, int]:
        """Every array unchecked on some case (its tolerance there admits every value) → on how many cases."""
        counts: dict[str, int] = {}
        for r in self:
            for n in r.unchecked:
                counts[n] = counts.get(n, 0) + 1
        return counts

    @property
    def only_unchecked(self) -> list[str]:
        """The outputs compared on some case and unchecked on every case that compared them: under tolerances
        that can fail in no case at all, so the run checked nothing of them."""
        checked = {row.name for r in self for row in r.rows if row.name not in r.unchecked}
        return [n for n in self.unchecked if n not in checked]

    @property
    def unaccepted(self) -> list[str]:
        """The :attr:`only_unchecked` outputs not named in ``accept_unchecked``: they fail the run."""
        return [n for n in self.only_unchecked if n not in self.accept_unchecked]

    @property
    def never_checked(self) -> list[str]:
        """"MODEL (KIND, ...)" for every model some of whose kinds had cases that were all skipped."""
        groups: dict[str, dict[str, bool]] = {}
        for r in self:
            kinds = groups.setdefault(r.case.model, {})
            kinds[r.case.kind] = kinds.get(r.case.kind, True) and r.skipped is not None
        out = []
        for model, kinds in groups.items():
            skipped = [k for k, all_skipped in kinds.items() if all_skipped]
            if skipped:
                out.append(f"{model} ({', '.join(skipped)})")
        return out

    @property
    def ok(self) -> bool:
        """No case failed, at least one array was compared, every required output was, and every output that
        was unchecked on every case comparing it is accepted."""
        return (all(r.ok for r in self) and any(r.rows for r in self) and not self.never_compared
                and not self.unaccepted)

    def total(self) -> str:
        """One line: the counts of cases and arrays and the verdict, saying what was not checked."""
        counts = {s: sum(r.status == s for r in self) for s in ("pass", "FAIL", "skip")}
        arrays = sum(len(r.rows) for r in self)
        unchecked = sum(len(r.unchecked) for r in self)
        verdict = "PASS" if self.ok else "FAIL"
        reasons = []
        if self.never_compared:
            reasons.append(f"{', '.join(self.never_compared)} never compared "
                           "(returned by no case; --skip-output NAME to accept)")
        if self.unaccepted:
            reasons.append(f"{', '.join(self.unaccepted)} never checked (on every case its tolerance admits every "
                           "value; --accept-unchecked NAME to accept)")
        accepted = [n for n in self.only_unchecked if n in self.accept_unchecked]
        if accepted:
            reasons.append(f"accepted unchecked: {', '.join(accepted)}")
        verdict += (": " + "; ".join(reasons)) if reasons else ""
        if not arrays and not counts["FAIL"]:
            verdict += " (nothing was compared)"
        unchecked_text = (f", {unchecked} of them unchecked (" + ", ".join(
            n if k == 1 else f"{n} on {k} cases" for n, k in self.unchecked.items()) + ")") if unchecked else ""
        never = f" [never checked: {', '.join(self.never_checked)}]" if self.never_checked else ""
        return (f"{len(self)} cases: {counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped{never}; "
                f"{arrays} arrays compared{unchecked_text}: {verdict}")
