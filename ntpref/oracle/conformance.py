"""``ntpref conformance``: check any implementation of the three models against the oracle (docs/conformance.md).

An **adapter** is a Python file (or module, object or dict) that defines one or both of

    evaluate(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]   # ntpref eval outputs
    train(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]      # ntpref train outputs

``model`` is a model of the registry (:mod:`ntpref.models`: "twostage", "shallow", "indrnn"); ``inputs`` are the arrays of an ``ntpref eval`` /
``ntpref train`` input (docs/contract.md) without ``model``, copies the adapter may keep or modify.
Every case of :mod:`ntpref.oracle.cases` is run through the function of its kind and the returned
arrays are compared with the oracle's outputs under a tolerance policy at a precision: in float64
(docs/tolerance.md) the calibrated tolerances by default, the running error bound with ``policy="bound"``;
with ``precision="float32"`` (docs/conformance.md, float32 mode) the calibrated float32 tolerances by
default, the float32 envelope (:mod:`ntpref.oracle.envelope`) with ``policy="bound"``:

* an array the oracle does not output fails (a misspelt name is never ignored); an output the
  adapter does not return is listed in its case, not failed; a case whose outputs the adapter returns
  none of fails;
* a run passes only if every **required** output of its cases was compared in at least one case:
  every output except the :data:`OPTIONAL` diagnostics of the models' specifications (the two-stage
  max-margin solutions ``W_ov_star``, ``W_kq_star`` and the correlations with them, ``stage1_corr``,
  ``stage2_corr``, which need a QP solver). So the loss, the model output and every gradient of an eval case, the trained parameters,
  ``loss_floor`` and the per-step logs of a train case are required; a required output that no case
  returned fails the run unless it is named in ``skip_outputs`` (``--skip-output NAME``);
* ``NotImplementedError`` raised by the adapter marks the case skipped, with its message; anything
  else it raises while it loads or runs (any exception, also ``SystemExit`` and ``KeyboardInterrupt``)
  is an :class:`AdapterError` carrying the adapter's own traceback (exit status 2). Only a signal is
  an interruption: one that :mod:`ntpref.interrupt` recorded (the command's handlers), or, under
  Python's default SIGINT handler, a KeyboardInterrupt (a Ctrl-C cannot be told from a raised one);
* the report names the failing quantity the run computes first (the model's ``timeline``: stage 1 before
  stage 2; at a step the loss, the gradient and its logged norm, then the update and the validation loss;
  the forward pass before the gradients), for a per-step log with the first step where the adapter leaves
  tolerance.

An implementation in another language is a :class:`CommandAdapter` (``--command 'CMD {input} {output}'``):
a command run once per case on a temporary input file, whose output file is judged as above. Its
non-zero exit status, timeout or unreadable output fails that case only (:class:`CaseError`); exit status
:data:`NOT_IMPLEMENTED` skips it.

Python API (e.g. in a pytest suite)::

    from ntpref.oracle.conformance import cases, check
    @pytest.mark.parametrize("case", cases(), ids=lambda c: c.id)
    def test_oracle(case):
        report = check(my_adapter_module, case)
        assert report.ok, report
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shlex
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import NamedTuple

import numpy as np

from .. import interrupt
from ..checks import integer_at_least, positive_argument
from ..errors import InputError, NtprefError
from ..models import NAMES, SPECS
from ..shipped import ADAPTERS, adapter_path
from ..npzio import BUDGET_VARIABLE, MAX_MEMBERS, load_npy, load_npz, memory_budget, save_npz
from .cases import DEFAULT_RANDOM, KINDS, POLICIES, PRECISIONS, TRAJECTORIES, Case, cases, check_policy
from .compare import Row, check_tolerance, compare_arrays, compare_one, element_bounds
from .envelope import MULTIPLE as ENVELOPE_MULTIPLE

__all__ = ["Adapter", "AdapterError", "CaseError", "CaseReport", "CommandAdapter", "NOT_IMPLEMENTED", "OPTIONAL",
           "RunReport", "cases", "check", "load_adapter", "run"]

LABELS = ("oracle", "adapter")
#: The adapter function of each kind of case.
FUNCTIONS = {"eval": "evaluate", "train": "train"}
#: Outputs a run passes without: every model's diagnostics (the two-stage max-margin solutions and the
#: correlations with them, a QP solver's).
OPTIONAL = frozenset(name for spec in SPECS.values() for name in spec.diagnostics)


class AdapterError(NtprefError):
    """The adapter raised (other than NotImplementedError) or returned something that is not a dict of arrays.
    ``__cause__`` holds the adapter's own exception, when there is one."""


