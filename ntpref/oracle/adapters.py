"""A Python implementation under test, an **adapter** (docs/conformance.md): a file, module, object or dict
defining ``evaluate(model, inputs)`` and/or ``train(model, inputs)``, loaded as an :class:`Adapter`, and the
rule by which whatever its code raises (other than a signal's interruption) becomes an :class:`AdapterError`
carrying the adapter's own exception."""
from __future__ import annotations

import importlib.util
import os
import signal
import sys
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from .. import interrupt
from ..errors import InputError, NtprefError
from .command_adapter import CommandAdapter

#: The adapter function of each kind of case.
FUNCTIONS = {"eval": "evaluate", "train": "train"}


class AdapterError(NtprefError):
    """The adapter raised (other than NotImplementedError) or returned something that is not a dict of arrays.
    ``__cause__`` holds the adapter's own exception, when there is one."""


def _interruption(exc: BaseException) -> bool:
    """Whether ``exc`` comes from a signal rather than from the adapter: :mod:`ntpref.interrupt` recorded
    one, or ``exc`` is a KeyboardInterrupt while SIGINT has Python's default handler (which makes a Ctrl-C
    one, indistinguishable from a raised one)."""
    return interrupt.received() is not None or (
        isinstance(exc, KeyboardInterrupt) and signal.getsignal(signal.SIGINT) is signal.default_int_handler)


def _raised(exc: BaseException) -> str:
    """What the adapter raised: ``KeyError: 'x'`` for an exception, ``SystemExit(0)`` or
    ``KeyboardInterrupt()`` for the others (their text alone says nothing)."""
    return f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else repr(exc)


@contextmanager
def adapter_code(where: str):
    """Run adapter code: whatever it raises, a signal's interruption excepted, becomes the AdapterError
    ``{where} raised {what}``."""
    try:
        yield
    except AdapterError:
        raise
    except BaseException as exc:
        if _interruption(exc):
            raise
        raise AdapterError(f"{where} raised {_raised(exc)}") from exc


class Adapter(NamedTuple):
    """An implementation under test: its ``name`` and its ``evaluate`` / ``train`` functions (None if absent)."""

    name: str
    evaluate: Callable | None
    train: Callable | None

    def function(self, kind: str) -> Callable | None:
        """The function that runs cases of ``kind`` ("eval" | "train")."""
        return getattr(self, FUNCTIONS[kind])


def load_adapter(adapter) -> Adapter:
    """An :class:`Adapter` from a path to a .py file (a file inside a package is imported as that package's
    module, any other file like a script), a module or object with ``evaluate`` / ``train`` attributes,
    or a dict of them.

    A :class:`CommandAdapter` is the Adapter named by its command line.

    InputError when the file is missing or defines neither function; AdapterError when loading it raises."""
    if isinstance(adapter, Adapter):
        return adapter
    if isinstance(adapter, CommandAdapter):
        return Adapter(adapter.command, adapter.evaluate, adapter.train)
    if isinstance(adapter, (str, os.PathLike)):
        name, found = str(adapter), _load_file(Path(adapter)).__dict__
    elif isinstance(adapter, Mapping):
        name, found = "adapter", adapter
    else:
        name, found = getattr(adapter, "__name__", type(adapter).__name__), {
            k: getattr(adapter, k) for k in FUNCTIONS.values() if hasattr(adapter, k)}
    functions = {k: found.get(k) for k in FUNCTIONS.values()}
    for key, fn in functions.items():
        if fn is not None and not callable(fn):
            raise InputError(f"{name}: '{key}' is not a function")
    if not any(functions.values()):
        raise InputError(f"{name}: defines neither evaluate(model, inputs) nor train(model, inputs)")
    return Adapter(name, functions["evaluate"], functions["train"])


def _load_file(path: Path):
    """The adapter file, executed afresh, as a module. A file inside a package (its folder holds an
    ``__init__.py``) is that package's module, as Python would import it: examples/adapters/torch_float64.py
    is ``examples.adapters.torch_float64`` and imports its sibling relatively. Any other file is loaded
    like a script. The folder above the outermost package (for a script: the file's own folder) is on
    sys.path while it loads."""
    if not path.is_file():
        raise InputError(f"{path}: no such adapter file")
    file = path.resolve()
    packages, folder = [], file.parent
    while (folder / "__init__.py").is_file():
        packages.insert(0, folder.name)
        folder = folder.parent
    package = ".".join(packages)
    name = f"{package}.{file.stem}" if package else f"ntpref_adapter_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise InputError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    if package:
        sys.modules[name] = module
    sys.path.insert(0, str(folder))
    try:
        with adapter_code(f"{path}: loading the adapter"):
            spec.loader.exec_module(module)
    except BaseException:
        if package:
            sys.modules.pop(name, None)
        raise
    finally:
        sys.path.remove(str(folder))
    if package in sys.modules:       # imported by the adapter's relative imports: it must be the file's own
        home = getattr(sys.modules[package], "__file__", None)
        if home is None or Path(home).resolve().parent != file.parent:
            raise InputError(f"{path}: package {package} is already imported from elsewhere ({home})")
    return module
