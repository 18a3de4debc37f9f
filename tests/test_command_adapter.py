"""``ntpref conformance --command``: an implementation in any language, run as a command once per case
(ntpref.oracle.conformance.CommandAdapter, docs/conformance.md "Any language: --command").

A small Python script stands for the foreign implementation: it wraps the oracle (and passes), breaks one
gradient (and fails, naming the case and the array), or fails in each way a command can (exit status 1,
killed by a signal, past its timeout, no output, garbage output), each of which must be that case's error
with the end of the command's stderr in the report, never a crash of ntpref nor a pass. The C example
examples/c/twostage_eval.c is compiled and must pass every two-stage eval case in float64.
"""
import ctypes
import os
import random
import signal
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.oracle.cases import stored_cases
from ntpref.oracle import reaper
from ntpref.oracle.conformance import NOT_IMPLEMENTED, CommandAdapter, check, run

from conformance_support import conformance

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "c" / "twostage_eval.c"

SCRIPT = '''
import os, shutil, signal, subprocess, sys, time
from pathlib import Path
mode, kind, model, form, source, target = sys.argv[1:]
print(f"{mode}: {kind} of {model}, files {form}", file=sys.stderr)
if mode == "exit1":
    sys.exit("it broke")
if mode == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
if mode == "sleeps":
    time.sleep(60)
if mode == "declines":
    print("nothing but the shallow model here", file=sys.stderr)
    sys.exit(%d)
if mode == "garbage":
    Path(target if form == "npz" else target + "/loss.npy").write_bytes(b"not an array")
if mode == "stray":
    Path(target, "notes.txt").write_text("hello")
if mode == "folder":
    Path(target, "loss.npy").mkdir()
if mode == "absurd":   # a zero-byte array whose shape no array can have
    header = repr({"descr": "<f8", "fortran_order": False, "shape": (0, 2 ** 62)}).encode() + b"\\n"
    Path(target, "loss.npy").write_bytes(b"\\x93NUMPY\\x01\\x00" + len(header).to_bytes(2, "little") + header)
if mode in ("clears_folder", "fifo_log", "dev_zero_log"):   # what the case's folder holds, the log's old place
    folder = Path(target).parent
    for entry in folder.iterdir():
        (shutil.rmtree if entry.is_dir() and not entry.is_symlink() else os.unlink)(entry)
    if mode == "fifo_log":
        os.mkfifo(folder / "stderr")
    if mode == "dev_zero_log":
        os.symlink("/dev/zero", folder / "stderr")
    sys.exit(1)
SCRIBBLE = ("import os, sys\\ni = 0\\nwhile True:\\n    i += 1\\n"
            "    open(os.path.join(sys.argv[1], str(i %% 300)), 'w').close()")
if mode in ("new_session", "new_group"):   # a child that leaves the command's session or process group
    child = subprocess.Popen([sys.executable, "-c", SCRIBBLE, str(Path(target).parent)],
                             **({"start_new_session": True} if mode == "new_session" else {"process_group": 0}))
    print(f"escaped pid {child.pid}", file=sys.stderr)
    time.sleep(0.2)
    sys.exit(1)
if mode == "daemon":   # double fork, own session, writing into the case's folder until killed
    r, w = os.pipe()
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.write(w, str(os.getpid()).encode())
            os.execv(sys.executable, [sys.executable, "-c", SCRIBBLE, str(Path(target).parent)])
        os._exit(0)
    print(f"escaped pid {os.read(r, 32).decode()}", file=sys.stderr)
    time.sleep(0.2)
    sys.exit(1)
if mode not in ("oracle", "broken"):
    sys.exit(0)
import numpy as np
from ntpref.npzio import load_npy, load_npz, save_npz
from ntpref.oracle import contract
inputs = load_npz(source) if form == "npz" else {p.stem: load_npy(p) for p in Path(source).iterdir()}
out = (contract.evaluate if kind == "eval" else contract.train)(inputs)
if mode == "broken":
    out["grad_W_kq"] = out["grad_W_kq"] * (1 + 1e-3)
if form == "npz":
    save_npz(target, out)
else:
    for name, value in out.items():
        np.save(Path(target, name + ".npy"), value)
''' % NOT_IMPLEMENTED


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("command") / "implementation.py"
    path.write_text(SCRIPT)
    return path


