"""How ``ntpref conformance`` loads an adapter file (docs/conformance.md): a file inside a package as that
package's module (relative imports work), any other file like a script (modules next to it import);
sys.path is as before afterwards, and a package name already taken by another folder is refused."""
import re
import sys

import pytest

from ntpref.errors import InputError
from ntpref.oracle.conformance import AdapterError, load_adapter

EVALUATE = "def evaluate(model, inputs):\n    return {'f': inputs['X']}\n"


@pytest.fixture
def fresh_modules():
    """Forget the modules a test imports under the made-up names used here."""
    yield
    for name in [n for n in sys.modules if n.split(".")[0] in ("adapterpkg", "adapter_helper")]:
        del sys.modules[name]


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_file_in_a_package_is_that_packages_module(tmp_path, fresh_modules):
    write(tmp_path / "adapterpkg" / "__init__.py", "")
    write(tmp_path / "adapterpkg" / "sub" / "__init__.py", "")
    write(tmp_path / "adapterpkg" / "sub" / "restatement.py", EVALUATE)
    path = write(tmp_path / "adapterpkg" / "sub" / "mine.py", "from .restatement import evaluate\n")
    before = list(sys.path)
    adapter = load_adapter(path)
    assert sys.path == before
    assert adapter.evaluate.__module__ == "adapterpkg.sub.restatement" and adapter.train is None
    assert sys.modules["adapterpkg.sub.mine"].__file__ == str(path)
    assert adapter.evaluate("shallow", {"X": 3})["f"] == 3
    assert load_adapter(path).evaluate is adapter.evaluate   # loaded again; the sibling is imported once


def test_file_outside_a_package_imports_its_neighbours(tmp_path, fresh_modules):
    write(tmp_path / "adapter_helper.py", EVALUATE)
    path = write(tmp_path / "mine.py", "from adapter_helper import evaluate\n")
    before = list(sys.path)
    assert load_adapter(path).evaluate.__module__ == "adapter_helper"
    assert sys.path == before and "ntpref_adapter_mine" not in sys.modules


def test_package_already_imported_from_elsewhere_is_refused(tmp_path, fresh_modules):
    for folder in ("first", "second"):
        write(tmp_path / folder / "adapterpkg" / "__init__.py", "")
        write(tmp_path / folder / "adapterpkg" / "restatement.py", EVALUATE)
    load_adapter(write(tmp_path / "first" / "adapterpkg" / "mine.py", "from .restatement import evaluate\n"))
    path = write(tmp_path / "second" / "adapterpkg" / "mine.py", "from .restatement import evaluate\n")
    first = tmp_path / "first" / "adapterpkg" / "__init__.py"
    with pytest.raises(InputError, match=re.escape(f"{path}: package adapterpkg is already imported from "
                                                   f"elsewhere ({first})")):
        load_adapter(path)


def test_package_module_that_raises_while_loading_is_forgotten(tmp_path, fresh_modules):
    write(tmp_path / "adapterpkg" / "__init__.py", "")
    path = write(tmp_path / "adapterpkg" / "broken.py", "from .missing import evaluate\n")
    with pytest.raises(AdapterError, match=re.escape(f"{path}: loading the adapter raised ModuleNotFoundError: "
                                                     "No module named 'adapterpkg.missing'")):
        load_adapter(path)
    assert "adapterpkg.broken" not in sys.modules
