"""``ntpref certify``: the oracle's float64 ``eval`` outputs measured against the exact backend
(:mod:`ntpref.exact`, docs/exact.md).

For every eval case and every output array Q, with Q̂ the oracle's float64 result and Q the
multiprecision value (50 digits, taken unrounded),

    err = max |Q̂ − Q|,   units = err / (u · max |Q|)  (u = 2⁻⁵³),   ratio = err / atol

where atol is the case's float64 tolerance (``case.tolerances("float64")[name]["atol"]``, the policy of
docs/tolerance.md, which every correct float64 implementation must meet). The oracle is certified on a
case when every ratio is ≤ 1. ``units`` says how many roundings of the array's largest entry the error
is worth; an array that is exactly 0 in exact arithmetic (f at the paired initialisation) has units 0
when the oracle returns exact zeros, and inf otherwise.

The exact backend needs mpmath (a test dependency of ntpref); it is imported when a certification runs.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from ..checks import check_backend, did_you_mean, integer_at_least
from ..errors import InputError
from . import contract
from .cases import DEFAULT_RANDOM, Case, random_cases, stored_cases

#: Unit roundoff of float64.
U = 2.0 ** -53


class Row(NamedTuple):
    """One array of one case: the oracle's largest error ``err``, ``scale`` = max |Q| of the exact values,
    and the case's float64 ``atol``."""

    case: str
    model: str
    name: str
    err: float
    scale: float
    atol: float

    @property
    def units(self) -> float:
        """err / (u · max |Q|): 0 for no error, inf for an error on an array that is exactly 0."""
        return 0.0 if self.err == 0 else (self.err / (U * self.scale) if self.scale > 0 else math.inf)

    @property
    def ratio(self) -> float:
        """err / atol."""
        return self.err / self.atol

    @property
    def ok(self) -> bool:
        return self.err <= self.atol

    def line(self, width: int = 0) -> str:
        """``case  array  err E = N u·max|Q| = R atol  ok|FAIL``, the case name padded to ``width``."""
        return (f"{self.case:<{width}}  {self.name:<10}  err {self.err:.2e} = {self.units:7.3g} u·max|Q| = "
                f"{self.ratio:.2e} atol  {'ok' if self.ok else 'FAIL'}")


class Report(list):
    """The :class:`Row` of every array of every certified case, in case order."""

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self)

    def worst(self) -> dict[tuple[str, str], tuple[Row, Row]]:
        """(model, array) → (the row of the largest err/atol, the row of the largest err/(u·max|Q|)) over
        the cases."""
        out = {}
        for row in self:
            by_ratio, by_units = out.get((row.model, row.name), (row, row))
            out[(row.model, row.name)] = (max(by_ratio, row, key=lambda r: r.ratio),
                                          max(by_units, row, key=lambda r: r.units))
        return out

    def __str__(self) -> str:
        width = max((len(row.case) for row in self), default=0)
        lines = [row.line(width) for row in self]
        lines.append("largest per model and array:")
        lines += [f"  {model:<8}  {name:<10}  err/atol {r.ratio:.2e} ({r.case}),  "
                  f"err {w.units:.3g} u·max|Q| ({w.case})" for (model, name), (r, w) in self.worst().items()]
        failed = sum(not row.ok for row in self)
        cases = len({row.case for row in self})
        lines.append(f"{len(self)} arrays of {cases} cases: " +
                     (f"{failed} beyond atol" if failed else "every error within the float64 tolerance"))
        return "\n".join(lines)


def _exact():
    try:
        from .. import exact
    except ModuleNotFoundError as exc:
        if exc.name != "mpmath":
            raise
        raise InputError("the exact backend needs mpmath: pip install mpmath") from None
    return exact


def errors(actual: np.ndarray, exact_values: np.ndarray) -> tuple[float, float]:
    """(max |actual − exact|, max |exact|) of a float64 array against an object array of mpf of the same
    shape; the differences are formed from the unrounded mpf values."""
    if np.shape(actual) != exact_values.shape:
        raise InputError(f"shape {list(np.shape(actual))} against the exact {list(exact_values.shape)}")
    pairs = zip(np.asarray(actual, dtype=np.float64).ravel().tolist(), exact_values.ravel().tolist())
    err = max((float(abs(q - a)) for a, q in pairs), default=0.0)
    return err, max((float(abs(q)) for q in exact_values.ravel().tolist()), default=0.0)


def certify(cases: Iterable[Case], backend: str = "numba") -> Report:
    """The oracle's error on every output array of every eval case (module docstring): the oracle's
    ``contract.evaluate(case.inputs, backend)`` against ``ntpref.exact.evaluate(case.inputs)``, judged by
    the case's float64 tolerances. InputError for a case that is not of kind "eval"."""
    check_backend(backend)
    exact = _exact()
    report = Report()
    for case in cases:
        if case.kind != "eval":
            raise InputError(f"case '{case.id}' is a {case.kind} case; certify takes eval cases")
        actual = contract.evaluate(case.inputs, backend)
        exact_values = exact.evaluate(case.inputs, as_float=False)
        tolerances = case.tolerances("float64")
        for name, values in exact_values.items():
            with exact.arith.precision():
                err, scale = errors(actual[name], values)
            report.append(Row(case.id, case.model, name, err, scale, tolerances[name]["atol"]))
    return report


def select(names: Iterable[str], random: int, seed: int, root=None) -> list[Case]:
    """The stored eval cases called ``names`` (all of them when none is named), then the eval cases among
    the first ``random`` random cases per model from ``seed``."""
    names = list(names)
    stored = {case.id: case for case in stored_cases(root=root)}
    unknown = [n for n in names if n not in stored]
    if unknown:
        raise InputError(f"unknown case '{unknown[0]}'{did_you_mean(unknown[0], stored)}; known: {', '.join(stored)}")
    chosen = [stored[n] for n in names] if names else [c for c in stored.values() if c.kind == "eval"]
    return chosen + [c for c in random_cases(None, random, seed) if c.kind == "eval"]


def _handle(args) -> int:
    random = args.random if args.random is not None else (0 if args.cases else DEFAULT_RANDOM)
    report = certify(select(args.cases, random, args.seed, args.root), args.backend)
    print(report)
    return 0 if report.ok else 1


def register(subparsers) -> None:
    """Add ``ntpref certify [CASE ...] [--random N] [--seed S] [--backend numba|numpy] [--root DIR]``."""
    text = "measure the oracle's float64 eval outputs against the exact (50-digit mpmath) backend"
    p = subparsers.add_parser("certify", help=text, description=text + ": per case and array the error in units of "
                              "u·max|value| and as a fraction of the case's float64 atol (docs/exact.md). Exit 0 "
                              "every error within atol, 1 any beyond, 2 usage error.")
    p.add_argument("cases", nargs="*", metavar="CASE", help="stored eval cases (default: every stored eval case)")
    p.add_argument("--random", type=integer_at_least(0), metavar="N",
                   help=f"the eval cases among N random cases per model (default {DEFAULT_RANDOM}, 0 when CASE "
                        "is given)")
    p.add_argument("--seed", type=integer_at_least(0), default=0, metavar="S",
                   help="seed of the random cases (default 0)")
    p.add_argument("--backend", choices=("numba", "numpy"), default="numba", help="the oracle's backend")
    p.add_argument("--root", metavar="DIR", help="reference directory of the stored cases (default: as ntpref verify)")
    p.set_defaults(func=_handle)
