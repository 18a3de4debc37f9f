"""The calibrated tolerances measured against the running error bound and the float32 envelope
(docs/tolerance.md, "A calibrated tolerance").

    python -m benchmarks.calibration [--random N] [--seed S] [--no-stored] [--skip CASE ...] [--numpy-only]
                                     [--authors CHECKOUT] [--markdown OUT.md] [-q]

from the repository root. On the conformance cases (the stored cases and ``--random N`` random cases per
model from ``--seed S``) it runs the exact backend once per case, builds every tolerance of every array (in
float64 the running error bound and the calibrated one; in float32 the envelope and the calibrated one
scaled from float64's: the policies of :mod:`ntpref.oracle.policies`) and measures under each:

  false failures  correct implementations of the precision (the mutation benchmark's family: in float64 the
                  NumPy backend as it is and on symmetry-moved inputs, the Numba backend on reversed
                  ones, the exact backend's loops with compensated sums, the shipped torch_float64 and
                  jax_float64 adapters, with ``--authors`` the shallow paper's own model; in float32 the
                  exact backend's loops with and without fused multiply-adds and the shipped torch_float32
                  and jax_float32 adapters) whose array fails; none may
  slack           tolerance / the family's worst error (1 / the largest err/tol over the family), per case
                  and array: the median and the minimum over the cases
  power           whether the oracle's outputs with the array multiplied by (1 + 10^-k ξ) (ξ = ±1 per entry;
                  k = 9 in float64, 4 in float32) fail, on the (case, array) pairs where every member is within
                  10^-k / 100 (float64, the oracle too) or 10^-k / 30 (float32) of the array's largest entry
                  of the exact value ("accurate"); a pass where the report says the array is unchecked (its
                  tolerance admits every value, docs/tolerance.md) is counted apart

The calibrated tolerances are built from the oracle and the exact backend only (and in float32 the oracle's
response to the inputs rounded to float32); none of the family's members enters them, so every member is a
held-out check (the rounded members share the exact backend's formulas, not its rounding: the 50-digit run
enters the tolerance, the 53- and 24-bit runs are judged by it).
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
from tabulate import tabulate

from ntpref.errors import NtprefError
from ntpref.models import SPECS
from ntpref.npzio import atomic_write, check_output
from ntpref.oracle.cases import cases
from ntpref.oracle.policies import POLICIES, PRECISIONS
from ntpref.oracle.compare import compare_arrays
from ntpref.oracle.exactness import differences, exact_backend
from ntpref.oracle.judging import unchecked_arrays

from .mutations import correct_family
from .sweeps import _outputs_of, _recording, perturbed

PROG = "python -m benchmarks.calibration"
#: precision → (k of the perturbation 10^-k whose power is measured, the accuracy of the family, as a
#: fraction of the array's largest entry, that makes it visible).
POWER = {"float64": (9, 1e-11), "float32": (4, 1e-4 / 30)}
#: The settings of the summary: (precision, policy).
SETTINGS = tuple((precision, policy) for precision in PRECISIONS for policy in POLICIES)


def measure_case(case, members) -> list[dict]:
    """One record per (floating-point array of ``case``, precision): per policy the family's largest err/tol
    (``worst``), whether the perturbation of :data:`POWER` fails (``caught``) and whether the report says the
    array is unchecked (``unchecked``, :func:`ntpref.oracle.judging.unchecked_arrays`); ``accurate``
    (module docstring) and ``visible`` (a non-zero entry). ``members``: (name, precision, adapter, last) of the family;
    a member that raises NotImplementedError for the case is left out of it."""
    exact_values = exact_backend().compute(case.kind, case.inputs, as_float=False)
    case.calibrate(exact_values)
    outputs = {}
    for name, precision, adapter, last in members:
        try:
            returned = _outputs_of(adapter, last, case)
        except NotImplementedError:         # a member that cannot express the case (as the report skips it)
            continue
        outputs[name, precision] = {k: np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else v
                                    for k, v in returned.items()}   # float32 widened
    records = []
    for precision in PRECISIONS:
        k, accurate = POWER[precision]
        mine = [out for (_, p), out in outputs.items() if p == precision]
        judged = [case.expected, *mine] if precision == "float64" else mine
        tolerances = {policy: case.tolerances(precision, policy) for policy in POLICIES}
        for array, value in case.expected.items():
            if value.dtype.kind != "f":
                continue
            errors = [float(differences(out[array], exact_values[array])[0].max(initial=0.0))
                      for out in judged if array in out and array in exact_values]
            scale = float(np.max(np.abs(value), initial=0.0))
            record = {"case": case.id, "model": case.model, "array": array, "precision": precision,
                      "visible": scale > 0, "solver": array in SPECS[case.model].diagnostics,
                      "accurate": bool(errors) and scale > 0 and max(errors) <= accurate * scale}
            wrong = next(iter(perturbed(case, array, k).values()))(case.model, case.inputs)
            for policy, tols in tolerances.items():
                ratios = [compare_arrays(case.expected, out, tols, names=[array]).rows[0].ratio
                          for out in mine if array in out]
                rows = compare_arrays(case.expected, case.expected, tols, names=[array]).rows
                record[policy] = {"worst": max(ratios, default=0.0),
                                  "unchecked": bool(unchecked_arrays(case.expected, tols, rows)),
                                  "caught": not compare_arrays(case.expected, wrong, tols, names=[array]).ok}
            records.append(record)
    return records


def summary(records: list[dict]) -> dict:
    """(precision, policy) → {"false": false failures, "accurate": accurate pairs (solver outputs included),
    "missed": accurate pairs the perturbation passes silently (the report does not say the array is
    unchecked) but the solver outputs (the model's ``diagnostics``), those counted in "solver", "unchecked":
    the accurate pairs the perturbation passes with the report saying so, "slack": (model, array) → (median,
    min, cases)}."""
    out = {}
    for precision, policy in SETTINGS:
        mine = [r for r in records if r["precision"] == precision]
        slacks = defaultdict(list)
        for r in mine:
            worst = r[policy]["worst"]
            if r["visible"] and worst > 0:
                slacks[(r["model"], r["array"])].append(1.0 / worst)
        out[(precision, policy)] = {
            "false": sum(r[policy]["worst"] > 1 for r in mine),
            "accurate": sum(r["accurate"] for r in mine),
            "missed": [(r["case"], r["array"]) for r in mine if r["accurate"] and not r["solver"]
                       and not r[policy]["caught"] and not r[policy]["unchecked"]],
            "solver": sum(r["accurate"] and r["solver"] and not r[policy]["caught"] for r in mine),
            "unchecked": sum(r["accurate"] and not r["solver"] and not r[policy]["caught"] and r[policy]["unchecked"]
                             for r in mine),
            "slack": {k: (float(np.median(v)), float(np.min(v)), len(v)) for k, v in sorted(slacks.items())}}
    return out


def _name(setting: tuple[str, str]) -> str:
    precision, policy = setting
    return f"{precision} {'envelope' if setting == ('float32', 'bound') else policy}"


def markdown(document: dict) -> str:
    s = {k: v for k, v in document["summary"].items() if v["slack"]}    # a precision without members left out
    lines = [f"{len(document['cases'])} cases (random {document['random']} per model from seed {document['seed']}"
             f"{', and the stored cases' if document['stored'] else ''}), {document['seconds']:.0f} s.", ""]
    lines.append(tabulate([(_name(k), v["false"], f"1e-{POWER[k[0]][0]}",
                            f"{len(v['missed'])} of {v['accurate']} (+ {v['solver']} solver)", v["unchecked"],
                            f"{np.median([m for m, _, _ in v['slack'].values()]):.3g}",
                            f"{max(m for m, _, _ in v['slack'].values()):.3g}",
                            f"{min(n for _, n, _ in v['slack'].values()):.3g}") for k, v in s.items()],
                           headers=("tolerance", "false failures", "perturbation",
                                    "passes silently where accurate (solver outputs)", "passes, said unchecked", "median of the arrays' median slack",
                                    "largest median slack", "smallest slack"), tablefmt="github"))
    lines += ["", "Slack per array (median / minimum over the cases):", ""]
    keys = sorted(set().union(*(v["slack"].keys() for v in s.values())))
    rows = []
    for key in keys:
        cells = [v["slack"].get(key) for v in s.values()]
        rows.append((key[0], key[1], max(c[2] for c in cells if c),
                     *(f"{c[0]:.2g} / {c[1]:.2g}" if c else "-" for c in cells)))
    lines.append(tabulate(rows, headers=("model", "array", "cases", *map(_name, s)), tablefmt="github"))
    for k, v in s.items():
        if k[1] == "calibrated" and v["missed"]:
            lines += ["", f"{_name(k)}, 1e-{POWER[k[0]][0]} passes silently where accurate: "
                      + "; ".join(f"{c} {a}" for c, a in v["missed"])]
    return "\n".join(lines) + "\n"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description="The calibrated tolerances against the running error "
                                "bound and the float32 envelope: false failures of the correct family, slack, "
                                "power at 1e-9 (float64) and 1e-4 (float32).")
    p.add_argument("--random", type=int, default=20, metavar="N", help="random cases per model (default 20)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the random cases (default 0)")
    p.add_argument("--no-stored", action="store_true", help="only the random cases")
    p.add_argument("--skip", nargs="+", default=[], metavar="CASE", help="leave these cases out")
    p.add_argument("--numpy-only", action="store_true", help="the family without PyTorch and JAX")
    p.add_argument("--authors", metavar="CHECKOUT", help="a checkout of enesarda22/nonasymptotic-transformer: "
                   "the shallow paper's own model joins the family (needs PyTorch)")
    p.add_argument("--markdown", metavar="OUT.md", help="also write the tables as markdown")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.markdown:
        check_output(args.markdown)
    try:
        members = [(m, *_recording(m.adapter)) for m in correct_family(not args.numpy_only, args.authors)]
    except NtprefError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    selected = [c for c in cases(random=args.random, seed=args.seed, stored=not args.no_stored) if c.id not in args.skip]
    start, records = time.perf_counter(), []
    for case in selected:
        records += measure_case(case, [(m.name, m.precision, a, last) for m, a, last in members
                                       if case.model in m.models])
        if not args.quiet:
            print(f"{case.id}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    document = {"random": args.random, "seed": args.seed, "stored": not args.no_stored,
                "cases": [c.id for c in selected], "seconds": time.perf_counter() - start}
    document["summary"] = summary(records)
    text = markdown(document)
    print(text, end="")
    if args.markdown:
        atomic_write(args.markdown, lambda fh: fh.write(text.encode()))
    return 0 if all(v["false"] == 0 for v in document["summary"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
