"""Cells and configurations of the reproduction targets: the per-seed grid, choosing one configuration
of a results directory, grouping results along a parameter, and the logged time grid."""
from __future__ import annotations

import math

import numpy as np

from ..errors import InputError

def seed_cells(seeds: int, **config) -> list[dict]:
    """One cell per seed 0..seeds−1, each with the rest of the configuration (the ``cells`` of the
    two-stage targets)."""
    return [{"seed": s, **config} for s in range(int(seeds))]


def select_config(results: list, varying=("seed",)) -> tuple[dict, list, str]:
    """(config, rows, note): the cells of one configuration of a results directory.

    Cells whose parameters differ in more than the names in ``varying`` (e.g. a quick and a full run written
    to the same directory) belong to different configurations. The one with the most cells is chosen (ties:
    the larger parameter values, so a full run beats a quick one); ``rows`` are its (params, arrays) sorted by
    the ``varying`` parameters, ``config`` its shared parameters and ``note`` names the configurations left
    out ("" when there are none). InputError on an empty list."""
    groups: dict[tuple, list] = {}
    for params, arrays in results:
        key = tuple(sorted((k, v) for k, v in params.items() if k not in varying))
        groups.setdefault(key, []).append((params, arrays))
    if not groups:
        raise InputError("no finished cells to summarize")
    best = max(groups, key=lambda k: (len(groups[k]), [v for _, v in k]))
    rows = sorted(groups[best], key=lambda r: [r[0].get(k) for k in varying])
    others = [f"{dict(k)} ({len(v)} cells)" for k, v in groups.items() if k != best]
    note = "ignored other configurations in this directory: " + "; ".join(others) if others else ""
    return dict(best), rows, note


def config_text(config: dict, leave_out=()) -> str:
    """A configuration as the summaries print it: "K = 8192, T = 16, n = 5000" (sorted names, ``leave_out``
    left out)."""
    return ", ".join(f"{k} = {config[k]}" for k in sorted(config) if k not in leave_out)


def per_seed_config(results: list) -> tuple[dict, list, str]:
    """:func:`select_config` over the seeds only, its rows as (seed, arrays) pairs sorted by seed."""
    config, rows, note = select_config(results)
    return config, [(params["seed"], arrays) for params, arrays in rows], note


def by_axis(rows: list, axis: str, value) -> tuple[np.ndarray, list[np.ndarray]]:
    """(sorted values of the parameter ``axis``, per value the array of ``value`` over the rows' seeds);
    ``value`` is the name of a 0-d result or a function arrays -> float."""
    get = value if callable(value) else (lambda arrays: arrays[value])
    per: dict = {}
    for params, arrays in sorted(rows, key=lambda r: r[0]["seed"]):
        per.setdefault(params[axis], []).append(float(get(arrays)))
    xs = sorted(per)
    return np.array(xs, dtype=float), [np.array(per[x]) for x in xs]


def time_grid(T: int, uniform: int = 1000, log: int = 200) -> np.ndarray:
    """[n] int64 sorted steps in 0..T: every ⌈T/uniform⌉-th step, ``log`` log-spaced steps in 1..T, 0 and T."""
    T = int(T)
    if T < 0:
        raise InputError(f"time_grid: T must be >= 0, got {T}")
    stride = max(1, math.ceil(T / max(uniform, 1)))
    parts = [np.arange(0, T + 1, stride), [0, T]]
    if T >= 1:
        parts.append(np.round(np.geomspace(1, T, log)))
    return np.unique(np.concatenate(parts).astype(np.int64))
