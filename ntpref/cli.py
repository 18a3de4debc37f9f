"""The ``ntpref`` command (spec/interchange.md, "Commands").

Exit status: 0 ok, 1 a comparison failed, 2 bad input or usage. Errors are one line on stderr,
never a traceback (set NTPREF_DEBUG=1 to see one). Commands other than eval/train live next to
the code they drive: each module in :data:`COMMAND_MODULES` has ``register(subparsers)``, which adds
its sub-commands with ``set_defaults(func=handler)``; ``handler(args) -> int`` is the exit status.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from . import __version__
from .errors import ComparisonError, NtprefError

COMMAND_MODULES = (
    "ntpref.oracle.compare",      # compare
    "ntpref.oracle.reference",    # verify, regen, export
    "ntpref.oracle.gradcheck",    # gradcheck
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
    """argparse with one-line usage errors (exit status 2), like every other ntpref error."""

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
    return parser




def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit status."""
    debug = os.environ.get("NTPREF_DEBUG") == "1"
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args))
    except ComparisonError as exc:
        print(f"ntpref: {exc}", file=sys.stderr)
        return 1
    except NtprefError as exc:
        if debug:
            raise
        print(f"ntpref: error: {exc}".replace("\n", " "), file=sys.stderr)
        return 2
    except MemoryError as exc:  # an input too large for this machine, not a bug
        if debug:
            raise
        print(f"ntpref: error: out of memory ({exc})".replace("\n", " "), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ntpref: interrupted", file=sys.stderr)
        return 130
    except SystemExit as exc:  # argparse usage errors exit with 2 already
        return int(exc.code or 0) if not isinstance(exc.code, str) else 2
    except Exception as exc:  # a bug: still one line, but say so
        if debug:
            raise
        print(f"ntpref: internal error (please report; NTPREF_DEBUG=1 shows a traceback): "
              f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
