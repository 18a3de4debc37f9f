"""``ntpref conformance``: its arguments, its header line, the rows of the failing (or, with -v, every)
array, the verdict and the JSON report; the work is :func:`ntpref.oracle.conformance.run`'s."""
from __future__ import annotations

import json
import sys
import traceback
from pathlib import Path

from ..backend import AUTO, CHOICES
from ..checks import integer_at_least, positive_argument
from ..errors import InputError
from ..models import NAMES
from ..npzio import atomic_write, check_output
from ..shipped import ADAPTERS, FAIL_ON_PURPOSE, adapter_path
from .adapters import FUNCTIONS, AdapterError, load_adapter
from .cases import DEFAULT_RANDOM, KINDS, random_cases
from .policies import DESCRIPTIONS, POLICIES, PRECISIONS, check_policy
from .command_adapter import DEFAULT_TIMEOUT, NOT_IMPLEMENTED, CommandAdapter
from .conformance import run
from .report import table_text

#: The folder of the oracle's modules, whose frames lead into the adapter's code.
ORACLE = Path(__file__).resolve().parent


def _adapter_traceback(exc: BaseException) -> str:
    """The traceback of the adapter's exception, from the adapter's first frame on (the oracle's and the
    import machinery's frames dropped)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename.startswith("<frozen")
                              or Path(tb.tb_frame.f_code.co_filename).resolve().parent == ORACLE):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _handle(args) -> int:
    given = [x is not None for x in (args.adapter, args.command_line, args.shipped)]
    if sum(given) != 1:
        raise InputError("give one of an adapter file (ADAPTER.py), --adapter NAME (a shipped adapter: ntpref "
                         "adapters lists them) or --command 'CMD ...', " + ("not more" if any(given) else "none was given"))
    if args.shipped is not None:
        args.adapter = adapter_path(args.shipped)
    if args.timeout is not None and args.command_line is None:
        raise InputError("--timeout applies to --command only")
    if args.json:
        check_output(args.json)      # before the run, not after it
    try:
        adapter = load_adapter(args.adapter if args.command_line is None else CommandAdapter(
            args.command_line, DEFAULT_TIMEOUT if args.timeout is None else args.timeout))
        defined = [FUNCTIONS[k] for k in FUNCTIONS if adapter.function(k) and args.kind in (None, k)]
        args.policy = check_policy(args.precision, args.policy)     # before the header, not at the first case
        policy = DESCRIPTIONS[args.precision, args.policy]
        print(f"conformance of {adapter.name} ({', '.join(defined)}) under the {policy}; random cases from seed "
              f"{args.seed}; {_backends_text(args)}")
        reports = run(adapter, args.model, args.random, args.seed, args.precision, not args.no_stored, args.root,
                      progress=lambda r: print(r.summary(), flush=True), skip_outputs=args.skip_output,
                      kind=args.kind, policy=args.policy, accept_unchecked=args.accept_unchecked,
                      backend=args.backend)
    except AdapterError as exc:
        if exc.__cause__ is not None:
            print(_adapter_traceback(exc.__cause__), end="", file=sys.stderr)
        raise
    rows = [row for r in reports for row in r.table_rows(args.verbose)]
    if rows:
        print(table_text(rows))
    line, ok = reports.total(), reports.ok
    if args.precision == "float64" and any("less precise" in r.note for rep in reports for r in rep.rows):
        print("(float32 results cannot meet the float64 policy: judge them with --precision float32)")
    print(line)
    if args.json:
        document = {"adapter": adapter.name, "precision": args.precision, "policy": args.policy,
                    "backend": args.backend, "seed": args.seed,
                    "random": args.random, "models": list(args.model or NAMES), "total": line, "ok": ok,
                    "cases": [r.to_dict() for r in reports]}
        atomic_write(args.json, lambda fh: fh.write(json.dumps(document, indent=1).encode()))
    return 0 if ok else 1


def _backends_text(args) -> str:
    """Which backend of the oracle computes the expected values: the random cases' (counted per backend, with
    "auto" when it chose) and the stored cases' (Numba, stored)."""
    chosen = {}
    for case in random_cases(args.model, args.random, args.seed, args.backend):
        if args.kind in (None, case.kind):
            chosen[case.backend] = chosen.get(case.backend, 0) + 1
    parts = [f"{backend} for {n} random case{'s' if n != 1 else ''}" for backend, n in sorted(chosen.items())]
    if not args.no_stored:
        parts.append("numba for the stored cases (their stored values)")
    how = " (auto: by each input's size)" if args.backend == AUTO and chosen else ""
    return "expected values by the oracle's " + ", ".join(parts) + how if parts else "no cases"


