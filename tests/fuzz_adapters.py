"""The adapter and command surfaces of the command-line fuzzer (tests/fuzz_cli.py): ``ntpref conformance``
with an adapter file that misbehaves, or with a ``--command`` that does."""
from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from ntpref.oracle.adapters import FUNCTIONS

from fuzz_common import Fixtures, Result, _call, _messages, _result, classify


# ---- conformance adapters that misbehave --------------------------------------------------------------------

#: The start of every adapter file: the oracle's outputs (what a correct adapter returns) and helpers.
ADAPTER_HEAD = '''"""A conformance adapter written by tests/fuzz_adapters.py: the oracle's own outputs, then a fault."""
import collections.abc
import os
import sys
import warnings

import numpy as np

from ntpref.oracle import contract
from ntpref.oracle.conformance import OPTIONAL


def oracle(kind, model, inputs):
    arrays = {"model": np.array(model), **inputs}
    return dict((contract.evaluate if kind == "eval" else contract.train)(arrays, "numpy"))


class Lazy:
    """An array-like that np.asarray converts (as it does a tensor), or whose conversion raises ``fault``."""

    def __init__(self, value, fault=None):
        self.value, self.fault = value, fault

    def __array__(self, dtype=None, copy=None):
        if self.fault is not None:
            raise self.fault
        return np.asarray(self.value, dtype)


class Unreadable(collections.abc.Mapping):
    """A mapping of the right names whose every look-up raises."""

    def __init__(self, names):
        self.names = list(names)

    def __getitem__(self, name):
        raise RuntimeError(f"cannot look up {name}")

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


def recurse():
    return recurse()
'''

#: Statements that end the adapter's code by raising; each is a fault at import and one in its function.
RAISES = {"exit_0": "sys.exit(0)", "exit_1": "sys.exit(1)", "exit_message": 'sys.exit("adapter gave up")',
          "keyboard_interrupt": "raise KeyboardInterrupt", "system_exit": "raise SystemExit",
          "generator_exit": "raise GeneratorExit", "value_error": 'raise ValueError("adapter bug")',
          "zero_division": "1 / 0"}


def _each(expr: str) -> str:
    """A function body returning ``expr`` of every correct output ``v``, under its name ``k``."""
    return "return {k: " + expr + " for k, v in out.items()}"


#: fault → (code run when the adapter is imported, after its functions; the verdict it calls for). In the code
#: "{function}" is the function of the case's kind.
MODULE_FAULTS = {
    **{name: (code, "error") for name, code in RAISES.items()},
    "prints": ('print("adapter: loading"); print("adapter: loading", file=sys.stderr)', "pass"),
    "chdir": ('os.chdir("/")', "pass"),
    "import_error": ("import ntpref_no_such_module", "error"),
    "syntax_error": ("def broken(:", "error"),
    "defines_neither": ("del evaluate, train", "error"),
    "not_a_function": ("{function} = 5", "error"),
    "other_kind_only": ("del {function}", "fail"),      # no case of the kind run: nothing compared
}

