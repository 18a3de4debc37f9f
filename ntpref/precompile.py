"""Compiling a command's Numba kernels before their first use, on two cores at once.

A first run on an empty Numba cache spends most of its time compiling, one kernel after another, on one
core. When some of the kernels a command needs are not in Numba's cache and the process may use a second
core, :func:`warm` compiles the ``side`` groups in a helper process (:func:`_main`, also ``python -m
ntpref.precompile GROUP ...``, which fills Numba's on-disk cache and exits) while this process compiles the
``main`` groups; the side groups' kernels are then loaded from the cache at their first call here. Numba's
cache holds what this process would have compiled, so no result changes, only the wall time of a first
run. A helper that fails costs only time: this process then compiles what it still needs itself.

A group is a call of the public code on a tiny input that compiles, with the argument types a real run
passes, the kernels it names:

    twostage.train    the normalized-GD loop of Algorithm 1 (``kernels.ngd_steps`` and the pass it runs)
    twostage.phases   the reduction of a pass and its stable attention-gradient phase
                      (``kernels.reduce_into``, ``kq_stable_rows``), with the argument types the loop gives them
    twostage.solver   the max-margin solver (``least_norm``'s NNLS kernel)
    twostage.pass     the one-call pass of ``forward`` / ``loss_and_grad`` on a small set (``pass_serial``)

A group's kernels that another process has already written to the cache are loaded, not compiled: the
training loop's compilation, the longest, loads the two kernels it reaches last, which the helper compiles
first while this process compiles the loop's first kernels (the forward phase among them), so the two
processes share the loop's work as well. Which process compiles a kernel never changes its code.
"""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

HELPER_TIMEOUT = 300.0   # seconds this process waits for the helper after its own compiling; then it stops it


def _twostage_data():
    from .twostage import model, random_realizable

    ds = random_realizable(K=3, N=2, seed=0).dataset
    return ds, model.prepare(ds)


def _twostage_train() -> None:
    from .progress import silent
    from .twostage import two_stage

    ds, prep = _twostage_data()
    W = np.zeros((ds.d, ds.d))
    two_stage.ngd(prep, W, W, True, W, np.zeros(ds.N, dtype=np.int64), 0.1, 0, "stable", set(), "numba",
                  "stage 2", silent)


def _twostage_phases() -> None:
    from .twostage import kernels

    _, prep = _twostage_data()
    N, Lmax = prep.tokens.shape
    K = prep.K
    slots = getattr(kernels.slots, "py_func", kernels.slots)   # plain Python: the loop compiles `slots`
    ws = slots(N, Lmax, K)
    for slot in ws:
        slot[...] = 0                          # l1 indexes the sentences' positions
    kernels.reduce_into(prep.tokens, prep.lengths, prep.weights, np.int64(kernels.MODE_FORWARD), ws.losses,
                         ws.lam, ws.gz, ws.attn, ws.gs, np.empty(N), np.zeros((K, K)), np.zeros((K, K)))
    B = np.zeros((K, K))
    kernels.kq_stable_rows(np.int64(0), np.int64(N), prep.tokens, prep.lengths, prep.weights, B, B, ws)


def _twostage_solver() -> None:
    from .twostage import least_norm

    least_norm.least_norm(np.eye(2))


def _twostage_pass() -> None:
    from .twostage import model

    ds, prep = _twostage_data()
    W = np.zeros((ds.d, ds.d))
    model.forward(prep, W, W)


class Group(NamedTuple):
    """A group of kernels (module docstring): ``compile()`` compiles them; ``kernels`` names their Numba
    dispatchers ("module:name"), whose cache tells whether the group is compiled (:func:`cached`)."""
    compile: Callable[[], None]
    kernels: tuple[str, ...]


_KERNELS = "ntpref.twostage.kernels:"
#: group name -> its :class:`Group` (module docstring)
GROUPS = {"twostage.train": Group(_twostage_train, (_KERNELS + "ngd_steps",)),
          "twostage.phases": Group(_twostage_phases, (_KERNELS + "reduce_into", _KERNELS + "kq_stable_rows")),
          "twostage.solver": Group(_twostage_solver, ("ntpref.twostage.least_norm:nnls_kernel",)),
          "twostage.pass": Group(_twostage_pass, (_KERNELS + "pass_serial",))}


def dispatchers(name: str) -> list:
    """The Numba dispatchers of group ``name`` (imported here)."""
    out = []
    for ref in GROUPS[name].kernels:
        module, attr = ref.split(":")
        out.append(getattr(importlib.import_module(module), attr))
    return out


#: (main, side) groups of a run of Algorithm 1 (``twostage.train``; its loss floor is a forward pass of the
#: loop): the loop here; the phases, then the solver, in the helper
TWOSTAGE_TRAINING = (("twostage.train",), ("twostage.phases", "twostage.solver"))
#: the same, and the one-call pass, for runs that also evaluate with ``forward``
TWOSTAGE_TRAINING_AND_PASS = (("twostage.train",), ("twostage.phases", "twostage.solver", "twostage.pass"))


def cached(name: str) -> bool:
    """True when Numba's on-disk cache holds entries of every kernel of group ``name`` that are current (the
    index of the kernel's file is of this Numba and of the source as it is now; whether an entry fits this
    machine is Numba's to decide at the first call). The index is read through Numba's internals
    (``dispatcher._cache``); a Numba without them counts as cached, so nothing is compiled ahead of use."""
    for dispatcher in dispatchers(name):
        load = getattr(getattr(getattr(dispatcher, "_cache", None), "_cache_file", None), "_load_index", None)
        if load is None:
            continue
        try:
            if not load():
                return False
        except Exception:      # noqa: BLE001 - an unreadable index is an empty one to Numba as well
            return False
    return True


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def warm(main: tuple[str, ...], side: tuple[str, ...], note=None) -> None:
    """Compile the kernels of the groups ``main`` here and those of ``side`` in a helper process at the same
    time, when some of them are not cached yet (nothing when all are); ``note(text)`` is told first. With one
    core, or when only side groups are missing (a helper would leave this process waiting), or when the
    helper cannot be started, everything missing compiles here."""
    missing = [name for name in (*main, *side) if not cached(name)]
    if not missing:
        return
    if note is not None:
        note("compiling the Numba kernels (first run on this machine; cached for the next ones)")
    to_helper = [name for name in side if name in missing]
    helper = None
    if to_helper and any(name in missing for name in main) and _cores() > 1:
        helper = _start_helper(to_helper)
    try:
        for name in missing:
            if helper is None or name not in to_helper:
                GROUPS[name].compile()
        if helper is not None:
            helper.wait(timeout=HELPER_TIMEOUT)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if helper is not None and helper.poll() is None:
            helper.kill()
            helper.wait()


def _start_helper(groups: list[str]) -> subprocess.Popen | None:
    """A helper process running :func:`_main` on ``groups`` with this process's environment and this ntpref
    first on its path (ahead of the current directory); its output is discarded. None when it cannot be
    started."""
    root = str(Path(__file__).resolve().parents[1])
    code = ("import sys; sys.path.insert(0, sys.argv[1]); from ntpref.precompile import _main; "
            "sys.exit(_main(sys.argv[2:]))")
    try:
        return subprocess.Popen([sys.executable, "-c", code, root, *groups], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except OSError:
        return None


def _main(argv: list[str]) -> int:
    unknown = [name for name in argv if name not in GROUPS]
    if unknown:
        print(f"ntpref.precompile: unknown group(s) {', '.join(unknown)}; groups: {', '.join(GROUPS)}",
              file=sys.stderr)
        return 2
    for name in argv:
        GROUPS[name].compile()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