def _interruption(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a signal rather than from the adapter: :mod:`ntpref.interrupt` recorded
    one, or ``exc`` is a KeyboardInterrupt while SIGINT has Python's default handler (which makes a Ctrl-C
    one, indistinguishable from a raised one)."""
    return interrupt.received() is not None or (
        isinstance(exc, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is signal.default_int_handler)


def _raised(exc: BaseException) -> str:
    """What the adapter raised: ``KeyError: 'x'`` for an exception, ``SystemExit(0)`` or
    ``KeyboardInterrupt()`` for the others (their text alone says nothing)."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else repr(exc)


@contextmanager
def _adapter_code(where: str):
    """Run adapter code: whatever it raises, a signal's interruption excepted, becomes the AdapterError
    ``{where} raised {what}``."""
    try:
        yield
    except AdapterError:
        raise
    except BaseException as exc:
        if _interruption(exc):
            raise
        raise AdapterError(f"{where} raised {_raised(exc)}") from exc


class Adapter(NamedTuple):
    """An implementation under test: its ``name`` and its ``evaluate`` / ``train`` functions (None if absent)."""

    name: str
    evaluate: Callable | None
    train: Callable | None

    def function(self, kind: str) -> Callable | None:
        """The function that runs cases of ``kind`` ("eval" | "train")."""
        return getattr(self, FUNCTIONS[kind])


def load_adapter(adapter) -> Adapter:
    """An :class:`Adapter` from a path to a .py file (a file inside a package is imported as that package's
    module, any other file like a script), a module or object with ``evaluate`` / ``train`` attributes,
    or a dict of them.

    A :class:`CommandAdapter` is the Adapter named by its command line.

    InputError when the file is missing or defines neither function; AdapterError when loading it raises."""
    if isinstance(adapter, Adapter):
        return adapter
    if isinstance(adapter, CommandAdapter):
        return Adapter(adapter.command, adapter.evaluate, adapter.train)
    if isinstance(adapter, (str, os.PathLike)):
        name, found = str(adapter), _load_file(Path(adapter)).__dict__
    elif isinstance(adapter, Mapping):
        name, found = "adapter", adapter
    else:
        name, found = getattr(adapter, "__name__", type(adapter).__name__), {
            k: getattr(adapter, k) for k in FUNCTIONS.values() if hasattr(adapter, k)}
    functions = {k: found.get(k) for k in FUNCTIONS.values()}
    for key, fn in functions.items():
        if fn is not None and not callable(fn):
            raise InputError(f"{name}: '{key}' is not a function")
    if not any(functions.values()):
        raise InputError(f"{name}: defines neither evaluate(model, inputs) nor train(model, inputs)")
    return Adapter(name, functions["evaluate"], functions["train"])


