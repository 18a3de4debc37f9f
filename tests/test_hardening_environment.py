"""The command's environment: every fault a user can cause is one clear line. Paths the operating system
refuses, bad Numba thread variables, and a read-only installation without a writable home (the Numba cache
falls back to a private temporary one).
"""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import ntpref
from ntpref.cli import main
from ntpref.npzio import load_npz

from cli_support import LONG, PACKAGE, one_error, write
from small_inputs import shallow_eval


# ---- paths the operating system refuses --------------------------------------------------------------------

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


# ---- Numba's thread variables ------------------------------------------------------------------------------

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


# ---- a read-only installation without a writable home ------------------------------------------------------

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
