"""The ``ntpref`` command (docs/contract.md, "Commands and exit statuses").

Exit status: 0 ok, 1 a comparison failed, 2 bad input or usage, 128 + N ended by signal N (SIGINT,
SIGTERM, SIGHUP: :mod:`ntpref.interrupt`). Output into a closed pipe (``ntpref reproduce --list | head -1``)
ends the command quietly with 141 = 128 + SIGPIPE, as a shell expects; any other failure to write standard
output (a full disk) is one line and status 2. Errors and warnings are one line on stderr each, never a
traceback (set NTPREF_DEBUG=1 to see one). Commands other than eval/train are registered by their
modules: each module in :data:`COMMAND_MODULES` has ``register(subparsers)``, which adds
its sub-commands with ``set_defaults(func=handler)``; ``handler(args) -> int`` is the exit status.
"""
from __future__ import annotations

import argparse
import gc
import importlib
import os
import re
import signal
import sys
import warnings
from contextlib import contextmanager, suppress

from . import __version__, interrupt

interrupt.install_if_command()  # the command: a signal while it imports ends it with one line (ntpref.interrupt)

from .backend import AUTO, CHOICES  # noqa: E402 - after the handlers
from .backend import HELP as BACKEND_HELP  # noqa: E402
from .errors import ComparisonError, NtprefError  # noqa: E402
from .numba_target import check_thread_variables, configure_process  # noqa: E402

COMMAND_MODULES = (
    "ntpref.oracle.compare",          # compare
    "ntpref.oracle.cli_reference",    # verify, regen, export
    "ntpref.oracle.gradcheck",        # gradcheck
    "ntpref.oracle.cli_conformance",  # conformance
    "ntpref.oracle.certify",          # certify
    "ntpref.reproduce",               # reproduce
    "ntpref.bench",                   # bench
    "ntpref.shipped",                 # adapters, docs
)


def _run_contract(args) -> int:
    from .oracle.contract import run_file
    from .progress import Progress

    def announce(text: str) -> None:
        if not args.quiet:
            print(f"ntpref {args.command}: backend {text}", file=sys.stderr)

    run_file(args.command, args.input, args.output, backend=args.backend,
             progress=Progress(enabled=not args.quiet), announce=announce)
    return 0


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<given>[^']*)' \(choose from (?P<choices>.*)\)")
_QUOTED = re.compile(r"'([^']*)'")


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

    def parse_args(self, args=None, namespace=None):
        """argparse's, with each unrecognized option reported by the sub-command that was given, with the
        option of that sub-command closest to it ("--wokers (did you mean '--workers'?)")."""
        namespace, extras = self.parse_known_args(args, namespace)
        if extras:
            parser = self._given_subcommand(namespace)
            parser.error("unrecognized arguments: " + " ".join(parser._suggested(token) for token in extras))
        return namespace

    def error(self, message):
        from .checks import did_you_mean   # imports Numba: not before configure_process

        match = _INVALID_CHOICE.search(message)
        if match:   # argparse's "invalid choice: 'evl' (choose from 'eval', ...)" gains a did-you-mean
            message += did_you_mean(match["given"], _QUOTED.findall(match["choices"]))
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")

    def _given_subcommand(self, namespace) -> "_Parser":
        """The parser of the (nested) sub-command named in ``namespace``; this parser when none is."""
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(namespace, action.dest, None))
                if chosen is not None:
                    return chosen._given_subcommand(namespace)
        return self

    def _suggested(self, token: str) -> str:
        """``token`` followed by the closest of this parser's options when it looks like a mistyped one."""
        from .checks import did_you_mean

        if not token.startswith("-") or token == "-":
            return token
        options = [o for action in self._actions for o in action.option_strings]
        return token + did_you_mean(token.split("=", 1)[0], options)


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
        p.add_argument("--backend", choices=CHOICES, default=AUTO, help=BACKEND_HELP)
        p.add_argument("-q", "--quiet", action="store_true", help="no progress output, no line naming the backend")
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