def _load_file(path: Path):
    """The adapter file, executed afresh, as a module. A file inside a package (its folder holds an
    ``__init__.py``) is that package's module, as Python would import it: examples/adapters/torch_float64.py
    is ``examples.adapters.torch_float64`` and imports its sibling relatively. Any other file is loaded
    like a script. The folder above the outermost package (for a script: the file's own folder) is on
    sys.path while it loads."""
    if not path.is_file():
        raise InputError(f"{path}: no such adapter file")
    file = path.resolve()
    packages, folder = [], file.parent
    while (folder / "__init__.py").is_file():
        packages.insert(0, folder.name)
        folder = folder.parent
    package = ".".join(packages)
    name = f"{package}.{file.stem}" if package else f"ntpref_adapter_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise InputError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    if package:
        sys.modules[name] = module
    sys.path.insert(0, str(folder))
    try:
        with _adapter_code(f"{path}: loading the adapter"):
            spec.loader.exec_module(module)
    except BaseException:
        if package:
            sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(str(folder))
    if package in sys.modules:       # imported by the adapter's relative imports: it must be the file's own
        home = getattr(sys.modules[package], "__file__", None)
        if home is None or Path(home).resolve().parent != file.parent:
            raise InputError(f"{path}: package {package} is already imported from elsewhere ({home})")
    return module


# --- an implementation in any language: a command run once per case ---------------------------------
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
    discarded and the last lines of its stderr quoted in the report of a case it fails; it runs in a session
    of its own, so that it and whatever it started are killed after ``timeout`` seconds, when it ends, and
    when ntpref is interrupted.

    Exit status 0 and the outputs are judged as a Python adapter's dict; :data:`NOT_IMPLEMENTED` skips the
    case (the reason: the last line of stderr); any other status, a signal, the timeout, a missing or
    unreadable output fail that case (:class:`CaseError`). InputError for a command line that does not
    split, names an unknown placeholder, no input, not exactly one output, or a program that is not found.
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
        """Write the input the command line names, run it, read its outputs."""
        with tempfile.TemporaryDirectory(prefix="ntpref-conformance-") as folder:
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
            status, tail = self._execute([word.format(**values) for word in self.words], Path(folder, "stderr"))
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

    def _execute(self, argv: list[str], log: Path) -> tuple[int, list[str]]:
        """Run ``argv`` with its stderr into ``log``: (exit status, or −N for signal N; the last lines of its
        stderr). CaseError when it cannot start or outlasts the timeout."""
        with open(log, "wb") as stderr:
            try:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr,
                                           start_new_session=True)
            except OSError as exc:
                raise CaseError(f"cannot run {argv[0]!r}: {exc.strerror or exc}") from None
            try:
                status = process.wait(self.timeout)
            except subprocess.TimeoutExpired:
                status = None
            finally:   # its whole session: nothing it started outlives the case (or an interrupted ntpref)
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        tail = _stderr_tail(log)
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


def _stderr_tail(log: Path) -> list[str]:
    """The last :data:`STDERR_LINES` non-blank lines of a command's stderr, each cut to STDERR_WIDTH characters."""
    with open(log, "rb") as fh:
        fh.seek(max(0, os.fstat(fh.fileno()).st_size - STDERR_LINES * STDERR_WIDTH * 4))
        lines = fh.read().decode("utf-8", errors="replace").splitlines()
    lines = [line.rstrip() for line in lines if line.strip()][-STDERR_LINES:]
    return [line if len(line) <= STDERR_WIDTH else line[:STDERR_WIDTH] + "..." for line in lines]


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


# --- one case -----------------------------------------------------------------------------------------
#: precision → an array whose tolerance admits an error of this fraction of its largest entry, or more, is
#: checked only coarsely on that case, and the report says so (:func:`coarse_arrays`). In float32 it is the
#: relative error whose detection docs/tolerance.md measures: a relative 1e-4 in such an array may pass.
COARSE = {"float64": 1e-2, "float32": 1e-4}


