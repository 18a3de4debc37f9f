"""Developer scripts: the PyTorch / JAX benchmark, run from the repository root as ``python -m
scripts.bench`` (it imports ``examples.adapters``). The reference-case generator and the command-line
fuzzer are test-support modules in tests/ (``python tests/make_reference_runs.py``, ``python
tests/fuzz_cli.py``), imported by the tests like their other helpers.
"""
