"""The files shipped beside the code, found the same way in a clone and in an installed package.

In a clone of the repository (or an editable install) they are the repository's own directories
``docs/``, ``examples/adapters/`` and ``reference_runs/``; a built wheel or sdist installs them as
``ntpref/docs``, ``ntpref/adapters`` and ``ntpref/reference_runs`` (setup.py maps them), so the commands
that use them (``ntpref verify``, ``ntpref conformance --adapter NAME``, ``ntpref docs``) work on any
install. Commands:

    ntpref adapters          the shipped conformance adapters: name, framework, installed or not, file
    ntpref docs [PAGE]       the documentation pages (their files), or the path of one page
"""
from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from .checks import did_you_mean
from .errors import InputError

_ROOT = Path(__file__).resolve().parent
#: installed name → the repository's directory (relative to the repository root)
_DIRS = {"docs": "docs", "adapters": "examples/adapters", "reference_runs": "reference_runs"}
#: The shipped adapters: name → (module file stem, the framework it needs).
ADAPTERS = {"torch-float64": ("torch_float64", "torch"), "torch-float32": ("torch_float32", "torch"),
            "jax-float64": ("jax_float64", "jax"), "jax-float32": ("jax_float32", "jax")}


def shipped_dir(name: str, marker: str) -> Path:
    """The directory ``name`` ("docs" | "adapters" | "reference_runs"): the repository's own when this is a
    clone holding ``marker`` there (a file that identifies it), else the copy installed inside the package."""
    checkout = _ROOT.parent / _DIRS[name]
    return checkout if (checkout / marker).is_file() else _ROOT / name


def adapter_path(name: str) -> Path:
    """The file of the shipped adapter ``name`` (:data:`ADAPTERS`); InputError for an unknown name."""
    if name not in ADAPTERS:
        raise InputError(f"unknown adapter {name!r}{did_you_mean(name, ADAPTERS)}; shipped: {', '.join(ADAPTERS)}")
    stem = ADAPTERS[name][0]
    path = shipped_dir("adapters", f"{stem}.py") / f"{stem}.py"
    if not path.is_file():
        raise InputError(f"adapter {name!r}: {path} is missing from this install")
    return path


def _summary(path: Path) -> str:
    """The first sentence of a module's docstring, on one line (read without importing the module)."""
    doc = " ".join((ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or "").split("\n\n")[0].split())
    return doc.split(". ")[0].rstrip(".:")


def docs_pages() -> dict[str, Path]:
    """name → file of every documentation page (``contract`` → docs/contract.md)."""
    root = shipped_dir("docs", "contract.md")
    return {p.stem: p for p in sorted(root.glob("*.md"))}


def _adapters(args) -> int:
    for name, (stem, framework) in ADAPTERS.items():
        path = adapter_path(name)
        present = importlib.util.find_spec(framework) is not None
        print(f"{name:14s} needs {framework} ({'installed' if present else 'not installed'}): {_summary(path)}")
        print(f"{'':14s} {path}")
    print("run one: ntpref conformance --adapter NAME (the files are the readable copies to start from)")
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
    """Add ``ntpref adapters`` and ``ntpref docs [PAGE]``."""
    text = "list the shipped conformance adapters (PyTorch, JAX) and where their files are"
    p = subparsers.add_parser("adapters", help=text, description=text)
    p.set_defaults(func=_adapters)
    text = "list the documentation pages shipped with ntpref, or print the path of one"
    p = subparsers.add_parser("docs", help=text, description=text + " (e.g. ntpref docs contract)")
    p.add_argument("page", nargs="?", metavar="PAGE")
    p.set_defaults(func=_docs)
