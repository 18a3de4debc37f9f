"""ntpref.testing, the pytest helpers of docs/conformance.md ("In your own test suite"): the page's example
file, run by pytest in a subprocess at its default verbosity next to a passing adapter (the oracle's NumPy
backend, tests/conformance_adapters/oracle_numpy.py) and next to a mutant of it: one test per case, named by
the case id, and a failing case's message holds the case's whole table, the failing array's row entire."""
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ntpref.oracle import contract
from ntpref.oracle.conformance import cases, check
from ntpref.testing import assert_conforms, parametrize_with_cases

REPO = Path(__file__).resolve().parents[1]
ORACLE_NUMPY = REPO / "tests" / "conformance_adapters" / "oracle_numpy.py"
#: The mutant: the oracle with grad_W[0, 0, 0] of the shallow transformer 1e-6 off (every shallow eval case fails).
MUTATION = '''

_evaluate = evaluate


def evaluate(model, inputs):
    out = _evaluate(model, inputs)
    if model == "shallow":
        out["grad_W"][0, 0, 0] += 1e-6
    return out
'''


def _docs_example() -> str:
    """The test file of docs/conformance.md, as a user copies it."""
    text = (REPO / "docs" / "conformance.md").read_text()
    blocks = re.findall(r"^```python\n(# test_against_ntpref\.py\n.*?)^```", text, flags=re.S | re.M)
    assert len(blocks) == 1, "docs/conformance.md has one test_against_ntpref.py example"
    return blocks[0]


def _pytest(folder: Path, adapter_source: str) -> tuple[int, str]:
    """pytest run at its default verbosity in ``folder`` on the docs' example beside ``my_adapter.py``."""
    (folder / "test_against_ntpref.py").write_text(_docs_example())
    (folder / "my_adapter.py").write_text(adapter_source)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}     # pytest's own defaults
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider"], cwd=folder, text=True,
                          capture_output=True, timeout=1200, env={**env, "PYTHONPATH": str(REPO)})
    return proc.returncode, proc.stdout + proc.stderr


def _selected():
    """The cases the docs' example selects (its decorator's arguments)."""
    call = re.search(r"@parametrize_with_cases\((.*)\)", _docs_example()).group(1)
    assert call == 'models=["shallow"], random=4', "the test below follows the docs' selection"
    return cases(["shallow"], random=4)


def test_the_docs_example_passes_for_a_correct_adapter(tmp_path):
    status, out = _pytest(tmp_path, ORACLE_NUMPY.read_text())
    ids = [c.id for c in _selected()]
    assert status == 0, out
    assert re.search(rf"^=+ {len(ids)} passed in ", out, re.M), out


def test_a_failing_case_shows_its_whole_table_at_default_verbosity(tmp_path):
    status, out = _pytest(tmp_path, ORACLE_NUMPY.read_text() + MUTATION)
    selected = _selected()
    failing = [c.id for c in selected if c.kind == "eval"]
    assert status == 1 and len(failing) >= 3, out
    assert re.search(rf"^=+ {len(failing)} failed, {len(selected) - len(failing)} passed in ", out, re.M), out
    for case_id in failing:
        assert f"FAILED test_against_ntpref.py::test_matches_the_oracle[{case_id}]" in out
    # the table of a stored case (its tolerances are stored: no exact run here) as the report prints it
    stored = next(c for c in selected if c.source == "stored" and c.kind == "eval")
    namespace = {}
    exec(ORACLE_NUMPY.read_text() + MUTATION, namespace)
    report = check({"evaluate": namespace["evaluate"]}, stored)
    row = next(line for line in report.table().splitlines() if line.split()[1] == "grad_W")
    assert "FAIL (1 entries outside; worst at (0, 0, 0)" in row
    assert len(repr(report)) > 240                       # more than pytest shows of `assert report.ok, report`
    assert f"E       AssertionError: {report.summary()}\n" in out
    assert f"E       {row}\n" in out, out


def _oracle(model, inputs):
    return contract.evaluate({"model": model, **inputs})


def _wrong_loss(model, inputs):
    return {**_oracle(model, inputs), "loss": np.array(1.0)}


def _declines(model, inputs):
    raise NotImplementedError("not the RNN")


def test_assert_conforms_passes_raises_and_skips():
    case = next(c for c in cases(["indrnn"], stored=False, random=2) if c.kind == "eval")
    assert assert_conforms({"evaluate": _oracle}, case).ok
    with pytest.raises(AssertionError) as info:
        assert_conforms({"evaluate": _wrong_loss}, case)
    message = str(info.value)
    assert message.startswith(f"FAIL  {case.id}: 4/5 arrays within tolerance; failing: loss\ncase ")
    assert len(message.splitlines()) == 1 + 2 + 5          # summary, header and rule, a row per array
    with pytest.raises(pytest.skip.Exception, match="not the RNN"):
        assert_conforms({"evaluate": _declines}, case)


def test_parametrize_with_cases_names_each_test_by_its_case():
    mark = parametrize_with_cases(["twostage"], kind="train", stored=False, random=5)
    argnames, argvalues = mark.args
    expected = [c.id for c in cases(["twostage"], stored=False, random=5) if c.kind == "train"]
    assert argnames == "case" and [c.id for c in argvalues] == expected == mark.kwargs["ids"]
    assert expected == ["r0_twostage_2_train_naive", "r0_twostage_3_train_late_stage",
                        "r0_twostage_4_train_attention_cancel"]
    with pytest.raises(ValueError, match="kind must be 'eval', 'train' or None, not 'evaluate'"):
        parametrize_with_cases(kind="evaluate")
