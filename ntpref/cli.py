"""The ``ntpref`` command (docs/contract.md, "Commands and exit statuses").

Exit status: 0 ok, 1 a comparison failed, 2 bad input or usage, 128 + N ended by signal N (SIGINT,
SIGTERM, SIGHUP: :mod:`ntpref.interrupt`). Errors and warnings are one line on stderr each, never a
traceback (set NTPREF_DEBUG=1 to see one). Commands other than eval/train live next to
the code they drive: each module in :data:`COMMAND_MODULES` has ``register(subparsers)``, which adds
its sub-commands with ``set_defaults(func=handler)``; ``handler(args) -> int`` is the exit status.
"""
from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import warnings

from . import __version__, interrupt
from .errors import ComparisonError, NtprefError
from .numba_target import check_thread_variables

COMMAND_MODULES = (
    "ntpref.oracle.compare",      # compare
    "ntpref.oracle.reference",    # verify, regen, export
    "ntpref.oracle.gradcheck",    # gradcheck
    "ntpref.oracle.conformance",  # conformance
    "ntpref.reproduce",           # reproduce
    "ntpref.bench",               # bench
)


def _run_contract(args) -> int:
    from .oracle.contract import run_file
    from .progress import Progress

    run_file(args.command, args.input, args.output, backend=args.backend,
             progress=Progress(enabled=not args.quiet))
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (exit status 2), like every other ntpref error; ``positionals``
    lists the destinations of the positional arguments given to ``add_argument``, in order (the
    sub-commands' parsers are of this class too)."""

    def __init__(self, *args, **kwargs):
        self.positionals = []
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if not action.option_strings:
            self.positionals.append(action.dest)
        return action

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every sub-command registered."""
    parser = _Parser(prog="ntpref", description="ntpref: a float64 CPU oracle (closed-form gradients, Numba "
                     "kernels) for two papers on training shallow transformers")
    parser.add_argument("--version", action="version", version=f"ntpref {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, text in (("eval", "evaluate loss, outputs and gradients of an input file"),
                       ("train", "train from an input file (Algorithm 1, ProjGD or ProjSGD)")):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument("input", metavar="INPUT.npz")
        p.add_argument("-o", "--output", metavar="OUT.npz", required=True)
        p.add_argument("--backend", choices=("numba", "numpy"), default="numba")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
        p.set_defaults(func=_run_contract)
    for module in COMMAND_MODULES:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:
                raise
            continue
        mod.register(sub)
    for command in sub.choices.values():  # named in the message of an interrupted command
        command.set_defaults(positionals=command.positionals)
    return parser


def _activity(args) -> str:
    """What an interrupted command was doing: the sub-command and its positional arguments ("train k20.npz")."""
    words = [args.command]
    for dest in args.positionals:
        value = getattr(args, dest, None)
        if isinstance(value, list):      # nargs="*", e.g. reproduce's targets
            words += map(str, value)
        elif value is not None:          # None: an optional positional left out
            words.append(str(value))
    return " ".join(words)


def _warning_line(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (e.g. a sweep recomputing a damaged cell) as one line: ``ntpref: warning: ...``."""
    print(f"ntpref: warning: {message}".replace("\n", " "), file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status. SIGINT, SIGTERM and SIGHUP end it with
    one line and status 128 + the signal's number (:mod:`ntpref.interrupt`)."""
    with interrupt.handling(), warnings.catch_warnings():
        warnings.showwarning = _warning_line
        try:
            status = _run(argv)
        except BaseException as exc:
            if interrupt.received() is None and not isinstance(exc, KeyboardInterrupt):
                return _failure(exc)
            status = None
        # a signal, also one that library code turned into another exception (numpy's import makes an
        # ImportError of it) or swallowed; a KeyboardInterrupt without our handler (not the main thread)
        signum = interrupt.received() or (signal.SIGINT if status is None else None)
        return status if signum is None else interrupt.report(signum)


def _run(argv: list[str] | None) -> int:
    check_thread_variables()
    parser = build_parser()
    args = parser.parse_args(argv)
    interrupt.set_activity(_activity(args))
    return int(args.func(args))


def _failure(exc: BaseException) -> int:
    """The exit status of a command that raised ``exc``, after one line on stderr saying why (NTPREF_DEBUG=1
    re-raises instead, to show the traceback)."""
    if isinstance(exc, SystemExit):  # argparse: usage errors exit with 2 already, --help and --version with 0
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    if isinstance(exc, ComparisonError):
        print(f"ntpref: {exc}", file=sys.stderr)
        return 1
    if os.environ.get("NTPREF_DEBUG") == "1" or not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, NtprefError):
        line = f"ntpref: error: {exc}"
    elif isinstance(exc, MemoryError):  # an input too large for this machine, not a bug
        line = f"ntpref: error: out of memory ({exc})"
    elif isinstance(exc, OSError) and exc.filename is not None:  # a path the system refuses (too long, ...)
        line = f"ntpref: error: {os.fsdecode(exc.filename)}: {exc.strerror or exc}"
    else:  # a bug: still one line, but say so
        line = (f"ntpref: internal error (please report; NTPREF_DEBUG=1 shows a traceback): "
                f"{type(exc).__name__}: {exc}")
    print(line.replace("\n", " "), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
