"""Experiment grids (sweeps) run through any ``concurrent.futures``-style executor.

A sweep is a list of independent *cells*, each a dict of JSON-serialisable parameters
(``{"seed": 3, "m": 64}``). A cell function ``fn(**params) -> dict[str, array-like]`` computes one cell.
Results land in one directory, one ``.npz`` file per cell, named by a stable key of the parameters and
written atomically by the coordinating process, with the cell's parameters as the array ``cell_params`` and
the version of the code that computed it as ``cell_version`` (:data:`VERSION_KEY`).
A rerun skips every cell whose file holds that cell's result (it loads and its ``cell_params`` match), so
an interrupted sweep resumes without recomputing or losing finished cells, and several machines can fill
one directory; a cell file that does not load (damaged, e.g. truncated by a copy) or holds other
parameters or another version is not a finished cell: it is recomputed and replaced, with a warning. :func:`load_results`
given the grid ignores, with a warning, files of the directory that are not cells of the grid (another
grid's cells, other files). :func:`copy_equivalent` fills cells from another grid's finished cells that
compute the same result, so two experiments that share cells compute them once.

What a cell holds: given ``expect(params) -> {name: CellArray}`` (the arrays the cell function returns for
those parameters), a cell file whose arrays are not those (one missing or extra, another dtype or shape, a
value out of its range: :func:`cell_fault`) is not a finished cell either. NaN and inf where the cell
function gives finite values do not make a file unfinished (the computation is deterministic, so computing
it again would give them again when they are its result): :func:`nonfinite_arrays` names them, for the
summary to say so.

Executors: a local process pool (default, ``workers`` processes, spawn start method so Numba's threads are
never forked; they ignore SIGINT, and are stopped when the sweep is interrupted), a Dask distributed
cluster (``scheduler="tcp://HOST:PORT"``, which must answer within :data:`SCHEDULER_TIMEOUT` seconds), a
fresh local Dask cluster (``dask_local=N``; it logs errors only, not the warnings of its shutdown
when the sweep is interrupted), or any object with ``submit(fn, *args) -> Future``
(``executor=``).
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import multiprocessing
import os
import signal
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np

from .checks import as_scalar
from .errors import InputError, NtprefError
from .npzio import load_npz, save_npz

PARAMS_KEY = "cell_params"
#: The version of the cell function's computation stored with each cell (an int64 array): a target raises its
#: ``CELL_VERSION`` when a change of its code changes its cells' results, and cells of another version are
#: recomputed, never mixed into a summary. A file without it holds version 1.
VERSION_KEY = "cell_version"
#: Seconds to wait for a Dask scheduler to answer (Dask's own default is 30 s).
SCHEDULER_TIMEOUT = 10


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


@dataclass(frozen=True)
class CellArray:
    """One array a cell function returns: its dtype ("f8", "i8", or "U": a string of any length), its shape,
    the closed interval [low, high] its finite values lie in, and whether NaN and inf are among the values the
    cell function gives (``nonfinite``: e.g. the losses of a run that diverged)."""

    dtype: str
    shape: tuple[int, ...] = ()
    low: float = -math.inf
    high: float = math.inf
    nonfinite: bool = False


def _dtype_text(dtype: np.dtype) -> str:
    return {"U": "a string", "S": "bytes"}.get(dtype.kind, str(dtype))


def cell_fault(arrays: Mapping[str, np.ndarray], expected: Mapping[str, CellArray]) -> str | None:
    """Why ``arrays`` (a cell file's, ``cell_params`` and ``cell_version`` taken out) are not what the cell
    function returns (``expected``), in one line, or None when they are: arrays missing or unexpected, another
    dtype or shape, finite values outside [low, high] (the least and the largest are named). NaN and inf are
    :func:`nonfinite_arrays`' to name, not faults."""
    missing = [n for n in expected if n not in arrays]
    extra = [n for n in arrays if n not in expected]
    parts = ([f"missing array(s) {', '.join(missing)}"] if missing else []) + \
            ([f"unexpected array(s) {', '.join(extra)}"] if extra else [])
    for name, want in expected.items():
        a = arrays.get(name)
        if a is None:
            continue
        if a.dtype.kind != "U" if want.dtype == "U" else a.dtype != np.dtype(want.dtype):
            parts.append(f"{name} is {_dtype_text(a.dtype)}, not {_dtype_text(np.dtype(want.dtype))}")
        elif a.shape != tuple(want.shape):
            parts.append(f"{name} has shape {a.shape}, not {tuple(want.shape)}")
        elif a.dtype.kind in "fi" and a.size:
            finite = a[np.isfinite(a)]
            if finite.size and finite.min() < want.low:
                parts.append(f"{name} holds {finite.min().item()!r}, below its least value {want.low:g}")
            if finite.size and finite.max() > want.high:
                parts.append(f"{name} holds {finite.max().item()!r}, above its largest value {want.high:g}")
    return "; ".join(parts) or None


def nonfinite_arrays(arrays: Mapping[str, np.ndarray], expected: Mapping[str, CellArray]) -> list[str]:
    """The names of the float arrays of ``arrays`` holding NaN or inf where ``expected`` says the cell function
    gives finite values only."""
    return [name for name, a in arrays.items()
            if a.dtype.kind == "f" and name in expected and not expected[name].nonfinite
            and not np.all(np.isfinite(a))]


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


def _start_resource_tracker() -> None:
    """Start multiprocessing's resource tracker with SIGHUP ignored (it ignores SIGINT and SIGTERM itself):
    a hangup of the process group would kill it, and its replacement prints tracebacks while the
    interrupted sweep shuts down."""
    from multiprocessing import resource_tracker

    if not hasattr(signal, "SIGHUP"):
        return
    try:
        previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave it to multiprocessing
        return
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, signal.SIG_DFL if previous is None else previous)


