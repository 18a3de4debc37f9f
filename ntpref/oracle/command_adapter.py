"""An implementation in any language, run as a command once per case (docs/conformance.md, "Any language:
--command"): the command line and its placeholders, the case's input written as an npz file or a directory
of ``NAME.npy`` files, the command run in a session of its own (killed with everything it started at the
timeout, at its end and when ntpref is interrupted: :mod:`ntpref.oracle.reaper`), its outputs read back,
and the last lines of its stderr quoted when it fails a case."""
from __future__ import annotations

import math
import os
import shlex
import shutil
import signal
import string
import subprocess
import tempfile
import warnings
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

import numpy as np

from ..errors import InputError, NtprefError
from ..npzio import BUDGET_VARIABLE, MAX_MEMBERS, load_npy, load_npz, memory_budget, save_npz
from .reaper import Reaper

#: Exit status by which a command declines a case, as NotImplementedError does in Python: the case is skipped.
NOT_IMPLEMENTED = 3
#: Seconds a command may take on one case unless told otherwise (``--timeout``).
DEFAULT_TIMEOUT = 600.0
#: Lines of the command's stderr quoted in the report of a case it failed, and the most characters of each.
STDERR_LINES, STDERR_WIDTH = 12, 300
#: What a command line may name: the case's input (an npz file, a directory of NAME.npy files), where its
#: outputs go (the same two forms), its kind ("eval" | "train") and its model.
PLACEHOLDERS = ("input", "input_dir", "output", "output_dir", "kind", "model")


class CaseError(NtprefError):
    """An implementation failed one case in a way that leaves the other cases to run (a command's non-zero
    exit status, its timeout, an output it did not write or wrote unreadable): that case fails with this
    message, where a Python adapter's exception would stop the run."""