def coarse_arrays(expected: Mapping[str, np.ndarray], tols: Mapping[str, Mapping],
                  precision: str = "float64") -> dict[str, float]:
    """name → max_k bound_k / max|expected| for the float arrays whose tolerance admits an error of at
    least :data:`COARSE` ``[precision]`` of their largest entry (bound_k of
    :func:`ntpref.oracle.compare.element_bounds`): where the arithmetic of the precision cannot resolve the
    array (float32 in a cancelling regime), a pass says little about it. Arrays that are 0 everywhere are
    left out."""
    out = {}
    for name, tol in tols.items():
        e = np.asarray(expected.get(name))
        if e.dtype.kind != "f" or not e.size:
            continue
        scale = float(np.max(np.abs(e)))
        if scale > 0 and np.isfinite(scale):
            with np.errstate(over="ignore", invalid="ignore"):
                widest = float(np.max(element_bounds(e, check_tolerance(name, tol)))) / scale
            if widest >= COARSE[precision]:
                out[name] = widest
    return out


class CaseReport:
    """The outcome of one case: ``rows`` (one compared array each, :class:`ntpref.oracle.compare.Row`),
    ``unknown`` (returned names the oracle does not output), ``not_returned``, ``skipped`` (the reason,
    or None), ``departure`` ((array, step) of the failing quantity computed first, step None unless it is a
    per-step log; None when nothing failed),
    ``error`` (why the implementation produced no outputs for the case, a :class:`CaseError`, or None),
    ``coarse`` (array → the error its tolerance admits relative to its largest entry, for the compared arrays
    :func:`coarse_arrays` names).
    ``ok`` is True when the case passed or was skipped; ``str(report)`` is its table and summary."""

    def __init__(self, case: Case, precision: str, rows=(), unknown=(), not_returned=(), skipped=None,
                 departure=None, seconds=0.0, error=None, coarse=None):
        self.case, self.precision, self.coarse = case, precision, dict(coarse or {})
        self.rows, self.unknown, self.not_returned = list(rows), list(unknown), list(not_returned)
        self.skipped, self.departure, self.seconds, self.error = skipped, departure, seconds, error

    @property
    def ok(self) -> bool:
        return self.skipped is not None or (self.error is None and bool(self.rows) and not self.unknown
                                            and all(r.ok for r in self.rows))

    @property
    def status(self) -> str:
        return "skip" if self.skipped is not None else "pass" if self.ok else "FAIL"

    def table_rows(self, verbose: bool = True) -> list[tuple]:
        """(case, array, max abs err, max rel err, tolerance, err/tol, verdict) of every array (failures
        only unless ``verbose``), then one row per unknown name."""
        out = []
        for r in self.rows:
            if verbose or not r.ok:
                out.append((self.case.id, r.name, _fmt(r.max_abs_err), _fmt(r.max_rel_err), r.tolerance,
                            _fmt(r.ratio, ".1e"), ("ok" if r.ok else "FAIL") + (f" ({r.note})" if r.note else "")))
        out += [(self.case.id, n, "-", "-", "-", "-", f"FAIL (not an output of ntpref {self.case.kind})")
                for n in self.unknown]
        return out

    def summary(self) -> str:
        """One line: verdict, case id and what happened (for a command's failure, then the last lines of its
        stderr)."""
        head = f"{self.status:4s}  {self.case.id}"
        if self.skipped is not None:
            return f"{head}: skipped: {self.skipped}"
        if self.error is not None:
            return f"{head}: {self.error}"
        n_ok = sum(r.ok for r in self.rows)
        text = f"{head}: {n_ok}/{len(self.rows)} arrays within tolerance"
        failing = [r.name for r in self.rows if not r.ok] + self.unknown
        if not self.rows:
            return text + f" (the adapter returned none of the outputs: {', '.join(self.case.expected)})"
        if failing:
            text += f"; failing: {', '.join(failing)}"
        if self.departure and self.departure[1] is not None:
            text += f"; leaves tolerance first at step {self.departure[1]} of {self.departure[0]}"
        elif self.departure and len(failing) > 1:
            text += f"; first wrong in the order of computation: {self.departure[0]}"
        if self.not_returned:
            text += f"; not returned: {', '.join(self.not_returned)}"
        if self.coarse:
            text += (f"; checked only coarsely (the {self.precision} tolerance admits errors up to this fraction of the array's "
                     f"largest entry): " + ", ".join(f"{n} {r:.1g}" for n, r in self.coarse.items()))
        return text

    def table(self, verbose: bool = True) -> str:
        return _table(self.table_rows(verbose))

    def __str__(self) -> str:
        return f"{self.table()}\n{self.summary()}"

    __repr__ = __str__   # what ``assert report.ok, report`` shows in pytest

    def to_dict(self) -> dict:
        """JSON-ready form of the report."""
        rows = [{"array": r.name, "shape": list(r.shape), "max_abs_err": _number(r.max_abs_err),
                 "max_rel_err": _number(r.max_rel_err), "tolerance": r.tolerance,
                 "err/tol": _number(r.ratio), "ok": r.ok, "note": r.note} for r in self.rows]
        return {"case": self.case.id, "model": self.case.model, "kind": self.case.kind, "source": self.case.source,
                "description": self.case.description, "status": self.status, "skipped": self.skipped,
                "error": self.error,
                "rows": rows, "unknown": self.unknown, "not_returned": self.not_returned,
                "departure": None if self.departure is None else {"array": self.departure[0], "step": self.departure[1]},
                "coarse": {n: _number(r) for n, r in self.coarse.items()}, "seconds": round(self.seconds, 3)}