def _watch_parent(parent: int, every: float = 1.0) -> None:
    """In a worker: exit at once when the coordinating process ``parent`` is gone (killed with SIGKILL, its
    pool never told the worker to stop), instead of idling, or finishing a long cell, for nothing."""
    while True:
        time.sleep(every)
        if os.getppid() != parent:
            os._exit(0)


def _init_worker(parent: int) -> None:
    """A local worker ignores SIGINT (Ctrl-C reaches the whole process group; the coordinating process
    handles it) and watches its parent (:func:`_watch_parent`)."""
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="ntpref-parent-watch").start()


@contextmanager
def _sigint_ignored():
    """SIGINT ignored in this process for the block (when it is the main thread): worker processes spawned
    inside inherit the disposition, so a Ctrl-C while they still import reaches none of them (it would print
    a traceback from multiprocessing's start-up code). The coordinating process handles Ctrl-C as soon as
    the block ends."""
    try:
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class _QuietStartPool:
    """A ProcessPoolExecutor whose ``submit`` (which spawns the workers, one per call until the pool is full)
    runs with SIGINT ignored (:func:`_sigint_ignored`)."""

    def __init__(self, pool: ProcessPoolExecutor):
        self.pool = pool

    def submit(self, fn, *args):
        with _sigint_ignored():
            return self.pool.submit(fn, *args)


@contextmanager
def _local_pool(workers: int):
    """A spawn ProcessPoolExecutor whose workers ignore SIGINT from their start (Ctrl-C reaches the whole
    process group; the coordinating process handles it) and are terminated when the block is left by an exception, so an
    interrupted sweep ends now instead of after the cells being computed."""
    _start_resource_tracker()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                               initializer=_init_worker, initargs=(os.getpid(),))
    try:
        yield _QuietStartPool(pool)
    except BaseException:
        for process in list((getattr(pool, "_processes", None) or {}).values()):  # no public way before 3.14
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def _dask_client(stack: ExitStack, scheduler: str | None, dask_local: int | None):
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("Dask is not installed: pip install 'ntpref[dist]'") from None
    if scheduler is None:
        stack.enter_context(worker_threads(dask_local))
        cluster = stack.enter_context(LocalCluster(n_workers=dask_local, threads_per_worker=1, processes=True,
                                                   dashboard_address=None, silence_logs=logging.ERROR))
        return stack.enter_context(Client(cluster))
    try:
        return stack.enter_context(Client(scheduler, timeout=SCHEDULER_TIMEOUT))
    except (OSError, ValueError, TypeError) as exc:   # no answer in time, refused, malformed address
        raise InputError(f"Dask scheduler {scheduler!r}: cannot connect ({exc})") from None


def _open_executor(stack: ExitStack, workers: int, scheduler: str | None, dask_local: int | None):
    if scheduler is not None or dask_local is not None:
        return _dask_client(stack, scheduler, dask_local).get_executor(pure=False)
    stack.enter_context(worker_threads(workers))
    return stack.enter_context(_local_pool(workers))


def _json_form(params: Mapping):
    """Cell parameters as JSON reads them back (tuples become lists), for comparing a file with a cell."""
    return json.loads(json.dumps(dict(params), sort_keys=True))


