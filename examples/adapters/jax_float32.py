"""Conformance adapter: the JAX restatement of jax_float64.py in float32 (every input array rounded to
float32, so XLA computes in float32; scalars such as eta stay Python floats). Judge it against float32
arithmetic:

    ntpref conformance examples/adapters/jax_float32.py --precision float32
"""
import numpy as np

from . import jax_float64 as _restatement


def _float32(inputs: dict) -> dict:
    """``inputs`` with every floating-point array (ndim ≥ 1) as float32."""
    return {k: np.asarray(v, dtype=np.float32) if np.ndim(v) and np.asarray(v).dtype.kind == "f" else v
            for k, v in inputs.items()}


def evaluate(model: str, inputs: dict) -> dict:
    return _restatement.evaluate(model, _float32(inputs))


def train(model: str, inputs: dict) -> dict:
    return _restatement.train(model, _float32(inputs))
