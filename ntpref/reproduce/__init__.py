"""``ntpref reproduce``: every experiment of both papers from one command each.

A *target* is a module in this package with

  DESCRIPTION: str                      one line for ``ntpref reproduce --list``
  SIZES: dict[str, dict]                {"quick": {...}, "full": {...}} keyword arguments of ``cells``
  cells(**size) -> list[dict]           the grid of independent cells (see :mod:`ntpref.sweep`)
  cell(**params) -> dict[str, array]    computes one cell (module level, so it can be shipped to workers)
  cell_arrays(**params)                 what ``cell(**params)`` returns: {name: :class:`ntpref.sweep.CellArray`}
      -> dict[str, CellArray]           (dtype, shape, range of values, whether NaN is one of them); a cell
                                        file holding anything else is recomputed on a run and refused by name
                                        by a summary, and one holding NaN or inf where the cell gives finite
                                        values is left out of the summary, which names it
  summarize(results, outdir) -> Summary builds the table and the PNG figures from the results directory
  CELL_VERSION: int                     optional (1 when absent): raised when a change of the code changes the
                                        cells' results, so cells of the old code are recomputed, never summarized
  equivalent_cell(params)               optional: (target, params) of another target's cell that computes
      -> tuple[str, dict] | None        exactly this cell's result, or None; finished ones are copied
                                        (:func:`ntpref.sweep.copy_equivalent`) instead of computed again
  PRECOMPILE: (tuple, tuple)            optional: the kernel groups of :mod:`ntpref.precompile` its cells use,
                                        (compiled here, compiled by a helper process), compiled side by side
                                        before the first cell when they are not in Numba's cache

``--seeds N`` runs the first N seeds of a size instead of its own number (fewer for a long run that must
fit a time budget, more for tighter intervals); the cells of the other seeds are unaffected, so runs with
different N share their finished cells. Its summary and figures go to ``OUT/TARGET/SIZE/seeds-N/``, so a
run of fewer (or more) seeds never replaces the summary of the size's own seeds.

Results go to ``OUT/TARGET/SIZE/cells/`` (one file per cell; a rerun resumes), the figures and
``summary.txt`` to ``OUT/TARGET/SIZE/`` (SIZE = quick | full). Summaries are built from the directory
alone (``--summarize-only`` rebuilds them).
"""
from __future__ import annotations

import importlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from ..checks import count_argument, did_you_mean
from ..errors import InputError
from ..npzio import atomic_write, check_output

#: target name -> module (ntpref.reproduce.<module>)
TARGETS = {
    "twostage": "figure2",            # two-stage Figure 2: six panels + L - L* rate
    "generalization": "generalization",  # unseen sentences: closure-determined vs non-comparable
    "width": "width",                 # teacher-student min training loss vs m
    "approx": "approx",               # approximation and linearisation errors vs m
    "approx-redraw": "approx_redraw",  # the same, a new data set for every (seed, m) as in the authors' script
    "length": "length",               # sequence length and sample size sweeps
    "length-kernel": "length_kernel",  # lambda_min of the NTK vs T and n; T sweep on a normalised teacher
    "rnn": "rnn",                     # transformer vs IndRNN on the autoregressive task
    "ntk": "ntk",                     # NTK-regime diagnostics: head movement, lambda_min, kernel drift
    "projsgd": "projsgd",             # ProjGD vs ProjSGD: min training loss vs m
    "joint": "joint",                 # joint training of W_ov, W_kq vs Algorithm 1 at equal gradient evaluations
    "optimizers": "optimizers",       # GD, normalized GD, Adam, AdamW in stage 2 and jointly: where each direction goes
    "init": "init",                   # initialisations: paired, unpaired, paired x1/2, x2: loss, movement, drift
}

#: The text table of a target, next to its figures.
SUMMARY = "summary.txt"
#: Seeds whose cells a run of other seeds recognises as its target's (:func:`_sibling_keys`).
MANY_SEEDS = 100


@dataclass
class Summary:
    """What a target's ``summarize`` returns: a text table, figure paths and headline numbers."""

    table: str
    figures: list[Path] = field(default_factory=list)
    numbers: dict[str, float] = field(default_factory=dict)


