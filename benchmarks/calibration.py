"""The calibrated float64 tolerance measured against the running error bound (docs/tolerance.md, "A calibrated
tolerance").

    python -m benchmarks.calibration [--random N] [--seed S] [--no-stored] [--skip CASE ...] [--numpy-only]
                                     [--markdown OUT.md] [-q]

from the repository root. On the conformance cases (the stored cases and ``--random N`` random cases per
model from ``--seed S``) it runs the exact backend once per case, builds both tolerances of every array (the
running error bound, :mod:`ntpref.oracle.tolerance`, and the calibrated one,
:mod:`ntpref.oracle.calibrated`) and measures under each:

  false failures  correct float64 implementations (the mutation benchmark's family: the NumPy backend as it
                  is and on symmetry-moved inputs, the shipped torch_float64 and jax_float64 adapters) whose
                  array fails; none may
  slack           tolerance / the family's worst error (1 / the largest err/tol over the family), per case
                  and array: the median and the minimum over the cases
  power           whether the oracle's outputs with the array multiplied by (1 + 1e-9 ξ) (ξ = ±1 per entry)
                  fail, on the (case, array) pairs where every member and the oracle are within 1e-11 of the
                  array's largest entry of the exact value ("accurate": 100x more accurate than the
                  perturbation)

The calibrated tolerance is built from the oracle and the exact backend only; none of the family's members
enters it, so every member is a held-out check.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from tabulate import tabulate

from ntpref.models import SPECS
from ntpref.npzio import atomic_write, check_output
from ntpref.oracle.calibrated import calibrated_tolerances
from ntpref.oracle.cases import POLICIES, cases
from ntpref.oracle.exactness import differences, exact_backend
from ntpref.oracle.compare import compare_arrays

from .mutations import correct_family
from .sweeps import _outputs_of, _recording, perturbed

PROG = "python -m benchmarks.calibration"
#: The perturbation whose power is measured, and the accuracy (of the array's largest entry) that makes it visible.
PERTURBATION, ACCURATE = 9, 1e-11


def measure_case(case, members) -> list[dict]:
    """One record per floating-point array of ``case``: per policy the family's largest err/tol (``worst``)
    and whether a 1e-9 perturbation fails (``caught``); ``accurate`` (module docstring) and ``visible`` (a
    non-zero entry)."""
    exact_values = exact_backend().compute(case.kind, case.inputs, as_float=False)
    bound = case.tolerances("float64", "bound")
    tolerances = {"bound": bound,
                  "calibrated": calibrated_tolerances(case.model, case.kind, case.expected, exact_values, bound)}
    outputs = {name: _outputs_of(adapter, last, case) for name, adapter, last in members}
    records = []
    for array, value in case.expected.items():
        if value.dtype.kind != "f":
            continue
        errors = [float(differences(out[array], exact_values[array])[0].max(initial=0.0))
                  for out in [case.expected, *outputs.values()] if array in out and array in exact_values]
        scale = float(np.max(np.abs(value), initial=0.0))
        record = {"case": case.id, "model": case.model, "array": array, "visible": scale > 0,
                  "solver": array in SPECS[case.model].diagnostics,
                  "accurate": bool(errors) and scale > 0 and max(errors) <= ACCURATE * scale}
        wrong = next(iter(perturbed(case, array, PERTURBATION).values()))(case.model, case.inputs)
        for policy, tols in tolerances.items():
            ratios = [compare_arrays(case.expected, out, tols, names=[array]).rows[0].ratio
                      for out in outputs.values() if array in out]
            record[policy] = {"worst": max(ratios, default=0.0),
                              "caught": not compare_arrays(case.expected, wrong, tols, names=[array]).ok}
        records.append(record)
    return records


def summary(records: list[dict]) -> dict:
    """policy → {"false": false failures, "accurate": accurate pairs (solver outputs included), "missed":
    accurate pairs a 1e-9 perturbation passes but the solver outputs (the model's ``diagnostics``), those counted
    in "solver", "slack": (model, array) → (median, min, cases)}."""
    out = {}
    for policy in POLICIES:
        slacks = defaultdict(list)
        for r in records:
            worst = r[policy]["worst"]
            if r["visible"] and worst > 0:
                slacks[(r["model"], r["array"])].append(1.0 / worst)
        out[policy] = {"false": sum(r[policy]["worst"] > 1 for r in records),
                       "accurate": sum(r["accurate"] for r in records),
                       "missed": [(r["case"], r["array"]) for r in records
                                  if r["accurate"] and not r["solver"] and not r[policy]["caught"]],
                       "solver": sum(r["accurate"] and r["solver"] and not r[policy]["caught"] for r in records),
                       "slack": {k: (float(np.median(v)), float(np.min(v)), len(v)) for k, v in sorted(slacks.items())}}
    return out


def markdown(document: dict) -> str:
    s = document["summary"]
    lines = [f"{len(document['cases'])} cases (random {document['random']} per model from seed {document['seed']}"
             f"{', and the stored cases' if document['stored'] else ''}), {document['seconds']:.0f} s.", ""]
    lines.append(tabulate([(p, s[p]["false"], f"{len(s[p]['missed'])} of {s[p]['accurate']} (+ {s[p]['solver']} solver)",
                            f"{np.median([m for m, _, _ in s[p]['slack'].values()]):.3g}",
                            f"{max(m for m, _, _ in s[p]['slack'].values()):.3g}",
                            f"{min(n for _, n, _ in s[p]['slack'].values()):.3g}") for p in POLICIES],
                           headers=("policy", "false failures", "1e-9 passes where accurate (solver outputs)",
                                    "median of the arrays' median slack", "largest median slack", "smallest slack"),
                           tablefmt="github"))
    lines += ["", "Slack per array (median / minimum over the cases):", ""]
    keys = s["bound"]["slack"].keys() | s["calibrated"]["slack"].keys()
    rows = []
    for key in sorted(keys):
        cells = [s[p]["slack"].get(key) for p in POLICIES]
        rows.append((key[0], key[1], max(c[2] for c in cells if c),
                     *(f"{c[0]:.2g} / {c[1]:.2g}" if c else "-" for c in cells)))
    lines.append(tabulate(rows, headers=("model", "array", "cases", "bound", "calibrated"), tablefmt="github"))
    missed = s["calibrated"]["missed"]
    if missed:
        lines += ["", "Calibrated, 1e-9 passes where accurate: " + "; ".join(f"{c} {a}" for c, a in missed)]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="The calibrated float64 tolerance against the running "
                                "error bound: false failures of the correct family, slack, power at 1e-9.")
    p.add_argument("--random", type=int, default=20, metavar="N", help="random cases per model (default 20)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the random cases (default 0)")
    p.add_argument("--no-stored", action="store_true", help="only the random cases")
    p.add_argument("--skip", nargs="+", default=[], metavar="CASE", help="leave these cases out")
    p.add_argument("--numpy-only", action="store_true", help="the family without PyTorch and JAX")
    p.add_argument("--markdown", metavar="OUT.md", help="also write the tables as markdown")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.markdown:
        check_output(args.markdown)
    members = [(m, *_recording(m.adapter)) for m in correct_family(not args.numpy_only) if m.precision == "float64"]
    selected = [c for c in cases(random=args.random, seed=args.seed, stored=not args.no_stored) if c.id not in args.skip]
    start, records = time.perf_counter(), []
    for case in selected:
        records += measure_case(case, [(m.name, a, last) for m, a, last in members if case.model in m.models])
        if not args.quiet:
            print(f"{case.id}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    document = {"random": args.random, "seed": args.seed, "stored": not args.no_stored,
                "cases": [c.id for c in selected], "seconds": time.perf_counter() - start}
    document["summary"] = summary(records)
    text = markdown(document)
    print(text, end="")
    if args.markdown:
        atomic_write(args.markdown, lambda fh: fh.write(text.encode()))
    return 0 if all(document["summary"][p]["false"] == 0 for p in POLICIES) else 1


if __name__ == "__main__":
    sys.exit(main())
