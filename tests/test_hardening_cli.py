"""The command line, its processes and its environment: every fault a user can cause is one clear line.

Paths the operating system refuses, a results directory that is a file, an unreachable Dask scheduler,
damaged or foreign files among a sweep's cells, bad Numba environment variables, minibatches larger than
the data, a read-only installation without a writable home, worker counts below one, signals (SIGINT,
SIGTERM, SIGHUP) at any moment, longdouble values beyond float64 and bytes where a string belongs.
"""
import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import ntpref
from ntpref import sweep
from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.npzio import load_npz, save_npz
from ntpref.reproduce import width

from small_inputs import indrnn_eval, shallow_eval, twostage_eval, twostage_train

PACKAGE = Path(ntpref.__file__).resolve().parent
LONG = "a" * 300 + ".npz"          # one path component longer than any file system allows (255)
TINY_WIDTH = dict(seeds=(1, 2), widths=(4, 8), n=40, K=16, steps=5, T=4, teachers=("diagonal",))


def shallow_train(**extra):
    return {**shallow_eval(), "eta": np.array(0.1), "steps": np.array(2), **extra}


def run(capsys, *argv) -> tuple[int, str]:
    """``ntpref ARGV`` in this process: (exit status, stderr)."""
    capsys.readouterr()
    status = main([str(a) for a in argv])
    return status, capsys.readouterr().err


