"""Correct programs that round in other ways, for the mutation and calibration benchmarks: the exact
backend's plain loops (ntpref/exact) run in a rounded arithmetic (``ntpref.exact.arith.rounded``), every
input and every operation rounded to a float format's significand, every sum and dot product formed left
to right in one of three ways:

  float64, compensated sums          53 bits, Kahan's summation of the rounded products
  float32, fused multiply-adds       24 bits, acc ← round(acc + a·b) per term of every dot product
  float32, separate multiply and add 24 bits, acc ← round(acc + round(a·b))

They round unlike the oracle's backends and unlike the PyTorch and JAX adapters: mpmath's elementary
functions, no vectorised or blocked sums, a dot product fused or not by choice rather than by
what a compiler picks on this CPU. The exponent is unbounded (nothing under- or overflows), and the
two-stage max-margin solutions come from the exact solver (a QP solve, not a sum); the two-stage runs
step along the normalized gradient formed in the rounded arithmetic.
"""
from __future__ import annotations

from ntpref import exact
from ntpref.exact.arith import rounded
from ntpref.models import NAMES

from .sweeps import Member

#: (member name, precision judged in, significand bits, sums) of the rounded members.
ARITHMETICS = (("exact backend's loops, float64, compensated sums", "float64", 53, "compensated"),
               ("exact backend's loops, float32, fused multiply-adds", "float32", 24, "fused"),
               ("exact backend's loops, float32, separate multiply and add", "float32", 24, "separate"))


def adapter(bits: int, sums: str) -> dict:
    """evaluate / train: the exact backend on the input in ``bits``-bit arithmetic with ``sums``."""
    def run(compute):
        def call(model: str, inputs: dict) -> dict:
            with rounded(bits, sums):
                return compute({"model": model, **inputs})
        return call
    return {"evaluate": run(exact.evaluate), "train": run(exact.train)}


def members() -> list[Member]:
    """The three members of :data:`ARITHMETICS`, on every model."""
    return [Member(name, precision, adapter(bits, sums), NAMES) for name, precision, bits, sums in ARITHMETICS]
