"""The three sweeps of the mutation benchmark (benchmarks/mutations.py), NumPy only: each runs
implementations through :func:`ntpref.oracle.conformance.check` and keeps one JSON-ready record per
case (and array).

  perturbations  the oracle's own outputs with one array multiplied elementwise by (1 + 10^-k ξ), ξ = ±1
                 per entry (a fixed draw per case and array, the same for every k), k = 2..12, judged in
                 float64 and in float32 mode: which k are caught, and whether the report's departure names
                 the perturbed array
  bugs           :class:`Bug`: an implementation with one injected bug, on every case of its model: caught or
                 not, the departure against the bug's *origin* (the first quantity it changes in the model's
                 order of computation), and on a passing case how much the bug changed the outputs
  family         :class:`Member`: a correct implementation, on every case of its models: the error of every
                 array as a multiple of its tolerance (err/tol), a failing case being a false failure
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple

import numpy as np

from ntpref.models import SPECS
from ntpref.oracle.adapters import FUNCTIONS
from ntpref.oracle.cases import Case
from ntpref.oracle.compare import compare_one
from ntpref.oracle.conformance import CaseReport, check, load_adapter

#: The exponents k of the relative perturbations 10^-k.
EXPONENTS = tuple(range(2, 13))
PRECISIONS = ("float64", "float32")
#: A passing bug that changes some output by more than this (relative to the array's largest entry)
#: acts on the case and is missed there; below it the bug does not act on the case.
ACTS = 1e-12

Origin = Callable[[Case], tuple[str, "int | None"]]


class Bug(NamedTuple):
    """An implementation with one injected bug: ``name``, the ``model`` it is run on, the ``adapter``
    (anything :func:`check` takes) and ``origin(case)``: the (array, step) of the first quantity the bug
    changes in the model's order of computation (step None unless the array is a per-step log)."""

    name: str
    model: str
    adapter: object
    origin: Origin


class Member(NamedTuple):
    """A correct implementation: ``name``, the ``precision`` it is judged in, its ``adapter`` and the
    ``models`` it implements."""

    name: str
    precision: str
    adapter: object
    models: tuple[str, ...]


# --- origins ---------------------------------------------------------------------------------------
def at(array: str, step: int | None = None) -> Origin:
    """The origin ``(array, step)`` whatever the case."""
    return lambda case: (array, step)


def by_kind(evaluation: Origin, training: Origin) -> Origin:
    """``evaluation`` on an eval case, ``training`` on a train case."""
    return lambda case: (evaluation if case.kind == "eval" else training)(case)


def first_update(case: Case) -> tuple[str, int]:
    """The first logged quantity after the first ProjGD / ProjSGD update: val_loss[0] (at θ(1)) with a
    validation set, else train_loss[1]."""
    return ("val_loss", 0) if "X_val" in case.inputs else ("train_loss", 1)


def forward(case: Case) -> tuple[str, int | None]:
    """The first output of the forward pass: attn (two-stage) or f in evaluation; in training the first
    loss computed with the attention or the model output: stage2_loss[0] (two-stage), train_loss[0]."""
    if case.kind == "eval":
        return ("attn" if case.model == "twostage" else "f"), None
    return ("stage2_loss" if case.model == "twostage" else "train_loss"), 0


def moment(case: Case, array: str, step: int | None) -> float:
    """When ``array`` (at ``step`` of a per-step log) is computed, in the model's order of computation."""
    times = SPECS[case.model].timeline(array, case.expected)
    return float(times[step] if step is not None and np.ndim(times) else times)


def placement(case: Case, departure: tuple[str, int | None], origin: tuple[str, int | None]) -> str:
    """Where the report's departure lies against the bug's origin: "origin" (the same quantity), "later"
    (the origin stayed within its tolerance) or "earlier" (the checker blames a quantity computed before
    anything the bug changes)."""
    if departure is None:
        return "none"
    dep, ori = moment(case, *departure), moment(case, *origin)
    return "origin" if dep == ori else "later" if dep > ori else "earlier"


# --- perturbations ---------------------------------------------------------------------------------
def signs(case: Case, array: str) -> np.ndarray:
    """ξ = ±1 per entry of ``array``, drawn from a generator seeded by the case id and the array name."""
    rng = np.random.default_rng(list(f"{case.id}/{array}".encode()))
    return rng.choice((-1.0, 1.0), size=np.shape(case.expected[array]))


def perturbed(case: Case, array: str, k: int) -> dict:
    """An adapter returning the oracle's outputs of ``case`` with ``array`` multiplied by (1 + 10^-k ξ)."""
    expected = case.expected
    wrong = expected[array] * (1.0 + 10.0 ** -k * signs(case, array))
    return {FUNCTIONS[case.kind]: lambda model, inputs: {**expected, array: wrong}}


