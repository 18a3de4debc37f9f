"""The two-stage step against what one core can do: ``python -m benchmarks.limit [--ghz F]`` from the
repository root (docs/performance.md, "The two-stage step against one core").

Counts (:func:`counts`) of one loss-and-gradient step (the Numba backend's MODE_GRAD serial pass and its
reduction, one-hot E; ntpref/twostage/kernels.py), per sentence of length L with K logits and Lmax the padded
length, read off the kernels' loops:

    adds and subtractions   3LK + 3K + 5L + 3   (u, U, logits, margins twice, S, ℓ and m, a, φ·a, g_s, loss, G_ov, G_kq)
    multiplications         3LK + K + 4L + 1    (logits, g_z, a, φ·a, g_s, loss, c φ_l, G_ov, G_kq)
    divisions               L                   (φ = u / U)
    comparisons             L - 1 + K           (arg max of the scores, r_max)
    exponentials            Lmax + K + 2        (u over the padded row, p̃, e^{-|r_max|}, e^m)
    logarithms              1                   (log or log1p)

These are hand counts, read off the kernels' loops once, not derived from the code: nothing ties them to
what the kernels run (tests/test_benchmarks.py checks only that :func:`counts` sums these per-sentence
formulas), so a change to a loop of ntpref/twostage/kernels.py needs them read again. The measured
instructions of the step are the Callgrind command of docs/performance.md, not these counts. Beside them,
the bytes of the work slots a pass writes (``kernels.slots``: 7 N + 3 N K + 7 N Lmax float64 and N int64)
beside the compulsory traffic (the sentences, W_ov, W_kq in; G_ov, G_kq out).

Measured here (:func:`measure`, minimum over repeated runs, one thread): the time per lane of the kernels'
vectorized exponential (ntpref.vmath.exp in a loop over 4096 entries, as the kernels' exponential loops run),
of a scalar libm log, and the add/multiply throughput of a vectorized loop of two multiplies and two adds per
entry (no FMA: Numba does not contract without fastmath). The limit is the sum of the arithmetic at that
throughput, the exponentials and the logs: what one core does with this step's operations and no overhead.
"""
from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from numba import njit

from ntpref import bench, vmath

EXP_N = 4096   # entries of the measured loops: 32 KB in and 32 KB out, in L2 as the work slots of a step are


def counts(lengths: np.ndarray, K: int, Lmax: int) -> dict:
    """Operation counts and bytes of one step on sentences of ``lengths`` (module docstring)."""
    L = np.asarray(lengths, dtype=np.int64)
    N = L.size
    sL, sLK = int(L.sum()), int(L.sum()) * K
    c = dict(adds=3 * sLK + N * (3 * K + 3) + 5 * sL, muls=3 * sLK + N * (K + 1) + 4 * sL, divs=sL,
             compares=sL - N + N * K, exps=N * (Lmax + K + 2), logs=N)
    c["slot_bytes"] = 8 * (7 * N + 3 * N * K + 7 * N * Lmax + N)
    c["compulsory_bytes"] = 8 * (N * Lmax + 3 * N + 4 * K * K)
    return c


@njit(cache=True, error_model="numpy")
def _exp_loop(x, out):
    for j in range(x.shape[0]):
        out[j] = vmath.exp(x[j])


@njit(cache=True, error_model="numpy")
def _addmul_loop(x, out):
    for j in range(x.shape[0]):
        out[j] = (x[j] * 1.0000001 + 0.5) * 0.9999999 + 0.25


@njit(cache=True, error_model="numpy")
def _log_loop(x, out):
    for j in range(x.shape[0]):
        out[j] = math.log(x[j])


def best_seconds(f, *args, calls: int = 50, rounds: int = 200) -> float:
    """Least time of one call of f(*args) over ``rounds`` batches of ``calls`` calls."""
    f(*args)
    best = math.inf
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            f(*args)
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def measure() -> dict:
    """Seconds per lane of the vectorized exp and of a scalar log, and add/multiply operations per second of
    a vectorized loop (module docstring)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-20.0, 0.0, EXP_N)       # the kernels' exponents are ≤ 0
    out = np.empty_like(x)
    exp_s = best_seconds(_exp_loop, x, out) / EXP_N
    log_s = best_seconds(_log_loop, rng.uniform(1.0, 10.0, EXP_N), out) / EXP_N
    addmul = 4 * EXP_N / best_seconds(_addmul_loop, x, out)
    return dict(exp_seconds=exp_s, log_seconds=log_s, addmul_per_second=addmul)


def limit(c: dict, m: dict) -> dict:
    """Seconds of the step's arithmetic (adds, multiplies, divisions and comparisons at the measured add/multiply
    rate), exponentials and logs, and their sum."""
    arith = (c["adds"] + c["muls"] + c["divs"] + c["compares"]) / m["addmul_per_second"]
    exps, logs = c["exps"] * m["exp_seconds"], c["logs"] * m["log_seconds"]
    return dict(arithmetic=arith, exps=exps, logs=logs, total=arith + exps + logs)


def _cpu_ghz() -> float | None:
    """The clock /proc/cpuinfo states (nominal; a VM reports the host's), or None."""
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("cpu MHz"):
                    return float(line.split(":", 1)[1]) / 1000.0
    except (OSError, ValueError):
        pass
    return None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.limit", description=__doc__.split("\n\n")[0])
    p.add_argument("--ghz", type=float, default=None, help="clock for the cycle counts (default: /proc/cpuinfo)")
    args = p.parse_args(argv)
    import numba
    numba.set_num_threads(1)
    case = bench.paper_cases(["twostage"])[0]
    ds = bench.make_inputs(case)["ds"]
    c = counts(ds.lengths, ds.K, ds.tokens.shape[1])
    m = measure()
    lim = limit(c, m)
    ghz = args.ghz or _cpu_ghz()
    cyc = (lambda s: f" = {s * ghz * 1e9:,.0f} cycles") if ghz else (lambda s: "")
    print(f"{case.label}, lengths {ds.lengths.min()}..{ds.lengths.max()} (sum {int(ds.lengths.sum())})")
    for k, v in c.items():
        print(f"  {k:17s} {v:>10,}")
    print(f"measured: exp {m['exp_seconds'] * 1e9:.2f} ns per lane{cyc(m['exp_seconds'])}, "
          f"log {m['log_seconds'] * 1e9:.2f} ns{cyc(m['log_seconds'])}, "
          f"adds and multiplies {m['addmul_per_second'] / 1e9:.2f} G/s"
          + (f" = {m['addmul_per_second'] / (ghz * 1e9):.2f} per cycle" if ghz else "") + f" (clock {ghz} GHz)")
    for k, v in lim.items():
        print(f"  limit {k:11s} {v * 1e6:7.2f} us{cyc(v)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