def target_module(name: str):
    """The module of target ``name``; InputError for an unknown target."""
    if name not in TARGETS:
        raise InputError(f"unknown reproduce target {name!r}{did_you_mean(name, TARGETS)}; "
                         f"known: {', '.join(TARGETS)}")
    return importlib.import_module(f"{__name__}.{TARGETS[name]}")


def with_seeds(config: dict, seeds: int | None) -> dict:
    """``config`` (keyword arguments of a target's ``cells``) with its first ``seeds`` seeds: a count of
    seeds stays a count (seeds 0..N−1), a tuple of seeds becomes 1..N. None: ``config`` unchanged."""
    if seeds is None:
        return config
    if "seeds" not in config:
        raise InputError("--seeds: this target has no seeds")
    return {**config, "seeds": seeds if isinstance(config["seeds"], int) else tuple(range(1, seeds + 1))}


def _precompiler(mod, progress):
    """What compiles target ``mod``'s kernels before its first cell (:func:`ntpref.precompile.warm` with the
    module's ``PRECOMPILE`` = (main groups, side groups)), or None when it names none."""
    if not hasattr(mod, "PRECOMPILE"):
        return None
    from ..precompile import warm

    return lambda: warm(*mod.PRECOMPILE, note=getattr(progress, "note", None))


def run_target(name: str, size: str = "quick", out: str | Path = "results", *, workers: int = 1,
               scheduler: str | None = None, dask_local: int | None = None, summarize_only: bool = False,
               seeds: int | None = None, progress=None) -> Summary:
    """Run (or resume) target ``name`` at ``size`` ("quick" | "full"), then summarize it; ``seeds``: run
    the first N seeds instead of the size's own (:func:`with_seeds`)."""
    from ..sweep import copy_equivalent, load_results, run_sweep

    mod = target_module(name)
    if size not in mod.SIZES:
        raise InputError(f"target {name!r} has no size {size!r}; sizes: {', '.join(mod.SIZES)}")
    outdir = Path(out) / name / size
    celldir = outdir / "cells"
    config = with_seeds(mod.SIZES[size], seeds)
    if config != mod.SIZES[size]:
        outdir = outdir / f"seeds-{seeds}"       # never replaces the summary of the size's own seeds
    # a summary that cannot be written (a FIFO of its name) is refused before the run; a results directory
    # that cannot be created is the sweep's to report
    if os.path.isdir(outdir):
        check_output(outdir / SUMMARY)
    cells = mod.cells(**config)
    version = getattr(mod, "CELL_VERSION", 1)

    def expect(params):
        return mod.cell_arrays(**params)

    if not summarize_only:
        if hasattr(mod, "equivalent_cell"):
            copied = copy_equivalent(cells, celldir, lambda cell: _equivalents(mod, cell, Path(out)), version,
                                     expect)
            if copied and hasattr(progress, "note"):
                progress.note(f"reproduce {name} ({size}): {copied} cells copied from another target's results "
                              "(the same computation)")
        run_sweep(mod.cell, cells, celldir, workers=workers, scheduler=scheduler,
                  dask_local=dask_local, progress=progress, label=f"reproduce {name} ({size})", version=version,
                  expect=expect, prepare=_precompiler(mod, progress))
    results, left_out = _finite_cells(load_results(celldir, cells, version, siblings=_sibling_keys(mod, size),
                                                   expect=expect), celldir, expect)
    if not results:
        raise InputError(f"{celldir}: no finished cells to summarize" + (f" ({left_out[0]})" if left_out else ""))
    summary = mod.summarize(results, outdir)
    summary.table = "\n".join([summary.table, *left_out])
    atomic_write(outdir / SUMMARY, lambda fh: fh.write((summary.table + "\n").encode()))
    return summary


