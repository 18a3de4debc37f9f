"""Sweep engine: one file per cell, atomic writes, resume without recomputation, real executors."""
import sys

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.sweep import (CellArray, cell_fault, cell_key, copy_equivalent, grid, load_results, nonfinite_arrays,
                          run_sweep)


def square_cell(x, seed):
    """A cheap deterministic cell: values depend on both parameters."""
    return {"y": np.float64(x) ** 2 + seed, "v": np.random.default_rng(seed).standard_normal(3) * x}


def expected(x, seed):
    return square_cell(x, seed)


def _check(outdir, cells):
    results = load_results(outdir)
    assert sorted(cell_key(p) for p, _ in results) == sorted(cell_key(c) for c in cells)
    for params, arrays in results:
        ref = expected(**params)
        assert arrays["y"] == ref["y"]
        np.testing.assert_array_equal(arrays["v"], ref["v"])


def test_grid_order_and_keys():
    cells = grid(seed=[1, 2], x=[0.5, 3])
    assert cells == [{"seed": 1, "x": 0.5}, {"seed": 1, "x": 3}, {"seed": 2, "x": 0.5}, {"seed": 2, "x": 3}]
    assert cell_key({"x": 3, "seed": 1}) == "seed=1_x=3"
    assert len({cell_key(c) for c in cells}) == 4


def test_resume_skips_finished_cells(tmp_path):
    cells = grid(seed=[0, 1, 2], x=[1.0, 2.0])
    calls = []

    def counting(x, seed):
        calls.append((x, seed))
        return square_cell(x, seed)

    first = run_sweep(counting, cells[:4], tmp_path)
    assert (first.computed, first.skipped) == (4, 0)
    second = run_sweep(counting, cells, tmp_path)
    assert (second.computed, second.skipped) == (2, 4)
    assert len(calls) == 6                                   # nothing computed twice
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".npz"]  # no temporaries left
    _check(tmp_path, cells)


def test_equivalent_cells_are_copied_not_computed(tmp_path):
    # Another grid names the same computation (x, seed) as (z, s, unit): its finished cells are copied
    # under this grid's parameters (replacing a damaged file of this grid) and the sweep computes only the
    # rest; a missing, damaged or foreign file there is passed over.
    other = tmp_path / "other"
    run_sweep(lambda z, s, unit: square_cell(z, s), [{"z": z, "s": 0, "unit": "m"} for z in (1.0, 2.0, 3.0)], other)
    (other / f"{cell_key({'z': 2.0, 's': 0, 'unit': 'm'})}.npz").write_bytes(b"PK\x03\x04 truncated")
    foreign = other / f"{cell_key({'z': 5.0, 's': 0, 'unit': 'm'})}.npz"
    (other / f"{cell_key({'z': 3.0, 's': 0, 'unit': 'm'})}.npz").rename(foreign)   # holds the cell z = 3
    mine = tmp_path / "mine"
    mine.mkdir()
    cells = grid(seed=[0], x=[1.0, 2.0, 4.0, 5.0])
    (mine / f"{cell_key(cells[0])}.npz").write_bytes(b"not a cell")

    def sources(cell):
        return [(tmp_path / "nowhere", {"z": cell["x"], "s": cell["seed"], "unit": "m"}),
                (other, {"z": cell["x"], "s": cell["seed"], "unit": "m"})]

    assert copy_equivalent(cells, mine, sources) == 1      # x = 1; x = 2 damaged, x = 4 missing, x = 5 foreign
    calls = []
    summary = run_sweep(lambda x, seed: calls.append(x) or square_cell(x, seed), cells, mine)
    assert (summary.computed, summary.skipped, sorted(calls)) == (3, 1, [2.0, 4.0, 5.0])
    _check(mine, cells)
    assert copy_equivalent(cells, mine, sources) == 0      # every cell is finished now