def perturbation_sweep(selected: Iterable[Case], precisions: Sequence[str] = PRECISIONS,
                       exponents: Sequence[int] = EXPONENTS, arrays: Sequence[str] | None = None,
                       policy: str | None = None) -> list[dict]:
    """One record per (case, floating-point output, precision): ``visible`` (the array has a non-zero
    entry, so that a relative perturbation moves it), ``caught`` (the exponents k whose perturbation
    fails the case), ``k_star`` (the largest k caught: 10^-k_star is the smallest perturbation caught;
    None when none is) and ``named`` (the exponents caught whose departure names the perturbed
    array). ``arrays``: only these outputs (default all); ``policy``: the tolerance policy of both
    precisions (default calibrated)."""
    records = []
    for case in selected:
        for precision in precisions:
            for array, value in case.expected.items():
                if value.dtype.kind != "f" or (arrays is not None and array not in arrays):
                    continue
                record = {"case": case.id, "model": case.model, "kind": case.kind, "array": array,
                          "precision": precision, "visible": bool(np.any(value != 0)), "caught": [], "named": []}
                for k in exponents if record["visible"] else ():
                    report = check(perturbed(case, array, k), case, precision, policy)
                    if not report.ok:
                        record["caught"].append(k)
                        if report.departure[0] == array:
                            record["named"].append(k)
                record["k_star"] = max(record["caught"], default=None)
                records.append(record)
    return records


# --- bugs ------------------------------------------------------------------------------------------
def _recording(adapter) -> tuple[dict, dict]:
    """(an adapter calling ``adapter`` and keeping what it returned, {"outputs": the last outputs})."""
    loaded, last = load_adapter(adapter), {}

    def keep(fn):
        def call(model, inputs):
            last["outputs"] = {k: np.asarray(v) for k, v in fn(model, inputs).items()}
            return last["outputs"]
        return call
    return {FUNCTIONS[k]: keep(loaded.function(k)) for k in FUNCTIONS if loaded.function(k)}, last


def change(outputs: dict, reference: dict) -> tuple[str | None, float]:
    """(array, size) of the largest change of ``outputs`` against ``reference``: max |Δ| over the array's
    largest |reference| entry (max |Δ| itself where the reference is 0), over the arrays both hold."""
    worst = (None, 0.0)
    for name in outputs.keys() & reference.keys():
        a, r = np.asarray(outputs[name], dtype=float), np.asarray(reference[name], dtype=float)
        if a.shape != r.shape:
            return name, float("inf")
        scale = float(np.max(np.abs(r), initial=0.0))
        size = float(np.max(np.abs(a - r), initial=0.0)) / (scale if scale > 0 else 1.0)
        if size > worst[1]:
            worst = (name, size)
    return worst


def origin_move(case: Case, origin: tuple[str, int | None], outputs: dict, reference: dict,
                policy: str | None = None) -> float | None:
    """How far the bug moves its origin: err/tol of ``outputs`` against the bug-free ``reference`` at the
    origin (a per-step log up to the origin's step), under the case's float64 tolerance of ``policy``; 0
    where the bug leaves the origin unchanged, None where either side lacks it."""
    array, step = origin
    if array not in outputs or array not in reference:
        return None
    end = None if step is None else step + 1
    tol = case.tolerances("float64", policy)[array]
    return compare_one(array, reference[array][:end], outputs[array][:end], tol).ratio


def bug_sweep(bugs: Iterable[Bug], selected: Sequence[Case], reference=None, policy: str | None = None) -> list[dict]:
    """One record per (bug, case of its model whose kind the bug's adapter runs), judged by the float64
    ``policy``: ``status``, the ``failing`` arrays, the report's ``departure``, the bug's ``origin``, the
    departure's ``placement`` against it and :func:`origin_move`; ``change``: (array, size) of the bug's
    largest change of the outputs against ``reference`` (an adapter: the implementation without the bug;
    None: the oracle's outputs)."""
    ref, ref_last = _recording(reference) if reference is not None else (None, None)
    references: dict[str, dict] = {}
    records = []
    for bug in bugs:
        adapter, last = _recording(bug.adapter)
        for case in selected:
            if case.model != bug.model or FUNCTIONS[case.kind] not in adapter:
                continue
            report = check(adapter, case, "float64", policy)
            if case.id not in references:
                references[case.id] = case.expected if ref is None else _outputs_of(ref, ref_last, case)
            origin, ran, ref_out = bug.origin(case), report.skipped is None, references[case.id]
            records.append({"bug": bug.name, "model": bug.model, "case": case.id, "kind": case.kind,
                            "status": report.status, "failing": [r.name for r in report.rows if not r.ok],
                            "departure": report.departure, "origin": origin,
                            "placement": placement(case, report.departure, origin),
                            "origin_move": origin_move(case, origin, last["outputs"], ref_out, policy) if ran else None,
                            "change": change(last["outputs"], ref_out) if ran else None})
    return records


def _outputs_of(adapter: dict, last: dict, case: Case) -> dict:
    """The outputs of a recording adapter on ``case``."""
    adapter[FUNCTIONS[case.kind]](case.model, {k: np.array(v) for k, v in case.inputs.items() if k != "model"})
    return last["outputs"]


# --- correct family --------------------------------------------------------------------------------
def family_sweep(members: Iterable[Member], selected: Sequence[Case], policy: str | None = None) -> list[dict]:
    """One record per (member, case of its models): ``status`` and, per array, ``ratio`` (err/tol, the
    largest error as a multiple of its tolerance, under ``policy`` at the member's precision) and ``ok``."""
    records = []
    for member in members:
        for case in selected:
            if case.model not in member.models:
                continue
            report: CaseReport = check(member.adapter, case, member.precision, policy)
            records.append({"member": member.name, "precision": member.precision, "case": case.id,
                            "model": case.model, "status": report.status,
                            "rows": [{"array": r.name, "ratio": r.ratio, "ok": r.ok} for r in report.rows]})
    return records
