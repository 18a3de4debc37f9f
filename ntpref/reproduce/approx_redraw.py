"""The approximation and linearisation errors vs the width m of :mod:`ntpref.reproduce.approx`, with the
inputs and the teacher drawn afresh for every (seed, m), as the authors' approximation script does (it
redraws them for every width from an unseeded generator; here the data set of (seed, m) is that of the
data seed :func:`data_seed`, so the run repeats bit for bit).

``approx`` keeps one data set per seed for every width, so its curve over m is one data set's; here every
point has its own data set, so the curve mixes the width's effect with the spread between data sets. The
medians over the seeds, their fitted slopes and the slopes' bootstrap intervals are those of ``approx``
(its ``summarize``), so the two runs' slopes compare directly. The student heads are the same
paired initialisation as in ``approx`` (seed + INIT_SEED_OFFSET).
"""
from __future__ import annotations

from . import approx

DESCRIPTION = "approx with the inputs and the teacher redrawn for every (seed, m), as the authors' script"

SIZES = approx.SIZES
cells = approx.cells
cell_arrays = approx.cell_arrays
#: The data seed of (seed, m) is DATA_SEED_SCALE · seed + m: distinct for every (seed, m) with m below it, and
#: never one of the seeds (1..10) of ``approx`` or of the width sweep.
DATA_SEED_SCALE = 1000
DATA = "the inputs and the teacher redrawn for every (seed, m)"


def data_seed(seed: int, m: int) -> int:
    """The data seed of the cell (seed, m): DATA_SEED_SCALE · seed + m."""
    return DATA_SEED_SCALE * seed + m


def cell(seed, teacher, m, n, K, T) -> dict:
    """:func:`ntpref.reproduce.approx.cell` on the data set of :func:`data_seed` (seed, m)."""
    return approx.cell(seed, teacher, m, n, K, T, data_seed=data_seed(seed, m))


def summarize(results, outdir) -> approx.Summary:
    """:func:`ntpref.reproduce.approx.summarize`, its first line and title saying how the data were drawn."""
    return approx.summarize(results, outdir, data=DATA)