def _number(x: float | None) -> float | str | None:
    """A float for JSON: "inf" / "nan" as strings (JSON has no such numbers)."""
    return x if x is None or np.isfinite(x) else str(x)


def _fmt(x, spec: str = ".3e") -> str:
    return "-" if x is None else format(x, spec)


def _table(rows: list[tuple]) -> str:
    from tabulate import tabulate

    headers = ("case", "array", "max abs err", "max rel err", "tolerance", "err/tol", "verdict")
    return tabulate(rows, headers=headers, disable_numparse=True) if rows else "(no rows)"


def _where(adapter: Adapter, case: Case) -> str:
    """``ADAPTER: evaluate() on case ID``, the head of a message about the adapter's run of ``case``."""
    return f"{adapter.name}: {FUNCTIONS[case.kind]}() on case {case.id}"


def _outputs(returned, adapter: Adapter, case: Case, precision: str) -> dict[str, np.ndarray]:
    """The adapter's return value as NumPy arrays (float32 ones widened in float32 mode)."""
    where = _where(adapter, case)
    if not isinstance(returned, Mapping):
        raise AdapterError(f"{where} returned {type(returned).__name__}, not a dict of arrays")
    out = {}
    for name, value in returned.items():
        try:
            a = np.asarray(value)
        except Exception as exc:
            raise AdapterError(f"{where}: output {name!r} is not an array ({type(exc).__name__}: {exc})") from exc
        out[str(name)] = a.astype(np.float64) if precision == "float32" and a.dtype.kind == "f" else a
    return out


def _first_failing_step(name: str, expected: np.ndarray, actual: np.ndarray, tol: Mapping) -> int:
    """The first step at which a failing per-step log leaves its tolerance: the end of the shortest failing
    prefix, by bisection."""
    lo, hi = 0, len(expected)                   # the prefix of length hi fails, of length lo passes
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if compare_one(name, expected[:mid], actual[:mid], tol).ok else (lo, mid)
    return hi - 1


def _departure(case: Case, rows: list[Row], expected: Mapping, actual: Mapping,
               tols: Mapping) -> tuple[str, int | None] | None:
    """(array, step) of the failing quantity the run computes first (the model's ``timeline``: stage 1
    before stage 2; at a step the loss, then the gradient and its logged norm, then the update and the
    validation loss; in an evaluation the forward pass before the gradients); step None for an array that
    is not a per-step log. None when nothing failed."""
    timeline = SPECS[case.model].timeline
    first, earliest = None, None
    for r in rows:
        if r.ok or r.max_abs_err is None:
            continue
        times = timeline(r.name, expected)
        step = None
        if r.name in TRAJECTORIES and np.ndim(times):
            step = _first_failing_step(r.name, expected[r.name], actual[r.name], tols[r.name])
        when = float(times[step] if step is not None else times)
        if earliest is None or when < earliest:
            first, earliest = (r.name, step), when
    return first