#: fault → (the body of the case's function, where ``out`` holds the correct outputs; the verdict it calls for)
CALL_FAULTS = {
    **{name: (code, "error") for name, code in RAISES.items()},
    "correct": ("return out", "pass"),
    "prints": ('print("adapter: computing"); print("adapter: note", file=sys.stderr); return out', "pass"),
    "warns": ('warnings.warn("adapter warning"); return out', "pass"),
    "chdir": ('os.chdir("/"); return out', "pass"),
    "modifies_inputs": ('[a.fill(0) for a in inputs.values() if a.dtype.kind == "f"]; inputs.clear(); return out',
                        "pass"),
    "tensors": (_each("Lazy(v)"), "pass"),
    "lists": (_each("v.tolist()"), "pass"),
    "longdouble": (_each("v.astype(np.longdouble)"), "pass"),
    "big_endian": (_each('v.astype(v.dtype.newbyteorder(">"))'), "pass"),
    "ordered_dict": ("return collections.OrderedDict(out)", "pass"),
    "no_diagnostics": ("return {k: v for k, v in out.items() if k not in OPTIONAL}", "pass"),
    "memory_error": ("raise MemoryError", "error"),
    "stop_iteration": ("raise StopIteration", "error"),
    "recursion": ("return recurse()", "error"),
    "returns_none": ("return None", "error"),
    "returns_list": ("return list(out.values())", "error"),
    "returns_text": ('return "loss"', "error"),
    "returns_array": ("return np.zeros(3)", "error"),
    "returns_items": ("return out.items()", "error"),
    "returns_generator": ("return (v for v in out.values())", "error"),
    "unreadable_mapping": ("return Unreadable(out)", "error"),
    "ragged": (_each("[1.0, [2.0, 3.0]]"), "error"),
    "conversion_raises": (_each('Lazy(v, ValueError("no conversion"))'), "error"),
    "conversion_exits": (_each("Lazy(v, SystemExit(0))"), "error"),
    "conversion_interrupted": (_each("Lazy(v, KeyboardInterrupt())"), "error"),
    "not_implemented": ('raise NotImplementedError("not this case")', "fail"),   # every case skipped
    "none_values": (_each("None"), "fail"),
    "text_values": (_each('"0.5"'), "fail"),
    "object_values": (_each("object()"), "fail"),
    "dict_values": (_each('{"value": v}'), "fail"),
    **{f"dtype_{d}": (_each(f"v.astype({d!r})"), "fail") for d in ("float32", "float16", "int64", "bool", "complex128",
                                                                    "object", "datetime64[s]", "V8", "<U8")},
    "added_axis": (_each("v[None]"), "fail"),
    "trailing_axis": (_each("v[..., None]"), "fail"),
    "one_more": (_each("np.resize(v, v.size + 1)"), "fail"),
    "empty_arrays": (_each("np.zeros((0,))"), "fail"),
    "nan": (_each("np.full_like(v, np.nan)"), "fail"),
    "one_inf": ("k = sorted(out)[0]; out[k] = out[k] + np.inf; return out", "fail"),
    "perturbed": (_each("v * (1 + 1e-3) + 1e-3"), "fail"),
    "drops_required": ("del out[sorted(set(out) - OPTIONAL)[0]]; return out", "fail"),
    "one_output": ("return {k: out[k] for k in sorted(out)[:1]}", "fail"),
    "empty_dict": ("return {}", "fail"),
    "misspelt": ('out[sorted(out)[0].upper() + "_"] = 0.0; return out', "fail"),
    "int_key": ("out[1] = 0.0; return out", "fail"),
    "returns_inputs": ("return inputs", "fail"),
    "huge_view": (_each("np.broadcast_to(0.0, (10 ** 6, 10 ** 6))"), "fail"),
    "huge_array": ("out[sorted(out)[0]] = np.zeros(1 << 22); return out", "fail"),
}

#: "import:NAME" and "call:NAME" → (module code, function body, verdict)
ADAPTER_FAULTS = {**{f"import:{k}": (code, "return out", v) for k, (code, v) in MODULE_FAULTS.items()},
                  **{f"call:{k}": ("", body, v) for k, (body, v) in CALL_FAULTS.items()}}

_PYTHON = shlex.quote(sys.executable)
#: Python code run by the commands below (``python -c CODE``): a process writing files into the case's
#: folder (``sys.argv[1]``'s) until it is killed, started by a fork, a fork in a session of its own, or a
#: daemon's double fork (the command itself exits 1 a moment later); a {output_dir} file whose header
#: declares an empty array of a shape no array can have.
_SCRIBBLE = "\nwhile True:\n    [open(os.path.join(folder, f'x{i}'), 'w').close() for i in range(100)]"
_ESCAPES = {
    "fork": "import os, sys, time\nfolder = os.path.dirname(sys.argv[1])\nif os.fork() == 0:" + _SCRIBBLE.replace(
        "\n", "\n    ") + "\ntime.sleep(0.3)\nsys.exit(1)",
    "setsid": "import os, sys, time\nfolder = os.path.dirname(sys.argv[1])\nif os.fork() == 0:\n    os.setsid()"
              + _SCRIBBLE.replace("\n", "\n    ") + "\ntime.sleep(0.3)\nsys.exit(1)",
    "daemon": "import os, sys, time\nfolder = os.path.dirname(sys.argv[1])\nif os.fork() == 0:\n    os.setsid()\n"
              "    if os.fork():\n        os._exit(0)" + _SCRIBBLE.replace("\n", "\n    ")
              + "\ntime.sleep(0.3)\nsys.exit(1)",
}
_ABSURD = ("import sys; h = repr({'descr': '<f8', 'fortran_order': False, 'shape': (0, 2 ** 62)}).encode() + b'\\n'; "
           "open(sys.argv[1] + '/loss.npy', 'wb').write(b'\\x93NUMPY\\x01\\x00' + len(h).to_bytes(2, 'little') + h)")


