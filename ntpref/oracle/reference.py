"""The stored reference cases' workflows (docs/contract.md, "Stored reference cases"): ``verify`` (files
against the manifest, recomputed, compared at the recorded tolerances and measured in ulp against the
stored bits), ``regen`` (rewrite a case's outputs after an intended change), ``retolerance`` (rewrite its
tolerances only) and ``export`` (copy a case with its tolerances for ``ntpref compare``). The directory and
its manifest are :mod:`ntpref.oracle.manifest`; the commands that run these are
:mod:`ntpref.oracle.cli_reference`.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..errors import ComparisonError, InputError
from ..npzio import atomic_write_all, load_npz
from .bits import ArrayBits, bit_distances, bits_summary
from .compare import Report, compare_arrays
from .kinds import compute, intermediates
from .manifest import (BYTES_FIELDS, FORMAT_VERSION, array_records, case_entry, check_file, default_root,
                       kept_fields, load_cases, model_problems, ordered_record, refuse_links, save_manifest,
                       select_cases, tolerances_of, write_case)
from .policies.bound import bound_tolerances


class CaseResult(NamedTuple):
    """Outcome of verifying one case: integrity ``problems``, the comparison ``report``, the recomputed
    arrays against their stored bits, ``bits`` (:class:`ArrayBits`; report None and bits empty if not run;
    only the arrays of the files that could be read), and ``unreadable``, the stored files that could not
    ("CASE/expected.npz")."""

    case: str
    kind: str
    problems: list
    report: Report | None
    bits: list
    seconds: float
    unreadable: list

    @property
    def ok(self) -> bool:
        return not self.problems and self.report is not None and self.report.ok

    @property
    def status(self) -> str:
        """"bit-identical", "within tolerance (max N ulp)" or "FAIL"."""
        if not self.ok:
            return "FAIL"
        summary = bits_summary(self.bits)
        return summary if summary == "bit-identical" else f"within tolerance ({summary})"

    @property
    def moved(self) -> list[str]:
        """The arrays promised bit-identical (manifest ``bitwise``) whose recomputed bits differ."""
        return [b.name for b in self.bits if b.promised and not b.identical]



def verify_case(root: Path, case: str, entry: Mapping, backend: str = "numba") -> CaseResult:
    """Check a case's files against the manifest, recompute it, compare at the manifest tolerances.

    The comparison covers the expected outputs and, when stored, the intermediates.
    """
    start = time.perf_counter()
    inputs, problems = check_file(root, case, entry, "input.npz")
    stored, unreadable = {}, [] if inputs is not None else [f"{case}/input.npz"]
    for filename in entry["files"]:
        if filename != "input.npz":
            arrays, more = check_file(root, case, entry, filename)
            if arrays is None:
                unreadable.append(f"{case}/{filename}")
            stored.update(arrays or {})
            problems += more
    report, bits = None, []
    if inputs is not None and not any(p.startswith(f"{case}/input.npz") for p in problems):
        try:
            actual = _outputs(entry, inputs, backend)
        except Exception as exc:  # one broken case must not hide the others' results
            if os.environ.get("NTPREF_DEBUG") == "1":
                raise
            problems.append(f"{case}: computing the stored input failed: {type(exc).__name__}: {exc}")
        else:
            tols = tolerances_of(entry)
            report = compare_arrays(stored, actual, tols, names=list(tols) + [n for n in actual if n not in tols])
            bits = bit_distances(stored, {n: a for n, a in actual.items() if n in stored}, entry)
    return CaseResult(case, entry["kind"], problems, report, bits, time.perf_counter() - start, unreadable)


def _outputs(entry: Mapping, inputs: Mapping[str, np.ndarray], backend: str) -> dict[str, np.ndarray]:
    """Outputs and (when the case stores them) intermediates of a case, in one dict."""
    out = compute(entry["kind"], inputs, backend)
    if "intermediates" in entry:
        out.update(intermediates(entry["model"], entry["kind"], inputs, backend))
    return out


def verify(root: str | os.PathLike | None = None, cases: Iterable[str] | None = None,
           backend: str = "numba") -> list[CaseResult]:
    """Verify the named cases (all when None) of the reference directory ``root``."""
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    return [verify_case(root, c, manifest["cases"][c], backend) for c in select_cases(manifest, cases)]


class Regenerated(NamedTuple):
    """What :func:`regen` found: the comparison ``report`` of the new values with the stored ones at the
    case's old tolerances, and ``bits``, the new arrays against the stored bits (:class:`ArrayBits`)."""

    report: Report
    bits: list

    @property
    def changed(self) -> list[ArrayBits]:
        """The arrays whose bits changed (or that are new)."""
        return [b for b in self.bits if not b.identical]