#: What the "bound" policy is at each precision, as the note of a failing calibrated array names it.
BOUNDS = {"float64": ("err/bound", "the guaranteed bound"),
          "float32": (f"err/({ENVELOPE_MULTIPLE:g} envelopes)", "the float32 envelope's tolerance")}


def _against_bound(case: Case, precision: str, rows: list[Row], expected: Mapping, actual: Mapping,
                   tols: Mapping) -> list[Row]:
    """``rows`` with every array that fails a calibrated tolerance annotated with its err/tol under the
    ``precision``'s "bound" policy: in float64 the running error bound, the guaranteed one (docs/tolerance.md):
    within it, the error is one no analysis rules out for a correct float64 program, however unlikely; beyond
    it, no correct program makes it. In float32 the envelope, the worst case of float32 rounding it measures."""
    bound, (label, what) = case.tolerances(precision, "bound"), BOUNDS[precision]
    out = []
    for r in rows:
        if not r.ok and r.ratio is not None and (check_tolerance(r.name, tols[r.name])
                                                 != check_tolerance(r.name, bound[r.name])):   # calibrated
            ratio = compare_one(r.name, expected[r.name], actual[r.name], bound[r.name]).ratio
            verdict = "within" if ratio <= 1 else "beyond"
            r = r._replace(note=f"{r.note}; {label} {ratio:.1e}: {verdict} {what}")
        out.append(r)
    return out


def check(adapter, case: Case, precision: str = "float64", policy: str | None = None) -> CaseReport:
    """Run ``case`` through the adapter (path, module, object or dict; see :func:`load_adapter`) and
    compare with the oracle under the tolerance ``policy`` at ``precision`` (:meth:`Case.tolerances`:
    "calibrated", the default, or "bound", the running error bound in float64 and the envelope in float32).
    Under the calibrated policy a failing array's note gives its err/tol under "bound" too
    (:func:`_against_bound`).

    Raises AdapterError when the adapter raises anything but a signal's interruption (its exception is
    the ``__cause__``) or returns something other than a dict of arrays; NotImplementedError gives a
    skipped report, :class:`CaseError` (a command's failure on this case) a failed one."""
    policy = check_policy(precision, policy)
    adapter = load_adapter(adapter)
    start = time.perf_counter()
    fn = adapter.function(case.kind)
    if fn is None:
        return CaseReport(case, precision, skipped=f"the adapter defines no {FUNCTIONS[case.kind]}()")
    expected, tols = case.expected, case.tolerances(precision, policy)
    inputs = {k: np.array(v) for k, v in case.inputs.items() if k != "model"}
    with _adapter_code(_where(adapter, case)):
        try:
            returned = fn(case.model, inputs)
        except NotImplementedError as exc:
            return CaseReport(case, precision, skipped=str(exc) or "NotImplementedError",
                              seconds=time.perf_counter() - start)
        except CaseError as exc:
            return CaseReport(case, precision, error=str(exc), seconds=time.perf_counter() - start)
        actual = _outputs(returned, adapter, case, precision)   # the adapter's objects run code as they convert
    names = [n for n in expected if n in actual]
    rows = compare_arrays(expected, actual, tols, names=names, labels=LABELS).rows
    if policy == "calibrated":
        rows = _against_bound(case, precision, rows, expected, actual, tols)
    outputs = SPECS[case.model].outputs(case.kind)      # intermediates left out are not "not returned"
    return CaseReport(case, precision, rows=rows, unknown=[n for n in actual if n not in expected],
                      not_returned=[n for n in expected if n not in actual and n in outputs],
                      departure=_departure(case, rows, expected, actual, tols),
                      seconds=time.perf_counter() - start,
                      coarse={n: r for n, r in coarse_arrays(expected, tols, precision).items() if n in names})


