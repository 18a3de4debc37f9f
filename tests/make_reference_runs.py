#!/usr/bin/env python
"""Generate the stored reference cases in ``reference_runs/`` (docs/contract.md, "Stored reference cases").

    python tests/make_reference_runs.py                 # (re)generate every case
    python tests/make_reference_runs.py CASE ...        # only these
    python tests/make_reference_runs.py --check         # rebuild inputs, assert they equal the stored ones
    python tests/make_reference_runs.py --list

Each case of :data:`CASES` (the stored cases of every model's specification, defined beside the model in
``ntpref/twostage/cases.py`` and ``ntpref/shallow/cases.py``) names its model, kind (eval / train / ntk),
what it exercises, its generating configuration and seed, and ``build(config, seed) -> input arrays``. The expected
outputs (and intermediates, see ``ntpref.oracle.kinds.intermediates``) come from the numba backend; before
anything is written the numpy backend is run on the same input and must agree within every array's
tolerance (so the tolerances are known to hold
across backends; the measured worst error/tolerance ratio is printed), and how far each case's arrays
moved from the bits stored before is printed too. Every array's record gets its ``bitwise`` promise from
the models' ``not_bitwise``. ``ntpref verify`` then recomputes the stored inputs, ``ntpref regen`` rewrites one
case from its stored input (keeping the promises).
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ntpref.models import SPECS
from ntpref.oracle.policies.bound import bound_tolerances
from ntpref.oracle.bits import bit_distances, changes_text
from ntpref.oracle.kinds import compute, intermediates
from ntpref.oracle.manifest import (case_entry, check_file, default_root, load_manifest, save_manifest, tolerances_of,
                                    write_case)
from ntpref.oracle.compare import compare_arrays
from ntpref.npzio import load_npz
from ntpref.numba_target import configure_process
from ntpref.spec import StoredCase

#: Every stored case of every model (:class:`ntpref.spec.StoredCase`), from the models' specifications.
CASES = [case for spec in SPECS.values() for case in spec.stored]

def bitwise_fields(model: str, names) -> dict:
    """name → {"bitwise": promised} for the arrays ``names`` of a case of ``model`` (its specification's
    ``not_bitwise``)."""
    return {name: {"bitwise": name not in SPECS[model].not_bitwise} for name in names}


def _stored(root: Path, name: str, manifest: dict) -> dict:
    """The expected arrays and intermediates stored for case ``name`` ({} for a new case or unreadable files)."""
    entry = manifest["cases"].get(name)
    if entry is None:
        return {}
    stored = {}
    for filename in entry["files"]:
        if filename != "input.npz":
            stored.update(check_file(root, name, entry, filename)[0] or {})
    return stored


def generate(cases: list[StoredCase], root: Path) -> None:
    manifest = load_manifest(root)
    for case in cases:
        start = time.perf_counter()
        inputs = case.inputs()
        before = _stored(root, case.name, manifest)
        runs = {}
        for backend in ("numba", "numpy"):
            runs[backend] = (compute(case.kind, inputs, backend),
                             intermediates(case.model, case.kind, inputs, backend))
        (expected, extra), (other, other_extra) = runs["numba"], runs["numpy"]
        tols = bound_tolerances(case.model, case.kind, inputs, {**expected, **extra}, outputs=expected)
        report = compare_arrays({**expected, **extra}, {**other, **other_extra}, tols, labels=("numba", "numpy"))
        if not report.ok:
            raise SystemExit(f"{case.name}: numba and numpy backends disagree beyond the tolerances:\n{report}")
        fields = bitwise_fields(case.model, [*expected, *extra])
        entry = case_entry(case.model, case.kind, case.description, case.config, case.seed,
                           inputs, expected, tols, extra, fields)
        bits = bit_distances(before, {**expected, **extra}, entry)
        write_case(root, case.name, entry, inputs, expected, manifest, extra)
        size = sum((root / case.name / f).stat().st_size for f in entry["files"])
        worst = max((r.ratio or 0.0) for r in report.rows)
        print(f"{case.name}: {len(expected)} arrays (+{len(extra)} intermediates), {size / 1024:.0f} KiB, "
              f"numba vs numpy worst error/tolerance {worst:.1e}, {time.perf_counter() - start:.1f} s")
        print(f"  against the bits stored before: {changes_text(bits)}")
    save_manifest(root, manifest)


def check(cases: list[StoredCase], root: Path) -> bool:
    """Rebuild each case's input from its config and seed; True when all equal the stored inputs bitwise."""
    ok = True
    for case in cases:
        stored = load_npz(root / case.name / "input.npz")
        rep = compare_arrays(stored, case.inputs(), labels=("stored", "rebuilt"))
        print(f"{case.name}: {'ok' if rep.ok else 'DIFFERS'}")
        if not rep.ok:
            print(rep)
        ok &= rep.ok
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", metavar="CASE")
    parser.add_argument("--root", type=Path, default=None, help="reference directory (default reference_runs/)")
    parser.add_argument("--check", action="store_true", help="only check that inputs rebuild bitwise")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    configure_process()   # the kernels as the ntpref command runs them (recorded in the provenance)
    by_name = {c.name: c for c in CASES}
    unknown = [c for c in args.cases if c not in by_name]
    if unknown:
        parser.error(f"unknown case {unknown[0]}; known: {', '.join(by_name)}")
    cases = [by_name[c] for c in args.cases] if args.cases else CASES
    root = args.root or default_root()
    if args.list:
        for c in cases:
            print(f"{c.name} [{c.model} {c.kind}]: {c.description}")
        return 0
    if args.check:
        return 0 if check(cases, root) else 1
    generate(cases, root)
    for c in cases:
        tols = tolerances_of(load_manifest(root)["cases"][c.name])
        print(f"  {c.name}: " + ", ".join(sorted({t.text() for t in tols.values()})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