def regen(root: str | os.PathLike | None, case: str, force: bool = False, backend: str = "numba") -> Regenerated:
    """Recompute ``case`` from its stored input and rewrite expected.npz (and intermediates.npz) and its
    manifest entry; returns what changed (:class:`Regenerated`).

    Refused (ComparisonError carrying the comparison table) when the stored input no longer matches
    the manifest, or the new values differ from the stored ones beyond the case's tolerances, unless
    ``force``. The rewritten entry's tolerances are the float64 policy's for the input
    (:func:`ntpref.oracle.policies.bound.bound_tolerances`); the other fields of each array's record
    (:func:`kept_fields`: ``bitwise``) stay. A file whose arrays keep their bits is not rewritten
    (:func:`write_case`). expected.npz is replaced atomically first, then manifest.json; if interrupted
    in between, ``verify`` reports a hash mismatch and rerunning ``regen`` repairs it. InputError, forced or
    not, before anything is computed: the case folder, a file it may rewrite or manifest.json is a symbolic
    link (:func:`refuse_links`: never written through), or the manifest names another model than the
    stored input (:func:`model_problems`).
    """
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    select_cases(manifest, [case])
    entry = manifest["cases"][case]
    refuse_links([root / case, *(root / case / f for f in entry["files"] if f != "input.npz"), root / "manifest.json"])
    inputs, in_problems = check_file(root, case, entry, "input.npz")
    if inputs is None:
        raise InputError("; ".join(in_problems))
    _require_model(root, case, entry, inputs)
    old = {}
    for filename in entry["files"]:
        if filename != "input.npz":
            old.update(check_file(root, case, entry, filename)[0] or {})
    new = compute(entry["kind"], inputs, backend)
    extra = intermediates(entry["model"], entry["kind"], inputs, backend) if "intermediates" in entry else {}
    tols = tolerances_of(entry)
    report = compare_arrays(old, {**new, **extra}, tols, labels=("stored", "new"))
    if not force and (in_problems or not report.ok):
        why = "; ".join(in_problems) if in_problems else report.summary()
        raise ComparisonError(f"regen {case}: refused without --force ({why})\n{report.table()}")
    bits = bit_distances(old, {**new, **extra}, entry)
    tols = bound_tolerances(entry["model"], entry["kind"], inputs, {**new, **extra}, outputs=new, backend=backend)
    values = {**new, **extra}
    kept = {n: kept_fields(rec, values[n], tols[n])
            for n, rec in array_records(entry).items() if n in values}
    fresh = case_entry(entry["model"], entry["kind"], entry["description"], entry["config"], entry["seed"],
                       inputs, new, tols, extra, kept)
    write_case(root, case, fresh, None, new, manifest, extra)
    save_manifest(root, manifest)
    return Regenerated(report, bits)


def _require_model(root: Path, case: str, entry: Mapping, inputs: Mapping[str, np.ndarray]) -> None:
    """InputError when the manifest names another model than the case's stored input
    (:func:`ntpref.oracle.manifest.model_problems`): no computation may run as the wrong model, forced or not."""
    problems = model_problems(root, case, entry, inputs)
    if problems:
        raise InputError(problems[0])