def command(script, mode, form="npz"):
    """The command line running ``script`` in ``mode``, on the npz files or on the directories of .npy files."""
    files = "{input} {output}" if form == "npz" else "{input_dir} {output_dir}"
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))} {mode} {{kind}} {{model}} {form} {files}"


ONE_EVAL = ("--model", "twostage", "--kind", "eval", "--no-stored", "--random")


def test_the_wrapped_oracle_passes_eval_and_train_cases(capsys, script):
    rc, out, err = conformance(capsys, "--command", command(script, "oracle"), "--model", "indrnn", "--no-stored",
                               "--random", 3)
    assert rc == 0, out + err
    assert [line.split()[:2] for line in out.splitlines()[1:4]] == [
        ["pass", "r0_indrnn_0_eval_paired:"], ["pass", "r0_indrnn_1_eval_T1_erf:"],
        ["pass", "r0_indrnn_2_train_projgd:"]]
    assert out.splitlines()[-1] == "3 cases: 3 passed, 0 failed, 0 skipped; 16 arrays compared: PASS"


def test_directories_of_npy_files_from_python(script):
    reports = run(CommandAdapter(command(script, "oracle", form="dir")), models=["twostage"], random=2, stored=False,
                  kind="eval")
    assert reports.ok, "\n".join(map(str, reports))
    assert [r.case.id for r in reports] == ["r0_twostage_0_eval_general_E", "r0_twostage_1_eval_saturated"]


def test_a_wrong_gradient_fails_with_the_case_and_array_named(capsys, script):
    rc, out, err = conformance(capsys, "--command", command(script, "broken"), *ONE_EVAL, 1)
    assert rc == 1, out + err
    assert "FAIL  r0_twostage_0_eval_general_E: 6/7 arrays within tolerance; failing: grad_W_kq" in out.splitlines()
    assert any(line.split()[:2] == ["r0_twostage_0_eval_general_E", "grad_W_kq"] and "FAIL" in line
               for line in out.splitlines())
    assert out.splitlines()[-1] == "1 cases: 0 passed, 1 failed, 0 skipped; 7 arrays compared: FAIL"


FAULTS = {
    ("exit1", "npz"): "the command exited with status 1",
    ("killed", "npz"): "the command was killed by SIGKILL",
    ("sleeps", "npz"): "the command timed out after 1 s and was killed",
    ("silent", "npz"): "the command exited with status 0, but {output}: no such file",
    ("garbage", "npz"): "the command exited with status 0, but {output}: not an npz file (File is not a zip file)",
    ("silent", "dir"): "the command exited with status 0, but {output_dir} is empty",
    ("garbage", "dir"): "the command exited with status 0, but {output_dir}/loss.npy: not a .npy array (it does not "
                        "start with the .npy magic string)",
    ("stray", "dir"): "the command exited with status 0, but {output_dir}: 'notes.txt' is not named NAME.npy (one "
                      ".npy file per output array)",
    ("folder", "dir"): "the command exited with status 0, but {output_dir}/loss.npy: is a directory, not a .npy file",
    ("absurd", "dir"): "the command exited with status 0, but {output_dir}/loss.npy: the .npy header's shape (0, "
                       "4611686018427387904) of float64 is larger than any array can be (its nonzero sizes times "
                       "the item size pass 9223372036854775807 bytes, even when a size is 0)",
    ("clears_folder", "npz"): "the command exited with status 1",
    ("fifo_log", "dir"): "the command exited with status 1",
    ("dev_zero_log", "npz"): "the command exited with status 1",
}


