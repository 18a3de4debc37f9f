"""Property-based fuzzing of the command line with random malformed input files.

Hypothesis drives the mutation engine of tests/fuzz_cli.py (valid inputs of all three models, then
dtype / shape / NaN / name / value mutations and byte-level damage); ``ntpref.cli.main`` runs in-process.
Every input must be either accepted (exit 0, finite float64 outputs) or rejected (exit 2, one line
"ntpref: error: ...", no output file). An "internal error" counts as a crash.
"""
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_cli

BASES = fuzz_cli.valid_inputs()


class DrawChooser:
    """The fuzz engine's choice interface with Hypothesis drawing (so failures shrink)."""

    def __init__(self, data):
        self.data = data

    def choice(self, options):
        return self.data.draw(st.sampled_from(list(options)))

    def integer(self, low, high):
        return self.data.draw(st.integers(low, high))


@pytest.fixture(scope="module")
def workdir():
    with tempfile.TemporaryDirectory(prefix="ntpref-fuzz-test-") as tmp:
        yield Path(tmp)


def test_valid_bases_are_accepted(workdir):
    for command, arrays in BASES:
        outcome, status, text = fuzz_cli.run_case(command, fuzz_cli._npz_bytes(arrays), workdir)
        assert outcome == "accepted", (arrays["model"], command, text)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), backend=st.sampled_from(["numba", "numpy"]))
def test_malformed_files_exit_2_with_one_line(workdir, data, backend):
    command, raw, what = fuzz_cli.generate(DrawChooser(data), BASES)
    outcome, status, text = fuzz_cli.run_case(command, raw, workdir, backend)
    assert outcome != "crash", f"{what}: exit {status}: {text}"
    if outcome == "rejected":
        assert status == 2 and text.count("\n") == 1 and "internal error" not in text


def test_classifier_flags_crashes(workdir, monkeypatch):
    """The oracle of the fuzz test itself: an internal error or a non-finite output is a crash."""
    import dataclasses

    import numpy as np

    from ntpref.models import SPECS

    command, arrays = BASES[3]
    raw = fuzz_cli._npz_bytes(arrays)
    shallow = SPECS["shallow"]
    monkeypatch.setitem(SPECS, "shallow", dataclasses.replace(shallow, evaluate=lambda *a: 1 / 0))
    assert fuzz_cli.run_case(command, raw, workdir)[0] == "crash"
    monkeypatch.setitem(SPECS, "shallow", dataclasses.replace(shallow, evaluate=lambda *a: {"f": np.array([np.nan])}))
    assert fuzz_cli.run_case(command, raw, workdir)[0] == "rejected"  # the contract's output guard catches it
    monkeypatch.setattr(fuzz_cli, "main", lambda argv: 0)
    assert fuzz_cli.run_case(command, raw, workdir)[0] == "crash"       # exit 0 without an output file
