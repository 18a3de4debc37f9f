"""Signals (SIGINT, SIGTERM, SIGHUP) at any moment of a command: at start-up, while ntpref imports, while it
trains and while a sweep's worker processes compute, each ends the command with one line and exit status
128 + signal; main() called from a program gives the program's handlers back; a signal inside a callback
from C, one that leaves a half-built object, and one that C code prints show no traceback.
"""
import gc
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cli_support import PACKAGE, run, write
from small_inputs import shallow_eval, shallow_train

NAMES = {signal.SIGINT: "SIGINT", signal.SIGTERM: "SIGTERM", signal.SIGHUP: "SIGHUP"}
INSTALL_LINE = next(i for i, line in enumerate((PACKAGE / "cli.py").read_text().splitlines(), 1)
                    if line.startswith("interrupt.install_if_command()"))
#: the module-level imports of ntpref/interrupt.py, which cli.py imports before it installs the handlers
INTERRUPT_IMPORTS_END = next(i for i, line in enumerate((PACKAGE / "interrupt.py").read_text().splitlines(), 1)
                             if line.startswith("SIGNALS = "))


def _default_dispositions() -> None:
    """Run in the child before exec: the default action for the signals under test. Ignored signals are
    inherited, and a test runner started by nohup ignores SIGHUP, one started in the background by a
    non-interactive shell ignores SIGINT; ntpref keeps an inherited ignore, as a command should."""
    for signum in NAMES:
        signal.signal(signum, signal.SIG_DFL)


def _child() -> dict:
    """Popen options of a command under test: unbuffered output, default signal dispositions."""
    return dict(env={**os.environ, "PYTHONUNBUFFERED": "1"}, preexec_fn=_default_dispositions)


def _check_interrupted(returncode: int, err: str, signum: int, activity: str | None = None) -> None:
    """One line naming the signal (and the activity, if given) with exit status 128 + signum; or the signal
    arrived while Python itself started, before ntpref's first line installed the handlers: then Python's
    own outcome (killed by the signal, or its start-up failure), and no frame of ntpref after that line
    (frames of ``ntpref/__init__.py``, of cli.py up to that line, or of the imports of interrupt.py, which
    cli.py imports first)."""
    if returncode == 128 + signum:
        what = re.escape(f" ({activity})") if activity else r"( \(.*\))?"
        assert re.fullmatch(rf"ntpref: interrupted by {NAMES[signum]}{what}\n", err), err
        return
    assert returncode in (-signum, 1), (returncode, err)
    for file, line in re.findall(r'File "([^"]+)", line (\d+)', err):
        inside = Path(file).resolve().is_relative_to(PACKAGE)
        name = Path(file).name
        assert not inside or name == "__init__.py" or (name == "cli.py" and int(line) <= INSTALL_LINE) or (
            name == "interrupt.py" and int(line) < INTERRUPT_IMPORTS_END), err


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("ntpref")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ntpref.cli"]


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_signal_at_any_moment_of_start_up(signum, tmp_path):
    inp = write(tmp_path / "in.npz", shallow_eval())
    argv = [*_console_script(), "eval", str(inp), "-o", str(tmp_path / "out.npz"), "-q"]
    handled, delays = 0, [0.0, 0.0, 0.005, 0.02, 0.05, 0.08, 0.12, 0.2, 0.4]
    for delay in delays:
        proc = subprocess.Popen(argv, cwd=tmp_path, **_child(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        time.sleep(delay)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
        if proc.returncode == 0:   # finished before the signal
            assert err == "" and (tmp_path / "out.npz").exists()
            continue
        _check_interrupted(proc.returncode, err, signum)
        handled += proc.returncode == 128 + signum
        assert out == ""
        if delay == delays[-1] and not handled and delay < 30:
            delays.append(2 * delay)     # still starting (a busy machine): a later signal
    assert handled     # once ntpref runs: its one line


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_while_ntpref_imports(signum, tmp_path):
    """Sent right after ``import ntpref`` reports ntpref.numba_target imported (-X importtime): ntpref's
    handlers are in place, main has not started."""
    inp = write(tmp_path / "in.npz", shallow_eval())
    proc = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "ntpref.cli", "eval", str(inp), "-o",
                             str(tmp_path / "out.npz"), "-q"], cwd=tmp_path, **_child(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:
        if line.split("|")[-1].strip() == "ntpref.numba_target":
            proc.send_signal(signum)
            break
    else:
        raise AssertionError("ntpref.numba_target was never imported")
    _, err = proc.communicate(timeout=120)
    err = "".join(line + "\n" for line in err.splitlines() if not line.startswith("import time:"))
    assert proc.returncode == 128 + signum
    assert re.fullmatch(rf"ntpref: interrupted by {NAMES[signum]}( \(eval {re.escape(str(inp))}\))?\n", err), err
    assert not (tmp_path / "out.npz").exists()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])
