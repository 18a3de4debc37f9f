"""The benchmark harness of the repository (benchmarks/: ``python -m benchmarks.run``, ``python -m
benchmarks.mutations``) for the tests that check it. It is not an installed package: pytest.ini puts the
repository root on sys.path, and each module is imported when a test first uses it (``harness.run``,
``harness.sweeps``), never at collection."""
import importlib


class _Harness:
    def __getattr__(self, name: str):
        return importlib.import_module(f"benchmarks.{name}")


harness = _Harness()
