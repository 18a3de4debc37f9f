"""The layers of the ntpref package, read from its source (docs/architecture.md, "Layers and modules").

Every module of ntpref/ (found on disk) is parsed with ast, and every import in it is checked, at module
level or inside a function, together with every module name written as a string where it may be
imported dynamically (an item of a tuple, list, set or dict display, or an argument of
``import_module``; e.g. cli.COMMAND_MODULES):

* layers: nothing imports a module of a higher layer (:data:`LAYERS`); the packages of :data:`SEPARATE`
  (the two papers' and the exact backend, which shares no code with them) never import each other;
  inside a paper's package nothing imports a module of a higher rank (:data:`PACKAGE_ORDER`: data, then
  the model and its kernels, then the algorithms, the contract on top);
* private names: no module imports or reads another module's private names (``from x import _y``,
  ``x._y``); a private module (``_m.py``) is private to its package.
* cycles: no import cycle among the modules of one package (module level or inside functions).

The checker itself is tested on small made-up packages, so that every rule is known to fire.
"""
import ast
from fnmatch import fnmatch
from pathlib import Path

import pytest

import ntpref

ROOT = Path(ntpref.__file__).resolve().parent

#: The layers of ntpref, bottom to top. A module may import modules of its own layer and of the layers
#: below it, never of a layer above. Patterns are module names (fnmatch); a new top-level module must be
#: added here, and a new package gets one row.
LAYERS = (
    ("foundation", ("ntpref", "ntpref.errors", "ntpref.checks", "ntpref.progress", "ntpref.interrupt",
                    "ntpref.numba_target", "ntpref.vmath", "ntpref.npzio", "ntpref.npyheader", "ntpref.blas",
                    "ntpref.jsonio", "ntpref.tolerance", "ntpref.rounding", "ntpref.spec", "ntpref.shipped")),
    ("papers", ("ntpref.twostage", "ntpref.twostage.*", "ntpref.shallow", "ntpref.shallow.*", "ntpref.exact",
                "ntpref.exact.*")),
    ("registry", ("ntpref.models", "ntpref.backend", "ntpref.precompile")),
    ("oracle", ("ntpref.oracle", "ntpref.oracle.*", "ntpref.testing")),
    ("sweep", ("ntpref.sweep",)),
    ("experiments", ("ntpref.reproduce", "ntpref.reproduce.*", "ntpref.bench")),
    ("command line", ("ntpref.cli",)),
)
#: Packages of one layer that never import each other: the two papers, and the exact backend (docs/exact.md),
#: a restatement of both papers' math that must share no code with their float64 backends.
SEPARATE = ("ntpref.twostage", "ntpref.shallow", "ntpref.exact")

#: Inside each paper's package, the ranks bottom to top: a module may import modules of its own rank and
#: below. Patterns are module file names without ".py" ("__init__" is the package's own module); the first
#: rank whose pattern matches wins, and a module that no pattern names belongs to the first rank, the data
#: (data sets, generators and the small building blocks the models use), so that files split off a data
#: module, or new building blocks, need no entry. A new model, algorithm or contract module needs one.
PACKAGE_ORDER = {
    "ntpref.twostage": (
        ("data", ()),
        ("model", ("model", "kernels")),
        ("max-margin", ("least_norm", "svm")),
        ("algorithm", ("two_stage",)),
        ("evaluation", ("generalization",)),
        ("contract", ("contract", "magnitudes", "cases", "spec", "__init__")),
    ),
    "ntpref.shallow": (
        ("data", ()),
        ("model", ("model", "kernels", "indrnn", "*_kernels")),
        ("ntk", ("ntk", "teacher")),
        ("algorithm", ("projgd",)),
        ("contract", ("contract", "magnitudes", "cases", "spec", "__init__")),
    ),
}


