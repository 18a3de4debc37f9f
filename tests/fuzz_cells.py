"""The cells surface of the command-line fuzzer (tests/fuzz_cli.py): ``ntpref reproduce --summarize-only`` on
damaged copies of committed reproduction cells."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from ntpref.npzio import load_npz, save_npz

from fuzz_common import Fixtures, Result, _call, _result, classify
from fuzz_npz import ARRAY_MUTATIONS


# ---- reproduction cells: damaged copies of committed cells ---------------------------------------------------

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
#: Targets whose committed full-size cells the cells runs damage: few cells, quick summaries.
CELL_TARGETS = ("approx", "twostage")


def cells_run(ch, fx: Fixtures) -> Result:
    """``reproduce TARGET --full --summarize-only`` on committed cells, one or two of them damaged (see
    tests/fuzz_cli.py)."""
    target, out = ch.choice(CELL_TARGETS), fx.fresh("cells")
    celldir = out / target / "full" / "cells"
    shutil.copytree(RESULTS / target / "full" / "cells", celldir)
    damaged, steps = set(), []
    for _ in range(ch.integer(1, 2)):
        path, name = ch.choice(sorted(celldir.iterdir())), ch.choice(sorted(ARRAY_MUTATIONS))
        arrays = load_npz(path)
        kept = {k: arrays.pop(k) for k in ("cell_params", "cell_version") if k in arrays}
        save_npz(path, {**ARRAY_MUTATIONS[name](arrays, ch), **kept})
        damaged.add(path)
        steps.append(name)
    rc, _, err = _call(["reproduce", target, "--full", "--summarize-only", "--out", out, "-q"])
    outcome, why = classify(rc, err)
    if outcome == "failed":
        why = "exit 1"
    elif outcome == "rejected" and not any(str(p) in err for p in damaged):
        why = "the error names no damaged cell"
    elif outcome == "accepted":
        summary = (out / target / "full" / "summary.txt").read_text()
        silent = [p for p in damaged if str(p) not in summary
                  and any(a.dtype.kind == "f" and not np.all(np.isfinite(a)) for a in load_npz(p).values())]
        why = f"NaN or inf of {silent[0].name} not named in the summary" if silent else None
    return _result(f"reproduce {target} --summarize-only, {'+'.join(steps)}", steps, rc, err, why, outcome)
