"""Developer scripts: ``bash scripts/full_runs.sh`` runs the full-size reproductions seed by seed and commits
their cells. The benchmark harness is the package ``benchmarks/`` (``python -m benchmarks.run``); the
reference-case generator and the command-line fuzzer are test-support modules in tests/ (``python
tests/make_reference_runs.py``, ``python tests/fuzz_cli.py``), imported by the tests like their other helpers.
"""