def _read_cell(path: Path) -> tuple[dict, dict[str, np.ndarray], int]:
    """(params, arrays, version) of one cell file; InputError naming the file when it is not a readable cell."""
    arrays = load_npz(path)
    if PARAMS_KEY not in arrays:
        raise InputError(f"{path}: not a sweep cell (it has no '{PARAMS_KEY}' array)")
    try:
        params = json.loads(as_scalar(PARAMS_KEY, arrays.pop(PARAMS_KEY), kind="str"))
    except (InputError, ValueError):
        params = None
    if not isinstance(params, dict):
        raise InputError(f"{path}: not a sweep cell (its '{PARAMS_KEY}' is not a JSON object)")
    version = as_scalar(VERSION_KEY, arrays.pop(VERSION_KEY), kind="int") if VERSION_KEY in arrays else 1
    return params, arrays, version


def _other_version(path: Path, stored: int, version: int) -> str:
    return (f"{path}: computed by version {stored} of this cell's code, and this ntpref computes version "
            f"{version}")


def _finished(path: Path, params: Mapping, *, warn: bool, version: int = 1,
              expect: Callable[[dict], Mapping[str, CellArray]] | None = None) -> dict[str, np.ndarray] | None:
    """The arrays of ``path`` when it holds the result of the cell ``params`` computed by ``version`` (and, with
    ``expect``, the arrays the cell function returns: :func:`cell_fault`), else None; with ``warn``, a file
    that exists but does not is reported with a warning (the sweep recomputes it)."""
    if not os.path.lexists(path):
        return None
    if os.path.islink(path):   # written through, it would replace the file of the cell it points at
        if warn:
            warnings.warn(f"recomputing {path}: a symbolic link, not a cell file (it is replaced by one)",
                          stacklevel=3)
        return None
    try:
        stored, arrays, stored_version = _read_cell(path)
    except InputError as exc:
        if warn:
            warnings.warn(f"recomputing a cell whose file does not load: {exc}", stacklevel=3)
        return None
    if stored != _json_form(params):
        if warn:
            warnings.warn(f"recomputing {path}: it holds the cell {stored}, not {_json_form(params)}", stacklevel=3)
        return None
    if stored_version != version:
        if warn:
            warnings.warn(f"recomputing {_other_version(path, stored_version, version)}", stacklevel=3)
        return None
    fault = None if expect is None else cell_fault(arrays, expect(dict(params)))
    if fault is not None:
        if warn:
            warnings.warn(f"recomputing {path}: {fault}", stacklevel=3)
        return None
    return arrays


def _write_cell(path: Path, params: Mapping, result: Mapping, version: int = 1) -> None:
    """Write one cell's result with its parameters as ``cell_params`` and ``version`` as ``cell_version``
    (atomically)."""
    for key in (PARAMS_KEY, VERSION_KEY):
        if key in result:
            raise NtprefError(f"sweep: cell result may not contain '{key}'")
    if os.path.islink(path):
        os.unlink(path)
    save_npz(path, {**result, PARAMS_KEY: np.array(json.dumps(dict(params), sort_keys=True)),
                    VERSION_KEY: np.array(version, dtype=np.int64)})


def copy_equivalent(cells: list[dict], outdir: str | os.PathLike,
                    sources: Callable[[dict], Iterable[tuple[Path, dict]]], version: int = 1,
                    expect: Callable[[dict], Mapping[str, CellArray]] | None = None) -> int:
    """Fill the cells of the grid that are not finished in ``outdir`` from finished cells of another grid that
    compute the same result; returns how many were copied.

    sources(cell) yields (directory, params) of the cells that compute exactly what ``cell`` does (e.g.
    another experiment's cell with other parameter names); the first whose file there loads and holds those
    parameters is copied, its arrays unchanged, under ``cell``'s own parameters (replacing a file in ``outdir``
    that is not a finished cell) and ``version``, the version of ``outdir``'s cells (an equivalent cell is
    the same computation, so a change of one target's cells changes the other's) and, with ``expect``, holding
    what ``cell``'s function returns. Files that do not are passed over silently: they belong to the other
    grid, whose own runs report them."""
    outdir, copied = Path(outdir), 0
    for cell in cells:
        target = outdir / f"{cell_key(cell)}.npz"
        if _finished(target, cell, warn=False, version=version, expect=expect) is not None:
            continue
        for directory, params in sources(cell):
            arrays = _finished(Path(directory) / f"{cell_key(params)}.npz", params, warn=False, version=version)
            if arrays is not None and (expect is None or cell_fault(arrays, expect(dict(cell))) is None):
                outdir.mkdir(parents=True, exist_ok=True)
                _write_cell(target, cell, arrays, version)
                copied += 1
                break
    return copied


