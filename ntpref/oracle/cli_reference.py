"""``ntpref verify``, ``ntpref regen`` and ``ntpref export``: their arguments and what they print; the work is
:mod:`ntpref.oracle.reference`'s."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tabulate import tabulate

from ..errors import InputError
from .bits import changes_text, ulp_text
from .manifest import ENV_ROOT, array_records, certified_text, default_root, load_cases, select_cases
from .provenance import provenance, provenance_text
from .reference import CaseResult, Regenerated, export, regen, retolerance, verify


def _print_results(results: list[CaseResult], manifest: Mapping, verbose: bool, promises: bool) -> bool:
    """The table of ``verify`` (per case with -v: the stored provenance, the comparison and every array's
    bits); ``promises``: whether the run can be held to the ``bitwise`` promises (the numba backend).
    Returns whether every case passed its tolerances."""
    rows = []
    for r in results:
        n = len(r.report.rows) if r.report else 0
        good = sum(row.ok for row in r.report.rows) if r.report else 0
        rows.append((r.case, r.kind, f"{good}/{n}", f"{r.seconds:.2f}", certified_text(manifest["cases"][r.case]),
                     r.status))
    if verbose:
        print(f"this run: {provenance_text(provenance())}\n")
    print(tabulate(rows, headers=("case", "kind", "arrays ok", "seconds", "certified", "status"),
                   disable_numparse=True))
    for r in results:
        if verbose or not r.ok:
            print(f"\n== {r.case} ==")
            if verbose:
                print(f"stored by: {provenance_text(manifest['cases'][r.case].get('provenance', {}))}")
            for p in r.problems:
                print(f"  {p}")
            if r.report is not None:
                print(r.report)
            if verbose and r.bits:
                entry = manifest["cases"][r.case]
                records = array_records(entry)
                print(tabulate([(b.name, "yes" if b.promised else "no", ulp_text(b.ulp),
                                 f"{records[b.name]['certified']:.1e}" if "certified" in records.get(b.name, {})
                                 else "-") for b in r.bits],
                               headers=("array", "bitwise", "stored vs new bits", "certified err/tol"),
                               disable_numparse=True))
    failed = [r.case for r in results if not r.ok]
    identical = sum(r.status == "bit-identical" for r in results)
    print(f"\n{len(results) - len(failed)}/{len(results)} cases ok, {identical} bit-identical"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    unreadable = [f for r in results for f in r.unreadable]
    if unreadable:
        print(f"stored files that do not read, so their arrays were not compared: {', '.join(unreadable)} "
              "(the reason is above)")
    moved = [r for r in results if r.moved] if promises else []
    if moved:
        print(f"arrays promised bit-identical whose bits moved: {sum(len(r.moved) for r in moved)}, in "
              f"{', '.join(r.case for r in moved)} (-v lists them): the oracle's rounding changed, or this "
              "platform's C library computes log, exp or erf differently (docs/contract.md)")
    return not failed


def _root(args) -> Path:
    return Path(args.root) if args.root else default_root()


def _handle_verify(args) -> int:
    root = _root(args)
    manifest = load_cases(root)
    if args.list:
        for name in select_cases(manifest, args.cases):
            c = manifest["cases"][name]
            print(f"{name} [{c['model']} {c['kind']}]: {c['description']}")
        return 0
    results = verify(root, args.cases, args.backend)
    return 0 if _print_results(results, manifest, args.verbose, promises=args.backend == "numba") else 1


def _handle_regen(args) -> int:
    root = _root(args)
    if args.tolerances_only and args.force:
        raise InputError("--tolerances-only never rewrites values; it cannot be combined with --force")
    for case in args.cases:
        if args.tolerances_only:
            report = retolerance(root, case, backend=args.backend)
            worst = max((r.ratio or 0.0) for r in report.rows)
            print(f"{case}: tolerances rewritten (float64 policy; stored values at {worst:.1e} of them)")
            continue
        result = regen(root, case, force=args.force, backend=args.backend)
        print(regen_text(case, result))
        if not result.report.ok:
            print(result.report)
    return 0


def regen_text(case: str, result: Regenerated) -> str:
    """What ``regen`` did, on one line: "CASE: unchanged, ..." or "CASE: rewritten, ..." (:func:`changes_text`),
    "(forced; differences below)" when the new values lie beyond the old tolerances."""
    if not result.changed:
        return f"{case}: {changes_text(result.bits)}"
    return f"{case}: rewritten, {changes_text(result.bits)}" + ("" if result.report.ok else
                                                               " (forced; differences below)")


def _handle_export(args) -> int:
    for path in export(_root(args), args.case, args.output):
        print(path)
    return 0


def register(subparsers) -> None:
    """Add ``ntpref verify [CASE ...]``, ``ntpref regen CASE ...`` and ``ntpref export CASE -o DIR``."""
    def common(p):
        p.add_argument("--root", metavar="DIR", help=f"reference directory (default ${ENV_ROOT} or the repository's "
                       "reference_runs/)")

    text = "recompute stored reference cases and compare them with their expected outputs"
    p = subparsers.add_parser("verify", help=text, description=text + "; also checks every stored array's "
                              "SHA-256 against manifest.json and reports each case as bit-identical or within "
                              "tolerance (max N ulp of the stored values) (exit 0 all within tolerance, 1 any "
                              "mismatch)")
    p.add_argument("cases", nargs="*", metavar="CASE", help="cases to verify (default all)")
    p.add_argument("--backend", choices=("numba", "numpy"), default="numba")
    p.add_argument("--list", action="store_true", help="list the cases and what they exercise, compute nothing")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every case's comparison table, each array's distance from its stored bits and "
                        "the provenance of this run and of the stored files")
    common(p)
    p.set_defaults(func=_handle_verify)

    text = "recompute reference cases from their stored inputs and rewrite expected.npz and the manifest"
    p = subparsers.add_parser("regen", help=text, description=text + " (after an intended change; refused when "
                              "values move beyond the case's tolerances unless --force); prints which arrays "
                              "changed and by how many ulp, or that none did")
    p.add_argument("cases", nargs="+", metavar="CASE")
    p.add_argument("--force", action="store_true", help="rewrite even when values change beyond tolerance")
    p.add_argument("--tolerances-only", action="store_true",
                   help="only replace the recorded tolerances by the float64 policy's (docs/tolerance.md); "
                        "stored files and hashes stay unchanged")
    p.add_argument("--backend", choices=("numba", "numpy"), default="numba")
    common(p)
    p.set_defaults(func=_handle_regen)

    text = "copy a reference case's input.npz, expected.npz and a case.json with its tolerances to a directory"
    p = subparsers.add_parser("export", help=text, description=text)
    p.add_argument("case", metavar="CASE")
    p.add_argument("-o", "--output", metavar="DIR", required=True)
    common(p)
    p.set_defaults(func=_handle_export)
