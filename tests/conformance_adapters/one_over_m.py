"""A broken implementation: the output scaled by 1/m instead of 1/sqrt(m) (shallow and indrnn eval).
f_broken(c, θ) = m^{-1} Σ c_i h_i is the oracle's f at c/√m, so the oracle evaluated there gives its
loss and, by the chain rule, its gradients (grad_c divided by √m). NumPy only."""
import math

import numpy as np

from ntpref.oracle import contract


def evaluate(model, inputs):
    if model == "twostage":
        raise NotImplementedError("no 1/sqrt(m) in the two-stage model")
    root_m = math.sqrt(len(inputs["c"]))
    out = contract.evaluate({"model": model, **inputs, "c": np.asarray(inputs["c"]) / root_m})
    out["grad_c"] = out["grad_c"] / root_m
    return out