def one_error(capsys, *argv) -> str:
    """Run ``ntpref ARGV``, check it fails with exit status 2 and one ``ntpref: error:`` line; the line."""
    status, err = run(capsys, *argv)
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("ntpref: error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    return err.rstrip("\n")


def write(path: Path, arrays: dict) -> Path:
    np.savez(path, **arrays)   # np.savez, not save_npz: any dtype (longdouble, bytes) gets in
    return path


# ---- 1. paths the operating system refuses ------------------------------------------------------------

def test_paths_too_long_are_named(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    good = write(tmp_path / "in.npz", shallow_eval())
    assert main(["eval", str(good), "-o", "out.npz", "-q"]) == 0
    cases = [("eval", LONG, "-o", "x.npz"), ("eval", good, "-o", LONG), ("compare", LONG, "out.npz"),
             ("compare", "out.npz", LONG), ("compare", "--input", LONG, "out.npz", "out.npz"),
             ("compare", "--tolerances", LONG[:-4] + ".json", "out.npz", "out.npz"), ("gradcheck", LONG),
             ("gradcheck", good, LONG), ("verify", "--root", LONG[:-4])]
    for argv in cases:
        err = one_error(capsys, *argv)
        assert LONG[:-4] in err and "File name too long" in err, (argv, err)
    assert "--root " + LONG[:-4] + ": unusable directory (File name too long)" in one_error(capsys, "verify", "--root", LONG[:-4])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "out.npz"]


# ---- 2, 3, 8. reproduce: --out, --scheduler, worker counts ----------------------------------------------

@pytest.fixture
def tiny_width(monkeypatch):
    """``reproduce width`` at a size that runs in about a second (2 seeds, m = 4 and 8, 5 steps)."""
    monkeypatch.setitem(width.SIZES, "quick", TINY_WIDTH)
    return width.cells(**TINY_WIDTH)


def test_reproduce_out_must_be_a_directory(tmp_path, capsys, tiny_width):
    (tmp_path / "file").write_text("not a directory")
    assert one_error(capsys, "reproduce", "width", "--out", tmp_path / "file", "-q") == (
        f"ntpref: error: --out {tmp_path / 'file'}: not a directory (give the directory for the results)")
    below = tmp_path / "file" / "results"
    assert one_error(capsys, "reproduce", "width", "--out", below, "-q") == (
        f"ntpref: error: {below / 'width' / 'quick' / 'cells'}: cannot create the results directory (Not a directory)")
    err = one_error(capsys, "reproduce", "width", "--out", tmp_path / LONG, "-q")
    assert err.endswith("/width/quick/cells: cannot create the results directory (File name too long)"), err
    assert (tmp_path / "file").read_text() == "not a directory"


def test_reproduce_unreachable_scheduler(tmp_path, capsys, tiny_width, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(sweep, "SCHEDULER_TIMEOUT", 1)
    assert one_error(capsys, "reproduce", "width", "--scheduler", "tcp://127.0.0.1:1", "--out", tmp_path, "-q") == (
        "ntpref: error: Dask scheduler 'tcp://127.0.0.1:1': cannot connect (Timed out trying to connect to "
        "tcp://127.0.0.1:1 after 1 s)")
    assert one_error(capsys, "reproduce", "width", "--scheduler", "nohost", "--out", tmp_path, "-q") == (
        "ntpref: error: Dask scheduler 'nohost': cannot connect (missing port number in address 'nohost')")


@pytest.mark.parametrize("option, value", [("--dask-local", "0"), ("--dask-local", "-2"), ("--workers", "0"),
                                           ("--workers", "-1"), ("--workers", "two")])
def test_reproduce_worker_counts_below_one(option, value, tmp_path, capsys):
    status, err = run(capsys, "reproduce", "width", option, value, "--out", tmp_path)
    assert status == 2
    assert err == (f"ntpref reproduce: error: argument {option}: expected a whole number >= 1, got '{value}' "
                   "(see 'ntpref reproduce --help')\n")
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (("reproduce", "width", "--wokers", "2"),
     "ntpref reproduce: error: unrecognized arguments: --wokers (did you mean '--workers'?)"),
    (("verify", "--lst"), "ntpref verify: error: unrecognized arguments: --lst (did you mean '--list'?)"),
    (("verify", "--lst", "--rot=x", "--zzz"), "ntpref verify: error: unrecognized arguments: --lst (did you "
     "mean '--list'?) --rot=x (did you mean '--root'?) --zzz (see 'ntpref verify --help')"),
    (("conformance", "--modle=shallow"),
     "ntpref conformance: error: unrecognized arguments: --modle=shallow (did you mean '--model'?) (see "),
    (("reproduce", "width", "--zzz"), "ntpref reproduce: error: unrecognized arguments: --zzz"),
    (("evl", "x.npz"), "ntpref: error: argument COMMAND: invalid choice: 'evl' (choose from 'eval', 'train', "),
    (("conformance", "--model", "shalow"), "(did you mean 'shallow'?) (see 'ntpref conformance --help')"),
    (("reproduce", "twostag"), "ntpref: error: unknown reproduce target 'twostag' (did you mean 'twostage'?); "),
])
def test_mistyped_options_and_names_get_a_did_you_mean(argv, message, tmp_path, capsys):
    status, err = run(capsys, *argv, "--out", tmp_path) if argv[0] == "reproduce" else run(capsys, *argv)
    assert status == 2
    assert err.count("\n") == 1 and message in err, err
    assert not any(tmp_path.iterdir())


def test_sweep_worker_counts_below_one(tmp_path):
    with pytest.raises(InputError, match="^sweep: dask_local must be at least 1, got 0$"):
        sweep.run_sweep(dict, [{"x": 1}], tmp_path, dask_local=0)
    with pytest.raises(InputError, match="^sweep: workers must be at least 1, got -1$"):
        sweep.run_sweep(dict, [{"x": 1}], tmp_path, workers=-1)


# ---- 4. cells that are damaged, another cell's, or no cells at all ---------------------------------------

