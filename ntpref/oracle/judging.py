"""Judging one conformance case (:func:`check`): the adapter run on the case's inputs, its outputs compared
with the oracle's under the chosen tolerance policy and precision, a failing calibrated array annotated
with its err/tol under the bound, the failing quantity computed first named, and the arrays whose tolerance
admits every value (unchecked, docs/tolerance.md) set apart."""
from __future__ import annotations

import time
from collections.abc import Mapping

import numpy as np

from ..models import SPECS
from ..tolerance import Tolerance
from .adapters import FUNCTIONS, Adapter, AdapterError, adapter_code, load_adapter
from .cases import TRAJECTORIES, Case
from .command_adapter import CaseError
from .compare import Row, compare_arrays, compare_one
from .policies import check_policy
from .policies.envelope import ENVELOPE_MULTIPLE
from .report import CaseReport

LABELS = ("oracle", "adapter")
def unchecked_arrays(expected: Mapping[str, np.ndarray], tols: Mapping[str, Tolerance],
                     rows: list[Row]) -> list[str]:
    """The compared arrays of ``rows`` that passed under a tolerance admitting every value of their quantity
    (:meth:`ntpref.tolerance.Tolerance.admits_every_value`): a pass says nothing about them."""
    return [r.name for r in rows if r.ok and r.ratio is not None and tols[r.name].admits_every_value(expected[r.name])]


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


def _first_failing_step(name: str, expected: np.ndarray, actual: np.ndarray, tol: Tolerance) -> int:
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
        if r.ok or r.name not in actual or np.shape(actual[r.name]) != np.shape(expected[r.name]):
            continue                 # a wrong shape has no place in the run; a non-finite value has
        times = timeline(r.name, expected)
        step = None
        if r.name in TRAJECTORIES and np.ndim(times):
            step = _first_failing_step(r.name, expected[r.name], actual[r.name], tols[r.name])
        when = float(times[step] if step is not None else times)
        if earliest is None or when < earliest:
            first, earliest = (r.name, step), when
    return first


#: What the "bound" policy is at each precision, as the note of a failing calibrated array names it, and
#: what an error within it is consistent with.
BOUNDS = {"float64": ("err/bound", "the guaranteed bound",
                      "consistent with a correct program that sums in another order, and with a slightly wrong "
                      "constant (an error of a few rounding units)"),
          "float32": (f"err/({ENVELOPE_MULTIPLE:g} envelopes)", "the float32 envelope's tolerance",
                      "consistent with float32 rounding in another order, and with a slightly wrong constant")}


def _against_bound(case: Case, precision: str, rows: list[Row], expected: Mapping, actual: Mapping,
                   tols: Mapping) -> list[Row]:
    """``rows`` with every array that fails a calibrated tolerance annotated with its err/tol under the
    ``precision``'s "bound" policy: in float64 the running error bound, the guaranteed one (docs/tolerance.md):
    within it, the error is one no analysis rules out for a correct float64 program, however unlikely; beyond
    it, no correct program makes it. In float32 the envelope, the worst case of float32 rounding it measures."""
    bound, (label, what, consistent) = case.tolerances(precision, "bound"), BOUNDS[precision]
    out = []
    for r in rows:
        if not r.ok and r.ratio is not None and tols[r.name] != bound[r.name]:   # calibrated
            ratio = compare_one(r.name, expected[r.name], actual[r.name], bound[r.name]).ratio
            verdict = (f"within {what}: {consistent}" if ratio <= 1 else
                       f"beyond {what}: no correct program makes this error")
            r = r._replace(note=f"{r.note}; {label} {ratio:.1e}: {verdict}")
        out.append(r)
    return out


def check(adapter, case: Case, precision: str = "float64", policy: str | None = None) -> CaseReport:
    """Run ``case`` through the adapter (path, module, object or dict; see :func:`load_adapter`) and
    compare with the oracle under the tolerance ``policy`` at ``precision`` (:meth:`Case.tolerances`:
    "calibrated", the default, or "bound", the running error bound in float64 and the envelope in float32).
    Under the calibrated policy a failing array's note gives its err/tol under "bound" too
    (:func:`_against_bound`).

    Raises AdapterError when the adapter raises anything but a signal's interruption (its exception is
    the ``__cause__``) or returns something other than a dict of arrays; NotImplementedError gives a
    skipped report, :class:`CaseError` (a command's failure on this case) a failed one."""
    policy = check_policy(precision, policy)
    adapter = load_adapter(adapter)
    start = time.perf_counter()
    fn = adapter.function(case.kind)
    if fn is None:
        return CaseReport(case, precision, skipped=f"the adapter defines no {FUNCTIONS[case.kind]}()")
    expected, tols = case.expected, case.tolerances(precision, policy)
    inputs = {k: np.array(v) for k, v in case.inputs.items() if k != "model"}
    with adapter_code(_where(adapter, case)):
        try:
            returned = fn(case.model, inputs)
        except NotImplementedError as exc:
            return CaseReport(case, precision, skipped=str(exc) or "NotImplementedError",
                              seconds=time.perf_counter() - start)
        except CaseError as exc:
            return CaseReport(case, precision, error=str(exc), seconds=time.perf_counter() - start)
        actual = _outputs(returned, adapter, case, precision)   # the adapter's objects run code as they convert
    names = [n for n in expected if n in actual]
    rows = compare_arrays(expected, actual, tols, names=names, labels=LABELS).rows
    if policy == "calibrated":
        rows = _against_bound(case, precision, rows, expected, actual, tols)
    outputs = SPECS[case.model].outputs(case.kind)      # intermediates left out are not "not returned"
    return CaseReport(case, precision, rows=rows, unknown=[n for n in actual if n not in expected],
                      not_returned=[n for n in expected if n not in actual and n in outputs],
                      departure=_departure(case, rows, expected, actual, tols),
                      seconds=time.perf_counter() - start, unchecked=unchecked_arrays(expected, tols, rows))