@pytest.mark.parametrize("mode, form", FAULTS, ids=lambda x: x)
def test_a_failing_command_fails_its_case_with_its_stderr(capsys, script, mode, form):
    """Every case runs (two here) and fails with the fault and the end of the command's stderr."""
    rc, out, err = conformance(capsys, "--command", command(script, mode, form), "--timeout", 1, *ONE_EVAL, 2)
    assert (rc, err) == (1, "")
    lines = out.splitlines()
    for case in ("r0_twostage_0_eval_general_E", "r0_twostage_1_eval_saturated"):
        at = lines.index(f"FAIL  {case}: {FAULTS[mode, form]}; its stderr ends:")
        assert lines[at + 1] == f"      | {mode}: eval of twostage, files {form}"
    assert lines[-1] == "2 cases: 0 passed, 2 failed, 0 skipped; 0 arrays compared: FAIL"


def _running(word: str) -> list[int]:
    """The pids of the running processes (zombies aside) that hold ``word`` as an argument."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if entry.name.isdigit() and word.encode() in argv:
            found.append(int(entry.name))
    return found


def _subreaper() -> int:
    flag = ctypes.c_int(-1)
    assert ctypes.CDLL(None, use_errno=True).prctl(37, ctypes.byref(flag), 0, 0, 0) == 0   # PR_GET_CHILD_SUBREAPER
    return flag.value


@pytest.fixture
def temporary(tmp_path, monkeypatch):
    """The folder the cases' temporary folders go to, empty."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    return folder


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="processes that left the command's "
                                "session are found and killed on Linux only")


@linux_only
@pytest.mark.parametrize("mode", ["new_session", "new_group", "daemon"])
def test_processes_that_leave_the_command_are_killed(capsys, script, temporary, mode):
    """A child in a session or process group of its own, or a daemon (double fork, setsid) that keeps
    writing into the case's folder: killed with the case, the folder removed, the subreaper flag restored."""
    assert _subreaper() == 0
    rc, out, err = conformance(capsys, "--command", command(script, mode), *ONE_EVAL, 1)
    assert (rc, err) == (1, ""), out + err
    lines = out.splitlines()
    at = lines.index("FAIL  r0_twostage_0_eval_general_E: the command exited with status 1; its stderr ends:")
    pid = int(lines[at + 2].split()[-1])
    assert lines[at + 2] == f"      | escaped pid {pid}"
    assert not Path(f"/proc/{pid}").exists(), f"process {pid} outlived its case"
    assert list(temporary.iterdir()) == [] and _subreaper() == 0


@linux_only
@pytest.mark.parametrize("line", ["set -m; sleep {t} &", "timeout {t} sleep {t} &", "setsid sleep {t} &",
                                  "(sleep {t} &) &", "nohup sleep {t} >/dev/null 2>&1 &"])
def test_shell_children_outside_the_group_are_killed(capsys, temporary, line):
    """Shell job control, GNU timeout (each its own process group), setsid, a subshell's orphan, nohup."""
    if shutil.which("bash") is None:
        pytest.skip("no bash on PATH")
    seconds = f"{random.randint(10 ** 6, 10 ** 7)}.{random.randint(1, 99)}"   # names its processes
    shell = line.format(t=seconds) + " sleep 0.5; echo started >&2; exit 1"   # once they run
    rc, out, err = conformance(capsys, "--command", f"bash -c {shlex.quote(shell)} sh {{input}} {{output}}",
                               *ONE_EVAL, 1)
    assert (rc, err) == (1, "") and "      | started" in out.splitlines(), out + err
    assert _running(seconds) == [] and list(temporary.iterdir()) == []