def test_reproduce_recomputes_damaged_cells_and_ignores_foreign_files(tmp_path, capsys, tiny_width):
    cells = tmp_path / "width" / "quick" / "cells"
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q")[0] == 0
    files = sorted(cells.iterdir())
    assert [f.stem for f in files] == sorted(sweep.cell_key(c) for c in tiny_width)
    original = {f.name: load_npz(f) for f in files}
    damaged, swapped = files[0], files[1]
    damaged.write_bytes(damaged.read_bytes()[:300])                     # truncated, e.g. by a copy
    os.replace(files[2], swapped)                                       # another cell's result under this name
    write(cells / "notes.npz", {"x": np.arange(3)})                     # foreign: not a cell
    other = {**tiny_width[0], "steps": 7}                               # a cell of another grid
    save_npz(cells / f"{sweep.cell_key(other)}.npz", {"loss": np.ones(2), "cell_params": np.array('{"steps": 7}')})

    ignoring = (f"ntpref: warning: {cells}: ignoring 2 file(s) that are not cells of this sweep "
                f"('{sweep.cell_key(other)}.npz', ...)")
    status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q", "--summarize-only")
    lines = err.splitlines()
    assert status == 2 and len(lines) == 2 and lines[0] == ignoring, err
    assert lines[1] == (f"ntpref: error: {damaged}: not an npz file (File is not a zip file); it is not a finished "
                        "cell: delete it, or run the sweep again to recompute it")

    status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q")
    lines = err.splitlines()
    assert status == 0 and len(lines) == 3, err
    assert lines[0] == (f"ntpref: warning: recomputing a cell whose file does not load: {damaged}: not an npz "
                        "file (File is not a zip file)")
    assert lines[1].startswith(f"ntpref: warning: recomputing {swapped}: it holds the cell ")
    assert lines[2] == ignoring
    for name, arrays in original.items():                               # recomputed: the same results again
        again = load_npz(cells / name)
        assert again.keys() == arrays.keys(), name
        assert all(np.array_equal(again[k], arrays[k]) for k in arrays if k != "cpu_seconds"), name


BAD_CELLS = {   # how a cell file is damaged -> the one line naming it (after "PATH: ")
    "negative loss": (lambda a: {**a, "min_train_loss": np.float64(-0.5)},
                      "min_train_loss holds -0.5, below its least value 0"),
    "array missing": (lambda a: {k: v for k, v in a.items() if k != "final_val_loss"},
                      "missing array(s) final_val_loss"),
    "wrong shape": (lambda a: {**a, "train_loss": a["train_loss"][:3]}, "train_loss has shape (3,), not (5,)"),
    "2-d scalar": (lambda a: {**a, "min_train_loss": np.ones((1, 1))}, "min_train_loss has shape (1, 1), not ()"),
    "string value": (lambda a: {**a, "min_train_loss": np.array("0.5")}, "min_train_loss is a string, not float64"),
    "another dtype": (lambda a: {**a, "train_loss": a["train_loss"].astype(np.float32)},
                      "train_loss is float32, not float64"),
    "extra array": (lambda a: {**a, "note": np.arange(2)}, "unexpected array(s) note"),
}


def test_a_bad_cell_is_named_in_one_line_and_recomputed_on_a_run(tmp_path, capsys, monkeypatch):
    """Every cell is checked against what its target's cell returns (names, dtypes, shapes, ranges), also when no
    majority of cells of its kind could tell it differs (two cells here)."""
    monkeypatch.setitem(width.SIZES, "quick", {**TINY_WIDTH, "seeds": (1,)})
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q")[0] == 0
    path = sorted((tmp_path / "width" / "quick" / "cells").iterdir())[0]
    original = load_npz(path)
    for damage, why in BAD_CELLS.values():
        save_npz(path, damage(original))
        status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q", "--summarize-only")
        assert (status, err) == (2, f"ntpref: error: {path}: {why}; it is not a finished cell: delete it, or run "
                                    "the sweep again to recompute it\n")
        status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q")
        assert (status, err) == (0, f"ntpref: warning: recomputing {path}: {why}\n")
        again = load_npz(path)
        assert again.keys() == original.keys()
        assert all(np.array_equal(again[k], original[k]) for k in original if k != "cpu_seconds")


