"""Provenance: what produced a stored result, recorded in the manifest of the reference cases
(:mod:`ntpref.oracle.manifest`) and printed by ``ntpref verify -v``."""
from __future__ import annotations

import functools
import os
import platform
import subprocess
from collections.abc import Mapping
from pathlib import Path

import numba
import numpy as np

from .. import __version__
from ..numba_target import configured_target


def provenance() -> dict:
    """What produces a result in this process: the ntpref version and git commit (:func:`git_commit`), the
    NumPy, Numba and Python versions, the system and architecture, the CPU model (:func:`cpu_model`) and the
    Numba CPU target the kernels are compiled for (:func:`ntpref.numba_target.configured_target`: CPU name
    and features, hence the vector width the ``ntpref`` command configured)."""
    return {"ntpref": __version__, "git": git_commit(), "numpy": np.__version__, "numba": numba.__version__,
            "python": platform.python_version(), "machine": f"{platform.system()} {platform.machine()}",
            "cpu": cpu_model(), "numba_target": configured_target()}


@functools.cache
def git_commit() -> str:
    """The commit of the git checkout ntpref is imported from, with "+modified" when its ``ntpref/`` sources
    differ from it (changed or new files); "unknown" for an installed copy or without git. Git runs without
    optional locks, so it never competes with another git process for the index."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists() or not (root / "ntpref" / "__init__.py").is_file():
        return "unknown"
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, env=env,
                              timeout=30, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        modified = git("status", "--porcelain", "--", "ntpref")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+modified" if modified else "")


@functools.cache
def cpu_model() -> str:
    """The CPU's model name ("model name" of /proc/cpuinfo, else :func:`platform.processor`, else "unknown")."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or "unknown"


def provenance_text(prov: Mapping) -> str:
    """A provenance record (:func:`provenance`) on one line; fields an older record lacks are left out."""
    target = prov.get("numba_target")
    parts = (f"ntpref {prov['ntpref']}" if "ntpref" in prov else "",
             f"git {prov['git']}" if "git" in prov else "",
             *(f"{label} {prov[key]}" for label, key in (("NumPy", "numpy"), ("Numba", "numba"), ("Python", "python"))
               if key in prov),
             prov.get("machine", ""), prov.get("cpu", ""),
             f"Numba target {target.get('cpu')} ({target.get('features') or 'no features'})"
             if isinstance(target, Mapping) else "")
    return ", ".join(p for p in parts if p) or "(no provenance)"
