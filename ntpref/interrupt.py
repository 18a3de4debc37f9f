"""Signals that end the ``ntpref`` command: one line on stderr, exit status 128 + the signal's number.

SIGINT (Ctrl-C), SIGTERM and SIGHUP end the command with one line naming the signal and what was running,
``ntpref: interrupted by SIGTERM (train k20.npz)``, and exit status 130, 143 and 129. Inside
:func:`ntpref.cli.main` the signal unwinds the work as an :class:`Interrupted` exception (a
KeyboardInterrupt), so a result file being written is removed (:func:`ntpref.npzio.atomic_write`)
and worker processes are stopped; a second signal while that runs ends the process at once. While the
command imports ntpref, before ``main`` starts, the process ends at once: there is nothing to clean up yet.

A program that imports ntpref keeps its own handlers: ``import ntpref`` installs none, and
:func:`install_if_command` (called first by ``ntpref.cli``, the command's module) acts only in the
command's process, and a program calling ``main`` gets its handlers
back when ``main`` returns (:class:`handling`). A signal the command was started with ignored stays
ignored (``nohup`` ignores SIGHUP, a shell's background job SIGINT). Python runs handlers between
bytecodes, so a signal that arrives during one long Numba kernel call takes effect when the call returns;
one that arrives while Python itself starts, before ``ntpref.cli`` installs the handlers, gets
Python's own behaviour (the process is killed by the signal, or Python reports a KeyboardInterrupt).
"""
import gc
import os
import signal
import sys

# Nothing else is imported here: ``ntpref.cli`` installs these handlers first, as early as it can.
SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Interrupted(KeyboardInterrupt):
    """A signal of :data:`SIGNALS` arrived while :func:`handling` was active."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


_state = {"unwind": False, "activity": "", "reported": False, "received": None}


def received() -> int | None:
    """The signal that arrived within :class:`handling`, or None."""
    return _state["received"]


def set_activity(text: str) -> None:
    """What the command is doing, for the message (e.g. "train k20.npz")."""
    _state["activity"] = text


def _line(signum: int) -> str:
    """``ntpref: interrupted by SIGNAL (activity)`` and a newline the first time, "" afterwards."""
    if _state["reported"]:
        return ""
    _state["reported"] = True
    what = f" ({_state['activity']})" if _state["activity"] else ""
    return f"ntpref: interrupted by {signal.Signals(signum).name}{what}\n"


def report(signum: int) -> int:
    """Print the line of :func:`_line` on stderr (once); returns the exit status 128 + signum."""
    try:
        print(_line(signum), end="", file=sys.stderr, flush=True)
    except (OSError, ValueError):  # no terminal any more (SIGHUP), stderr closed
        pass
    return 128 + signum


def _handler(signum, frame) -> None:
    _state["received"] = _state["received"] or signum
    if _state["unwind"]:
        _state["unwind"] = False   # a second signal while unwinding ends the process at once
        raise Interrupted(signum)
    try:  # straight to the descriptor: the signal may have interrupted a write to sys.stderr
        os.write(2, _line(signum).encode(errors="replace"))
    finally:
        os._exit(128 + signum)


def _install() -> dict:
    """Handle every signal of SIGNALS that is not ignored with _handler; returns the previous handlers
    (none outside the main thread, where Python cannot set handlers)."""
    previous = {}
    for signum in SIGNALS:
        old = signal.getsignal(signum)
        if old is signal.SIG_IGN:
            continue
        try:
            signal.signal(signum, _handler)
        except ValueError:  # not the main thread
            break
        previous[signum] = old
    return previous


def started_as_command() -> bool:
    """Whether this process runs the ``ntpref`` console script or ``python -m ntpref.cli``, read from the
    interpreter's own command line (``sys.orig_argv``): the worker processes the command starts have theirs."""
    argv = iter(getattr(sys, "orig_argv", ())[1:])
    for word in argv:
        if word in ("-X", "-W", "--check-hash-based-pycs"):  # options with a separate value
            next(argv, None)
        elif word == "-m" or word.startswith("-m"):
            return (next(argv, "") if word == "-m" else word[2:]) == "ntpref.cli"
        elif word == "-c":
            return False
        elif not word.startswith("-"):  # the script
            return os.path.basename(word) == "ntpref"
    return False


def install_if_command() -> None:
    """In the ``ntpref`` command, end the process with one line on a signal from now on (module docstring)."""
    if started_as_command():
        _install()


def _deliver_later(signum: int) -> None:
    """Raise :class:`Interrupted` for ``signum`` a millisecond from now (SIGALRM), in whatever line of Python
    runs then."""
    def alarm(_signum, _frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 1e-3)


def _unraisable(hook):
    """A ``sys.unraisablehook`` that re-delivers an :class:`Interrupted` which Python could not raise (it
    arrived in a callback from C, e.g. Numba's cache notification, where exceptions are only printed): it
    is raised again a moment later, so the work unwinds in ordinary Python code (if that moment falls in a
    callback again, the same happens again). Once a signal has arrived, what a destructor raises is not
    printed either: the signal can stop library code between two lines of a constructor (llvmlite's
    references, as Numba starts), and the half-built object fails as it is destroyed. Before a signal,
    anything else goes to ``hook``."""
    def unraisable(info):
        if isinstance(info.exc_value, Interrupted):
            _deliver_later(info.exc_value.signum)
        elif _state["received"] is None:
            hook(info)
    return unraisable


def _excepthook(hook):
    """A ``sys.excepthook`` that prints nothing for an :class:`Interrupted`: C code that prints an exception
    and goes on (NumPy's ``import_array``, run by an extension module as it loads, prints what stopped the
    import and raises an ImportError instead) would show a traceback. The signal is recorded
    (:func:`received`), so the command still ends with its one line. Anything else goes to ``hook``."""
    def excepthook(kind, value, tb):
        if not isinstance(value, Interrupted):
            hook(kind, value, tb)
    return excepthook


class handling:
    """``with handling():`` a signal of SIGNALS raises :class:`Interrupted` within the block; the previous
    handlers (and ``sys.unraisablehook``, ``sys.excepthook``) come back afterwards."""

    def __enter__(self):
        self.previous = _install()
        self.hook, self.alarm = sys.unraisablehook, signal.getsignal(signal.SIGALRM)
        self.excepthook = sys.excepthook
        sys.unraisablehook, sys.excepthook = _unraisable(self.hook), _excepthook(self.excepthook)
        _state.update(unwind=bool(self.previous), activity="", reported=False, received=None)
        return self

    def __exit__(self, *exc_info):
        if _state["received"] is not None:
            gc.collect()   # half-built objects in reference cycles go now, under the hook of _unraisable
        _state.update(unwind=False, received=None)
        sys.unraisablehook, sys.excepthook = self.hook, self.excepthook
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self.alarm if self.alarm is not None else signal.SIG_DFL)
        for signum, old in self.previous.items():
            signal.signal(signum, old if old is not None else signal.SIG_DFL)
        return False