@pytest.mark.parametrize("value", [np.nan, -np.inf])
def test_a_cell_holding_nan_or_inf_is_left_out_of_the_summary_by_name(value, tmp_path, capsys, tiny_width):
    """Such a cell is no damage a new run would repair (the computation is deterministic): it is kept, and the
    summary is the one of the other cells, with a line naming it."""
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q")[0] == 0
    path = sorted((tmp_path / "width" / "quick" / "cells").iterdir())[0]
    without = tmp_path / "without"
    shutil.copytree(path.parent, without / "width" / "quick" / "cells")
    (without / "width" / "quick" / "cells" / path.name).unlink()
    assert run(capsys, "reproduce", "width", "--out", without, "-q", "--summarize-only")[0] == 0
    arrays = load_npz(path)
    arrays["train_loss"][2] = value
    save_npz(path, {**arrays, "min_train_loss": np.float64(value)})
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q") == (0, "")   # kept, not recomputed
    summary = (tmp_path / "width" / "quick" / "summary.txt").read_text()
    note = (f"left out of this summary: {path} holds NaN or inf in min_train_loss, train_loss (delete it to "
            "compute it again)")
    assert summary == (without / "width" / "quick" / "summary.txt").read_text().removesuffix("\n") + f"\n{note}\n"
    for other in sorted(path.parent.iterdir()):
        save_npz(other, {**load_npz(other), "final_val_loss": np.float64(np.nan)})
    status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q", "--summarize-only")
    assert status == 2 and err.startswith(f"ntpref: error: {path.parent}: no finished cells to summarize "
                                          f"(left out of this summary: {path} holds NaN or inf"), err


def test_load_results_names_a_file_that_is_no_cell(tmp_path):
    write(tmp_path / "notes.npz", {"x": np.arange(3)})
    with pytest.raises(InputError, match=re.escape(f"{tmp_path / 'notes.npz'}: not a sweep cell (it has no "
                                                   "'cell_params' array); it is not a finished cell: delete it")):
        sweep.load_results(tmp_path)
    ignoring = "ignoring 1 file(s) that are not cells of this sweep ('notes.npz')"
    with pytest.warns(UserWarning, match=re.escape(ignoring)):
        assert sweep.load_results(tmp_path, [{"x": 1}]) == []


# ---- 5. Numba's thread variables -------------------------------------------------------------------------

@pytest.mark.parametrize("variable, value, message", [
    ("NUMBA_NUM_THREADS", "0", "expected a whole number of threads from 1 to {limit}"),
    ("NUMBA_NUM_THREADS", "-1", "expected a whole number of threads from 1 to {limit}"),
    ("NUMBA_NUM_THREADS", "abc", "expected a whole number of threads from 1 to {limit}"),
    ("NUMBA_NUM_THREADS", "100000", "expected a whole number of threads from 1 to {limit}"),
    ("NUMBA_THREADING_LAYER", "bogus", "not a threading layer; expected one of default, workqueue, forksafe, "
                                       "omp, tbb, safe, threadsafe"),
])
def test_numba_thread_variables(variable, value, message, tmp_path, capsys, monkeypatch):
    inp = write(tmp_path / "in.npz", shallow_eval())
    monkeypatch.setenv(variable, value)
    limit = max(1024, os.cpu_count() or 1)
    assert one_error(capsys, "eval", inp, "-o", tmp_path / "out.npz", "-q") == (
        f"ntpref: error: environment variable {variable}={value!r}: {message.format(limit=limit)}")
    assert not (tmp_path / "out.npz").exists()


def test_threading_layer_that_cannot_load(tmp_path):
    """TBB is optional: either Numba loads it, or the command says it cannot, naming the variable."""
    inp = write(tmp_path / "in.npz", shallow_eval())
    env = {**os.environ, "NUMBA_THREADING_LAYER": "tbb"}
    proc = subprocess.run([sys.executable, "-m", "ntpref.cli", "eval", str(inp), "-o", str(tmp_path / "o.npz"), "-q"],
                          env=env, capture_output=True, text=True, cwd=tmp_path)
    if proc.returncode == 0:
        assert proc.stderr == "" and (tmp_path / "o.npz").exists()
    else:
        assert proc.returncode == 2 and proc.stderr == (
            "ntpref: error: environment variable NUMBA_THREADING_LAYER='tbb': No threading layer could be loaded. "
            "Intel TBB is required, try: $ conda/pip install tbb (or unset the variable to use the default "
            "layer)\n"), proc.stderr


