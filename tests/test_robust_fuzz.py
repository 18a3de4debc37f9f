"""Property-based fuzzing of the command line with random malformed input files.

Hypothesis drives the mutation engine of tests/fuzz_npz.py (valid inputs of all three models, then
dtype / shape / NaN / name / value mutations and byte-level damage); ``ntpref.cli.main`` runs in-process.
Every input must be either accepted (exit 0, finite float64 outputs) or rejected (exit 2, one line
"ntpref: error: ...", no output file). An "internal error" counts as a crash.

The other surfaces of the fuzzer (tests/fuzz_cli.py) get a deterministic slice each: every conformance
adapter fault and every --command once (each must get the verdict it calls for), Hypothesis-drawn tolerance
files and damaged reference directories, three closed pipes and one killed worker; a last test checks that
the classifiers flag internal errors, wrong exit statuses and stray output as crashes.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_adapters
import fuzz_common
import fuzz_json
import fuzz_npz
import fuzz_reference
import fuzz_subprocess

BASES = fuzz_common.valid_inputs()


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
        outcome, status, text = fuzz_npz.run_case(command, fuzz_npz._npz_bytes(arrays), workdir)
        assert outcome == "accepted", (arrays["model"], command, text)


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data(), backend=st.sampled_from(["numba", "numpy"]))
def test_malformed_files_exit_2_with_one_line(workdir, data, backend):
    command, raw, what = fuzz_npz.generate(DrawChooser(data), BASES)
    outcome, status, text = fuzz_npz.run_case(command, raw, workdir, backend)
    assert outcome != "crash", f"{what}: exit {status}: {text}"
    if outcome == "rejected":
        assert status == 2 and text.count("\n") == 1 and "internal error" not in text


def test_classifier_flags_crashes(workdir, monkeypatch):
    """The oracle of the fuzz test itself: an internal error or a non-finite output is a crash."""
    import dataclasses

    import numpy as np

    from ntpref.models import SPECS

    command, arrays = BASES[3]
    raw = fuzz_npz._npz_bytes(arrays)
    shallow = SPECS["shallow"]
    monkeypatch.setitem(SPECS, "shallow", dataclasses.replace(shallow, evaluate=lambda *a: 1 / 0))
    assert fuzz_npz.run_case(command, raw, workdir)[0] == "crash"
    monkeypatch.setitem(SPECS, "shallow", dataclasses.replace(shallow, evaluate=lambda *a: {"f": np.array([np.nan])}))
    assert fuzz_npz.run_case(command, raw, workdir)[0] == "rejected"  # the contract's output guard catches it
    monkeypatch.setattr(fuzz_common, "main", lambda argv: 0)
    assert fuzz_npz.run_case(command, raw, workdir)[0] == "crash"       # exit 0 without an output file


# ---- the other surfaces: a deterministic slice of each generator, and the classifier firing --------------------

class FirstChooser:
    """The fuzz engine's choice interface always taking the first option and the lowest integer."""

    def choice(self, options):
        return list(options)[0]

    def integer(self, low, high):
        return low


@pytest.fixture(scope="module")
def fixtures(workdir):
    return fuzz_common.Fixtures(workdir)


FAULTS = sorted(fuzz_adapters.ADAPTER_FAULTS)
MODEL_KINDS = [(model, kind) for kind in ("eval", "train") for model in ("twostage", "shallow", "indrnn")]


@pytest.mark.parametrize("fault", FAULTS)
def test_adapter_faults_get_their_verdict(fixtures, fault):
    """Every adapter fault once, on one case of a model and kind that cycle with the fault."""
    model, kind = MODEL_KINDS[FAULTS.index(fault) % len(MODEL_KINDS)]
    result = fuzz_adapters.run_adapter_case(fault, model, kind, fixtures.workdir)
    assert result.outcome != "crash", result


@pytest.mark.parametrize("name", sorted(fuzz_adapters.COMMANDS))
def test_commands_get_their_verdict(name):
    result = fuzz_adapters.run_command_case(name, "indrnn", "eval")
    assert result.outcome != "crash", result