class _StdoutFailure(Exception):
    """Writing to standard output failed; ``args[0]`` is the OSError."""


class _CheckedStdout:
    """Standard output whose write errors raise :class:`_StdoutFailure`, told apart from every other
    OSError; everything else is the wrapped stream's."""

    def __init__(self, stream):
        self._stream = stream

    def __getattr__(self, name):
        return getattr(self._stream, name)

    def write(self, text):
        return self._checked(self._stream.write, text)

    def flush(self):
        return self._checked(self._stream.flush)

    @staticmethod
    def _checked(call, *args):
        try:
            return call(*args)
        except OSError as exc:
            raise _StdoutFailure(exc) from exc


@contextmanager
def _checked_stdout():
    """``sys.stdout`` as a :class:`_CheckedStdout` for the duration (unchanged when there is none)."""
    stream = sys.stdout
    if stream is not None:
        sys.stdout = _CheckedStdout(stream)
    try:
        yield
    finally:
        sys.stdout = stream


def main(argv: list[str] | None = None) -> int:
    """The command line ``argv`` (default the process's) run, for the console script (:func:`command`) and
    for callers in Python; returns the exit status. SIGINT, SIGTERM and SIGHUP end it with
    one line and status 128 + the signal's number (:mod:`ntpref.interrupt`); standard output is flushed
    before it returns, so that a failure to write it is reported here (:func:`_failure`)."""
    with interrupt.handling(), warnings.catch_warnings(), _checked_stdout():
        warnings.showwarning = _warning_line
        try:
            status = _run(argv)
            if sys.stdout is not None:
                sys.stdout.flush()
        except BaseException as exc:
            if interrupt.received() is None and not isinstance(exc, KeyboardInterrupt):
                return _failure(exc)
            status = None
        # a signal, also one that library code turned into another exception (numpy's import makes an
        # ImportError of it) or swallowed; a KeyboardInterrupt without our handler (not the main thread)
        signum = interrupt.received() or (signal.SIGINT if status is None else None)
        return status if signum is None else interrupt.report(signum)


def command() -> int:
    """The console script ``ntpref``: :func:`main` on the process's arguments, after which the objects left
    in the process are exempted from the garbage collector (``gc.freeze``). The process ends right after
    and frees them; a last collection at exit would first walk every object of Numba's compiler and of
    matplotlib (a few tenths of a second after a ``reproduce``). Every output is written and closed by then."""
    status = main()
    gc.freeze()
    return status


def _run(argv: list[str] | None) -> int:
    configure_process()      # before any ntpref module imports Numba (ntpref.numba_target)
    check_thread_variables()
    parser = build_parser()
    args = parser.parse_args(argv)
    interrupt.set_activity(_activity(args))
    return int(args.func(args))


def _silence_stdout() -> None:
    """Point standard output's descriptor at /dev/null, so that flushing what is left at exit cannot fail
    again (Python would print "Exception ignored ...")."""
    with suppress(OSError, ValueError, AttributeError):  # no descriptor: a stream in memory, or none
        fd = sys.stdout.fileno()
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)


def _output_failure(exc: BaseException) -> int | None:
    """The exit status for a failure to write output, after at most one line on stderr: 128 + SIGPIPE and
    no message for a closed pipe (standard output or error: a shell's command would have been killed by
    SIGPIPE), 2 for another failure to write standard output; None for any other exception."""
    cause = exc.args[0] if isinstance(exc, _StdoutFailure) else exc
    if isinstance(cause, BrokenPipeError):
        _silence_stdout()
        return 128 + signal.SIGPIPE
    if not isinstance(exc, _StdoutFailure):
        return None
    _silence_stdout()
    print(f"ntpref: cannot write to standard output: {cause.strerror or cause}", file=sys.stderr)
    return 2


def _failure(exc: BaseException) -> int:
    """The exit status of a command that raised ``exc``, after one line on stderr saying why (NTPREF_DEBUG=1
    re-raises instead, to show the traceback)."""
    status = _output_failure(exc)
    if status is not None:
        return status
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
    sys.exit(command())