@linux_only
def test_a_process_that_cannot_be_killed_is_named_in_the_verdict(capsys, temporary, monkeypatch):
    """Where killing fails (another user's process, one stuck in the kernel: here os.kill refused), the case
    fails naming the survivor, whatever the command's status."""
    seconds = f"{random.randint(10 ** 6, 10 ** 7)}.{random.randint(1, 99)}"

    def refuse(pid, sig):
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(reaper, "GRACE", 0.2)
    monkeypatch.setattr(os, "kill", refuse)
    shell = f"setsid sleep {seconds} & sleep 0.5; exit 0"
    rc, out, err = conformance(capsys, "--command", f"bash -c {shlex.quote(shell)} sh {{input}} {{output}}",
                               *ONE_EVAL, 1)
    monkeypatch.undo()
    survivors = _running(seconds)
    for pid in survivors:                  # this process's children since the command ended: reaped here
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert len(survivors) == 1 and (rc, err) == (1, ""), out + err
    assert (f"FAIL  r0_twostage_0_eval_general_E: the command exited with status 0, and processes it started could "
            f"not be killed: {survivors[0]} (sleep) (nothing on stderr)") in out.splitlines()


def test_a_folder_that_cannot_be_removed_is_a_warning(capsys, script, temporary, monkeypatch):
    """The case's verdict stands and the run goes on; one warning line names the folder left."""
    def refuse(path, *args, **kwargs):
        raise OSError(16, "Device or resource busy")

    monkeypatch.setattr(shutil, "rmtree", refuse)
    rc, out, err = conformance(capsys, "--command", command(script, "exit1"), *ONE_EVAL, 2)
    monkeypatch.undo()
    left = sorted(temporary.iterdir())
    assert rc == 1 and len(left) == 2 and left[0].name.startswith("ntpref-conformance-"), out + err
    assert err.splitlines() == [f"ntpref: warning: cannot remove the temporary folder {folder} of a --command case; "
                                "remove it by hand" for folder in sorted(left, key=lambda f: err.index(str(f)))]
    assert out.splitlines()[-1] == "2 cases: 0 passed, 2 failed, 0 skipped; 0 arrays compared: FAIL"