def module_name(path: str) -> tuple[str, bool]:
    """(dotted name, is a package) of a file given relative to ntpref/ ("a/b.py", "a/__init__.py")."""
    parts = ["ntpref", *Path(path).with_suffix("").parts]
    return (".".join(parts[:-1]), True) if parts[-1] == "__init__" else (".".join(parts), False)


def package_of(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def layer(module: str) -> int | None:
    return next((i for i, (_, patterns) in enumerate(LAYERS) if any(fnmatch(module, p) for p in patterns)), None)


def separate(module: str) -> str | None:
    return next((p for p in SEPARATE if module == p or module.startswith(p + ".")), None)


def rank(module: str, is_package: bool) -> tuple[str, int, str] | None:
    """(package, rank, rank name) of a module of a package of PACKAGE_ORDER, else None."""
    package = package_of(module, is_package)
    if package not in PACKAGE_ORDER:
        return None
    short = "__init__" if is_package else module.rpartition(".")[2]
    ranks = PACKAGE_ORDER[package]
    index = next((i for i, (_, patterns) in enumerate(ranks) if any(fnmatch(short, p) for p in patterns)), 0)
    return package, index, ranks[index][0]


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


class Module:
    """One parsed module: its name, file, syntax tree, and the names of all ntpref modules (→ is a package)."""

    def __init__(self, path: str, source: str, known: dict[str, bool]):
        self.path, (self.name, self.is_package) = f"ntpref/{path}", module_name(path)
        self.tree, self.known = ast.parse(source), known
        self.package = package_of(self.name, self.is_package)

    def base(self, node: ast.ImportFrom) -> str:
        """The absolute module a ``from ... import`` reads from."""
        if not node.level:
            return node.module or ""
        parts = self.package.split(".")
        return ".".join(parts[: len(parts) - (node.level - 1)] + ([node.module] if node.module else []))

    def imports(self):
        """(line, ntpref module imported, full name imported, is a dynamic import) of every import: ``from m
        import x`` imports module m.x if there is one, else m; a dynamic import is a module's name as a string
        (:func:`listed_names`)."""
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in self.known:
                        yield node.lineno, alias.name, alias.name, False
            elif isinstance(node, ast.ImportFrom):
                base = self.base(node)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in self.known else base
                    if target in self.known:
                        yield node.lineno, target, full, False
            for const in listed_names(node):
                if const.value in self.known:
                    yield const.lineno, const.value, const.value, True

    def attribute_reads(self):
        """(line, full name) of every ``module.attribute`` whose left side is an ntpref module bound by an
        import anywhere in the file (``import ntpref.a.b`` binds ``ntpref``)."""
        bound = {}
        for node in ast.walk(self.tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in self.known:
                        bound[alias.asname or "ntpref"] = alias.name if alias.asname else "ntpref"
            elif isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (full := f"{self.base(node)}.{alias.name}") in self.known:
                        bound[alias.asname or alias.name] = full

        def resolve(expr) -> str | None:
            if isinstance(expr, ast.Name):
                return bound.get(expr.id)
            if isinstance(expr, ast.Attribute):
                left = resolve(expr.value)
                return f"{left}.{expr.attr}" if f"{left}.{expr.attr}" in self.known else None
            return None

        for node in ast.walk(self.tree):
            if isinstance(node, ast.Attribute) and (left := resolve(node.value)) is not None:
                yield node.lineno, f"{left}.{node.attr}"

    def foreign_private(self, full: str) -> str | None:
        """The first private part of ``full`` (as a full name) unless it is this module's own name or a
        private module of this module's package."""
        parts = full.split(".")
        for i in range(1, len(parts)):
            if private(parts[i]):
                thing, owner = ".".join(parts[: i + 1]), ".".join(parts[:i])
                mine = owner == self.package if thing in self.known else owner == self.name
                return None if mine else thing
        return None


def listed_names(node) -> list[ast.Constant]:
    """The string constants that may name a module to import: the arguments of ``import_module(...)`` or
    ``__import__(...)``, the items of a tuple, list or set display, the values of a dict display."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) in (
            "import_module", "__import__"):
        items = node.args
    elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = node.elts
    elif isinstance(node, ast.Dict):
        items = node.values
    else:
        items = []
    return [c for c in items if isinstance(c, ast.Constant) and isinstance(c.value, str)]


def parse(files: dict[str, str]) -> list[Module]:
    known = dict(module_name(path) for path in files)
    return [Module(path, source, known) for path, source in files.items()]


def report(found: list[tuple[str, int, str]]) -> list[str]:
    """"path:line: text" lines ordered by file and line, each once."""
    return [f"{path}:{line}: {text}" if line else f"{path}: {text}" for path, line, text in sorted(set(found))]


def layer_violations(files: dict[str, str]) -> list[str]:
    """One line per import that breaks a rule of LAYERS, SEPARATE or PACKAGE_ORDER (files: path relative to
    ntpref/ → source), and per module that no layer names."""
    found = []
    for m in parse(files):
        own = layer(m.name)
        if own is None:
            found.append((m.path, 0, f"{m.name} is in no layer of LAYERS (tests/test_layers.py)"))
            continue
        own_rank = rank(m.name, m.is_package)
        for line, target, _, dynamic in m.imports():
            if target == m.name:
                continue
            other, theirs = layer(target), rank(target, m.known[target])
            what = f"{m.name} {'names' if dynamic else 'imports'} {target}"
            if other is not None and other > own:
                found.append((m.path, line, f"{what}: layer '{LAYERS[other][0]}' is above '{LAYERS[own][0]}'"))
            elif separate(m.name) and separate(target) and separate(m.name) != separate(target):
                found.append((m.path, line, f"{what}: {separate(m.name)} and {separate(target)} are separate "
                              "packages (SEPARATE), they never import each other"))
            elif own_rank and theirs and theirs[0] == own_rank[0] and theirs[1] > own_rank[1]:
                found.append((m.path, line, f"{what}: in {own_rank[0]}, '{theirs[2]}' is above '{own_rank[2]}'"))
    return report(found)


def private_violations(files: dict[str, str]) -> list[str]:
    """One line per import or read of another module's private name (files as for layer_violations)."""
    found = []
    for m in parse(files):
        uses = [(line, full, "imports") for line, _, full, dynamic in m.imports() if not dynamic]
        uses += [(line, full, "reads") for line, full in m.attribute_reads()]
        for line, full, verb in uses:
            if (thing := m.foreign_private(full)) is not None:
                found.append((m.path, line, f"{m.name} {verb} the private name {thing}"))
    return report(found)


def cycle_violations(files: dict[str, str]) -> list[str]:
    """One line per import cycle among the modules of one package (files as for layer_violations): imports at
    module level or inside functions, not counting a module's imports of its own package's ``__init__``."""
    graph: dict[str, dict[str, tuple[str, int]]] = {}
    for m in parse(files):
        for line, target, _, dynamic in m.imports():
            if (not dynamic and target != m.name and target != m.package and not m.known[target]
                    and package_of(target, False) == m.package):
                graph.setdefault(m.name, {}).setdefault(target, (m.path, line))
    found, state = [], {}

    def visit(name: str, path: list[str]) -> None:
        state[name] = "open"
        for target in sorted(graph.get(name, {})):
            if state.get(target) == "open":
                loop = path[path.index(target):] + [target]
                where, line = graph[name][target]
                found.append((where, line, "import cycle: " + " -> ".join(loop)))
            elif target not in state:
                visit(target, path + [target])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    return report(found)


def package_files() -> dict[str, str]:
    return {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in sorted(ROOT.rglob("*.py"))}


def test_no_module_imports_upward():
    found = layer_violations(package_files())
    assert not found, f"{len(found)} import(s) break the layers:\n" + "\n".join(found)


def test_no_import_cycle_inside_a_package():
    found = cycle_violations(package_files())
    assert not found, f"{len(found)} import cycle(s):\n" + "\n".join(found)


def test_no_module_uses_another_modules_private_names():
    found = private_violations(package_files())
    assert not found, f"{len(found)} use(s) of another module's private names:\n" + "\n".join(found)


def test_the_tables_name_real_modules():
    """Every pattern of the tables matches a module on disk (a renamed module cannot leave a dead rule)."""
    names = [module_name(path) for path in package_files()]
    for _, patterns in LAYERS:
        for p in patterns:
            assert any(fnmatch(name, p) for name, _ in names), f"LAYERS: no module matches {p!r}"
    for package, ranks in PACKAGE_ORDER.items():
        shorts = ["__init__" if is_pkg else name.rpartition(".")[2]
                  for name, is_pkg in names if package_of(name, is_pkg) == package]
        for _, patterns in ranks:
            for p in patterns:
                assert any(fnmatch(s, p) for s in shorts), f"PACKAGE_ORDER[{package!r}]: no module matches {p!r}"


# --- the checker on made-up packages ------------------------------------------------------------------
PAPERS = {"__init__.py": "", "errors.py": "", "vmath.py": "", "cli.py": "", "sweep.py": "",
          "twostage/__init__.py": "", "twostage/model.py": "", "twostage/kernels.py": "from .. import vmath\n",
          "twostage/two_stage.py": "", "shallow/__init__.py": "", "shallow/model.py": "", "shallow/ntk.py": "",
          "oracle/__init__.py": "", "oracle/contract.py": ""}


def test_checker_finds_upward_imports_also_inside_functions():
    files = {**PAPERS,
             "errors.py": "def f():\n    from .oracle import contract\n",
             "twostage/dataset.py": "import ntpref.errors\nfrom . import orders\n",          # allowed
             "twostage/orders.py": "from .dataset import Dataset\n\n\ndef g():\n    from .two_stage import train\n",
             "shallow/data.py": "from ntpref.shallow.ntk import jvp\nfrom .model import forward\n",
             "shallow/model.py": "from ..twostage import model\n",
             "oracle/contract.py": "MODELS = ('ntpref.shallow.model', 'ntpref.cli')\n",
             "sweep.py": "from .cli import main\n"}
    assert layer_violations(files) == [
        "ntpref/errors.py:2: ntpref.errors imports ntpref.oracle.contract: layer 'oracle' is above 'foundation'",
        "ntpref/oracle/contract.py:1: ntpref.oracle.contract names ntpref.cli: layer 'command line' is above "
        "'oracle'",
        "ntpref/shallow/data.py:1: ntpref.shallow.data imports ntpref.shallow.ntk: in ntpref.shallow, 'ntk' is "
        "above 'data'",
        "ntpref/shallow/data.py:2: ntpref.shallow.data imports ntpref.shallow.model: in ntpref.shallow, 'model' "
        "is above 'data'",
        "ntpref/shallow/model.py:1: ntpref.shallow.model imports ntpref.twostage.model: ntpref.shallow and "
        "ntpref.twostage are separate packages (SEPARATE), they never import each other",
        "ntpref/sweep.py:1: ntpref.sweep imports ntpref.cli: layer 'command line' is above 'sweep'",
        "ntpref/twostage/orders.py:5: ntpref.twostage.orders imports ntpref.twostage.two_stage: in ntpref.twostage, "
        "'algorithm' is above 'data'",
    ]


def test_checker_keeps_the_exact_backend_apart_from_the_papers():
    """The exact backend may use the foundation and its own modules, never a paper's package (either way);
    the oracle above may use it."""
    files = {**PAPERS,
             "exact/__init__.py": "from . import arith\nfrom ..checks import as_scalar\n",         # allowed
             "exact/arith.py": "from .. import errors\n",                                          # allowed
             "exact/twostage.py": "from ..twostage import model\n\n\ndef f():\n    import ntpref.shallow.ntk\n",
             "shallow/ntk.py": "from ..exact import arith\n",
             "oracle/contract.py": "from .. import exact\n",                                       # allowed
             "checks.py": ""}
    assert layer_violations(files) == [
        "ntpref/exact/twostage.py:1: ntpref.exact.twostage imports ntpref.twostage.model: ntpref.exact and "
        "ntpref.twostage are separate packages (SEPARATE), they never import each other",
        "ntpref/exact/twostage.py:5: ntpref.exact.twostage imports ntpref.shallow.ntk: ntpref.exact and "
        "ntpref.shallow are separate packages (SEPARATE), they never import each other",
        "ntpref/shallow/ntk.py:1: ntpref.shallow.ntk imports ntpref.exact.arith: ntpref.shallow and ntpref.exact "
        "are separate packages (SEPARATE), they never import each other",
    ]


def test_checker_finds_import_cycles_also_inside_functions():
    files = {**PAPERS,
             "oracle/cases.py": "from . import contract\n",
             "oracle/contract.py": "def f():\n    from .envelope import bound\n",
             "oracle/envelope.py": "from .cases import TRAJECTORIES\n",
             "oracle/__init__.py": "from .cases import cases\n",
             "oracle/compare.py": "from . import __version__\nfrom .. import oracle\n",    # the package: allowed
             "twostage/model.py": "from . import kernels\n",
             "twostage/kernels.py": "from . import model\n"}
    assert cycle_violations(files) == [
        "ntpref/oracle/envelope.py:1: import cycle: ntpref.oracle.cases -> ntpref.oracle.contract -> "
        "ntpref.oracle.envelope -> ntpref.oracle.cases",
        "ntpref/twostage/model.py:1: import cycle: ntpref.twostage.kernels -> ntpref.twostage.model -> "
        "ntpref.twostage.kernels",
    ]


def test_checker_finds_unlayered_modules():
    assert layer_violations({**PAPERS, "newtool.py": ""}) == [
        "ntpref/newtool.py: ntpref.newtool is in no layer of LAYERS (tests/test_layers.py)"]


def test_checker_finds_private_names():
    files = {**PAPERS,
             "shallow/_common.py": "",
             "shallow/model.py": "from . import _common\nfrom ._common import helper\n_own = 1\nx = _own\n",
             "twostage/two_stage.py": "from . import model\n\n\ndef f():\n    return model._prepared(model.forward)\n",
             "oracle/contract.py": ("import ntpref.shallow.model\nimport ntpref.twostage.two_stage as t\n"
                                    "from ..shallow.model import _own\nfrom ..shallow import _common\n"
                                    "from .. import __version__\n"
                                    "y = ntpref.shallow.model._own + t._step + t.__name__\n")}
    assert private_violations(files) == [
        "ntpref/oracle/contract.py:3: ntpref.oracle.contract imports the private name ntpref.shallow.model._own",
        "ntpref/oracle/contract.py:4: ntpref.oracle.contract imports the private name ntpref.shallow._common",
        "ntpref/oracle/contract.py:6: ntpref.oracle.contract reads the private name ntpref.shallow.model._own",
        "ntpref/oracle/contract.py:6: ntpref.oracle.contract reads the private name ntpref.twostage.two_stage._step",
        "ntpref/twostage/two_stage.py:5: ntpref.twostage.two_stage reads the private name ntpref.twostage.model._prepared",
    ]


@pytest.mark.parametrize("path, expected", [
    ("twostage/orders.py", ("ntpref.twostage", 0, "data")),            # not named: data
    ("twostage/kernels.py", ("ntpref.twostage", 1, "model")),
    ("shallow/indrnn_kernels.py", ("ntpref.shallow", 1, "model")),
    ("shallow/__init__.py", ("ntpref.shallow", 4, "contract")),
    ("oracle/cases.py", None),
])
def test_rank_of_a_module(path, expected):
    assert rank(*module_name(path)) == expected
