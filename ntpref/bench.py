"""``ntpref bench``: time one full-batch loss-and-gradient step (the public ``loss_and_grad`` on data prepared
once, as a training loop calls it) of each model at the papers' sizes (each model's specification's ``bench``;
shallow also m = 256 and T = 64) with the Numba backend. The source repository's benchmark harness (``python -m
benchmarks.run``: PyTorch and JAX, scaling series, figure) is built on these cases, steps and timing loop.
"""
from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numba
import numpy as np

from .checks import count_argument
from .errors import InputError
from .models import NAMES, SPECS, check_models, spec_named
from .npzio import atomic_write, check_output

SHORT_STEP = 0.02   # seconds; see :func:`time_steps`


@dataclass
class BenchCase:
    """A model at one size (its specification's ``bench.size`` with changes), its label (``shallow n=4000
    d=8 T=16 m=64``) and the size a scaling series varies (None for a paper case)."""

    model: str
    size: dict
    label: str
    series: str | None = None


def case(model: str, series: str | None = None, **sizes) -> BenchCase:
    """``model`` at its paper size with ``sizes`` changed, e.g. ``case("shallow", m=256)``."""
    bench = spec_named(model).bench
    size = {**bench.size, **sizes}
    return BenchCase(model, size, f"{model} " + " ".join(f"{k}={size[k]}" for k in bench.label_keys), series)


def paper_cases(models: Sequence[str] = NAMES) -> list[BenchCase]:
    """The papers' sizes of ``models`` and the variants each specification times beside them (twostage K = 20,
    N = 200; shallow n = 4000, d = 8, T = 16, m = 64, also m = 256 and T = 64; indrnn d = 17, T = 97)."""
    return [case(name, **v) for name in check_models(models) for v in ({}, *SPECS[name].bench.variants)]


def make_inputs(case: BenchCase, seed: int = 0) -> dict:
    """Random inputs of the case (its specification's ``bench.inputs``)."""
    return spec_named(case.model).bench.inputs(case.size, seed)


def ntpref_step(case: BenchCase, inputs: dict, backend: str = "numba") -> Callable[[], object]:
    """A zero-argument call of ntpref's ``loss_and_grad`` on the case's inputs (data prepared here, once)."""
    return spec_named(case.model).bench.step(inputs, backend)


def thread_counts(requested: Sequence[int] | None) -> list[int]:
    """``requested``, or 1 and 2 (1 alone on one core) when None; InputError for a count outside 1 to
    NUMBA_NUM_THREADS, the most threads Numba runs here (it would run fewer than the report claims)."""
    limit = numba.config.NUMBA_NUM_THREADS
    threads = [k for k in (1, 2) if k <= limit] if requested is None else list(requested)
    for k in threads:
        if not 1 <= k <= limit:
            raise InputError(f"--threads {k}: expected 1 to {limit}, the threads Numba runs on this machine "
                             f"({os.cpu_count()} cores; NUMBA_NUM_THREADS sets another limit)")
    return threads


def time_steps(steps: Sequence[Callable], repeats: int, warmup: int = 2, max_seconds: float = 60.0) -> list:
    """Seconds of ``repeats`` timed calls of each step (a list per step) after ``warmup`` untimed rounds, the
    steps interleaved (one call each per round) so that a changing load affects them alike; a step's first timed
    call, and each after one shorter than SHORT_STEP, follows an untimed call (as in a training loop, where a
    step follows itself). The rounds stop early (after 3) once they have taken max_seconds."""
    for step in [s for _ in range(warmup) for s in steps]:
        step()
    times: list[list[float]] = [[] for _ in steps]
    start = time.perf_counter()
    for r in range(repeats):
        for step, t in zip(steps, times):
            if not t or t[-1] < SHORT_STEP:
                step()          # a short step re-warms caches and predictors after the others
            t0 = time.perf_counter()
            step()
            t.append(time.perf_counter() - t0)
        if r >= 2 and time.perf_counter() - start > max_seconds:
            break
    return times


def format_seconds(s: float) -> str:
    """A step's time in ms below one second, else in s."""
    return f"{s * 1e3:.3f} ms" if s < 1.0 else f"{s:.3f} s"


def add_arguments(p) -> None:
    """The options of ``ntpref bench``, which the harness shares."""
    p.add_argument("--threads", type=count_argument, nargs="+",
                   help="thread counts, at most the number of cores (default 1 2; 1 on one core). On a busy "
                        "machine more threads than free cores run slower, not faster: Numba's threads spin")
    p.add_argument("--repeats", type=count_argument, default=7, help="timed runs per measurement (median; default 7)")
    p.add_argument("--models", nargs="+", default=list(NAMES), choices=NAMES)
    p.add_argument("--json", metavar="PATH.json", help="all timings as JSON")


def _command(args) -> int:
    """``ntpref bench``: thread counts and the JSON path are checked before anything is timed."""
    from tabulate import tabulate

    threads, rows = thread_counts(args.threads), []
    if args.json:
        check_output(args.json)
    for c in paper_cases(args.models):
        step = ntpref_step(c, make_inputs(c))
        for k in threads:
            numba.set_num_threads(k)
            t = time_steps([step], args.repeats)[0]
            rows.append(dict(case=c.label, threads=k, seconds=float(np.median(t)), best=float(np.min(t))))
    print(tabulate([[r["case"], r["threads"], format_seconds(r["seconds"]), format_seconds(r["best"])] for r in rows],
                   headers=["case (ntpref numba)", "threads", "median step", "min step"], tablefmt="github"))
    if args.json:
        document = dict(backend="numba", repeats=args.repeats, rows=rows)
        atomic_write(args.json, lambda fh: fh.write(json.dumps(document, indent=1).encode()))
    return 0


def register(subparsers) -> None:
    """Add ``ntpref bench``."""
    text = "time one loss-and-gradient step of each model at the papers' sizes (Numba backend)"
    p = subparsers.add_parser("bench", help=text, description=text + "; the benchmark against PyTorch and JAX, "
                              "with scaling series, is python -m benchmarks.run in the source repository.")
    add_arguments(p)
    p.set_defaults(func=_command)