def test_signal_while_training(signum, tmp_path):
    inp = write(tmp_path / "in.npz", shallow_train(steps=np.array(10 ** 6)))
    out = tmp_path / "res" / "out.npz"
    proc = subprocess.Popen([*_console_script(), "train", str(inp), "-o", str(out)], cwd=tmp_path, **_child(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = proc.stderr.readline()
    assert first.startswith("shallow ProjGD: "), first
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    lines = err.splitlines()
    assert proc.returncode == 128 + signum
    assert lines[-1] == f"ntpref: interrupted by {NAMES[signum]} (train {inp})"
    assert all(line.startswith("shallow ProjGD: ") for line in lines[:-1]), err
    assert not (tmp_path / "res").exists()


SLOW_WIDTH = r"""
import sys
from ntpref.cli import main
from ntpref.reproduce import width
width.SIZES["quick"] = dict(seeds=(1, 2), widths=(4, 8), n=40, K=16, steps=10 ** 6, T=4, teachers=("diagonal",))
sys.exit(main(["reproduce", "width", "--workers", "2", "--out", sys.argv[1]]))
"""


def _children(pid: int) -> set[int]:
    try:
        return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}
    except OSError:
        return set()


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads child processes from /proc")
@pytest.mark.parametrize("signum, group", [(signal.SIGINT, True), (signal.SIGTERM, False)])
def test_signal_stops_the_worker_processes(signum, group, tmp_path):
    """Ctrl-C reaches the whole process group, kill(1) only the command: either way one line, and the worker
    processes are stopped instead of finishing their cells."""
    proc = subprocess.Popen([sys.executable, "-c", SLOW_WIDTH, str(tmp_path / "r")], cwd=tmp_path, **_child(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stderr.readline().startswith("reproduce width (quick): 0/4")
    while len(_children(proc.pid)) < 3:      # the resource tracker and the two workers
        assert proc.poll() is None
        time.sleep(0.05)
    workers = _children(proc.pid)
    time.sleep(1.0)                           # the workers are computing cells
    (os.killpg if group else os.kill)(proc.pid, signum)
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (128 + signum, f"ntpref: interrupted by {NAMES[signum]} (reproduce width)\n")
    for _ in range(600):
        alive = [p for p in workers if Path(f"/proc/{p}").exists() and "Z" not in
                 Path(f"/proc/{p}/stat").read_text().split(")")[-1].split()[0]]
        if not alive:
            break
        time.sleep(0.05)
    assert not alive
    assert not list((tmp_path / "r").rglob("*.npz"))


def test_interrupt_in_process_restores_the_handlers(tmp_path, capsys, monkeypatch):
    """main() called from a program: the signal ends only that call, and the program's handlers come back."""
    def interrupted(args):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        raise AssertionError("not interrupted")

    before = {s: signal.getsignal(s) for s in NAMES}
    monkeypatch.setattr("ntpref.cli._run_contract", interrupted)
    inp = write(tmp_path / "in.npz", shallow_eval())
    assert run(capsys, "eval", inp, "-o", tmp_path / "o.npz") == (143, f"ntpref: interrupted by SIGTERM (eval {inp})\n")
    assert {s: signal.getsignal(s) for s in NAMES} == before


def test_a_signal_inside_a_callback_from_c_still_unwinds(capsys):
    """Python only prints an exception raised in a callback from C (Numba's cache notification is one):
    the signal is delivered again and unwinds the work in the next ordinary line, with nothing printed."""
    import ctypes

    from ntpref import interrupt

    @ctypes.CFUNCTYPE(None)
    def callback():
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(10_000):   # the handler runs here, inside the callback
            pass

    hook, term = sys.unraisablehook, signal.getsignal(signal.SIGTERM)
    with pytest.raises(interrupt.Interrupted) as info:
        with interrupt.handling():
            callback()
            for _ in range(10_000_000):   # ordinary code after the callback: the signal lands here
                pass
    assert info.value.signum == signal.SIGTERM
    assert capsys.readouterr().err == ""
    assert sys.unraisablehook is hook and signal.getsignal(signal.SIGTERM) is term   # both given back


def test_a_half_built_object_the_signal_leaves_fails_silently_as_it_goes():
    """A signal between two lines of a constructor leaves an object whose destructor fails (llvmlite's
    references can, as Numba starts): after the signal that failure is not printed, in the unwinding or in
    a reference cycle collected as the block ends; before any signal the same failure still is."""
    from ntpref import interrupt

    class Half:
        def __init__(self, signal_now):
            self.cycle = self
            if signal_now:
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10_000_000):   # the handler raises here, before the attribute exists
                    pass
            self.ref = 1

        def __del__(self):
            del self.ref

    seen, hook = [], sys.unraisablehook
    sys.unraisablehook = lambda info: seen.append(type(info.exc_value))
    try:
        with interrupt.handling():
            try:   # as the command's main does: the exception, its frames and the object go in the block
                Half(signal_now=True)
            except interrupt.Interrupted as exc:
                assert exc.signum == signal.SIGTERM
        assert seen == []
        with interrupt.handling():
            half = Half(signal_now=False)
            del half.ref, half
            gc.collect()
        assert seen == [AttributeError]
    finally:
        sys.unraisablehook = hook


def test_a_signal_that_c_code_prints_shows_no_traceback(capsys):
    """C code that prints an exception and goes on (PyErr_Print, which calls sys.excepthook: NumPy's
    import_array does it when an import is interrupted, then raises an ImportError) prints nothing for the
    signal; the signal is recorded. Anything else is still printed."""
    from ntpref import interrupt

    hooks = sys.excepthook, sys.unraisablehook
    with interrupt.handling():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(10_000_000):   # the handler raises here
                pass
        except interrupt.Interrupted as exc:
            sys.excepthook(type(exc), exc, exc.__traceback__)
        assert interrupt.received() == signal.SIGTERM
        other = ValueError("other")
        sys.excepthook(ValueError, other, None)
    assert capsys.readouterr().err == "ValueError: other\n"
    assert (sys.excepthook, sys.unraisablehook) == hooks   # given back
