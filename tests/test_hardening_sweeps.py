"""``ntpref reproduce`` and its sweeps: every fault a user can cause is one clear line. A results directory
that is a file, an unreachable Dask scheduler, worker counts below one, and cell files that are damaged,
another cell's, foreign, holding NaN or inf, or no cells at all.
"""
import os
import re
import shutil

import numpy as np
import pytest

from ntpref import sweep
from ntpref.errors import InputError
from ntpref.npzio import load_npz, save_npz
from ntpref.reproduce import width

from cli_support import LONG, TINY_WIDTH, one_error, run, write


# ---- reproduce: --out, --scheduler, worker counts ----------------------------------------------------------

def test_reproduce_out_must_be_a_directory(tmp_path, capsys, tiny_width):
    (tmp_path / "file").write_text("not a directory")
    assert one_error(capsys, "reproduce", "width", "--out", tmp_path / "file", "-q") == (
        f"ntpref: error: --out {tmp_path / 'file'}: not a directory (give the directory for the results)")
    below = tmp_path / "file" / "results"
    assert one_error(capsys, "reproduce", "width", "--out", below, "-q") == (
        f"ntpref: error: {below / 'width' / 'quick' / 'cells'}: cannot create the results directory (Not a directory)")
    err = one_error(capsys, "reproduce", "width", "--out", tmp_path / LONG, "-q")
    assert err.endswith("/width/quick/cells: cannot create the results directory (File name too long)"), err
    assert (tmp_path / "file").read_text() == "not a directory"


