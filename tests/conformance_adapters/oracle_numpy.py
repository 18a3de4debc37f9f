"""Conformance adapter: the oracle's own NumPy backend (another float64 implementation of the same math)."""
from ntpref.oracle import contract


def evaluate(model, inputs):
    return contract.evaluate({"model": model, **inputs}, backend="numpy")


def train(model, inputs):
    return contract.train({"model": model, **inputs}, backend="numpy")