class CommandAdapter:
    """An implementation in any language, run as ``command`` once per case (docs/conformance.md, "Any
    language: --command").

    The command line is split like a shell's words (:func:`shlex.split`) but run without a shell, after its
    placeholders are replaced in each word (Python format syntax, ``{{`` and ``}}`` for literal braces):
    ``{input}`` an uncompressed npz file holding the case's ``ntpref eval`` / ``ntpref train`` input (with
    the 0-d string ``model``), ``{input_dir}`` a directory holding the same arrays as one ``NAME.npy``
    file each (C order), ``{output}`` the npz file or ``{output_dir}`` the empty directory the command writes
    its outputs into (exactly one of the two), ``{kind}`` and ``{model}``. Its stdin is empty, its stdout
    discarded and the last lines of its stderr (kept in an unnamed temporary file outside the case's folder)
    quoted in the report of a case it fails; it runs in a session of its own, and it and whatever it started
    (on Linux also what left that session: :class:`ntpref.oracle.reaper.Reaper`) are killed after
    ``timeout`` seconds, when it ends, and when ntpref is interrupted. The case's folder is removed then (a
    warning naming it when that fails).

    Exit status 0 and the outputs are judged as a Python adapter's dict; :data:`NOT_IMPLEMENTED` skips the
    case (the reason: the last line of stderr); any other status, a signal, the timeout, a missing or
    unreadable output, a process it started that cannot be killed fail that case (:class:`CaseError`).
    InputError for a command line that does not split, names an unknown placeholder, no input, not exactly
    one output, or a program that is not found.
    """

    def __init__(self, command: str, timeout: float = DEFAULT_TIMEOUT):
        self.command = command
        self.words, self.used = _command_words(command)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (0 < timeout < math.inf):
            raise InputError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.timeout = float(timeout)

    def __repr__(self) -> str:
        return f"CommandAdapter({self.command!r}, timeout={self.timeout:g})"

    def evaluate(self, model: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The command's ``ntpref eval`` outputs for one case."""
        return self._case("eval", model, inputs)

    def train(self, model: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The command's ``ntpref train`` outputs for one case."""
        return self._case("train", model, inputs)

    def _case(self, kind: str, model: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Write the input the command line names, run it, read its outputs; the case's folder is removed
        afterwards (a warning naming it when it cannot be)."""
        folder = tempfile.mkdtemp(prefix="ntpref-conformance-")
        try:
            return self._run_in(folder, kind, model, inputs)
        finally:
            _remove(folder)

    def _run_in(self, folder: str, kind: str, model: str, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """:meth:`_case` in the temporary ``folder``."""
        paths = {name: Path(folder, file) for name, file in (("input", "input.npz"), ("input_dir", "input"),
                                                             ("output", "output.npz"), ("output_dir", "output"))}
        arrays = {"model": np.array(model), **inputs}
        if "input" in self.used:
            save_npz(paths["input"], arrays)
        if "input_dir" in self.used:
            paths["input_dir"].mkdir()
            for name, value in arrays.items():
                np.save(paths["input_dir"] / f"{name}.npy", np.asarray(value, order="C"), allow_pickle=False)
        if "output_dir" in self.used:
            paths["output_dir"].mkdir()
        values = {"kind": kind, "model": model, **{name: str(path) for name, path in paths.items()}}
        status, tail = self._execute([word.format(**values) for word in self.words])
        if status == NOT_IMPLEMENTED:
            raise NotImplementedError(tail[-1] if tail else f"the command exited with status {status} "
                                                            "(not implemented)")
        if status != 0:
            raise CaseError(_quoting(_exit_text(status), tail))
        where = "output" if "output" in self.used else "output_dir"
        try:
            return load_npz(paths[where]) if where == "output" else _npy_directory(paths[where])
        except InputError as exc:   # named by its placeholder: the temporary path means nothing afterwards
            text = str(exc).replace(str(paths[where]), f"{{{where}}}")
            raise CaseError(_quoting(f"the command exited with status 0, but {text}", tail)) from None

    def _execute(self, argv: list[str]) -> tuple[int, list[str]]:
        """Run ``argv`` with its stderr into an unnamed temporary file (outside the case's folder, so the
        command cannot replace it): (exit status, or −N for signal N; the last lines of its stderr).
        CaseError when it cannot start, outlasts the timeout or leaves processes that cannot be killed."""
        with tempfile.TemporaryFile(prefix="ntpref-stderr-") as stderr, Reaper() as reaper:
            try:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                           start_new_session=True)
            except OSError as exc:
                raise CaseError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
            try:
                status = process.wait(self.timeout)
            except subprocess.TimeoutExpired:
                status = None
            finally:   # its session, then all else it started: nothing outlives the case (or an interrupted ntpref)
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                survivors = reaper.kill_all()
            tail = _stderr_tail(stderr)
        if survivors:
            raise CaseError(_quoting(f"{_exit_text(status) if status is not None else 'the command timed out'}, "
                                     f"and processes it started could not be killed: {', '.join(survivors)}", tail))
        if status is None:
            raise CaseError(_quoting(f"the command timed out after {self.timeout:g} s and was killed", tail))
        return status, tail


def _command_words(command: str) -> tuple[list[str], frozenset[str]]:
    """The words of a command line and the placeholders it names, checked (see :class:`CommandAdapter`)."""
    where = f"command {command!r}"
    if not isinstance(command, str):
        raise InputError(f"{where}: not a string")
    try:
        words = shlex.split(command)
    except ValueError as exc:
        raise InputError(f"{where}: {exc}") from None
    if not words:
        raise InputError(f"{where}: no program to run")
    used = set()
    for word in words:
        try:
            fields = [(name, spec, conversion) for _, name, spec, conversion in string.Formatter().parse(word)
                      if name is not None]
        except ValueError as exc:
            raise InputError(f"{where}: {word!r}: {exc} (write {{{{ and }}}} for a literal brace)") from None
        for name, spec, conversion in fields:
            if name not in PLACEHOLDERS or spec or conversion:
                text = "{" + name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
                raise InputError(f"{where}: unknown placeholder {text} (the placeholders are "
                                 f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}; {{{{ and }}}} are literal braces)")
            used.add(name)
    if not used & {"input", "input_dir"}:
        raise InputError(f"{where}: names neither {{input}} nor {{input_dir}}, so the command cannot read the case")
    if len(used & {"output", "output_dir"}) != 1:
        raise InputError(f"{where}: name exactly one of {{output}} (an npz file) and {{output_dir}} (a directory "
                         "of NAME.npy files) for the outputs")
    program_named = not any(name for _, name, _, _ in string.Formatter().parse(words[0]))   # not a placeholder
    if program_named and shutil.which(words[0].format()) is None:
        raise InputError(f"{where}: no program {words[0].format()!r} (not on PATH, or not an executable file)")
    return words, frozenset(used)


def _npy_directory(folder: Path) -> dict[str, np.ndarray]:
    """The arrays of a directory of ``NAME.npy`` files, each read by :func:`ntpref.npzio.load_npy`. InputError
    naming the directory for an empty one, an entry not named ``NAME.npy``, more than MAX_MEMBERS entries or
    more bytes than the memory budget, and the file for one that is not a regular, well-formed ``.npy`` file."""
    try:
        entries = sorted(os.listdir(folder))
    except OSError as exc:
        raise InputError(f"{folder}: cannot list it ({exc.strerror or exc})") from None
    if not entries:
        raise InputError(f"{folder} is empty")
    if len(entries) > MAX_MEMBERS:
        raise InputError(f"{folder}: {len(entries)} files, more than the {MAX_MEMBERS} arrays an output may hold")
    stray = [e for e in entries if not e.endswith(".npy") or e == ".npy"]
    if stray:
        raise InputError(f"{folder}: '{stray[0]}' is not named NAME.npy (one .npy file per output array)")
    total, budget = 0, memory_budget()
    for entry in entries:
        with suppress(OSError):      # a dangling link and the like: load_npy names the fault below
            total += os.stat(folder / entry).st_size
    if total > budget:
        raise InputError(f"{folder}: its files take {total} bytes, more than the memory budget of {budget} bytes "
                         f"(set {BUDGET_VARIABLE}, e.g. to 16G, to allow more)")
    return {entry[:-len(".npy")]: load_npy(folder / entry) for entry in entries}


def _stderr_tail(log) -> list[str]:
    """The last :data:`STDERR_LINES` non-blank lines of a command's stderr (the open file ``log``), each cut to
    STDERR_WIDTH characters; at most the last STDERR_LINES × STDERR_WIDTH × 4 bytes are read."""
    most = STDERR_LINES * STDERR_WIDTH * 4
    log.seek(max(0, os.fstat(log.fileno()).st_size - most))
    lines = log.read(most).decode("utf-8", errors="replace").splitlines()
    lines = [line.rstrip() for line in lines if line.strip()][-STDERR_LINES:]
    return [line if len(line) <= STDERR_WIDTH else line[:STDERR_WIDTH] + "..." for line in lines]


def _remove(folder: str) -> None:
    """Remove a case's temporary folder, whatever the command left in it (unwritable folders included); a
    warning naming it when that fails, never an error: the case's verdict stands."""
    with suppress(OSError):
        shutil.rmtree(folder, onerror=_writable_then_retry)
    if os.path.lexists(folder):
        warnings.warn(f"cannot remove the temporary folder {folder} of a --command case; remove it by hand",
                      stacklevel=2)


def _writable_then_retry(function, path, exc_info) -> None:
    """rmtree's error handler: make the folder holding ``path`` (and ``path``, a folder) writable and
    searchable, then remove ``path`` once more; a second failure propagates."""
    for folder in (os.path.dirname(path), path):
        with suppress(OSError):
            if os.path.isdir(folder) and not os.path.islink(folder):
                os.chmod(folder, 0o700)
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def _exit_text(status: int) -> str:
    """"the command exited with status 1" or "the command was killed by SIGSEGV" (``status`` −11)."""
    if status >= 0:
        return f"the command exited with status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        name = f"signal {-status}"
    return f"the command was killed by {name}"


def _quoting(message: str, tail: list[str]) -> str:
    """``message``, then the last lines of the command's stderr, one indented line each."""
    if not tail:
        return f"{message} (nothing on stderr)"
    return f"{message}; its stderr ends:" + "".join(f"\n      | {line}" for line in tail)