def test_failing_cell_keeps_finished_ones(tmp_path):
    def flaky(x, seed):
        if seed == 1:
            raise RuntimeError("boom")
        return square_cell(x, seed)

    with pytest.raises(RuntimeError, match="boom"):
        run_sweep(flaky, grid(seed=[0, 1], x=[1.0]), tmp_path)
    assert [p for p, _ in load_results(tmp_path)] == [{"seed": 0, "x": 1.0}]


def test_duplicate_cells_rejected(tmp_path):
    with pytest.raises(InputError, match="same parameters"):
        run_sweep(square_cell, [{"x": 1, "seed": 0}, {"seed": 0, "x": 1}], tmp_path)


def test_process_pool(tmp_path):
    cells = grid(seed=[0, 1], x=[1.0, 2.0, 3.0])
    lines = []
    s = run_sweep(square_cell, cells, tmp_path, workers=2, progress=lambda *a: lines.append(a))
    assert s.computed == 6 and lines[-1] == ("cells", 6, 6)
    _check(tmp_path, cells)


def test_dask_local_cluster(tmp_path):
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import the tests
    cells = grid(seed=[0, 1, 2], x=[2.0])
    s = run_sweep(square_cell, cells, tmp_path, dask_local=2)
    assert s.computed == 3
    _check(tmp_path, cells)


def test_cells_of_another_code_version_are_recomputed_never_summarized(tmp_path):
    cells = grid(seed=[0, 1], x=[2.0])
    calls = []

    def counting(x, seed):
        calls.append((x, seed))
        return square_cell(x, seed)

    run_sweep(counting, cells, tmp_path)                          # version 1 (also what old files hold)
    assert run_sweep(counting, cells, tmp_path, version=1).computed == 0
    assert [p for p, _ in load_results(tmp_path, cells, version=1)] == cells
    with pytest.raises(InputError, match=r"seed=0_x=2.0.npz: computed by version 1 of this cell's code, and this "
                                         r"ntpref computes version 2"):
        load_results(tmp_path, cells, version=2)
    with pytest.warns(UserWarning, match=r"recomputing .*computed by version 1 of this cell's code"):
        assert run_sweep(counting, cells, tmp_path, version=2).computed == 2
    assert len(calls) == 4 and [p for p, _ in load_results(tmp_path, cells, version=2)] == cells
    copies = tmp_path / "copies"
    assert copy_equivalent(cells, copies, lambda c: [(tmp_path, c)], version=1) == 0   # version 2 is not a copy of 1
    assert copy_equivalent(cells, copies, lambda c: [(tmp_path, c)], version=2) == 2
    assert [p for p, _ in load_results(copies, cells, version=2)] == cells


def test_a_symlinked_cell_is_replaced_by_a_file_and_its_target_left_alone(tmp_path):
    cells = grid(seed=[0, 1], x=[2.0])
    run_sweep(square_cell, cells, tmp_path)
    first, second = (tmp_path / f"{cell_key(c)}.npz" for c in cells)
    before = first.read_bytes()
    second.unlink()
    second.symlink_to(first.name)                      # seed 1's cell points at seed 0's file
    with pytest.warns(UserWarning, match=r"recomputing .*seed=1_x=2.0.npz: a symbolic link, not a cell file"):
        assert run_sweep(square_cell, cells, tmp_path).computed == 1
    assert not second.is_symlink() and first.read_bytes() == before
    assert run_sweep(square_cell, cells, tmp_path).computed == 0
    _check(tmp_path, cells)


def test_a_cell_whose_arrays_differ_from_its_kind_is_recomputed_and_never_summarized(tmp_path):
    from ntpref.npzio import load_npz, save_npz

    cells = grid(seed=[0, 1, 2], x=[2.0])
    run_sweep(square_cell, cells, tmp_path)
    damaged = {1: lambda a: {k: v for k, v in a.items() if k != "v"},                       # an array missing
               2: lambda a: {**a, "v": a["v"].astype(np.float32)}}                           # another dtype
    for seed, damage in damaged.items():
        path = tmp_path / f"{cell_key(cells[seed])}.npz"
        save_npz(path, damage(load_npz(path)))
        with pytest.raises(InputError, match=rf"seed={seed}_x=2.0.npz: (missing array\(s\) v|array\(s\) v of another "
                                             r"dtype or rank) \(the other cells of its kind differ\); it is not a "
                                             r"finished cell"):
            load_results(tmp_path, cells)
        with pytest.warns(UserWarning, match=rf"recomputing .*seed={seed}_x=2.0.npz"):
            assert run_sweep(square_cell, cells, tmp_path).computed == 1
        _check(tmp_path, cells)