@linux_only
def test_the_subreaper_flag_is_left_as_it_was():
    """A program that is a subreaper itself stays one after a command's case (the flag is restored, not
    cleared); ntpref's import never sets it (test above: 0 before and after a case)."""
    code = ("import ctypes; from ntpref.oracle.reaper import Reaper; libc = ctypes.CDLL(None)\n"
            "assert libc.prctl(36, 1, 0, 0, 0) == 0\n"
            "with Reaper() as r:\n    assert r.kill_all() == []\n"
            "flag = ctypes.c_int(-1); libc.prctl(37, ctypes.byref(flag), 0, 0, 0); print(flag.value)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "1\n"


def test_the_not_implemented_status_skips_the_case(capsys, script):
    rc, out, err = conformance(capsys, "--command", command(script, "declines"), *ONE_EVAL, 1)
    assert rc == 1, out + err          # nothing was compared: not a pass
    assert "skip  r0_twostage_0_eval_general_E: skipped: nothing but the shallow model here" in out.splitlines()
    assert out.splitlines()[-1] == ("1 cases: 0 passed, 0 failed, 1 skipped [never checked: twostage (eval)]; 0 "
                                    "arrays compared: FAIL (nothing was compared)")


def test_usage_errors_exit_2(capsys, script, tmp_path):
    good = command(script, "oracle")
    for args, line in (
            ([script, "--command", good], "give one of an adapter file (ADAPTER.py), --adapter NAME (a shipped "
                                          "adapter: ntpref adapters lists them) or --command 'CMD ...', not more"),
            ([], "give one of an adapter file (ADAPTER.py), --adapter NAME (a shipped adapter: ntpref adapters lists "
                 "them) or --command 'CMD ...', none was given"),
            ([script, "--timeout", 5], "--timeout applies to --command only"),
            (["--command", "cat {inptu} {output}"], "command 'cat {inptu} {output}': unknown placeholder {inptu} (the "
             "placeholders are {input}, {input_dir}, {output}, {output_dir}, {kind}, {model}; {{ and }} are "
             "literal braces)"),
            (["--command", "cat {input}"], "command 'cat {input}': name exactly one of {output} (an npz file) and "
             "{output_dir} (a directory of NAME.npy files) for the outputs"),
            (["--command", "cat {output}"], "command 'cat {output}': names neither {input} nor {input_dir}, so the "
             "command cannot read the case"),
            (["--command", f"{tmp_path}/missing {{input}} {{output}}"], f"command '{tmp_path}/missing {{input}} "
             f"{{output}}': no program '{tmp_path}/missing' (not on PATH, or not an executable file)")):
        rc, out, err = conformance(capsys, *args)
        assert (rc, err) == (2, f"ntpref: error: {line}\n"), (args, out)
    for value in ("0", "-1", "inf", "soon"):
        rc, out, err = conformance(capsys, "--command", good, "--timeout", value)
        assert (rc, err) == (2, f"ntpref conformance: error: argument --timeout: expected a positive number, got "
                                f"'{value}' (see 'ntpref conformance --help')\n")
    with pytest.raises(InputError, match="timeout must be a positive number of seconds, got 0"):
        CommandAdapter(good, timeout=0)


@pytest.fixture(scope="module")
def c_example(tmp_path_factory):
    """examples/c/twostage_eval.c built with the system C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler (cc or gcc) on PATH")
    exe = tmp_path_factory.mktemp("c") / "twostage_eval"
    subprocess.run([compiler, "-O2", "-std=c99", "-Wall", "-Wextra", "-Werror", "-o", str(exe), str(EXAMPLE), "-lm"],
                   check=True, capture_output=True)
    return f"{shlex.quote(str(exe))} {{kind}} {{input_dir}} {{output_dir}}"


def test_the_c_example_passes_every_twostage_eval_case(capsys, c_example):
    rc, out, err = conformance(capsys, "--command", c_example, "--model", "twostage", "--kind", "eval", "--random", 10)
    assert rc == 0, out + err
    assert out.splitlines()[-1] == "9 cases: 9 passed, 0 failed, 0 skipped; 61 arrays compared: PASS"


def test_the_c_example_declines_training(c_example):
    case = next(c for c in stored_cases(["twostage"]) if c.kind == "train")
    report = check(CommandAdapter(c_example), case)
    assert report.status == "skip"
    assert report.skipped == "twostage_eval: only eval of model twostage is implemented, not train of twostage"


def test_the_c_example_reads_the_model_as_a_utf32_string(c_example, tmp_path):
    """model.npy is a 0-d '<U' array (UTF-32LE code points padded with NULs): the C example decodes it (to
    UTF-8, in its message for a model it declines) and refuses other string forms in one line."""
    exe = shlex.split(c_example)[0]
    values = {"twostagé €😀": (3, "not eval of twostagé €😀"), "train": (3, "not eval of train"),
              "x" * 63: (3, f"not eval of {'x' * 63}"), "x" * 64: (2, "array 'model': a string of more than 63 bytes"),
              ("twostage",): (2, "array 'model': a string option is a 0-d array, this one has 1 dimensions"),
              b"twostage": (2, "model.npy: dtype is not a little-endian unicode string '<U...'"),
              ">U": (2, "model.npy: dtype is not a little-endian unicode string '<U...'")}
    for value, (status, message) in values.items():
        folder = tmp_path / str(len(list(tmp_path.iterdir())))
        folder.mkdir()
        array = (np.array("twostage", dtype=">U8") if value == ">U"
                 else np.array(list(value) if isinstance(value, tuple) else value))
        np.save(folder / "model.npy", array)
        proc = subprocess.run([exe, "eval", str(folder), str(folder)], capture_output=True, text=True)
        assert (proc.returncode, proc.stdout) == (status, ""), value
        assert proc.stderr.endswith(message + "\n") and proc.stderr.count("\n") == 1, (value, proc.stderr)
