"""One model's public loss-and-gradient step, called CALLS times after one warm-up call, one thread:
``python -m benchmarks.step MODEL CALLS`` (MODEL twostage | shallow | indrnn). For instruction counts
(docs/performance.md): a profiler's count of ``CALLS = 20`` minus that of ``CALLS = 0``, over 20, is one
step's. The timed calls run inside one ``functools.reduce``, so Callgrind can count them alone:
``valgrind --tool=callgrind --toggle-collect=functools_reduce python -m benchmarks.step twostage 200`` counts
exactly the 200 calls (its "Collected" total over 200 is one step's). Sizes: two-stage K = 20, N = 200 (lengths 2..6); shallow n = 512, d = 8, T = 16, m = 64; IndRNN
n = 512, d = 17, T = 17, m = 64; random inputs from seed 0.
"""
from __future__ import annotations

import functools
import sys

import numba
import numpy as np

from ntpref import shallow, twostage


def step(model: str):
    """The step of ``model`` on its inputs (module docstring), ready to call."""
    rng = np.random.default_rng(0)
    if model == "twostage":
        prepared = twostage.prepare(twostage.random_realizable(K=20, N=200, min_len=2, max_len=6, seed=0).dataset)
        W_ov, W_kq = rng.standard_normal((2, 20, 20))
        return lambda: twostage.loss_and_grad(prepared, W_ov, W_kq)
    n, d, T, m = (512, 8, 16, 64) if model == "shallow" else (512, 17, 17, 64)
    module = shallow if model == "shallow" else shallow.indrnn
    params = shallow.iid_init(m, d, 0) if model == "shallow" else shallow.indrnn.paired_init(m, d, 0)
    data = module.prepare(shallow.scale_tokens(rng.standard_normal((n, T, d))), rng.standard_normal(n))
    return lambda: module.loss_and_grad(data, *params)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("twostage", "shallow", "indrnn") or not argv[1].isdigit():
        print("usage: python -m benchmarks.step twostage|shallow|indrnn CALLS", file=sys.stderr)
        return 2
    numba.set_num_threads(1)
    run = step(argv[0])
    run()
    functools.reduce(lambda _, __: run(), range(int(argv[1])), None)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
