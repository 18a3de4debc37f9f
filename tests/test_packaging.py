"""ntpref as a user outside the repository gets it: the wheel and the sdist built from this checkout, the wheel
installed in a fresh virtual environment and run from a directory outside the clone.

The installed package must have what the docs promise: the stored reference cases (`ntpref verify`), the
documentation (`ntpref docs`), the shipped adapters (`ntpref adapters`, `ntpref conformance --adapter`), the
C example (compiled and run as the docs say) and a quick reproduction; the sdist must hold its own tests.
Those tests are marked slow (a fresh environment installs NumPy, Numba, matplotlib and the local PyTorch CPU
wheel): ``python -m pytest -m slow tests/test_packaging.py``. A fast test reads setup.py's package map and
checks that every file the docs name for users is in it.
"""
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from ntpref import shipped

REPO = Path(__file__).resolve().parents[1]
#: Files the docs name as the evidence behind a statement (tests, benchmarks, scripts; the committed
#: reproduction cells): the source distribution (or the repository) holds them, the wheel does not, and
#: docs/conformance.md names them as the source distribution's.
SOURCE_ONLY = re.compile(r"tests/(?!conformance_adapters/)|benchmarks/|scripts/|docs/results/[^/]+/full/cells/")
#: A repository path in a page: a file or folder under one of the repository's top-level folders.
REPO_PATH = re.compile(r"(?<![\w./-])((?:docs|examples|tests|benchmarks|scripts|reference_runs|ntpref)/[\w./*-]*)")


def _package_map() -> tuple[dict[str, str], dict[str, list[str]]]:
    """setup.py's package_dir (installed package → repository folder) and package_data (package → globs),
    read from its source without running it."""
    call = next(n for n in ast.walk(ast.parse((REPO / "setup.py").read_text())) if isinstance(n, ast.Call)
                and getattr(n.func, "id", None) == "setup")
    keywords = {k.arg: k.value for k in call.keywords}
    return ast.literal_eval(keywords["package_dir"]), ast.literal_eval(keywords["package_data"])


def _installed(path: str) -> bool:
    """Whether the repository path (a file, or a folder ending in "/") is installed by the wheel: under the
    package itself, a module of a mapped folder or a file its package_data globs match, or a mapped folder."""
    if path.startswith("ntpref/"):
        return True
    package_dir, package_data = _package_map()
    for package, folder in package_dir.items():
        if path.rstrip("/") == folder or path.startswith(folder + "/") and _folder(path):
            return True
        if path.startswith(folder + "/"):
            rel = path[len(folder) + 1:]
            globs = package_data.get(package, []) + ["*.py"]
            return any((REPO / folder / rel) in set((REPO / folder).glob(g)) for g in globs)
    return False


def _folder(path: str) -> bool:
    return path.endswith("/") or (REPO / path).is_dir()


def _placeholder(path: str) -> bool:
    """A path with a word to substitute (reference_runs/NAME/, docs/results/TARGET/SIZE/) or a glob, or an
    installed location (ntpref/adapters): nothing of that name in the repository."""
    parts = path.rstrip("/").split("/")
    return ("*" in path or any(p.isupper() for p in parts)
            or len(parts) == 2 and parts[0] == "ntpref" and parts[1] in shipped._DIRS)


def test_every_file_the_docs_name_for_users_is_installed():
    """A file or folder a page names is in the wheel's package map (and exists), unless it is a test, a
    benchmark or a script, which the page must then call the source distribution's."""
    package_dir, _ = _package_map()
    assert {f"ntpref.{name}": folder for name, folder in shipped._DIRS.items()} == package_dir
    for name in {**shipped.ADAPTERS, **shipped.PROGRAMS}:
        assert _installed(str(shipped.adapter_path(name).relative_to(REPO))), name
    named, missing = 0, []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for paragraph in page.read_text().split("\n\n"):
            for path in REPO_PATH.findall(paragraph):
                path = path.rstrip(".")
                named += 1
                if not _placeholder(path) and not (REPO / path).exists():
                    missing.append(f"{page.name}: {path} does not exist")
                elif not SOURCE_ONLY.match(path) and not _installed(path):
                    missing.append(f"{page.name}: {path} is not installed")
                elif (SOURCE_ONLY.match(path) and page.name == "conformance.md"
                      and "source distribution" not in paragraph):
                    missing.append(f"{page.name}: {path} is not called the source distribution's")
    assert named > 50 and not missing, missing