@settings(max_examples=50, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_tolerance_files_and_damaged_references(fixtures, data):
    for run in (fuzz_json.tolerance_run, fuzz_reference.reference_run):
        result = run(DrawChooser(data), fixtures)
        assert result.outcome != "crash", result


@pytest.mark.parametrize("name, read", [("compare wide", 0), ("compare wide", 4096), ("reproduce --list", None)])
def test_closed_pipes(fixtures, name, read):
    argv = fuzz_subprocess.pipe_commands(fixtures)[name]
    outcome, status, text = fuzz_subprocess.run_pipe_case(argv, read, fixtures.workdir)
    assert outcome != "crash", (status, text)


def test_killed_worker(fixtures):
    """A worker killed as it starts: one error line, then a rerun completes (two seeds, to be quick)."""
    outcome, status, text = fuzz_subprocess.run_worker_case("start", False, 0.0, fixtures.workdir, seeds=2)
    assert outcome == "rejected", (status, text)


def test_classifier_flags_crashes_of_the_other_surfaces(fixtures, monkeypatch):
    """The oracle of the fuzz runs itself: internal errors, wrong statuses and stray output are crashes."""
    from ntpref.oracle import cli_reference, compare, conformance, judging, manifest, reaper

    workdir = fixtures.workdir
    assert fuzz_adapters.run_adapter_case("call:correct", "shallow", "eval", workdir).outcome == "accepted"
    with monkeypatch.context() as m:                 # an internal error behind a correct adapter
        m.setattr(judging, "_outputs", lambda *a: 1 / 0)
        assert fuzz_adapters.run_adapter_case("call:correct", "shallow", "eval", workdir).outcome == "crash"
    with monkeypatch.context() as m:                 # exit 0 for a misbehaving adapter, a PASS without a verdict
        m.setattr(fuzz_common, "main", lambda argv: 0)
        assert fuzz_adapters.run_adapter_case("call:returns_none", "shallow", "eval", workdir).outcome == "crash"
        assert fuzz_adapters.run_adapter_case("call:correct", "shallow", "eval", workdir).outcome == "crash"
    with monkeypatch.context() as m:
        m.setattr(conformance.CommandAdapter, "_case", lambda *a: 1 / 0)
        assert fuzz_adapters.run_command_case("exit_1", "shallow", "eval").outcome == "crash"
    with monkeypatch.context() as m:                 # a process that left the command's session, not killed
        m.setattr(reaper.Reaper, "kill_all", lambda self: [])
        result = fuzz_adapters.run_command_case("setsid_sleep", "shallow", "eval")
        assert result.outcome == "crash" and "left behind: leaked process" in result.text, result
    with monkeypatch.context() as m:
        m.setattr(compare, "load_tolerances", lambda *a, **k: 1 / 0)
        assert fuzz_json.tolerance_run(FirstChooser(), fixtures).outcome == "crash"
    with monkeypatch.context() as m:
        m.setattr(manifest, "check_manifest", lambda *a: 1 / 0)
        assert fuzz_reference.reference_run(FirstChooser(), fixtures).outcome == "crash"
    with monkeypatch.context() as m:                 # export says it succeeded but wrote nothing
        m.setattr(cli_reference, "export", lambda *a: [])
        result = fuzz_reference.reference_run(FirstChooser(), fixtures)
        assert result.steps[-1] == "run:export" and result.outcome == "crash"
    assert fuzz_common.classify(2, "Traceback (most recent call last):\nntpref: error: x\n")[0] == "crash"
    assert fuzz_subprocess.pipe_outcome(None, 141, "")[0] == "crash"   # read to its end, yet SIGPIPE
    assert fuzz_subprocess.pipe_outcome(0, 141, "Exception ignored ...\n")[0] == "crash"
    fake = lambda argv, cwd, **popen: subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], **popen)
    monkeypatch.setattr(fuzz_subprocess, "_ntpref", fake)
    assert fuzz_subprocess.run_worker_case("start", False, 0.0, workdir, seeds=2)[0] == "crash"
