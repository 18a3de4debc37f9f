"""ntpref as a user outside the repository gets it: the wheel and the sdist built from this checkout, the wheel
installed in a fresh virtual environment and run from a directory outside the clone.

The installed package must have what the docs promise: the stored reference cases (`ntpref verify`), the
documentation (`ntpref docs`), the shipped adapters (`ntpref adapters`, `ntpref conformance --adapter`)
and a quick reproduction; the sdist must hold its own tests. Marked slow (a fresh environment installs
NumPy, Numba, matplotlib and the local PyTorch CPU wheel): ``python -m pytest -m slow tests/test_packaging.py``.
"""
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def run(cmd, cwd, env_bin=None, timeout=1800):
    """Run ``cmd`` (a list; its first item looked up in ``env_bin`` when given) in ``cwd``; its stdout."""
    if env_bin is not None:
        cmd = [str(env_bin / cmd[0]), *cmd[1:]]
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """(wheel, sdist) built from this checkout."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ".", "-w", out], REPO)
    run([sys.executable, "setup.py", "-q", "sdist", "-d", out], REPO)
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


def test_the_wheel_ships_the_cases_the_docs_and_the_adapters(dist):
    names = set(zipfile.ZipFile(dist[0]).namelist())
    for name in ("ntpref/reference_runs/manifest.json", "ntpref/docs/contract.md", "ntpref/docs/conformance.md",
                 "ntpref/adapters/torch_float64.py", "ntpref/adapters/torch_restatement.py",
                 "ntpref/adapters/jax_float64.py", "ntpref/adapters/jax_float32.py"):
        assert name in names, name
    assert not any("/cells/" in n or n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)


def test_the_sdist_holds_its_own_tests(dist):
    names = {n.split("/", 1)[1] for n in tarfile.open(dist[1]).getnames() if "/" in n}
    for name in ("pytest.ini", "setup.py", "tests/conftest.py", "tests/test_layers.py", "tests/common_checks.py",
                 "tests/conformance_adapters/gradient_error.py", "reference_runs/manifest.json",
                 "examples/adapters/torch_float64.py", "docs/contract.md"):
        assert name in names, name
    assert not any("/cells/" in n for n in names)


def test_an_installed_wheel_outside_the_clone(dist, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    bin_ = venv / "bin"
    run(["python", "-m", "pip", "install", "-q", "torch==2.13.0"], tmp_path, bin_)     # the local CPU wheel
    run(["python", "-m", "pip", "install", "-q", f"{dist[0]}[plot]"], tmp_path, bin_)
    away = tmp_path / "elsewhere"
    away.mkdir()
    assert "13/13 cases ok" in run(["ntpref", "verify"], away, bin_)
    page = Path(run(["ntpref", "docs", "contract"], away, bin_).strip())
    assert page.is_file() and "site-packages" in str(page) and page.read_text().startswith("#")
    assert "torch-float64" in run(["ntpref", "adapters"], away, bin_)
    out = run(["ntpref", "conformance", "--adapter", "torch-float64", "--model", "twostage", "--no-stored",
               "--random", "2"], away, bin_)
    assert out.splitlines()[-1].endswith(": PASS"), out
    run(["ntpref", "reproduce", "generalization", "--quick", "--out", away / "results", "-q"], away, bin_)
    assert (away / "results" / "generalization" / "quick" / "summary.txt").is_file()