def run_sweep(fn: Callable[..., Mapping], cells: list[dict], outdir: str | os.PathLike, *, workers: int = 1,
              scheduler: str | None = None, dask_local: int | None = None, executor=None,
              progress: Callable[[str, int, int], None] | None = None, label: str = "cells",
              version: int = 1, expect: Callable[[dict], Mapping[str, CellArray]] | None = None,
              prepare: Callable[[], None] | None = None) -> SweepSummary:
    """Compute every cell whose result file is missing in ``outdir``; write each result atomically.

    fn: a module-level (picklable) function; ``fn(**cell)`` returns a dict of arrays/scalars.
    workers: local processes (1 = run in this process, no pool). scheduler / dask_local (N >= 1 workers) /
    executor: see module docstring. progress(label, done, total) is called after each finished cell (done
    counts skipped cells). version: the cells' ``cell_version`` (files of another version are recomputed).
    expect(params): the arrays ``fn(**params)`` returns (files holding others are recomputed).
    prepare(): called once before the first cell when some are to be computed in this process or its pool
    of ``workers`` processes (not with a scheduler, a Dask cluster or an executor), e.g. to compile their
    kernels (:func:`ntpref.precompile.warm`).
    A failing cell re-raises after the cells already finished are saved.
    """
    for name, value in (("workers", workers), ("dask_local", dask_local)):
        if value is not None and value < 1:
            raise InputError(f"sweep: {name} must be at least 1, got {value}")
    outdir = Path(outdir)
    try:
        outdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, no permission, a name too long
        raise InputError(f"{outdir}: cannot create the results directory ({exc.strerror or exc})") from None
    keys = [cell_key(c) for c in cells]
    if len(set(keys)) != len(keys):
        raise InputError("sweep: two cells have the same parameters")
    found = {k: _finished(outdir / f"{k}.npz", c, warn=True, version=version, expect=expect)
             for k, c in zip(keys, cells)}
    odd = _odd_cells({k: (c, a) for (k, a), c in zip(found.items(), cells) if a is not None})
    for key, why in odd.items():
        warnings.warn(f"recomputing {outdir / f'{key}.npz'}: {why}", stacklevel=2)
    todo = [(k, c) for k, c in zip(keys, cells) if found[k] is None or k in odd]
    total, done, start = len(cells), len(cells) - len(todo), time.perf_counter()
    report = progress or (lambda *a: None)
    report(label, done, total)

    def save(key, params, result):
        nonlocal done
        _write_cell(outdir / f"{key}.npz", params, result, version)
        done += 1
        report(label, done, total)

    local = executor is None and scheduler is None and dask_local is None
    if todo and local and prepare is not None:
        prepare()
    if workers <= 1 and local:
        for key, params in todo:
            save(key, params, _call(fn, params))
    elif todo:
        try:
            with ExitStack() as stack:
                ex = executor if executor is not None else _open_executor(stack, workers, scheduler, dask_local)
                _run_pooled(ex, fn, todo, save)
        except Exception as exc:   # noqa: BLE001 - sorted out by _worker_died
            if not _worker_died(exc):
                raise
            raise InputError(f"{label}: a worker process died ({type(exc).__name__}: killed, or out of memory?); "
                             f"the {done} finished cells of {total} are kept in {outdir}, and running the same "
                             "command again resumes") from None
    return SweepSummary(total, len(todo), total - len(todo), time.perf_counter() - start)


def _run_pooled(ex, fn: Callable[..., Mapping], todo: list[tuple[str, dict]],
                save: Callable[[str, dict, Mapping], None]) -> None:
    """Submit every (key, params) of ``todo`` to the executor ``ex`` and ``save`` each result as it arrives.

    When a worker dies (:func:`_worker_died`: a future says so, or ``submit`` itself when the pool broke before
    every cell was handed out), the results already arrived are saved, then that error is raised; a cell's own
    error is raised at once."""
    pending, died = {}, None
    for key, params in todo:
        try:
            pending[ex.submit(_call, fn, params)] = (key, params)
        except Exception as exc:   # noqa: BLE001 - sorted out by _worker_died
            if not _worker_died(exc):
                raise
            died = exc
            break
    while pending:
        finished = ([fut for fut in pending if fut.done()] if died is not None
                    else wait(pending, return_when=FIRST_COMPLETED)[0])
        for fut in finished:
            key, params = pending.pop(fut)
            try:
                result = fut.result()
            except Exception as exc:   # noqa: BLE001 - sorted out by _worker_died
                if not _worker_died(exc):
                    raise
                died = died or exc
                continue
            save(key, params, result)
        if died is not None:
            break
    if died is not None:
        raise died


