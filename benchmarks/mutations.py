"""The power of the checker: a mutation benchmark of ``ntpref conformance`` (docs/tolerance.md, "The power of
the checker").

    python -m benchmarks.mutations [--quick] [--random N] [--seed S] [--policy calibrated|bound]
                                   [--json OUT.json] [--markdown OUT.md] [--numpy-only] [--authors CHECKOUT] [-q]

from the repository root (it imports ``examples.adapters``; PyTorch and JAX are needed for the structural
bugs and the framework adapters). On the conformance cases (the stored cases and ``--random N`` random
cases per model from ``--seed S``, ``ntpref.oracle.cases.cases``) it measures both halves of the promise
"a correct implementation passes, a wrong one fails and the report says where":

  perturbations  the oracle's own outputs with one array multiplied elementwise by (1 + 10^-k ξ), ξ = ±1
                 a random sign per entry, k = 2..12, in float64 and in float32 mode: per case and array
                 the smallest perturbation caught, and whether the report's departure names the array
  bugs           twelve structural bugs injected into the PyTorch restatement (benchmarks/mutants.py), on
                 every case of their model: caught or not, the departure against the bug's origin
  family         correct implementations: the shipped torch_float64 and jax_float64 adapters, the oracle's
                 NumPy backend on symmetry-moved inputs and its Numba backend on reversed ones
                 (benchmarks/symmetries.py), the exact backend's loops with compensated sums
                 (benchmarks/rounded.py) in float64, with ``--authors`` the shallow paper's own model
                 (benchmarks/authors_model.py), and torch_float32, jax_float32 and the exact backend's loops
                 with and without fused multiply-adds in float32 mode: false failures, and the slack
                 (tolerance / worst error of the family) of every array

Every verdict is that of the ``--policy`` (default calibrated in float64 and float32, as ``ntpref
conformance``; ``bound``, the running error bound in float64 and the envelope in float32). It prints the
tables (markdown) and writes them with ``--markdown``, every record with ``--json``.
``--quick``: the random cases only, one per regime (``--random 5``), about a minute; ``--numpy-only``:
without PyTorch and JAX (no structural bugs, the family without the framework adapters).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from tabulate import tabulate

from ntpref.errors import NtprefError
from ntpref.models import NAMES, SPECS
from ntpref.npzio import atomic_write, check_output
from ntpref.oracle.cases import cases
from ntpref.oracle.policies import DEFAULT_POLICY, POLICIES

from . import rounded, symmetries, sweeps
from .sweeps import ACTS, Member

PROG = "python -m benchmarks.mutations"
#: Random cases per model of the full run and of --quick.
RANDOM, QUICK_RANDOM = 40, 5


def correct_family(frameworks: bool = True, authors: str | None = None) -> list[Member]:
    """The correct implementations: the oracle's NumPy backend as it is, on each symmetry's moved input
    and on the input moved by every symmetry of its model; the Numba backend on the input with every
    symmetry of its model reversed (its sums right to left); the exact backend's loops in rounded
    arithmetic (benchmarks/rounded.py: float64 with compensated sums, float32 with and without fused
    multiply-adds); with ``frameworks`` the shipped torch_float64, jax_float64 (float64), torch_float32 and
    jax_float32 (float32 mode) adapters, and with ``authors`` (a checkout of the shallow paper's repository)
    their model in float64 (benchmarks/authors_model.py)."""
    every = symmetries.SYMMETRIES
    members = [Member("numpy backend" + "".join(f", {s.name} permuted" for s in move), "float64",
                      symmetries.adapter(move), symmetries.applicable(move)) for move in [[], *([s] for s in every)]]
    members += [Member("numpy backend, every symmetry of the model", "float64",
                       symmetries.adapter(every, where_applicable=True), NAMES),
                Member("numba backend, every symmetry of the model reversed", "float64",
                       symmetries.adapter(every, backend="numba", reverse=True, where_applicable=True), NAMES),
                *rounded.members()]
    if frameworks:
        from examples.adapters import jax_float32, jax_float64, torch_float32, torch_float64

        members += [Member("torch_float64", "float64", torch_float64, NAMES),
                    Member("jax_float64", "float64", jax_float64, NAMES),
                    Member("torch_float32", "float32", torch_float32, NAMES),
                    Member("jax_float32", "float32", jax_float32, NAMES)]
    if authors:
        from .authors_model import AuthorsModel, load

        members.append(Member("the shallow paper's own model", "float64", AuthorsModel(load(authors)),
                              ("shallow", "indrnn")))
    return members


def benchmark(random: int, seed: int = 0, stored: bool = True, frameworks: bool = True,
              log=None, policy: str = DEFAULT_POLICY, authors: str | None = None) -> dict:
    """Run the three sweeps on the cases under the tolerance ``policy`` and return the document: the command's
    settings, the case ids, the records of each sweep and its seconds. ``frameworks`` False: NumPy only (no
    structural bugs, the family without the PyTorch and JAX adapters); ``authors``: a checkout of the shallow
    paper's repository, whose model joins the family."""
    selected = cases(random=random, seed=seed, stored=stored)
    document = {"random": random, "seed": seed, "stored": stored, "policy": policy,
                "cases": [c.id for c in selected], "seconds": {}}
    family = correct_family(frameworks, authors)
    parts = {"perturbations": lambda: sweeps.perturbation_sweep(selected, policy=policy),
             "family": lambda: sweeps.family_sweep(family, selected, policy)}
    if frameworks:
        from . import mutants

        parts["bugs"] = lambda: sweeps.bug_sweep(mutants.catalogue(), selected, reference=mutants.adapter(),
                                                 policy=policy)
    for name, run in parts.items():
        if log:
            log(f"{name} on {len(selected)} cases ...")
        start = time.perf_counter()
        document[name] = run()
        document["seconds"][name] = round(time.perf_counter() - start, 1)
        if log:
            log(f"{name}: {document['seconds'][name]} s")
    return document


# --- summaries -------------------------------------------------------------------------------------
def _power(summary: dict, key: str) -> str:
    """10^-k of ``summary[key]`` as text ("1e-9", "3e-10"); "none" when nothing was caught, "-" when the
    precision was not run."""
    if not summary:
        return "-"
    return "none" if summary[key] is None else f"{10.0 ** -summary[key]:.0e}"


def perturbation_summary(records: list[dict]) -> dict:
    """(model, array) → precision → {"cases": visible cases, "every": the largest k caught on every one
    of them (None: a case catches none), "weakest": that case, "median": the median k* over them,
    "named": (caught perturbations whose departure names the array, caught perturbations)}."""
    out: dict = defaultdict(dict)
    groups = defaultdict(list)
    for r in records:
        if r["visible"]:
            groups[(r["model"], r["array"], r["precision"])].append(r)
    for (model, array, precision), rs in groups.items():
        stars = [(r["k_star"] if r["k_star"] is not None else -math.inf, r["case"]) for r in rs]
        worst = min(stars)
        out[(model, array)][precision] = {
            "cases": len(rs), "every": None if worst[0] == -math.inf else worst[0], "weakest": worst[1],
            "median": float(np.median([s for s, _ in stars])) if worst[0] != -math.inf else None,
            "named": (sum(len(r["named"]) for r in rs), sum(len(r["caught"]) for r in rs))}
    return dict(out)


def slack_summary(records: list[dict]) -> dict:
    """(model, array) → precision → {"median", "min", "tightest" (the case of the minimum), "cases"}: the
    slack tolerance / worst error of the family's members of that precision, per case 1 / max err/tol
    (inf where every member is exact)."""
    worst = defaultdict(float)
    for r in records:
        for row in r["rows"]:
            if row["ratio"] is not None:
                key = (r["model"], row["array"], r["precision"], r["case"])
                worst[key] = max(worst[key], row["ratio"])
    per = defaultdict(list)
    for (model, array, precision, case), ratio in worst.items():
        per[(model, array, precision)].append((1.0 / ratio if ratio > 0 else math.inf, case))
    out: dict = defaultdict(dict)
    for (model, array, precision), slacks in per.items():
        low = min(slacks)
        out[(model, array)][precision] = {"median": float(np.median([s for s, _ in slacks])), "min": low[0],
                                          "tightest": low[1], "cases": len(slacks)}
    return dict(out)


def bug_summary(records: list[dict]) -> list[dict]:
    """Per (bug, model), in catalogue order: cases run, caught (failed), missed (passed although the bug
    changed an output by more than ACTS relative), idle (passed, the bug changes nothing there), the
    first case that catches it with its departure, and the departures' placements against the origin."""
    out: dict = {}
    for r in records:
        s = out.setdefault((r["bug"], r["model"]), {"bug": r["bug"], "model": r["model"], "cases": 0, "caught": 0,
                                                     "missed": [], "idle": 0, "first": None,
                                                     "placement": defaultdict(int), "later": []})
        s["cases"] += 1
        if r["status"] == "FAIL":
            s["caught"] += 1
            s["placement"][r["placement"]] += 1
            if s["first"] is None:
                s["first"] = (r["case"], r["departure"])
            if r["placement"] != "origin":
                s["later"].append((r["case"], r["departure"], r["origin"], r["origin_move"]))
        elif r["change"] is not None and r["change"][1] > ACTS:
            s["missed"].append((r["case"], r["change"]))
        else:
            s["idle"] += 1
    return list(out.values())


def family_summary(records: list[dict]) -> list[dict]:
    """Per member: precision, cases run and skipped, false failures (failing cases), the worst err/tol
    with its case and array."""
    out: dict = {}
    for r in records:
        s = out.setdefault(r["member"], {"member": r["member"], "precision": r["precision"], "cases": 0,
                                         "skipped": 0, "failed": [], "worst": (0.0, None, None)})
        s["cases"] += 1
        s["skipped"] += r["status"] == "skip"
        if r["status"] == "FAIL":
            s["failed"].append(r["case"])
        for row in r["rows"]:
            if row["ratio"] is not None and row["ratio"] > s["worst"][0]:
                s["worst"] = (row["ratio"], r["case"], row["array"])
    return list(out.values())


# --- tables ----------------------------------------------------------------------------------------
def _step(quantity) -> str:
    """``array`` or ``array[t]`` of a (array, step) pair."""
    if quantity is None:
        return "-"
    array, step = quantity
    return array if step is None else f"{array}[{step}]"


def _slack(s: dict | None, key: str) -> str:
    if s is None:
        return "-"
    return "exact" if math.isinf(s[key]) else f"{s[key]:.0e}"


def array_tables(document: dict) -> str:
    """Per model and array: the smallest perturbation caught on every case where it is visible (with the
    weakest case) and the median over the cases, float64 and float32 mode; the slack median and minimum."""
    power = perturbation_summary(document["perturbations"])
    slack = slack_summary(document["family"]) if "family" in document else {}
    parts = []
    for model in NAMES:
        rows = []
        named = SPECS[model].eval_outputs + SPECS[model].train_outputs
        others = [a for m, a in power if m == model and a not in named]     # the intermediates its cases keep
        for array in [a for a in named if (model, a) in power] + others:
            p, s = power[(model, array)], slack.get((model, array), {})
            f64, f32 = p.get("float64", {}), p.get("float32", {})
            rows.append([array, f64.get("cases", "-"), _power(f64, "every"), f64.get("weakest", "-"),
                         _power(f64, "median"), _power(f32, "every"), _power(f32, "median"),
                         _slack(s.get("float64"), "median"), _slack(s.get("float64"), "min"),
                         _slack(s.get("float32"), "median"), _slack(s.get("float32"), "min")])
        parts.append(f"**{model}**\n\n" + tabulate(
            rows, headers=["array", "cases", "f64: caught on every case", "f64: weakest case", "f64: median",
                           "f32: every case", "f32: median", "slack f64 median", "slack f64 min",
                           "slack f32 median", "slack f32 min"], tablefmt="github", disable_numparse=True))
    weak64 = [f"{m} {a} ({p['float64']['weakest']}: {_power(p['float64'], 'every')})" for (m, a), p in power.items()
              if "float64" in p and (p["float64"]["every"] is None or p["float64"]["every"] < 6)]
    weak32 = [f"{m} {a} ({p['float32']['weakest']})" for (m, a), p in power.items()
              if "float32" in p and p["float32"]["every"] is None]
    parts.append("float64 arrays where a relative 1e-6 passes on some case: " + ("; ".join(weak64) or "none") + ".")
    parts.append("float32 mode, arrays where even 1e-2 passes on some case: " + ("; ".join(weak32) or "none") + ".")
    named = [r for r in document["perturbations"] if r["caught"]]
    right = sum(len(r["named"]) for r in named), sum(len(r["caught"]) for r in named)
    parts.append(f"Departure of the caught perturbations: the perturbed array named in {right[0]} of {right[1]}.")
    return "\n\n".join(parts)


def bug_table(document: dict) -> str:
    """Per bug and model: cases caught / run, the first case catching it and its departure, the
    departures against the origin, the passing cases where the bug acts (missed) or not (idle)."""
    summary = bug_summary(document["bugs"])
    rows = []
    for s in summary:
        first = f"{s['first'][0]}: {_step(s['first'][1])}" if s["first"] else "-"
        where = ", ".join(f"{k} {v}" for k, v in sorted(s["placement"].items()))
        missed = "; ".join(f"{c} ({a} by {x:.0e})" for c, (a, x) in s["missed"]) or "0"
        rows.append([s["bug"], s["model"], f"{s['caught']}/{s['cases']}", first, where, missed, s["idle"]])
    caught = sum(s["caught"] > 0 for s in summary)
    everywhere = sum(s["caught"] > 0 and not s["missed"] for s in summary)
    earlier = sum(s["placement"].get("earlier", 0) for s in summary)
    lines = [tabulate(rows, headers=["bug", "model", "caught", "first caught: departure", "departure vs origin",
                                     "missed (passes, changes outputs)", "idle (no effect)"],
                      tablefmt="github", disable_numparse=True),
             f"Caught on some case: {caught}/{len(summary)}; on every case where they change an output: "
             f"{everywhere}/{len(summary)}; departures before the origin: {earlier}."]
    later: dict = {}
    for s in summary:
        for case, departure, origin, moved in s["later"]:
            group = later.setdefault((s["bug"], s["model"], _step(origin), departure[0]), [0, 0.0, case])
            group[0] += 1
            group[1] = max(group[1], moved or 0.0)
    if later:
        lines.append("Departures after the origin, by origin and departure: how far the bug moves its origin "
                     "at most (err/tol against the bug-free restatement; 0: unchanged there):\n\n" +
                     tabulate([[b, m, o, d, n, f"{x:.1e}", c] for (b, m, o, d), (n, x, c) in later.items()],
                              headers=["bug", "model", "origin", "departure", "cases", "origin moved (err/tol)",
                                       "e.g."], tablefmt="github", disable_numparse=True))
    return "\n\n".join(lines)


def family_table(document: dict) -> str:
    """Per correct implementation: precision, cases run (skipped), false failures, worst err/tol."""
    rows = []
    for s in family_summary(document["family"]):
        ratio, case, array = s["worst"]
        rows.append([s["member"], s["precision"], f"{s['cases']} ({s['skipped']})",
                     ", ".join(s["failed"]) or "0", f"{ratio:.1e} ({case}, {array})" if case else "0"])
    return tabulate(rows, headers=["correct implementation", "mode", "cases (skipped)", "false failures",
                                   "worst err/tol"], tablefmt="github", disable_numparse=True)


def markdown(document: dict) -> str:
    """The tables of the document: arrays, structural bugs, correct family, and the seconds."""
    parts = [f"Policy: {document['policy']}. Smallest relative perturbation 10^-k caught (k = 2..12, the "
             "oracle's outputs, one array multiplied by 1 + 10^-k ξ, ξ = ±1 per entry), and slack = tolerance / "
             "worst error of the "
             "correct family (median and minimum over the cases):", array_tables(document)]
    if "bugs" in document:
        parts += ["Structural bugs in the PyTorch restatement:", bug_table(document)]
    parts += ["Correct implementations (every case must pass):", family_table(document),
              "Seconds: " + ", ".join(f"{k} {v}" for k, v in document["seconds"].items()) +
              f"; {len(document['cases'])} cases ({'stored and ' if document['stored'] else ''}"
              f"{document['random']} random per model, seed {document['seed']})."]
    return "\n\n".join(parts) + "\n"


def _jsonable(x):
    """``x`` with tuples as lists and non-finite floats as strings (JSON has no inf)."""
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return x


# --- command ---------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="Measure the power of ntpref conformance: injected bugs "
                                "must fail and name where they show, correct implementations must pass.")
    p.add_argument("--quick", action="store_true", help=f"random cases only, {QUICK_RANDOM} per model")
    p.add_argument("--random", type=int, metavar="N", help=f"random cases per model (default {RANDOM}; "
                   f"--quick {QUICK_RANDOM})")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the random cases (default 0)")
    p.add_argument("--policy", choices=POLICIES, default=DEFAULT_POLICY,
                   help=f"the tolerances of both precisions (default {DEFAULT_POLICY}, as ntpref conformance)")
    p.add_argument("--json", metavar="OUT.json", help="every record as JSON")
    p.add_argument("--markdown", metavar="OUT.md", help="the tables as markdown")
    p.add_argument("--numpy-only", action="store_true",
                   help="without PyTorch and JAX: no structural bugs, the family without the framework adapters")
    p.add_argument("--authors", metavar="CHECKOUT", help="a checkout of enesarda22/nonasymptotic-transformer: "
                   "the shallow paper's own model joins the correct family (needs PyTorch)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (default: the process's arguments); the exit status: 0, or 1 when a
    correct implementation failed a case."""
    args = parser().parse_args(argv)
    random = args.random if args.random is not None else QUICK_RANDOM if args.quick else RANDOM
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    try:
        for path in (args.json, args.markdown):
            if path:
                check_output(path)
        document = benchmark(random, args.seed, stored=not args.quick, frameworks=not args.numpy_only, log=log,
                             policy=args.policy, authors=args.authors)
    except NtprefError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    document["command"] = " ".join([PROG, *(argv if argv is not None else sys.argv[1:])])
    document["date"] = datetime.date.today().isoformat()
    text = markdown(document)
    print(text)
    if args.markdown:
        atomic_write(args.markdown, lambda fh: fh.write(text.encode()))
    if args.json:
        atomic_write(args.json, lambda fh: fh.write(json.dumps(_jsonable(document), indent=1).encode()))
    return 0 if all(r["status"] != "FAIL" for r in document["family"]) else 1


if __name__ == "__main__":
    sys.exit(main())