def retolerance(root: str | os.PathLike | None, case: str, backend: str = "numba") -> Report:
    """Replace the tolerances recorded for ``case`` by the float64 policy's for its stored input
    (:func:`ntpref.oracle.policies.bound.bound_tolerances`), leaving every stored file and hash as it is.

    Refused (ComparisonError) when the stored files do not match the manifest, or when the stored
    expected values no longer agree with a fresh computation under the new tolerances (then the
    values, not the tolerances, need attention: ``regen``). Returns that comparison.
    """
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    select_cases(manifest, [case])
    entry = manifest["cases"][case]
    stored, problems = {}, []
    for filename in entry["files"]:
        arrays, more = check_file(root, case, entry, filename)
        if filename == "input.npz" and arrays is not None:
            _require_model(root, case, entry, arrays)
        problems += more
        if filename != "input.npz":
            stored.update(arrays or {})
    if problems:
        raise ComparisonError(f"retolerance {case}: stored files do not match the manifest: " + "; ".join(problems))
    inputs = load_npz(root / case / "input.npz")
    tols = bound_tolerances(entry["model"], entry["kind"], inputs, stored, backend=backend)
    report = compare_arrays(stored, _outputs(entry, inputs, backend), tols, labels=("stored", "new"))
    if not report.ok:
        raise ComparisonError(f"retolerance {case}: refused, the stored values fail the new tolerances "
                              f"({report.summary()})\n{report.table()}")
    for section in ("arrays", "intermediates"):
        for name, rec in entry.get(section, {}).items():
            tol = tols[name]
            entry[section][name] = ordered_record({k: rec[k] for k in BYTES_FIELDS}, kept_fields(rec, stored[name], tol), tol)
    save_manifest(root, manifest)
    return report


def export(root: str | os.PathLike | None, case: str, outdir: str | os.PathLike) -> list[Path]:
    """Copy a case's input.npz, expected.npz (and intermediates.npz) to ``outdir``; write ``case.json``.

    The files are checked against the manifest first (ComparisonError when damaged), and written all or
    none (:func:`ntpref.npzio.atomic_write_all`: an InputError leaves ``outdir`` as it was). ``case.json``
    holds the case's float64-policy tolerances (docs/tolerance.md) and can be passed to
    ``ntpref compare --tolerances``.
    """
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    select_cases(manifest, [case])
    entry = manifest["cases"][case]
    problems = [p for f in entry["files"] for p in check_file(root, case, entry, f)[1]]
    if problems:
        raise ComparisonError(f"export {case}: stored files do not match the manifest: " + "; ".join(problems))
    outdir = Path(outdir)
    run = "eval" if entry["kind"] == "eval" else "train"
    info = {"case": case, "format_version": FORMAT_VERSION, "model": entry["model"], "kind": entry["kind"],
            "description": entry["description"], "config": entry["config"], "seed": entry["seed"],
            "provenance": entry.get("provenance", manifest.get("provenance")),
            "usage": (f"ntpref {run} input.npz -o out.npz && ntpref compare expected.npz out.npz "
                      "--tolerances case.json  (or --input input.npz: the same float64 policy, "
                      "computed from the input)") if entry["kind"] != "ntk" else
                     "kind ntk: gram = ntpref.shallow.ntk.ntk_gram(X, c, U, W, ...); compare with expected.npz",
            "tolerances": {n: t.to_json() for n, t in tolerances_of(entry).items()}}
    contents = {outdir / f: (root / case / f).read_bytes() for f in entry["files"]}
    contents[outdir / "case.json"] = (json.dumps(info, indent=1) + "\n").encode("utf-8")
    atomic_write_all({path: lambda fh, data=data: fh.write(data) for path, data in contents.items()})
    return list(contents)