def _literal(code: str) -> str:
    """``code`` as one word of a --command line: quoted, its braces doubled (not placeholders)."""
    return shlex.quote(code.replace("{", "{{").replace("}", "}}"))


#: name → (command line, the verdict it calls for, --timeout or None)
COMMANDS = {
    "correct": (f"{_PYTHON} -m ntpref.cli {{kind}} {{input}} -o {{output}} --backend numpy -q", "pass", None),
    "exit_1": ("sh -c 'exit 1' sh {input} {output}", "fail", None),
    "declines": ("sh -c 'echo not this case >&2; exit 3' sh {input} {output}", "fail", None),   # every case skipped
    "killed": ("sh -c 'kill -9 $$' sh {input} {output}", "fail", None),
    "writes_nothing": ("true {input} {output}", "fail", None),
    "garbage": ("sh -c 'echo garbage > \"$1\"' sh {output} {input}", "fail", None),
    "empty_file": ("sh -c ': > \"$1\"' sh {output} {input}", "fail", None),
    "copies_input": ("cp {input} {output}", "fail", None),
    "stray_file": ("sh -c 'echo x > \"$1/notes.txt\"' sh {output_dir} {input_dir}", "fail", None),
    "fifo": ("sh -c 'mkfifo \"$1\"' sh {output} {input}", "fail", None),
    "dev_zero": ("sh -c 'ln -s /dev/zero \"$1\"' sh {output} {input}", "fail", None),
    "timeout": ("sh -c 'sleep 5' sh {input} {output}", "fail", 1),
    "background": ("sh -c 'sleep 30 & exit 1' sh {input} {output}", "fail", None),
    **{f"escapes_{how}": (f"{_PYTHON} -c {_literal(code)} {{output}} {{input}}", "fail", None)
       for how, code in _ESCAPES.items()},
    "job_control": ("bash -c 'set -m; sleep 30 & sleep 0.3; exit 1' sh {input} {output}", "fail", None),
    "gnu_timeout": ("sh -c 'timeout 30 sleep 30 & sleep 0.3; exit 1' sh {input} {output}", "fail", None),
    "setsid_sleep": ("sh -c 'setsid sleep 30 & sleep 0.3; exit 1' sh {input} {output}", "fail", None),
    "clears_folder": ("sh -c 'rm -rf \"$(dirname \"$1\")\"/*; echo cleared >&2; exit 1' sh {output} {input}",
                      "fail", None),
    "fifo_log": ("sh -c 'mkfifo \"$(dirname \"$1\")/stderr\"; exit 1' sh {output} {input}", "fail", None),
    "dev_zero_log": ("sh -c 'ln -s /dev/zero \"$(dirname \"$1\")/stderr\"; exit 1' sh {output} {input}", "fail",
                     None),
    "locked_folder": ("sh -c 'mkdir \"$1/d\" && touch \"$1/d/f\" && chmod 0 \"$1/d\" \"$1\"; exit 1' sh {output_dir} "
                      "{input}", "fail", None),
    "absurd_header": (f"{_PYTHON} -c {_literal(_ABSURD)} {{output_dir}} {{input}}", "fail", None),
    "stderr_flood": ("sh -c 'yes flood | head -c 2000000 >&2; exit 1' sh {input} {output}", "fail", None),
    "binary_stderr": ("sh -c 'printf \"\\377\\376\\n\" >&2; exit 2' sh {input} {output}", "fail", None),
    "not_found": ("ntpref-no-such-program {input} {output}", "error", None),
    "unknown_placeholder": ("cat {inptu} {output}", "error", None),
    "no_output": ("cat {input}", "error", None),
    "unbalanced_quote": ("sh -c 'exit 1 {input} {output}", "error", None),
    "empty": ("", "error", None),
}

#: verdict → (the outcome it is, the exit status it must have)
VERDICTS = {"pass": ("accepted", 0), "fail": ("failed", 1), "error": ("rejected", 2)}


def adapter_source(fault: str, kind: str) -> str:
    """The adapter file of ``fault`` (ADAPTER_FAULTS) for a case of ``kind``: both functions, the faulty body in
    the one of ``kind``, then the module code."""
    module, body, _ = ADAPTER_FAULTS[fault]
    functions = "".join(f"\n\ndef {fn}(model, inputs):\n    out = oracle({k!r}, model, inputs)\n"
                        f"    {body if k == kind else 'return out'}\n" for k, fn in FUNCTIONS.items())
    return ADAPTER_HEAD + functions + "\n" + module.replace("{function}", FUNCTIONS[kind]) + "\n"


