"""Measurements of the benchmark beyond one step: the whole Figure-2 run, the start-up time of a fresh
process, and bitwise determinism of the ntpref numba step across thread counts."""
from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence

import numba
import numpy as np

from ntpref import bench


def figure2_seconds(threads: int = 1, seed: int = 0) -> float:
    """Wall-clock seconds of the whole Figure-2 run (twostage.train with T0 = 1000, T = 10000, stable
    direction, K = 20, N = 200) after a short compiling run."""
    from ntpref.twostage import random_realizable, train
    numba.set_num_threads(threads)
    ds = random_realizable(K=20, N=200, seed=seed).dataset
    train(ds, T0=3, T=3)
    t0 = time.perf_counter()
    train(ds, T0=1000, T=10000)
    return time.perf_counter() - t0


def startup_seconds() -> float:
    """Seconds for `import ntpref` plus a first shallow, indrnn and twostage step in a fresh Python
    process (warm Numba cache; run once before to fill it)."""
    code = ("import time; t = time.perf_counter(); import numpy as np\n"
            "from ntpref import shallow, twostage\n"
            "X = np.full((4, 3, 2), 0.1); y = np.zeros(4)\n"
            "shallow.loss_and_grad(shallow.prepare(X, y), *shallow.iid_init(2, 2, 0))\n"
            "shallow.indrnn.loss_and_grad(shallow.indrnn.prepare(X, y), *shallow.indrnn.paired_init(2, 2, 0))\n"
            "ds = twostage.random_realizable(K=5, N=10, seed=0).dataset\n"
            "twostage.loss_and_grad(ds, np.eye(5), np.eye(5))\n"
            "print(time.perf_counter() - t)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)   # fill the cache
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def _bits(result) -> bytes:
    """All floats of a step's result (nested tuples of arrays / floats) as bytes."""
    if isinstance(result, (tuple, list)):
        return b"".join(_bits(r) for r in result)
    return np.ascontiguousarray(result, dtype=np.float64).tobytes()


def thread_determinism(cases: Sequence[bench.BenchCase], threads: Sequence[int] = (1, 2), seed: int = 0) -> dict:
    """{case label: True when the ntpref numba step gives bitwise the same loss and gradients for every
    thread count in ``threads``}."""
    out = {}
    for case in cases:
        step = bench.ntpref_step(case, bench.make_inputs(case, seed))
        results = []
        for k in threads:
            numba.set_num_threads(k)
            results.append(_bits(step()))
        out[case.label] = all(r == results[0] for r in results)
    return out