def register(subparsers) -> None:
    """Add ``ntpref conformance (ADAPTER.py | --command CMD [--timeout S]) [--model ...] [--kind K] [--random N]
    [--seed S] [--precision ...] [--policy ...] [--skip-output NAME ...] [--accept-unchecked NAME ...] [--json F]
    [-v]``."""
    text = ("check an implementation (an adapter file defining evaluate and/or train, or a command in any "
            "language) against the oracle")
    p = subparsers.add_parser("conformance", help=text, description=text + " on every stored eval/train case and "
                              "fresh random cases covering the options and edge regimes (docs/conformance.md). "
                              "Exit 0 all pass, 1 a case failed, a required output was never compared or an "
                              "output was unchecked on every case (its tolerance admits every value) without "
                              "--accept-unchecked, "
                              "2 adapter or usage error.")
    p.add_argument("adapter", metavar="ADAPTER.py", nargs="?",
                   help="defines evaluate(model, inputs) and/or train(model, inputs) returning dicts of arrays")
    p.add_argument("--adapter", metavar="NAME", dest="shipped", choices=ADAPTERS,
                   help="instead of ADAPTER.py: an adapter shipped with ntpref (" +
                        ", ".join(name for name in ADAPTERS if name not in FAIL_ON_PURPOSE) + "; failing on purpose, "
                        "to show what a failing adapter reports: " + ", ".join(FAIL_ON_PURPOSE) + "; its framework "
                        "must be installed)")
    p.add_argument("--command", metavar="CMD", dest="command_line",   # args.command is the sub-command
                   help="instead of ADAPTER.py: a command run once per case (no shell), with {input} or "
                        "{input_dir} (the case's input: an npz file, a directory of NAME.npy files), {output} or "
                        "{output_dir} (where it writes its outputs, in the same forms), {kind} and {model} "
                        f"replaced; exit status {NOT_IMPLEMENTED} skips the case")
    p.add_argument("--timeout", type=positive_argument, metavar="SECONDS",
                   help=f"with --command: seconds per case before the command is killed (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--model", nargs="+", choices=NAMES, help="only these models (default all)")
    p.add_argument("--kind", choices=KINDS, help="only the cases of this kind (default both)")
    p.add_argument("--random", type=integer_at_least(0), default=DEFAULT_RANDOM, metavar="N",
                   help=f"random cases per model (default {DEFAULT_RANDOM}: every regime of every model)")
    p.add_argument("--seed", type=integer_at_least(0), default=0, metavar="S",
                   help="seed of the random cases (default 0)")
    p.add_argument("--precision", choices=PRECISIONS, default="float64",
                   help="the arithmetic the implementation is judged in (default float64); float32 results are "
                        "widened to float64 and judged against what float32 arithmetic achieves on each input")
    p.add_argument("--policy", choices=POLICIES,
                   help="calibrated (the default): 16 times the oracle's own error against exact arithmetic "
                        "(recorded for the stored cases; one exact run per random case, seconds each), in float32 "
                        "scaled by 2^29 plus the response to the inputs rounded to float32; bound: the running "
                        "error bound every correct float64 program meets, in float32 the float32 envelope")
    p.add_argument("--no-stored", action="store_true", help="only the random cases")
    p.add_argument("--backend", choices=CHOICES, default=AUTO,
                   help="the oracle's backend that computes the random cases' expected values and the tolerance "
                        "policies' runs of them: 'auto' (the default) picks numpy for a small input (all of the "
                        "random cases: no Numba compilation), numba otherwise (ntpref eval --help); the stored "
                        "cases keep their stored Numba values")
    p.add_argument("--root", metavar="DIR", help="reference directory of the stored cases (default: as ntpref verify)")
    p.add_argument("--skip-output", action="append", default=[], metavar="NAME",
                   help="accept that no case returns this output (an eval or train output; repeatable)")
    p.add_argument("--accept-unchecked", action="append", default=[], metavar="NAME",
                   help="accept that this output is unchecked on every case that compares it: its tolerance admits every "
                        "value (it is at or above the array's own scale; docs/tolerance.md); repeatable")
    p.add_argument("--json", metavar="REPORT.json", help="also write the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="every array's row (default: failures only)")
    p.set_defaults(func=_handle)