def _finite_cells(results: list, celldir: Path, expect) -> tuple[list, list[str]]:
    """(the cells of ``results`` without NaN or inf where their target's cell gives finite values, one line
    naming each of the others): those are left out of the summary, and the line says so."""
    from ..sweep import cell_key, nonfinite_arrays

    kept, left_out = [], []
    for params, arrays in results:
        names = nonfinite_arrays(arrays, expect(params))
        if names:
            left_out.append(f"left out of this summary: {celldir / (cell_key(params) + '.npz')} holds NaN or inf in "
                            f"{', '.join(names)} (delete it to compute it again)")
        else:
            kept.append((params, arrays))
    return kept, left_out


def _sibling_keys(mod, size: str) -> set[str]:
    """The cell keys of ``size`` for up to :data:`MANY_SEEDS` seeds: cells another ``--seeds`` run of the same
    target leaves in its directory, which a run of other seeds ignores without a warning."""
    from ..sweep import cell_key

    if "seeds" not in mod.SIZES[size]:
        return set()
    return {cell_key(c) for c in mod.cells(**with_seeds(mod.SIZES[size], MANY_SEEDS))}


def _equivalents(mod, cell: dict, out: Path):
    """(cells directory, params) of the other target's cell that computes what ``cell`` of ``mod`` does, in
    the directory of each size of that target (the first finished one is copied)."""
    found = mod.equivalent_cell(cell)
    if found is None:
        return []
    name, params = found
    return [(out / name / size / "cells", params) for size in target_module(name).SIZES]


def _handler(args) -> int:
    from ..progress import Progress
    from .plots import pyplot

    if args.list or not args.targets:
        for name, module in TARGETS.items():
            print(f"{name:15s} {importlib.import_module(f'{__name__}.{module}').DESCRIPTION}")
        return 0
    names = list(TARGETS) if args.targets == ["all"] else args.targets
    for name in names:
        target_module(name)  # fail on a typo before running anything
    pyplot()                 # and without matplotlib before computing cells whose summary could not be drawn
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise InputError(f"--out {args.out}: not a directory (give the directory for the results)")
    for name in names:
        start = time.perf_counter()
        s = run_target(name, "full" if args.full else "quick", args.out, workers=args.workers,
                       scheduler=args.scheduler, dask_local=args.dask_local,
                       summarize_only=args.summarize_only, seeds=args.seeds,
                       progress=Progress(enabled=not args.quiet))
        print(f"== {name} ({time.perf_counter() - start:.1f} s)\n{s.table}")
        for f in s.figures:
            print(f"figure: {f}")
    return 0


def register(subparsers) -> None:
    """Add ``ntpref reproduce`` to the command line."""
    from ..sweep import SCHEDULER_TIMEOUT

    p = subparsers.add_parser("reproduce", help="reproduce the papers' experiments (figures and tables)",
                              description="ntpref reproduce: every experiment of both papers from one command each. "
                              "Cells go to OUT/TARGET/SIZE/cells/ (a rerun resumes), summary.txt and the figures to "
                              "OUT/TARGET/SIZE/ (docs/reproductions.md). Threads: each worker process gets cores / "
                              "workers Numba threads unless NUMBA_NUM_THREADS is set; on a busy machine fewer "
                              "threads than cores run faster (spinning threads on taken cores are slow).")
    p.add_argument("targets", nargs="*", metavar="TARGET", help=f"{' | '.join(TARGETS)} | all")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small default size (minutes on 2 cores)")
    size.add_argument("--full", action="store_true", help="the papers' size")
    p.add_argument("--out", default="results", help="results directory (default: results)")
    p.add_argument("--workers", type=count_argument, default=1, help="local worker processes (default 1)")
    dist = p.add_mutually_exclusive_group()
    dist.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                      help=f"run cells on a Dask distributed cluster (it must answer within {SCHEDULER_TIMEOUT} s)")
    dist.add_argument("--dask-local", type=count_argument, metavar="N", help="start a local Dask cluster of N workers")
    p.add_argument("--seeds", type=count_argument, metavar="N",
                   help="run (or summarize) the first N seeds instead of the size's own number")
    p.add_argument("--summarize-only", action="store_true", help="rebuild table and figures from finished cells")
    p.add_argument("--list", action="store_true", help="list the targets")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=_handler)
