"""Developer scripts: reference-run generation, the PyTorch / JAX benchmark, the command-line fuzzer.

A package, so that the tests import what they reuse (``from scripts import fuzz_cli``) from the
repository root. Run each from the repository root: ``python scripts/make_reference_runs.py``,
``python scripts/fuzz_cli.py``, ``python -m scripts.bench`` (it imports ``examples.adapters``).
"""