def test_reproduce_unreachable_scheduler(tmp_path, capsys, tiny_width, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr(sweep, "SCHEDULER_TIMEOUT", 1)
    assert one_error(capsys, "reproduce", "width", "--scheduler", "tcp://127.0.0.1:1", "--out", tmp_path, "-q") == (
        "ntpref: error: Dask scheduler 'tcp://127.0.0.1:1': cannot connect (Timed out trying to connect to "
        "tcp://127.0.0.1:1 after 1 s)")
    assert one_error(capsys, "reproduce", "width", "--scheduler", "nohost", "--out", tmp_path, "-q") == (
        "ntpref: error: Dask scheduler 'nohost': cannot connect (missing port number in address 'nohost')")


@pytest.mark.parametrize("option, value", [("--dask-local", "0"), ("--dask-local", "-2"), ("--workers", "0"),
                                           ("--workers", "-1"), ("--workers", "two")])
def test_reproduce_worker_counts_below_one(option, value, tmp_path, capsys):
    status, err = run(capsys, "reproduce", "width", option, value, "--out", tmp_path)
    assert status == 2
    assert err == (f"ntpref reproduce: error: argument {option}: expected a whole number >= 1, got '{value}' "
                   "(see 'ntpref reproduce --help')\n")
    assert not any(tmp_path.iterdir())


def test_sweep_worker_counts_below_one(tmp_path):
    with pytest.raises(InputError, match="^sweep: dask_local must be at least 1, got 0$"):
        sweep.run_sweep(dict, [{"x": 1}], tmp_path, dask_local=0)
    with pytest.raises(InputError, match="^sweep: workers must be at least 1, got -1$"):
        sweep.run_sweep(dict, [{"x": 1}], tmp_path, workers=-1)


# ---- cells that are damaged, another cell's, or no cells at all --------------------------------------------

def test_reproduce_recomputes_damaged_cells_and_ignores_foreign_files(tmp_path, capsys, tiny_width):
    cells = tmp_path / "width" / "quick" / "cells"
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q")[0] == 0
    files = sorted(cells.iterdir())
    assert [f.stem for f in files] == sorted(sweep.cell_key(c) for c in tiny_width)
    original = {f.name: load_npz(f) for f in files}
    damaged, swapped = files[0], files[1]
    damaged.write_bytes(damaged.read_bytes()[:300])                     # truncated, e.g. by a copy
    os.replace(files[2], swapped)                                       # another cell's result under this name
    write(cells / "notes.npz", {"x": np.arange(3)})                     # foreign: not a cell
    other = {**tiny_width[0], "steps": 7}                               # a cell of another grid
    save_npz(cells / f"{sweep.cell_key(other)}.npz", {"loss": np.ones(2), "cell_params": np.array('{"steps": 7}')})

    ignoring = (f"ntpref: warning: {cells}: ignoring 2 file(s) that are not cells of this sweep "
                f"('{sweep.cell_key(other)}.npz', ...)")
    status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q", "--summarize-only")
    lines = err.splitlines()
    assert status == 2 and len(lines) == 2 and lines[0] == ignoring, err
    assert lines[1] == (f"ntpref: error: {damaged}: not an npz file (File is not a zip file); it is not a finished "
                        "cell: delete it, or run the sweep again to recompute it")

    status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q")
    lines = err.splitlines()
    assert status == 0 and len(lines) == 3, err
    assert lines[0] == (f"ntpref: warning: recomputing a cell whose file does not load: {damaged}: not an npz "
                        "file (File is not a zip file)")
    assert lines[1].startswith(f"ntpref: warning: recomputing {swapped}: it holds the cell ")
    assert lines[2] == ignoring
    for name, arrays in original.items():                               # recomputed: the same results again
        again = load_npz(cells / name)
        assert again.keys() == arrays.keys(), name
        assert all(np.array_equal(again[k], arrays[k]) for k in arrays if k != "cpu_seconds"), name


BAD_CELLS = {   # how a cell file is damaged -> the one line naming it (after "PATH: ")
    "negative loss": (lambda a: {**a, "min_train_loss": np.float64(-0.5)},
                      "min_train_loss holds -0.5, below its least value 0"),
    "array missing": (lambda a: {k: v for k, v in a.items() if k != "final_val_loss"},
                      "missing array(s) final_val_loss"),
    "wrong shape": (lambda a: {**a, "train_loss": a["train_loss"][:3]}, "train_loss has shape (3,), not (5,)"),
    "2-d scalar": (lambda a: {**a, "min_train_loss": np.ones((1, 1))}, "min_train_loss has shape (1, 1), not ()"),
    "string value": (lambda a: {**a, "min_train_loss": np.array("0.5")}, "min_train_loss is a string, not float64"),
    "another dtype": (lambda a: {**a, "train_loss": a["train_loss"].astype(np.float32)},
                      "train_loss is float32, not float64"),
    "extra array": (lambda a: {**a, "note": np.arange(2)}, "unexpected array(s) note"),
}


def test_a_bad_cell_is_named_in_one_line_and_recomputed_on_a_run(tmp_path, capsys, monkeypatch):
    """Every cell is checked against what its target's cell returns (names, dtypes, shapes, ranges), also when no
    majority of cells of its kind could tell it differs (two cells here)."""
    monkeypatch.setitem(width.SIZES, "quick", {**TINY_WIDTH, "seeds": (1,)})
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q")[0] == 0
    path = sorted((tmp_path / "width" / "quick" / "cells").iterdir())[0]
    original = load_npz(path)
    for damage, why in BAD_CELLS.values():
        save_npz(path, damage(original))
        status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q", "--summarize-only")
        assert (status, err) == (2, f"ntpref: error: {path}: {why}; it is not a finished cell: delete it, or run "
                                    "the sweep again to recompute it\n")
        status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q")
        assert (status, err) == (0, f"ntpref: warning: recomputing {path}: {why}\n")
        again = load_npz(path)
        assert again.keys() == original.keys()
        assert all(np.array_equal(again[k], original[k]) for k in original if k != "cpu_seconds")


@pytest.mark.parametrize("value", [np.nan, -np.inf])
def test_a_cell_holding_nan_or_inf_is_left_out_of_the_summary_by_name(value, tmp_path, capsys, tiny_width):
    """Such a cell is no damage a new run would repair (the computation is deterministic): it is kept, and the
    summary is the one of the other cells, with a line naming it."""
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q")[0] == 0
    path = sorted((tmp_path / "width" / "quick" / "cells").iterdir())[0]
    without = tmp_path / "without"
    shutil.copytree(path.parent, without / "width" / "quick" / "cells")
    (without / "width" / "quick" / "cells" / path.name).unlink()
    assert run(capsys, "reproduce", "width", "--out", without, "-q", "--summarize-only")[0] == 0
    arrays = load_npz(path)
    arrays["train_loss"][2] = value
    save_npz(path, {**arrays, "min_train_loss": np.float64(value)})
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q") == (0, "")   # kept, not recomputed
    summary = (tmp_path / "width" / "quick" / "summary.txt").read_text()
    note = (f"left out of this summary: {path} holds NaN or inf in min_train_loss, train_loss (delete it to "
            "compute it again)")
    assert summary == (without / "width" / "quick" / "summary.txt").read_text().removesuffix("\n") + f"\n{note}\n"
    for other in sorted(path.parent.iterdir()):
        save_npz(other, {**load_npz(other), "final_val_loss": np.float64(np.nan)})
    status, err = run(capsys, "reproduce", "width", "--out", tmp_path, "-q", "--summarize-only")
    assert status == 2 and err.startswith(f"ntpref: error: {path.parent}: no finished cells to summarize "
                                          f"(left out of this summary: {path} holds NaN or inf"), err


def test_load_results_names_a_file_that_is_no_cell(tmp_path):
    write(tmp_path / "notes.npz", {"x": np.arange(3)})
    with pytest.raises(InputError, match=re.escape(f"{tmp_path / 'notes.npz'}: not a sweep cell (it has no "
                                                   "'cell_params' array); it is not a finished cell: delete it")):
        sweep.load_results(tmp_path)
    ignoring = "ignoring 1 file(s) that are not cells of this sweep ('notes.npz')"
    with pytest.warns(UserWarning, match=re.escape(ignoring)):
        assert sweep.load_results(tmp_path, [{"x": 1}]) == []
