"""The files shipped beside the code (ntpref.shipped): the adapters, the documentation pages and the reference
cases are found in a clone; an installed copy (tests/test_packaging.py, slow) finds them inside the package."""
import re
from pathlib import Path

import pytest

from ntpref import shipped
from ntpref.cli import main
from ntpref.errors import InputError

REPO = Path(__file__).resolve().parents[1]


def test_in_a_clone_the_repository_directories_are_used():
    assert shipped.shipped_dir("docs", "contract.md") == REPO / "docs"
    assert shipped.shipped_dir("adapters", "torch_float64.py") == REPO / "examples" / "adapters"
    assert shipped.shipped_dir("reference_runs", "manifest.json") == REPO / "reference_runs"


def test_without_the_marker_the_installed_copy_is_used(monkeypatch, tmp_path):
    fake = tmp_path / "site-packages" / "ntpref"
    fake.mkdir(parents=True)
    monkeypatch.setattr(shipped, "_ROOT", fake)
    assert shipped.shipped_dir("docs", "contract.md") == fake / "docs"
    with pytest.raises(InputError, match="adapter 'torch-float64': .* is missing from this install"):
        shipped.adapter_path("torch-float64")


def test_every_shipped_adapter_is_a_file_named_by_the_table(capsys):
    for name, (directory, file, _) in {**shipped.ADAPTERS, **shipped.PROGRAMS}.items():
        assert shipped.adapter_path(name) == REPO / shipped._DIRS[directory] / file
    assert main(["adapters"]) == 0
    out = capsys.readouterr().out
    assert all(f"{name} " in out and f"needs {module}" in out for name, (_, _, module) in shipped.ADAPTERS.items())
    assert "c-twostage-eval      needs a C compiler, cc" in out
    assert f"\n{' ' * 21}{REPO / 'examples' / 'c' / 'twostage_eval.c'}\n" in out
    assert "oracle-numpy         needs numpy (installed): Conformance adapter: the oracle's own NumPy backend" in out
    with pytest.raises(InputError, match=r"unknown adapter 'torch-flot64' \(did you mean 'torch-float64'\?\)"):
        shipped.adapter_path("torch-flot64")


def test_the_adapters_that_fail_on_purpose_are_listed_apart(capsys):
    """The NumPy adapters whose run docs/conformance.md's table does not call a pass are the ones ``ntpref
    adapters`` lists under the fail-on-purpose heading, and only they; the correct ones come first."""
    table = re.findall(r"^\| `([a-z0-9-]+)` \| [^|]+ \| ([^|]+) \|$", (REPO / "docs" / "conformance.md").read_text(),
                       re.M)
    runs = {name: run.strip() for name, run in table if name in shipped.ADAPTERS}
    assert len(runs) == 9 and set(runs) == {n for n, (d, _, _) in shipped.ADAPTERS.items() if d == "numpy_adapters"}
    failing = [name for name, run in runs.items() if not run.startswith("passes")]
    assert main(["adapters"]) == 0
    out = capsys.readouterr().out
    correct, rest = out.split("adapters that fail on purpose, to show what a failing adapter reports (not for use):\n")
    on_purpose, program = rest.split("example program for ntpref conformance --command:\n")
    listed = [re.findall(r"^(\S+) +needs ", part, re.M) for part in (correct, on_purpose, program)]
    assert correct.startswith("adapters (correct implementations):\n")
    assert listed[1] == failing == list(shipped.FAIL_ON_PURPOSE)
    assert listed[0] == [name for name in shipped.ADAPTERS if name not in failing]
    assert listed[2] == list(shipped.PROGRAMS)


def test_adapters_name_prints_the_path_of_one_file(capsys):
    for name, path in (("c-twostage-eval", REPO / "examples" / "c" / "twostage_eval.c"),
                       ("detached-attention", REPO / "tests" / "conformance_adapters" / "detached_attention.py"),
                       ("jax-float32", REPO / "examples" / "adapters" / "jax_float32.py")):
        assert main(["adapters", name]) == 0
        assert capsys.readouterr().out == f"{path}\n"
    assert main(["adapters", "c-twostage"]) == 2
    assert "unknown adapter 'c-twostage' (did you mean 'c-twostage-eval'?)" in capsys.readouterr().err


def test_a_shipped_numpy_adapter_runs_by_name(capsys):
    assert main(["conformance", "--adapter", "one-over-m", "--model", "indrnn", "--no-stored", "--random", "1"]) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"conformance of {REPO / 'tests' / 'conformance_adapters' / 'one_over_m.py'} (evaluate)")
    assert "FAIL  r0_indrnn_0_eval_paired: 2/5 arrays within tolerance; failing: grad_c, grad_u, grad_W_in" in out
    assert main(["conformance", "--adapter", "c-twostage-eval"]) == 2       # a program, not an adapter
    assert "invalid choice: 'c-twostage-eval'" in capsys.readouterr().err


def test_docs_lists_the_pages_and_prints_one(capsys):
    assert main(["docs"]) == 0
    listed = capsys.readouterr().out.split()
    assert {"contract", "conformance", "tolerance", "twostage", "shallow"} <= set(listed[::2])
    assert main(["docs", "contract.md"]) == 0
    assert capsys.readouterr().out.strip() == str(REPO / "docs" / "contract.md")
    assert main(["docs", "contrct"]) == 2
    assert "unknown page 'contrct' (did you mean 'contract'?)" in capsys.readouterr().err


def test_conformance_takes_one_adapter_source(capsys):
    assert main(["conformance", "--adapter", "torch-float64", str(REPO / "tests" / "conformance_adapters" /
                                                                  "oracle_numpy.py")]) == 2
    assert "give one of an adapter file (ADAPTER.py), --adapter NAME" in capsys.readouterr().err


def _heading_anchors(page: Path) -> set[str]:
    """The anchors a renderer gives the headings of a markdown page (outside code blocks): lower case, the
    punctuation but hyphens dropped, spaces as hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return {re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def test_every_link_of_the_readme_and_the_docs_names_a_file_and_a_heading_that_exist():
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    broken, links = [], 0
    for page in pages:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            links += 1
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.is_file():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _heading_anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert links > 100 and not broken, broken