# --- a whole run --------------------------------------------------------------------------------------
class RunReport(list):
    """The :class:`CaseReport` of every case of a run, in order, and the verdict of the whole run:
    ``never_compared`` (the required outputs, not in ``skip_outputs``, that no case returned), ``ok``
    and ``total()``."""

    def __init__(self, reports: Iterable[CaseReport] = (), skip_outputs: Iterable[str] = ()):
        super().__init__(reports)
        self.skip_outputs = frozenset(skip_outputs)

    @property
    def never_compared(self) -> list[str]:
        """Outputs of the cases run that no case compared, less the :data:`OPTIONAL` and skipped ones."""
        compared = {row.name for r in self for row in r.rows}
        missing = dict.fromkeys(n for r in self for n in r.not_returned)
        return [n for n in missing if n not in compared and n not in OPTIONAL and n not in self.skip_outputs]

    @property
    def ok(self) -> bool:
        """No case failed, at least one array was compared and every required output was."""
        return all(r.ok for r in self) and any(r.rows for r in self) and not self.never_compared

    def total(self) -> str:
        """One line: the counts of cases and arrays and the verdict, saying what was not checked."""
        counts = {s: sum(r.status == s for r in self) for s in ("pass", "FAIL", "skip")}
        arrays = sum(len(r.rows) for r in self)
        never = self.never_compared
        verdict = "PASS" if self.ok else "FAIL"
        if never:
            verdict += (f": {', '.join(never)} never compared "
                        "(returned by no case; --skip-output NAME to accept)")
        elif not arrays and not counts["FAIL"]:
            verdict += " (nothing was compared)"
        coarse = sum(len(r.coarse) for r in self)
        coarse = f", {coarse} of them only coarsely" if coarse else ""
        return (f"{len(self)} cases: {counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped; "
                f"{arrays} arrays compared{coarse}: {verdict}")


def _check_skips(skip_outputs: Iterable[str], selected: list[Case]) -> None:
    """InputError for a name of ``skip_outputs`` that no selected case outputs (a misspelt name is never
    ignored)."""
    outputs = {n for case in selected for n in case.expected}
    unknown = [n for n in skip_outputs if n not in outputs]
    if unknown:
        raise InputError(f"--skip-output {unknown[0]}: not an output of the cases run "
                         f"({', '.join(sorted(outputs)) or 'none'})")


def run(adapter, models=None, random: int = DEFAULT_RANDOM, seed: int = 0, precision: str = "float64",
        stored: bool = True, root=None, progress: Callable[[CaseReport], None] | None = None,
        skip_outputs: Iterable[str] = (), kind: str | None = None, policy: str | None = None) -> RunReport:
    """:func:`check` on every case of ``models`` whose kind the adapter defines (and is ``kind``, "eval" or
    "train", when given): the stored cases (of ``root``; none when ``stored`` is False) and ``random``
    random cases per model from ``seed``. ``adapter`` is anything :func:`load_adapter` takes, a
    :class:`CommandAdapter` included. ``progress`` sees each report as it is made. ``skip_outputs`` names
    required outputs the run passes without (InputError for a name no case outputs); ``policy``: the float64
    tolerance policy (:func:`check`)."""
    if kind is not None and kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    adapter = load_adapter(adapter)
    selected = [case for case in cases(models, random, seed, stored, root)
                if adapter.function(case.kind) and kind in (None, case.kind)]
    skip_outputs = list(skip_outputs)
    if skip_outputs:
        _check_skips(skip_outputs, selected)
    reports = RunReport(skip_outputs=skip_outputs)
    for case in selected:
        reports.append(check(adapter, case, precision, policy))
        if progress is not None:
            progress(reports[-1])
    return reports


