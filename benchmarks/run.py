"""The benchmark command: ``python -m benchmarks.run [options]`` from the repository root (options:
``--help``; the package's docstring). Prints the report (machine, paper-size table, scaling slopes, whole
runs) and writes ``--json`` and ``--figure`` atomically; the thread counts and output paths are checked
before anything is timed, and a bad one is one line on stderr with exit status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict

from ntpref import bench
from ntpref.models import NAMES
from ntpref.errors import InputError, NtprefError
from ntpref.npzio import atomic_write, check_output
from ntpref.numba_target import configure_process
from ntpref.reproduce.plots import pyplot

from . import frameworks, report, timing
from .cases import scaling_cases
from .whole_runs import figure2_seconds, startup_seconds, thread_determinism

PROG = "python -m benchmarks.run"


def benchmark(implementations: Sequence[timing.Implementation], *, quick: bool = False,
              threads: Sequence[int] | None = None, repeats: int = 7, scaling: bool = True,
              models: Sequence[str] = NAMES, figure_path: str | None = None, json_path: str | None = None,
              whole_runs: bool = True, quiet: bool = False) -> str:
    """Run the benchmark and return the report text; ``threads`` None: 1 and 2 threads (1 alone on one
    core); ``quick``: 3 repeats at most and three points per scaling series."""
    threads = bench.thread_counts(threads)
    for path in (json_path, figure_path):
        if path:
            check_output(path)
    if figure_path:
        if not scaling:
            raise InputError("--figure plots the scaling series, which --no-scaling leaves out")
        pyplot()  # without matplotlib, fail now rather than after the run
    cases = bench.paper_cases(models)
    if scaling:
        cases += [c for c in scaling_cases(3 if quick else 4) if c.model in models]
    log = None if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    rows = timing.run(implementations, cases, threads, repeats=min(repeats, 3) if quick else repeats, progress=log)
    extras = {}
    if whole_runs and "twostage" in models:
        for k in threads:
            extras[f"Figure-2 run (T0 = 1000, T = 10000, stable), ntpref numba, {k} thread(s)"] = \
                f"{figure2_seconds(k):.3f} s"
    if whole_runs:
        extras["import + first call of each model, warm cache"] = f"{startup_seconds():.2f} s"
    if len(threads) > 1:
        same = thread_determinism(bench.paper_cases(models), threads)
        extras[f"ntpref numba bitwise identical for threads {tuple(threads)}"] = \
            "yes, every paper case" if all(same.values()) else "NO: " + ", ".join(k for k, v in same.items() if not v)
    if json_path:
        document = dict(machine=report.machine(), rows=[asdict(r) for r in rows], extras=extras)
        atomic_write(json_path, lambda fh: fh.write(json.dumps(document, indent=1).encode()))
    if figure_path:
        report.figure(rows, figure_path)
    return report.report(rows, extras)


def parser() -> argparse.ArgumentParser:
    """The command's options: those of ``ntpref bench`` and the harness's own."""
    p = argparse.ArgumentParser(prog=PROG, description="Benchmark ntpref against PyTorch and JAX (one "
                                "full-batch loss-and-gradient step per model; docs/performance.md).")
    bench.add_arguments(p)
    p.add_argument("--quick", action="store_true", help="3 repeats, shorter scaling series")
    p.add_argument("--no-scaling", action="store_true", help="paper sizes only")
    p.add_argument("--no-numpy", action="store_true", help="skip the NumPy backend")
    p.add_argument("--no-torch", action="store_true", help="skip PyTorch")
    p.add_argument("--no-jax", action="store_true", help="skip JAX")
    p.add_argument("--no-whole-runs", action="store_true", help="skip the Figure-2 run and start-up timings")
    p.add_argument("--figure", metavar="PATH.png", help="log-log figure of the scaling series")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command with ``argv`` (default: the process's arguments); the exit status."""
    args = parser().parse_args(argv)
    configure_process()   # the kernels as the ntpref command runs them (full vector width)
    impls = timing.ntpref_implementations(numpy=not args.no_numpy)
    if not args.no_torch:
        impls += frameworks.torch_implementations()
    if not args.no_jax:
        impls += frameworks.jax_implementations()
    try:
        text = benchmark(impls, quick=args.quick, threads=args.threads, repeats=args.repeats,
                         scaling=not args.no_scaling, models=args.models, figure_path=args.figure,
                         json_path=args.json, whole_runs=not args.no_whole_runs, quiet=args.quiet)
    except NtprefError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
