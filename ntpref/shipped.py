"""The files shipped beside the code, found the same way in a clone and in an installed package.

In a clone of the repository (or an editable install) they are the repository's own directories
``docs/``, ``examples/adapters/``, ``tests/conformance_adapters/``, ``examples/c/`` and ``reference_runs/``;
a built wheel or sdist installs them as ``ntpref/docs``, ``ntpref/adapters``, ``ntpref/numpy_adapters``,
``ntpref/c_example`` and ``ntpref/reference_runs`` (setup.py maps them), so the commands that use them
(``ntpref verify``, ``ntpref conformance --adapter NAME``, ``ntpref adapters``, ``ntpref docs``) work on
any install. Commands:

    ntpref adapters [NAME]   the shipped adapters (the correct ones, then those that fail on purpose) and the
                             C example: name, what it needs, installed or not, file; with NAME, the path of
                             its file alone
    ntpref docs [PAGE]       the documentation pages (their files), or the path of one page
"""
from __future__ import annotations

import ast
import importlib.util
import shutil
from pathlib import Path

from .checks import did_you_mean
from .errors import InputError

_ROOT = Path(__file__).resolve().parent
#: installed name → the repository's directory (relative to the repository root)
_DIRS = {"docs": "docs", "adapters": "examples/adapters", "numpy_adapters": "tests/conformance_adapters",
         "c_example": "examples/c", "reference_runs": "reference_runs"}
_NUMPY = ("oracle_numpy", "float32_outputs")
_FAILING = ("detached_attention", "gradient_error", "one_over_m", "softmax_over_padding", "loss_only", "raising",
            "signalled")
#: The shipped conformance adapters (``ntpref conformance --adapter NAME``): name → (directory, file, the
#: module it needs): the PyTorch and JAX restatements, and the NumPy adapters built on the oracle (correct
#: ones, deliberately broken ones and misbehaving ones, as tests/test_conformance_judging.py and
#: tests/test_conformance_adapter_faults.py run them).
ADAPTERS = {"torch-float64": ("adapters", "torch_float64.py", "torch"),
            "torch-float32": ("adapters", "torch_float32.py", "torch"),
            "jax-float64": ("adapters", "jax_float64.py", "jax"), "jax-float32": ("adapters", "jax_float32.py", "jax"),
            **{stem.replace("_", "-"): ("numpy_adapters", f"{stem}.py", "numpy") for stem in _NUMPY + _FAILING}}
#: The shipped adapters that fail on purpose (broken math, an adapter that raises, one interrupted by a
#: signal): they show what a failing adapter reports and are no implementation to use or copy.
FAIL_ON_PURPOSE = tuple(stem.replace("_", "-") for stem in _FAILING)
#: The shipped example programs for ``ntpref conformance --command``: name → (directory, file, the compiler).
PROGRAMS = {"c-twostage-eval": ("c_example", "twostage_eval.c", "cc")}


def shipped_dir(name: str, marker: str) -> Path:
    """The directory ``name`` (a key of the repository map: "docs", "adapters", "reference_runs", ...): the
    repository's own when this is a clone holding ``marker`` there (a file that identifies it), else the copy
    installed inside the package."""
    checkout = _ROOT.parent / _DIRS[name]
    return checkout if (checkout / marker).is_file() else _ROOT / name


def adapter_path(name: str) -> Path:
    """The file of the shipped adapter or example program ``name`` (:data:`ADAPTERS`, :data:`PROGRAMS`);
    InputError for an unknown name or a file missing from the install."""
    known = {**ADAPTERS, **PROGRAMS}
    if name not in known:
        raise InputError(f"unknown adapter {name!r}{did_you_mean(name, known)}; shipped: {', '.join(known)}")
    directory, file, _ = known[name]
    path = shipped_dir(directory, file) / file
    if not path.is_file():
        raise InputError(f"adapter {name!r}: {path} is missing from this install")
    return path


def _summary(path: Path) -> str:
    """The first sentence of a module's docstring or of a C file's opening comment, on one line (read without
    importing or compiling anything)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".c":
        doc = "\n".join(line.strip().lstrip("/*").strip() for line in text.split("*/")[0].splitlines())
    else:
        doc = ast.get_docstring(ast.parse(text)) or ""
    doc = " ".join(doc.strip().split("\n\n")[0].split())
    return doc.split(". ")[0].rstrip(".:")


def docs_pages() -> dict[str, Path]:
    """name → file of every documentation page (``contract`` → docs/contract.md)."""
    root = shipped_dir("docs", "contract.md")
    return {p.stem: p for p in sorted(root.glob("*.md"))}


def _adapters(args) -> int:
    if args.name is not None:
        print(adapter_path(args.name))
        return 0
    width = max(map(len, {**ADAPTERS, **PROGRAMS}))
    correct = [name for name in ADAPTERS if name not in FAIL_ON_PURPOSE]
    for title, names in (("adapters (correct implementations):", correct),
                         ("adapters that fail on purpose, to show what a failing adapter reports (not for use):",
                          FAIL_ON_PURPOSE)):
        print(title)
        for name in names:
            module = ADAPTERS[name][2]
            present = "installed" if importlib.util.find_spec(module) is not None else "not installed"
            print(f"{name:{width}s} needs {module} ({present}): {_summary(adapter_path(name))}")
            print(f"{'':{width}s} {adapter_path(name)}")
    print("example program for ntpref conformance --command:")
    for name, (_, _, compiler) in PROGRAMS.items():
        present = "on PATH" if shutil.which(compiler) else "not on PATH"
        print(f"{name:{width}s} needs a C compiler, {compiler} ({present}): {_summary(adapter_path(name))}")
        print(f"{'':{width}s} {adapter_path(name)}")
    print("run an adapter: ntpref conformance --adapter NAME; build the C example: "
          "cc -O2 -o twostage_eval \"$(ntpref adapters c-twostage-eval)\" -lm (docs/conformance.md); "
          "ntpref adapters NAME prints the path of one file (the correct ones are readable copies to start from)")
    return 0


def _docs(args) -> int:
    pages = docs_pages()
    if args.page is None:
        for name, path in pages.items():
            print(f"{name:14s} {path}")
        return 0
    page = args.page[:-3] if args.page.endswith(".md") else args.page
    if page not in pages:
        raise InputError(f"unknown page {args.page!r}{did_you_mean(page, pages)}; pages: {', '.join(pages)}")
    print(pages[page])
    return 0


def register(subparsers) -> None:
    """Add ``ntpref adapters [NAME]`` and ``ntpref docs [PAGE]``."""
    text = "list the shipped conformance adapters (PyTorch, JAX, NumPy) and the C example, and where their files are"
    p = subparsers.add_parser("adapters", help=text, description=text + "; with NAME, print the path of its file")
    p.add_argument("name", nargs="?", metavar="NAME", help="an adapter or the C example (c-twostage-eval): print "
                   "the path of its file alone")
    p.set_defaults(func=_adapters)
    text = "list the documentation pages shipped with ntpref, or print the path of one"
    p = subparsers.add_parser("docs", help=text, description=text + " (e.g. ntpref docs contract)")
    p.add_argument("page", nargs="?", metavar="PAGE")
    p.set_defaults(func=_docs)