# ---- 6. minibatch sizes ---------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [2 ** 62, 10 ** 9, 6])
def test_batch_beyond_the_data(batch, tmp_path, capsys):
    inp = write(tmp_path / "in.npz", shallow_train(batch=np.array(batch), seed=np.array(0)))
    assert one_error(capsys, "train", inp, "-o", tmp_path / "out.npz", "-q") == (
        f"ntpref: error: {inp}: array 'batch': must be between 1 and n = 5 (the number of training samples), "
        f"got {batch}")


def test_batch_of_every_sample_runs(tmp_path, capsys):
    inp = write(tmp_path / "in.npz", shallow_train(batch=np.array(5), seed=np.array(0)))
    assert run(capsys, "train", inp, "-o", tmp_path / "out.npz", "-q") == (0, "")


# ---- 7. a read-only installation without a writable home -------------------------------------------------

def _read_only_copy(tmp_path: Path) -> Path:
    """A copy of the package whose every ``__pycache__`` is a file, so no directory can be made there (as
    for a read-only installation, also when the tests run as root)."""
    root = tmp_path / "site"
    shutil.copytree(PACKAGE, root / "ntpref", ignore=shutil.ignore_patterns("__pycache__"))
    for d in [root / "ntpref", *(root / "ntpref").rglob("*")]:
        if d.is_dir():
            (d / "__pycache__").write_text("")
    return root