def _adapter_traceback(exc: BaseException) -> str:
    """The traceback of the adapter's exception, from the adapter's first frame on (ntpref's and the
    import machinery's frames dropped)."""
    tb = exc.__traceback__
    while tb is not None and (tb.tb_frame.f_code.co_filename == __file__
                              or tb.tb_frame.f_code.co_filename.startswith("<frozen")):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def _handle(args) -> int:
    from ..npzio import atomic_write, check_output

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
        policy = {("float64", "calibrated"): "calibrated float64 tolerances (docs/tolerance.md)",
                  ("float64", "bound"): "float64 running error bound (docs/tolerance.md)",
                  ("float32", "calibrated"): "calibrated float32 tolerances (docs/conformance.md)",
                  ("float32", "bound"): "float32 envelope (docs/conformance.md)"}[args.precision, args.policy]
        print(f"conformance of {adapter.name} ({', '.join(defined)}) under the {policy}; random cases from seed {args.seed}")
        reports = run(adapter, args.model, args.random, args.seed, args.precision, not args.no_stored, args.root,
                      progress=lambda r: print(r.summary(), flush=True), skip_outputs=args.skip_output,
                      kind=args.kind, policy=args.policy)
    except AdapterError as exc:
        if exc.__cause__ is not None:
            print(_adapter_traceback(exc.__cause__), end="", file=sys.stderr)
        raise
    rows = [row for r in reports for row in r.table_rows(args.verbose)]
    if rows:
        print(_table(rows))
    line, ok = reports.total(), reports.ok
    if args.precision == "float64" and any("less precise" in r.note for rep in reports for r in rep.rows):
        print("(float32 results cannot meet the float64 policy: judge them with --precision float32)")
    print(line)
    if args.json:
        document = {"adapter": adapter.name, "precision": args.precision, "policy": args.policy, "seed": args.seed,
                    "random": args.random, "models": list(args.model or NAMES), "total": line, "ok": ok,
                    "cases": [r.to_dict() for r in reports]}
        atomic_write(args.json, lambda fh: fh.write(json.dumps(document, indent=1).encode()))
    return 0 if ok else 1


def register(subparsers) -> None:
    """Add ``ntpref conformance (ADAPTER.py | --command CMD [--timeout S]) [--model ...] [--kind K] [--random N]
    [--seed S] [--precision ...] [--policy ...] [--skip-output NAME ...] [--json F] [-v]``."""
    text = ("check an implementation (an adapter file defining evaluate and/or train, or a command in any "
            "language) against the oracle")
    p = subparsers.add_parser("conformance", help=text, description=text + " on every stored eval/train case and "
                              "fresh random cases covering the options and edge regimes (docs/conformance.md). "
                              "Exit 0 all pass, 1 a case failed or a required output was never compared, "
                              "2 adapter or usage error.")
    p.add_argument("adapter", metavar="ADAPTER.py", nargs="?",
                   help="defines evaluate(model, inputs) and/or train(model, inputs) returning dicts of arrays")
    p.add_argument("--adapter", metavar="NAME", dest="shipped", choices=ADAPTERS,
                   help="instead of ADAPTER.py: an adapter shipped with ntpref (" + ", ".join(ADAPTERS) + "; its "
                        "framework must be installed)")
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
    p.add_argument("--root", metavar="DIR", help="reference directory of the stored cases (default: as ntpref verify)")
    p.add_argument("--skip-output", action="append", default=[], metavar="NAME",
                   help="accept that no case returns this output (an eval or train output; repeatable)")
    p.add_argument("--json", metavar="REPORT.json", help="also write the report as JSON")
    p.add_argument("-v", "--verbose", action="store_true", help="every array's row (default: failures only)")
    p.set_defaults(func=_handle)
