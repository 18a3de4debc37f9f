"""The cross-framework checks (scripts/crosscheck_torch.py, scripts/crosscheck_jax.py) on the stored cases.

Each script restates the models with its framework's autograd and must reproduce every reference case
(exit 0, every case in the table); a tampered expected file must make it exit 1 naming the case and
array; usage errors exit 2. Skipped with a reason when the framework or the reference runs are absent, except under
NTPREF_CROSSCHECK_REQUIRED=1, where a missing framework is a failure.
"""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ntpref.oracle.npzio import load_npz, save_npz

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("NTPREF_REFERENCE_RUNS") or REPO / "reference_runs")
FRAMEWORKS = ("torch", "jax")


def _manifest():
    path = ROOT / "manifest.json"
    if not path.is_file():
        pytest.skip(f"no reference runs at {ROOT} (generate them with scripts/make_reference_runs.py)")
    return json.loads(path.read_text())


def _need(framework):
    """Skip without the framework, unless NTPREF_CROSSCHECK_REQUIRED is set (CI): then its absence fails."""
    if os.environ.get("NTPREF_CROSSCHECK_REQUIRED"):
        __import__(framework)
    pytest.importorskip(framework, reason=f"{framework} is not installed (pip install ntpref[crosscheck])")


def _start(framework, *args):
    return subprocess.Popen([sys.executable, str(REPO / "scripts" / f"crosscheck_{framework}.py"), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc):
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


@pytest.fixture(scope="module")
def full_runs():
    """Both scripts on every stored case, started together (the frameworks' start-up overlaps)."""
    _manifest()
    procs = {}
    for fw in FRAMEWORKS:
        try:
            __import__(fw)
        except ImportError:
            continue
        procs[fw] = _start(fw)
    return {fw: _finish(p) for fw, p in procs.items()}


def _table_rows(out):
    """The body rows of the printed table, split into columns (case, array, ...)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("case ")) + 2
    end = next(i for i, line in enumerate(lines) if re.match(r"\d+ case\(s\)", line))
    return [line.split() for line in lines[start:end]]


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_every_case_passes(framework, full_runs):
    _need(framework)
    rc, out, err = full_runs[framework]
    assert rc == 0, f"crosscheck_{framework} exit {rc}\n{out}\n{err}"
    assert {row[0] for row in _table_rows(out)} == set(_manifest()["cases"]), out
    assert "FAIL" not in out


def _tampered_root(tmp_path):
    """A copy of the first eval case whose first non-zero float expected array is off by 1e-6 relative."""
    manifest = _manifest()
    case = next(c for c, e in manifest["cases"].items() if e["kind"] == "eval")
    shutil.copytree(ROOT / case, tmp_path / case)
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "cases": {case: manifest["cases"][case]}}))
    expected = load_npz(tmp_path / case / "expected.npz")
    name = next(n for n, a in expected.items() if a.dtype.kind == "f" and np.any(a != 0))
    scale = np.max(np.abs(expected[name]))
    expected[name] = expected[name] * (1 + 1e-6) + 1e-6 * scale
    save_npz(tmp_path / case / "expected.npz", expected)
    return case, name


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_tampered_expected_fails_naming_case_and_array(framework, tmp_path):
    _need(framework)
    case, name = _tampered_root(tmp_path)
    rc, out, err = _finish(_start(framework, "--root", tmp_path))
    assert rc == 1, out + err
    failing = [row[:2] for row in _table_rows(out) if row[4].startswith("FAIL")]
    assert failing == [[case, name]], out


def _unused(*args):
    raise AssertionError("a usage error must stop before any case runs")


def test_usage_errors_exit_2(tmp_path, capsys):
    """Unknown case, missing root, bad option: exit 2 with a one-line reason (driver run in-process)."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import crosscheck_common as common
    finally:
        sys.path.pop(0)
    _manifest()  # skips without reference runs
    fw = common.Framework("stub", "0", _unused, _unused, _unused, _unused, _unused)
    assert common.main(fw, ["--root", str(ROOT), "--cases", "no_such_case"]) == 2
    assert "no_such_case" in capsys.readouterr().err
    assert common.main(fw, ["--root", str(tmp_path / "missing")]) == 2
    assert "manifest.json" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        common.main(fw, ["--no-such-option"])
    assert exc.value.code == 2