def _unwritable_env(tmp_path: Path, site: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_CACHE_HOME", "NUMBA_CACHE_DIR")}
    (tmp_path / "tmp").mkdir()
    env.update(PYTHONPATH=str(site), HOME="/dev/null", NUMBA_CACHE_DIR="/dev/null/numba",
               TMPDIR=str(tmp_path / "tmp"), PYTHONDONTWRITEBYTECODE="1")
    return env


def test_no_writable_numba_cache_falls_back_to_a_private_temporary_one(tmp_path):
    site = _read_only_copy(tmp_path)
    env = _unwritable_env(tmp_path, site)
    cache = tmp_path / "tmp" / f"ntpref-numba-cache-{os.geteuid()}"
    notice = (f"ntpref: notice: no writable Numba cache directory (NUMBA_CACHE_DIR=/dev/null/numba, "
              f"{site / 'ntpref' / '__pycache__'}, /dev/null/.cache/numba); compiled kernels are cached in {cache}\n")
    for _ in range(2):       # every module with kernels is imported (cached functions are declared)
        proc = subprocess.run([sys.executable, "-m", "ntpref.cli", "reproduce", "--list"], env=env, cwd=tmp_path,
                              capture_output=True, text=True)
        assert (proc.returncode, proc.stderr) == (0, notice)
        assert "width" in proc.stdout
    assert cache.is_dir() and (cache.stat().st_mode & 0o777) == 0o700 and any(cache.iterdir())
    cache.chmod(0o777)      # writable by others: never trusted, a fresh private directory instead
    proc = subprocess.run([sys.executable, "-m", "ntpref.cli", "--version"], env=env, cwd=tmp_path,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout == f"ntpref {ntpref.__version__}\n"
    fresh = re.fullmatch(r"ntpref: notice: .*; compiled kernels are cached in (\S+)\n", proc.stderr).group(1)
    assert Path(fresh).parent == tmp_path / "tmp" and Path(fresh) != cache
    assert (Path(fresh).stat().st_mode & 0o777) == 0o700


@pytest.mark.slow
def test_read_only_installation_computes_and_caches(tmp_path):
    """The whole eval compiles into the temporary cache; the second run loads it and gives the same bytes."""
    site = _read_only_copy(tmp_path)
    env = _unwritable_env(tmp_path, site)
    inp = write(tmp_path / "in.npz", shallow_eval())
    outputs = []
    for k in range(2):
        out = tmp_path / f"out{k}.npz"
        proc = subprocess.run([sys.executable, "-m", "ntpref.cli", "eval", str(inp), "-o", str(out), "-q"], env=env,
                              cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == 0 and proc.stderr.count("\n") == 1 and "notice" in proc.stderr
        outputs.append(load_npz(out))
    cache = tmp_path / "tmp" / f"ntpref-numba-cache-{os.geteuid()}"
    assert list(cache.rglob("*.nbi"))
    assert all(outputs[0][k].tobytes() == outputs[1][k].tobytes() for k in outputs[0])


# ---- 9. signals ----------------------------------------------------------------------------------------

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


# ---- 10, 11. longdouble beyond float64, bytes for strings --------------------------------------------------

FLOATS = [("eval", shallow_eval, "X"), ("eval", shallow_eval, "W"), ("eval", indrnn_eval, "u"),
          ("eval", twostage_eval, "W_kq"), ("train", twostage_train, "eta0"), ("train", shallow_train, "eta"),
          ("train", lambda: shallow_train(rho=np.array([1.0, 2.0, 3.0])), "rho"),
          ("eval", lambda: {**shallow_eval(), "kappa": np.array(1.0)}, "kappa")]


@pytest.mark.parametrize("kind, make, name", FLOATS)
def test_longdouble_beyond_float64_names_the_array(kind, make, name, tmp_path, capsys):
    arrays = make()
    value = np.asarray(arrays[name], dtype=np.longdouble).copy()
    if np.finfo(np.longdouble).max <= np.finfo(np.float64).max:
        pytest.skip("longdouble is float64 on this platform")
    value.flat[-1] = np.longdouble("-1e400")
    inp = write(tmp_path / "in.npz", {**arrays, name: value})
    last = tuple(int(i) for i in np.unravel_index(value.size - 1, value.shape))
    where = f" at index {last}" if value.ndim else ""
    assert one_error(capsys, kind, inp, "-o", tmp_path / "out.npz", "-q") == (
        f"ntpref: error: {inp}: array '{name}': value -1e+400{where} is beyond the float64 range (|x| <= 1.798e+308)")


def test_longdouble_within_float64_is_rounded_to_float64(tmp_path, capsys):
    arrays = shallow_eval()
    write(tmp_path / "a.npz", arrays)
    write(tmp_path / "b.npz", {**arrays, "X": arrays["X"].astype(np.longdouble)})
    for f in "ab":
        assert run(capsys, "eval", tmp_path / f"{f}.npz", "-o", tmp_path / f"out_{f}.npz", "-q") == (0, "")
    a, b = load_npz(tmp_path / "out_a.npz"), load_npz(tmp_path / "out_b.npz")
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


STRINGS = [("eval", twostage_eval, "model"), ("train", lambda: {**twostage_train(), "direction": np.array("naive")},
                                                "direction"),
           ("eval", lambda: {**shallow_eval(), "activation": np.array("erf")}, "activation"),
           ("train", lambda: {**indrnn_eval(), "eta": np.array(0.1), "steps": np.array(2),
                              "activation": np.array("erf")}, "activation")]


@pytest.mark.parametrize("kind, make, name", STRINGS)
def test_ascii_bytes_are_the_string(kind, make, name, tmp_path, capsys):
    arrays = make()
    write(tmp_path / "str.npz", arrays)
    write(tmp_path / "bytes.npz", {**arrays, name: np.array(str(arrays[name]).encode("ascii"))})
    for f in ("str", "bytes"):
        assert run(capsys, kind, tmp_path / f"{f}.npz", "-o", tmp_path / f"out_{f}.npz", "-q") == (0, "")
    a, b = load_npz(tmp_path / "out_str.npz"), load_npz(tmp_path / "out_bytes.npz")
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    inp = write(tmp_path / "bad.npz", {**arrays, name: np.array(b"tw\xffo")})
    assert one_error(capsys, kind, inp, "-o", tmp_path / "out.npz", "-q") == (
        f"ntpref: error: {inp}: array '{name}': expected a string, got bytes that are not ASCII (b'tw\\xffo')")


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


def test_every_help_text_is_plain_text():
    """The help of ntpref and of each sub-command is plain text: no reStructuredText markup of the
    docstrings it may come from (double backticks, :func: roles)."""
    from ntpref.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.choices and a.dest == "command"]
    texts = {"ntpref": parser.format_help(), **{name: p.format_help() for name, p in sub.choices.items()}}
    assert len(texts) > 10
    for name, text in texts.items():
        assert not re.search(r"``|:(func|mod|class|data|meth):`", text), (name, text)
