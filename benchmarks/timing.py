"""Implementations and the timing run of the benchmark.

An *implementation* turns a case's inputs (``ntpref.bench.make_inputs``) into a zero-argument ``step()``
that computes the loss and every gradient once. :func:`run` times every implementation on every case for
each thread count with ``ntpref.bench.time_steps`` (median and minimum of ``repeats`` runs after
``warmup`` calls, wall clock, same process, implementations interleaved) and returns :class:`Timing` rows.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numba
import numpy as np

from ntpref import bench

from .cases import flops

BASELINE = "ntpref numba"


@dataclass
class Implementation:
    """``setup(case, inputs) -> step`` (or None when the implementation does not cover the case);
    ``set_threads(k)`` sets its thread count (None: it cannot, the row says so)."""

    name: str
    setup: Callable
    set_threads: Callable | None = None


@dataclass
class Timing:
    """One timed implementation on one case at one thread count (0: the implementation's default)."""

    case: str
    model: str
    series: str | None
    size: dict
    implementation: str
    threads: int
    seconds: float        # median wall-clock time of one step
    best: float           # fastest of the timed steps
    flops: float


def ntpref_implementations(numpy: bool = True) -> list[Implementation]:
    """"ntpref numba" (threads via numba.set_num_threads) and, unless ``numpy=False``, "ntpref numpy"
    (NumPy's own threading, usually single-threaded elementwise work)."""
    impls = [Implementation(BASELINE, partial(bench.ntpref_step, backend="numba"), numba.set_num_threads)]
    if numpy:
        impls.append(Implementation("ntpref numpy", partial(bench.ntpref_step, backend="numpy"), None))
    return impls


def run(implementations: Sequence[Implementation], cases: Sequence[bench.BenchCase], threads: Sequence[int] = (1, 2),
        repeats: int = 7, warmup: int = 2, seed: int = 0, max_seconds: float = 60.0,
        progress: Callable[[str], None] | None = None) -> list[Timing]:
    """Time every implementation on every case for every thread count, the implementations of one case and
    thread count interleaved (``ntpref.bench.time_steps``), so that a changing machine load affects all of
    them alike and the ratios stay meaningful. An implementation that cannot set its thread count is timed
    with the first thread count only and reported with threads = 0 ("default")."""
    rows = []
    for case in cases:
        inputs = bench.make_inputs(case, seed)
        fl = flops(case, inputs)
        steps = [(impl, impl.setup(case, inputs)) for impl in implementations]
        steps = [(impl, step) for impl, step in steps if step is not None]
        for ki, k in enumerate(threads):
            active = [(impl, step) for impl, step in steps if impl.set_threads is not None or ki == 0]
            for impl, _ in active:
                if impl.set_threads is not None:
                    impl.set_threads(k)
            if progress:
                progress(f"{case.label}, {k} thread(s): " + ", ".join(impl.name for impl, _ in active))
            times = bench.time_steps([step for _, step in active], repeats, warmup, max_seconds)
            for (impl, _), t in zip(active, times):
                rows.append(Timing(case.label, case.model, case.series, dict(case.size), impl.name,
                                   k if impl.set_threads is not None else 0, float(np.median(t)),
                                   float(np.min(t)), fl))
    return rows