def square_arrays(x, seed):
    """What square_cell returns."""
    return {"y": CellArray("f8", low=0.0), "v": CellArray("f8", (3,))}


def test_cell_fault_names_every_way_a_cell_differs_from_what_its_function_returns():
    expected = {"loss": CellArray("f8", (2,), low=0.0), "n": CellArray("i8", low=0, high=3), "why": CellArray("U"),
                "curve": CellArray("f8", (2,), nonfinite=True)}
    good = {"loss": np.array([0.0, 1.5]), "n": np.int64(3), "why": np.array("max_steps"),
            "curve": np.array([np.nan, 1.0])}
    assert cell_fault(good, expected) is None and nonfinite_arrays(good, expected) == []
    assert cell_fault({**good, "loss": np.array([-1e-300, 1.0])}, expected) == \
        "loss holds -1e-300, below its least value 0"
    assert cell_fault({**good, "n": np.int64(4)}, expected) == "n holds 4, above its largest value 3"
    assert cell_fault({k: v for k, v in good.items() if k != "n"} | {"extra": np.ones(1)}, expected) == \
        "missing array(s) n; unexpected array(s) extra"
    assert cell_fault({**good, "loss": np.array(["0", "1"]), "why": np.float64(1.0)}, expected) == \
        "loss is a string, not float64; why is float64, not a string"
    assert cell_fault({**good, "why": np.array(b"max_steps")}, expected) == "why is bytes, not a string"
    assert cell_fault({**good, "loss": np.zeros(3), "n": np.array([1])}, expected) == \
        "loss has shape (3,), not (2,); n has shape (1,), not ()"
    assert cell_fault({**good, "n": np.int32(1)}, expected) == "n is int32, not int64"
    bad = {**good, "loss": np.array([np.inf, -2.0])}          # the range is checked on the finite values
    assert cell_fault(bad, expected) == "loss holds -2.0, below its least value 0"
    assert nonfinite_arrays({**good, "loss": np.array([np.nan, 1.0])}, expected) == ["loss"]


def test_cells_holding_other_arrays_than_their_function_returns_are_recomputed_and_never_summarized(tmp_path):
    from ntpref.npzio import load_npz, save_npz

    cells = grid(seed=[0], x=[2.0])           # one cell: no other cell of its kind to compare with
    expect = lambda params: square_arrays(**params)    # noqa: E731
    run_sweep(square_cell, cells, tmp_path, expect=expect)
    path = tmp_path / f"{cell_key(cells[0])}.npz"
    save_npz(path, {**load_npz(path), "y": np.float64(-4.0)})
    assert load_results(tmp_path, cells)[0][1]["y"] == -4.0                   # unchecked without expect
    with pytest.raises(InputError, match=r"seed=0_x=2.0.npz: y holds -4.0, below its least value 0; it is not a "
                                         r"finished cell"):
        load_results(tmp_path, cells, expect=expect)
    copies = tmp_path / "copies"
    assert copy_equivalent(cells, copies, lambda c: [(tmp_path, c)], expect=expect) == 0   # not copied either
    assert copy_equivalent(cells, copies, lambda c: [(tmp_path, c)]) == 1
    with pytest.warns(UserWarning, match=r"recomputing .*seed=0_x=2.0.npz: y holds -4.0, below its least value 0"):
        assert run_sweep(square_cell, cells, tmp_path, expect=expect).computed == 1
    _check(tmp_path, cells)