def _worker_died(exc: BaseException) -> bool:
    """Whether ``exc`` says a worker process died (a local pool's BrokenProcessPool, Dask's KilledWorker)
    rather than that a cell raised."""
    from concurrent.futures.process import BrokenProcessPool

    return isinstance(exc, BrokenProcessPool) or type(exc).__name__ == "KilledWorker"


def _layout(arrays: Mapping[str, np.ndarray]) -> tuple:
    """The layout of a cell's arrays: (name, dtype, ndim) sorted by name, strings of any length alike."""
    return tuple(sorted((name, a.dtype.kind if a.dtype.kind in "US" else a.dtype.str, a.ndim)
                        for name, a in arrays.items()))


def _odd_cells(finished: Mapping[str, tuple[dict, Mapping[str, np.ndarray]]]) -> dict[str, str]:
    """{key: why} for the finished cells whose arrays are not those of their kind: cells with the same
    parameter names hold arrays of the same names, dtypes and numbers of dimensions (a cell function
    returns one layout), so a cell whose layout differs from the one most cells of its kind share (an
    array missing, added, of another dtype or rank: a file damaged or written by other code) is not a
    finished cell. Without such a majority (fewer than two cells, a tie) nothing can be said."""
    from collections import Counter

    kinds: dict[tuple, list[str]] = {}
    for key, (params, _) in finished.items():
        kinds.setdefault(tuple(sorted(params)), []).append(key)
    odd = {}
    for keys in kinds.values():
        layouts = {k: _layout(finished[k][1]) for k in keys}
        common, count = Counter(layouts.values()).most_common(1)[0]
        if count * 2 <= len(keys):
            continue
        want = {name: rest for name, *rest in common}
        for key, layout in layouts.items():
            if layout == common:
                continue
            have = {name: rest for name, *rest in layout}
            missing = [n for n in want if n not in have]
            other = [n for n in have if n in want and have[n] != want[n]]
            extra = [n for n in have if n not in want]
            parts = ([f"missing array(s) {', '.join(missing)}"] if missing else []) + \
                    ([f"array(s) {', '.join(other)} of another dtype or rank"] if other else []) + \
                    ([f"unexpected array(s) {', '.join(extra)}"] if extra else [])
            odd[key] = "; ".join(parts) + " (the other cells of its kind differ)"
    return odd


def load_results(outdir: str | os.PathLike, cells: list[dict] | None = None, version: int | None = None,
                 siblings: set[str] = frozenset(), expect: Callable[[dict], Mapping[str, CellArray]] | None = None
                 ) -> list[tuple[dict, dict[str, np.ndarray]]]:
    """The finished cells in ``outdir`` as (params, arrays), sorted by cell key: every ``.npz`` file, or
    with ``cells`` those of that grid (other files are ignored, with a warning unless their key is among
    ``siblings``: cells of the same sweep for other seeds).

    A file that is not a finished cell (does not load, no ``cell_params``, another cell's parameters, with
    ``version`` another ``cell_version``, with ``expect`` arrays other than the cell function returns:
    :func:`cell_fault`) is an InputError naming it and saying how to fix it.
    """
    outdir = Path(outdir)
    paths = sorted(outdir.glob("*.npz"))
    wanted = None if cells is None else {cell_key(c): _json_form(c) for c in cells}
    if wanted is not None:
        foreign = [p.name for p in paths if p.stem not in wanted and p.stem not in siblings]
        if foreign:
            warnings.warn(f"{outdir}: ignoring {len(foreign)} file(s) that are not cells of this sweep "
                          f"('{foreign[0]}'{', ...' if len(foreign) > 1 else ''})", stacklevel=2)
        paths = [p for p in paths if p.stem in wanted]
    out = []
    for path in paths:
        try:
            params, arrays, stored_version = _read_cell(path)
            if wanted is not None and params != wanted[path.stem]:
                raise InputError(f"{path}: holds the cell {params}, not {wanted[path.stem]}")
            if version is not None and stored_version != version:
                raise InputError(_other_version(path, stored_version, version))
            fault = None if expect is None else cell_fault(arrays, expect(params))
            if fault is not None:
                raise InputError(f"{path}: {fault}")
        except InputError as exc:
            raise InputError(f"{exc}; it is not a finished cell: delete it, or run the sweep again to "
                             "recompute it") from None
        out.append((params, arrays))
    odd = _odd_cells({cell_key(p): (p, a) for p, a in out})
    if odd:
        key, why = next(iter(odd.items()))
        raise InputError(f"{outdir / f'{key}.npz'}: {why}; it is not a finished cell: delete it, or run the sweep "
                         "again to recompute it")
    return out
