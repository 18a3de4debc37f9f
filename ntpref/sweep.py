"""Experiment grids (sweeps) run through any ``concurrent.futures``-style executor.

A sweep is a list of independent *cells*, each a dict of JSON-serialisable parameters
(``{"seed": 3, "m": 64}``). A cell function ``fn(**params) -> dict[str, array-like]`` computes one cell.
Results land in one directory, one ``.npz`` file per cell, named by a stable key of the parameters and
written atomically by the coordinating process; rerunning skips cells whose file exists, so an interrupted
sweep resumes without recomputing or losing finished cells, and several machines can fill one directory.

Executors: a local process pool (default, ``workers`` processes, spawn start method so Numba's threads are
never forked), a Dask distributed cluster (``scheduler="tcp://HOST:PORT"``), a fresh local Dask cluster
(``dask_local=N``), or any object with ``submit(fn, *args) -> Future`` (``executor=``).
"""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np

from .errors import InputError, NtprefError
from .oracle.npzio import load_npz, save_npz

PARAMS_KEY = "cell_params"


def grid(**axes: Iterable) -> list[dict]:
    """The Cartesian product of named axes as a list of cells, in a fixed order (last axis fastest).

    grid(seed=[1, 2], m=[8, 16]) -> [{"seed": 1, "m": 8}, {"seed": 1, "m": 16}, {"seed": 2, "m": 8}, ...]
    """
    names = list(axes)
    return [dict(zip(names, values)) for values in product(*(list(axes[n]) for n in names))]


def cell_key(params: Mapping) -> str:
    """A stable, readable file stem for a cell: ``m=64_seed=3`` (sorted names), hashed when long."""
    text = json.dumps(dict(params), sort_keys=True, separators=(",", ":"))
    readable = "_".join(f"{k}={params[k]}" for k in sorted(params))
    safe = "".join(ch if ch.isalnum() or ch in "=_.-" else "-" for ch in readable)
    if len(safe) > 120 or safe != readable:
        return (safe[:80] + "_" + hashlib.sha256(text.encode()).hexdigest()[:16]).strip("_")
    return safe


@dataclass(frozen=True)
class SweepSummary:
    """What a call of :func:`run_sweep` did: cells in the grid, computed now, and found done already."""

    total: int
    computed: int
    skipped: int
    seconds: float


def _call(fn: Callable, params: dict) -> dict:
    return {k: np.asarray(v) for k, v in fn(**params).items()}


@contextmanager
def worker_threads(processes: int):
    """Give each of ``processes`` local worker processes its share of the cores as Numba threads.

    Numba's OpenMP threads spin while they wait, so more threads than free cores is very slow: on the
    2-core machine ``reproduce width --quick --workers 2`` took 251 s with 2 threads per worker and 59 s
    with 1 (same results), and on a busy machine a 2-thread shallow ProjGD step at m = 8, n = 800 was
    10x slower than a 1-thread one (0.031 vs 0.0031 s). The worker processes are spawned, so they read
    NUMBA_NUM_THREADS from the environment set here (restored afterwards); a value the user set is left
    alone. Results do not depend on the thread count (the kernels are bitwise deterministic)."""
    if processes <= 1 or "NUMBA_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["NUMBA_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // processes))
    try:
        yield
    finally:
        del os.environ["NUMBA_NUM_THREADS"]


def _open_executor(stack: ExitStack, workers: int, scheduler: str | None, dask_local: int | None):
    if scheduler is not None or dask_local is not None:
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise InputError("Dask is not installed: pip install 'ntpref[dist]'") from None
        if scheduler is not None:
            client = stack.enter_context(Client(scheduler))
        else:
            stack.enter_context(worker_threads(dask_local))
            cluster = stack.enter_context(LocalCluster(n_workers=dask_local, threads_per_worker=1,
                                                       processes=True, dashboard_address=None))
            client = stack.enter_context(Client(cluster))
        return client.get_executor(pure=False)
    stack.enter_context(worker_threads(workers))
    return stack.enter_context(ProcessPoolExecutor(max_workers=workers,
                                                   mp_context=multiprocessing.get_context("spawn")))


def run_sweep(fn: Callable[..., Mapping], cells: list[dict], outdir: str | os.PathLike, *, workers: int = 1,
              scheduler: str | None = None, dask_local: int | None = None, executor=None,
              progress: Callable[[str, int, int], None] | None = None, label: str = "cells") -> SweepSummary:
    """Compute every cell whose result file is missing in ``outdir``; write each result atomically.

    fn: a module-level (picklable) function; ``fn(**cell)`` returns a dict of arrays/scalars.
    workers: local processes (1 = run in this process, no pool). scheduler / dask_local / executor: see module
    docstring. progress(label, done, total) is called after each finished cell (done counts skipped cells).
    A failing cell re-raises after the cells already finished are saved.
    """
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    keys = [cell_key(c) for c in cells]
    if len(set(keys)) != len(keys):
        raise InputError("sweep: two cells have the same parameters")
    todo = [(k, c) for k, c in zip(keys, cells) if not (outdir / f"{k}.npz").exists()]
    total, done, start = len(cells), len(cells) - len(todo), time.perf_counter()
    report = progress or (lambda *a: None)
    report(label, done, total)

    def save(key, params, result):
        nonlocal done
        if PARAMS_KEY in result:
            raise NtprefError(f"sweep: cell result may not contain '{PARAMS_KEY}'")
        save_npz(outdir / f"{key}.npz", {**result, PARAMS_KEY: np.array(json.dumps(params, sort_keys=True))})
        done += 1
        report(label, done, total)

    if workers <= 1 and executor is None and scheduler is None and dask_local is None:
        for key, params in todo:
            save(key, params, _call(fn, params))
    elif todo:
        with ExitStack() as stack:
            ex = executor if executor is not None else _open_executor(stack, workers, scheduler, dask_local)
            pending = {ex.submit(_call, fn, params): (key, params) for key, params in todo}
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    key, params = pending.pop(fut)
                    save(key, params, fut.result())
    return SweepSummary(total, len(todo), total - len(todo), time.perf_counter() - start)


def load_results(outdir: str | os.PathLike) -> list[tuple[dict, dict[str, np.ndarray]]]:
    """Every finished cell in ``outdir`` as (params, arrays), sorted by cell key."""
    out = []
    for path in sorted(Path(outdir).glob("*.npz")):
        arrays = load_npz(path)
        params = json.loads(str(arrays.pop(PARAMS_KEY)))
        out.append((params, arrays))
    return out
