"""The benchmark's cases beyond the papers' sizes (``ntpref.bench.paper_cases``), and flop counts.

Scaling series (:func:`scaling_cases`): one size doubled three times (an 8x range) from a base case:
  shallow n, m, T; indrnn n, T; twostage K, N. ``report.slopes`` fits log time = a + b log size.

Flop counts per step (:func:`flops`; a multiply, an add, an exp or a tanh each count 1):
  shallow   n m (4d² + 8Td + 8T + 3d)        (W_i q, scores, U-projections, softmax, a, M U, gradients)
  indrnn    n m T (4d + 10)                  (W_in x_t, recurrence, tanh, σ', BPTT, gradients)
  twostage  Σ_sentences (6 L K + 5 K + 11 L) (scores, softmaxes, logits, a, g_s, scattered gradients)
GFLOP/s = flops / median time.
"""
from __future__ import annotations

import numpy as np

from ntpref import bench


def scaling_cases(points: int = 4) -> list[bench.BenchCase]:
    """Scaling series: each listed size doubled ``points`` − 1 times from a base case."""
    doubling = [2 ** k for k in range(points)]
    return ([bench.case("shallow", "n", n=500 * f) for f in doubling]
            + [bench.case("shallow", "m", n=1000, m=32 * f) for f in doubling]
            + [bench.case("shallow", "T", n=1000, T=8 * f) for f in doubling]
            + [bench.case("indrnn", "n", n=500 * f, T=24) for f in doubling]
            + [bench.case("indrnn", "T", n=1000, T=12 * f) for f in doubling]
            + [bench.case("twostage", "K", K=10 * f) for f in doubling]
            + [bench.case("twostage", "N", N=200 * f) for f in doubling])


def flops(case: bench.BenchCase, inputs: dict) -> float:
    """Stated flop count of one loss-and-gradient step of ``case`` on ``inputs`` (module docstring)."""
    s = case.size
    if case.model == "shallow":
        n, d, T, m = s["n"], s["d"], s["T"], s["m"]
        return float(n * m * (4 * d * d + 8 * T * d + 8 * T + 3 * d))
    if case.model == "indrnn":
        n, d, T, m = s["n"], s["d"], s["T"], s["m"]
        return float(n * m * T * (4 * d + 10))
    L = inputs["ds"].lengths.astype(np.float64)
    K = s["K"]
    return float(np.sum(6 * L * K + 5 * K + 11 * L))