def run(cmd, cwd, env_bin=None, timeout=1800, status=0):
    """Run ``cmd`` (a list; its first item looked up in ``env_bin`` when given, and then without a PYTHONPATH
    that would put the clone before the installed package) in ``cwd``, expecting exit status ``status``; its
    stdout."""
    env = dict(os.environ)
    if env_bin is not None:
        cmd = [str(env_bin / cmd[0]), *cmd[1:]]
        env.pop("PYTHONPATH", None)
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == status, f"{cmd}: exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    """(wheel, sdist) built from this checkout."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ".", "-w", out], REPO)
    run([sys.executable, "setup.py", "-q", "sdist", "-d", out], REPO)
    return next(out.glob("*.whl")), next(out.glob("*.tar.gz"))


@pytest.mark.slow
def test_the_wheel_ships_the_cases_the_docs_and_the_adapters(dist):
    names = set(zipfile.ZipFile(dist[0]).namelist())
    for name in ("ntpref/reference_runs/manifest.json", "ntpref/docs/contract.md", "ntpref/docs/conformance.md",
                 "ntpref/adapters/torch_float64.py", "ntpref/adapters/torch_restatement.py",
                 "ntpref/adapters/jax_float64.py", "ntpref/adapters/jax_float32.py", "ntpref/c_example/twostage_eval.c",
                 "ntpref/numpy_adapters/oracle_numpy.py", "ntpref/numpy_adapters/detached_attention.py"):
        assert name in names, name
    assert not any("/cells/" in n or n.startswith(("tests/", "benchmarks/", "examples/")) for n in names)


@pytest.mark.slow
def test_the_sdist_holds_its_own_tests(dist):
    names = {n.split("/", 1)[1] for n in tarfile.open(dist[1]).getnames() if "/" in n}
    for name in ("pytest.ini", "setup.py", "tests/conftest.py", "tests/test_layers.py", "tests/common_checks.py",
                 "tests/conformance_adapters/gradient_error.py", "reference_runs/manifest.json",
                 "examples/adapters/torch_float64.py", "docs/contract.md"):
        assert name in names, name
    assert not any("/cells/" in n for n in names)


@pytest.mark.slow
def test_an_installed_wheel_outside_the_clone(dist, tmp_path):
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv], tmp_path)
    bin_ = venv / "bin"
    run(["python", "-m", "pip", "install", "-q", "torch==2.13.0"], tmp_path, bin_)     # the local CPU wheel
    run(["python", "-m", "pip", "install", "-q", f"{dist[0]}[plot]"], tmp_path, bin_)
    away = tmp_path / "elsewhere"
    away.mkdir()
    stored = len(json.loads((REPO / "reference_runs" / "manifest.json").read_text())["cases"])
    # every case within tolerance; arrays not promised bitwise (norms, correlations) may move by an ulp
    assert f"{stored}/{stored} cases ok" in run(["ntpref", "verify"], away, bin_)
    page = Path(run(["ntpref", "docs", "contract"], away, bin_).strip())
    assert page.is_file() and "site-packages" in str(page) and page.read_text().startswith("#")
    listing = run(["ntpref", "adapters"], away, bin_)
    assert all(name in listing for name in ("torch-float64", "oracle-numpy", "detached-attention", "c-twostage-eval"))
    # the C example, compiled and run as docs/conformance.md says, from its installed copy
    source = Path(run(["ntpref", "adapters", "c-twostage-eval"], away, bin_).strip())
    assert source.is_file() and "site-packages" in str(source) and source.name == "twostage_eval.c"
    if shutil.which("cc"):
        run(["cc", "-O2", "-o", away / "twostage_eval", source, "-lm"], away)
        out = run(["ntpref", "conformance", "--command", "./twostage_eval {kind} {input_dir} {output_dir}",
                   "--model", "twostage", "--kind", "eval"], away, bin_)
        assert re.fullmatch(r"(\d+) cases: \1 passed, 0 failed, 0 skipped; \d+ arrays compared: PASS",
                            out.splitlines()[-1]), out
    # a shipped NumPy adapter by name (a broken one fails), and a copy of one run as the user's own file
    out = run(["ntpref", "conformance", "--adapter", "detached-attention", "--no-stored", "--model", "twostage",
               "--random", "1"], away, bin_, status=1)
    assert "FAIL  r0_twostage_0_eval_general_E: 6/7 arrays within tolerance; failing: grad_W_kq" in out
    shutil.copy(run(["ntpref", "adapters", "oracle-numpy"], away, bin_).strip(), away / "my_adapter.py")
    out = run(["ntpref", "conformance", "my_adapter.py", "--model", "indrnn", "--random", "1"], away, bin_)
    assert out.splitlines()[-1].endswith(": PASS"), out
    out = run(["ntpref", "conformance", "--adapter", "torch-float64", "--model", "twostage", "--no-stored",
               "--random", "2"], away, bin_)
    assert out.splitlines()[-1].endswith(": PASS"), out
    run(["ntpref", "reproduce", "generalization", "--quick", "--out", away / "results", "-q"], away, bin_)
    assert (away / "results" / "generalization" / "quick" / "summary.txt").is_file()