@contextlib.contextmanager
def _adapter_process():
    """Keep what an in-process adapter changes from the next run: the working directory, and no bytecode
    written (a rewritten adapter of the same size within a second would load the old file's)."""
    cwd, bytecode = os.getcwd(), sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.dont_write_bytecode = bytecode


def _conformance(source: list[str], model: str, kind: str, verdict: str, name: str | None) -> tuple:
    """Run ``ntpref conformance SOURCE`` on one random case of ``model`` and ``kind``: (exit status, stderr, why
    it is a crash or None, outcome). ``name``: what the error line must name (the adapter file)."""
    args = ["conformance", *source, "--model", model, "--kind", kind, "--no-stored",
            "--random", "1" if kind == "eval" else "3"]          # the first random case of that kind
    with _adapter_process():
        rc, out, err = _call(args)
    outcome, why = classify(rc, err, strict=False)
    want, status = VERDICTS[verdict]
    last = (out.strip().splitlines() or [""])[-1]
    if why is None and outcome != want:
        why = f"exit {rc}, but this adapter calls for {status}"
    elif why is None and outcome == "accepted" and not last.endswith(": PASS"):
        why = f"exit 0 without a PASS verdict (last line {last!r})"
    elif why is None and outcome == "failed" and ": FAIL" not in last:
        why = f"exit 1 without a FAIL verdict (last line {last!r})"
    elif why is None and outcome == "rejected" and name is not None and name not in _messages(err)[0]:
        why = "the error line does not name the adapter"
    return rc, err, why, outcome


def run_adapter_case(fault: str, model: str, kind: str, workdir: Path) -> Result:
    """Write the adapter of ``fault`` into ``workdir`` and run it on one case (see :func:`_conformance`)."""
    path = workdir / "adapter.py"
    path.write_text(adapter_source(fault, kind))
    rc, err, why, outcome = _conformance([path], model, kind, ADAPTER_FAULTS[fault][2], str(path))
    return _result(f"conformance {model} {kind} adapter {fault}", [f"adapter:{fault}"], rc, err, why, outcome)


#: The environment variable that marks the processes of one command case: every process the command starts
#: inherits it, so one still running after the case (found in /proc) is a leaked process.
MARK = "NTPREF_FUZZ_COMMAND_CASE"


def _marked(token: str) -> list[int]:
    """The pids of the processes (this one aside) whose environment holds ``MARK=token``."""
    found, needle = [], f"{MARK}={token}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _watched_command():
    """Run a command case marked (MARK) and with its temporary folders in a folder of their own; yields a
    list that receives what it left behind: processes still running (killed then) and temporary folders."""
    token, left = f"{os.getpid()}-{time.monotonic_ns()}", []
    folder, tempdir = tempfile.mkdtemp(prefix="ntpref-fuzz-tmp-"), tempfile.tempdir
    os.environ[MARK], tempfile.tempdir = token, folder
    try:
        yield left
    finally:
        del os.environ[MARK]
        tempfile.tempdir = tempdir
        leaked = _marked(token) if os.path.isdir("/proc") else []
        for pid in leaked:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        left += [f"leaked process {pid}" for pid in leaked] + [f"temporary folder {e}" for e in os.listdir(folder)]
        shutil.rmtree(folder, ignore_errors=True)


def run_command_case(name: str, model: str, kind: str) -> Result:
    """Run the command of ``name`` (COMMANDS) on one case (see :func:`_conformance`); a process the command
    started that is still running afterwards, or a temporary folder left, is a crash."""
    command, verdict, timeout = COMMANDS[name]
    source = ["--command", command] + ([] if timeout is None else ["--timeout", timeout])
    with _watched_command() as left:
        rc, err, why, outcome = _conformance(source, model, kind, verdict, None)
    if left and why is None:
        why = "left behind: " + ", ".join(left)
    return _result(f"conformance {model} {kind} command {name}", [f"command:{name}"], rc, err, why, outcome)


def _model_kind(ch) -> tuple[str, str]:
    return ch.choice(("twostage", "shallow", "indrnn")), ch.choice(tuple(FUNCTIONS))


def adapter_run(ch, fx: Fixtures) -> Result:
    fault = ch.choice(sorted(ADAPTER_FAULTS))
    return run_adapter_case(fault, *_model_kind(ch), fx.workdir)


def command_run(ch, fx: Fixtures) -> Result:
    name = ch.choice(sorted(COMMANDS))
    return run_command_case(name, *_model_kind(ch))
