"""Conformance adapters for PyTorch and JAX (docs/conformance.md, "Shipped adapters").

Each adapter is a module of this package, checked by path (``ntpref conformance
examples/adapters/torch_float64.py``, which imports a file inside a package as that package's module)
or imported from the repository root (``from examples.adapters import torch_restatement``). Importing
this package imports no framework; each module imports its own (torch or jax).
"""
