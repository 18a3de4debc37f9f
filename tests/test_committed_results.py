"""The committed full-size summaries are what the committed cells give: for every target whose full grid of
cells is in docs/results/TARGET/full/cells/, ``summarize`` rebuilds summary.txt byte for byte (the table
``ntpref reproduce TARGET --full --summarize-only --out docs/results`` writes)."""
import shutil
from pathlib import Path

import pytest

from ntpref.reproduce import TARGETS, run_target, target_module
from ntpref.sweep import cell_key

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def complete(name: str) -> bool:
    """Whether every cell of the target's full grid is committed."""
    celldir = RESULTS / name / "full" / "cells"
    mod = target_module(name)
    return all((celldir / f"{cell_key(c)}.npz").is_file() for c in mod.cells(**mod.SIZES["full"]))


COMPLETE = [name for name in TARGETS if complete(name)]


def test_some_target_has_its_full_cells_committed():
    assert {"twostage", "generalization", "approx"} <= set(COMPLETE)


@pytest.mark.parametrize("name", COMPLETE)
def test_committed_summary_is_what_the_committed_cells_give(name, tmp_path):
    shutil.copytree(RESULTS / name / "full" / "cells", tmp_path / name / "full" / "cells")
    run_target(name, "full", tmp_path, summarize_only=True)
    assert (tmp_path / name / "full" / "summary.txt").read_text() == (RESULTS / name / "full" / "summary.txt").read_text()
