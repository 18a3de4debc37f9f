"""Shared test fixtures, and the parallel run's set-up (pytest.ini runs the suite with pytest-xdist: ``-n auto``
workers, each test file on one worker, so a module's fixtures are computed once; ``-n 0`` runs it in this
process alone)."""
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

#: Workers of ``-n auto``: one per core this process may run on, at most this many (each worker imports
#: and collects the suite and loads the compiled kernels again).
MAX_WORKERS = 4

#: Compiles, in a process of its own, the Numba kernels of the stored cases of the models named in argv
#: (``ntpref verify``'s computation, results unused) into the kernel cache every worker reads.
WARM_UP = """
import sys
from ntpref.oracle import manifest, reference
stored = manifest.load_manifest(manifest.default_root())["cases"]
reference.verify(cases=[c for c, entry in stored.items() if entry["model"] in sys.argv[1:]])
"""
#: One warm-up process per group, run side by side.
WARM_UP_GROUPS = (("twostage",), ("shallow", "indrnn"))


@pytest.fixture
def rng():
    """A fresh seeded generator per test (tests never depend on global random state)."""
    return np.random.default_rng(12345)


# The stored reference runs' fixtures import ntpref when used: every pytest process loads this file, also
# xdist's controller, which runs no test.
@pytest.fixture(scope="module")
def manifest():
    """The manifest of the repository's stored reference runs (tests/reference_support.py)."""
    from ntpref.oracle import manifest as mf
    from reference_support import REPO_RUNS

    return mf.load_manifest(REPO_RUNS)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A private copy of reference_runs, selected through NTPREF_REFERENCE_RUNS."""
    from ntpref.oracle import manifest as mf
    from reference_support import REPO_RUNS

    root = tmp_path / "runs"
    shutil.copytree(REPO_RUNS, root)
    monkeypatch.setenv(mf.ENV_ROOT, str(root))
    return root


@pytest.fixture
def tiny_width(monkeypatch):
    """``reproduce width`` at a size that runs in about a second (2 seeds, m = 4 and 8, 5 steps); returns its
    cells."""
    from ntpref.reproduce import width
    from cli_support import TINY_WIDTH

    monkeypatch.setitem(width.SIZES, "quick", TINY_WIDTH)
    return width.cells(**TINY_WIDTH)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return max(1, min(MAX_WORKERS, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                      else os.cpu_count() or 1))


def pytest_sessionstart(session):
    """Before the workers of a parallel run of the whole suite start: compile the models' kernels once into
    the shared cache (with an empty cache each worker would otherwise compile the same kernels). Only speed
    changes: a kernel not in the cache is compiled where it is first called, so a warm-up that fails (its
    output is discarded; the tests report any fault of the oracle) leaves the compiling to the workers."""
    config = session.config
    if (hasattr(config, "workerinput") or getattr(config.option, "numprocesses", None) in (None, 0, 1)
            or config.option.collectonly):
        return
    if config.args_source is not pytest.Config.ArgsSource.TESTPATHS:     # files or tests named: run just those
        return
    procs = [subprocess.Popen([sys.executable, "-c", WARM_UP, *group], cwd=config.rootpath,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for group in WARM_UP_GROUPS]
    for proc in procs:
        proc.wait()
