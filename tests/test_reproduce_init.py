"""The ``init`` reproduction target (ntpref.reproduce.init) and the initialisation options it uses
(``scale`` of ntpref.shallow.paired_init / iid_init) at tiny sizes: the initial points are checked against
their definitions, the paired cells against the ntk and width targets' cells bit for bit, and the summary
against numbers recomputed here from the cells."""
import io
from pathlib import Path

import numpy as np
import pytest

from ntpref import shallow, sweep
from ntpref.errors import InputError
from ntpref.progress import Progress
from ntpref.reproduce import init, ntk, run_target, stats, teacher_student, width
from ntpref.shallow import iid_init, paired_init
from ntpref.sweep import load_results, run_sweep

DATA = dict(n=120, K=32, T=4, teacher="diagonal")
TINY = dict(seeds=(1, 2, 3), widths=(4, 16), steps=30, n_drift=20, inits=tuple(init.INITS), **DATA)


@pytest.fixture(autouse=True, scope="module")
def one_numba_thread():
    """One Numba thread (the results do not depend on it; spinning threads on a busy machine are slow)."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, one_numba_thread):
    """The ntk target's training cells (seeds 1, 2), then the init target's, at a tiny size in one results
    directory."""
    out = tmp_path_factory.mktemp("results")
    mp = pytest.MonkeyPatch()
    mp.setitem(ntk.SIZES, "tiny", dict(seeds=(1, 2), widths=(4, 16), steps=30, n_grams=(10,), n_drift=20, draws=64,
                                       **DATA))
    ntk_train = [c for c in ntk.cells(**ntk.SIZES["tiny"]) if c["kind"] == "train"]
    mp.setitem(init.SIZES, "tiny", TINY)
    computed, cell = [], init.cell
    mp.setattr(init, "cell", lambda **params: computed.append(params) or cell(**params))
    try:
        run_sweep(ntk.cell, ntk_train, out / "ntk" / "tiny" / "cells")
        log = io.StringIO()
        summary = run_target("init", "tiny", out, progress=Progress(stream=log))
        again = run_target("init", "tiny", out, summarize_only=True)
    finally:
        mp.undo()
    return dict(out=out, summary=summary, again=again, log=log.getvalue(), computed=computed,
                rows=load_results(out / "init" / "tiny" / "cells"))


@pytest.mark.parametrize("draw", [paired_init, iid_init])
@pytest.mark.parametrize("s", [0.5, 2.0, 0.3, 1e-3])
def test_scale_multiplies_every_initial_parameter_by_s_exactly(draw, s):
    unit = draw(6, 3, 7)
    scaled = draw(6, 3, 7, scale=s)
    for a, b in zip(scaled, unit, strict=True):
        np.testing.assert_array_equal(a, s * b)       # the same one rounding of s·x, entry by entry
    if s in (0.5, 2.0):                                # a power of two: exactly s times, no rounding at all
        for a, b in zip(scaled, unit):
            np.testing.assert_array_equal(a / s, b)
    for a, b in zip(draw(6, 3, 7, scale=1.0), unit):  # s = 1 is the default, bit for bit
        np.testing.assert_array_equal(a, b)


def test_scale_is_validated():
    for bad in (0.0, -1.0, float("inf"), float("nan"), "2", np.ones(2)):
        with pytest.raises(InputError, match="'scale'"):
            paired_init(4, 3, 0, scale=bad)
    with pytest.raises(InputError, match="'scale': .* overflow"):
        iid_init(4, 3, 0, scale=1e308)


def test_paired_inits_give_f_exactly_zero_and_the_unpaired_one_does_not():
    data = teacher_student.teacher_data(1, **{k: DATA[k] for k in ("n", "T", "K")})
    batch = shallow.prepare(data.X_train, data.y_train)
    for name in init.INITS:
        theta0 = init.initial_heads(name, 16, 1)
        f0 = shallow.forward(batch, *theta0).f
        start = init.cell(kind="start", seed=1, init=name, m=16, **DATA)
        assert start["max_abs_f0"] == np.max(np.abs(f0))
        assert start["initial_train_loss"] == pytest.approx(np.mean((f0 - data.y_train) ** 2), rel=1e-12)
        if init.INITS[name][0]:
            assert not f0.any()                                        # every output exactly 0
        else:
            assert np.abs(f0).min() > 0 and np.abs(f0).max() > 0.1    # an O(1) random function
    # the initialisations are the definitions: the paired draws scaled, or m independent heads of that law
    base = paired_init(16, teacher_student.D, 1 + teacher_student.INIT_SEED_OFFSET)
    for name, s in (("paired", 1.0), ("paired-x0.5", 0.5), ("paired-x2", 2.0)):
        for a, b in zip(init.initial_heads(name, 16, 1), base):
            np.testing.assert_array_equal(a, s * b)
    c, U, W = init.initial_heads("unpaired", 16, 1)
    assert not np.array_equal(c[:8], -c[8:]) and not np.array_equal(U[:8], U[8:])
    np.testing.assert_array_equal(W, iid_init(16, teacher_student.D, 1 + teacher_student.INIT_SEED_OFFSET).W)
    with pytest.raises(InputError, match="init must be one of"):
        init.initial_heads("paired-x3", 16, 1)


def test_paired_cells_are_the_ntk_targets_cells_and_are_copied(tiny):
    # seeds 1, 2 of the paired training cells come from the ntk target's results, seed 3 is computed
    assert "reproduce init (tiny): 4 cells copied from another target's results" in tiny["log"]
    ntk_cells = {(p["seed"], p["m"]): a for p, a in load_results(tiny["out"] / "ntk" / "tiny" / "cells")
                 if p["kind"] == "train"}
    copied = [(p, a) for p, a in tiny["rows"] if p not in tiny["computed"]]
    assert sorted((p["seed"], p["m"]) for p, _ in copied) == sorted(ntk_cells)
    for p, a in copied:
        assert p["init"] == "paired" and p["kind"] == "train"
        source = ntk_cells[p["seed"], p["m"]]
        assert set(a) == set(source)
        for key in source:
            np.testing.assert_array_equal(a[key], source[key])
    # the same computation: the init target's cell recomputes them bit for bit, and its min training loss is
    # the width sweep's (the same data, initial heads and ProjGD run)
    params = dict(kind="train", seed=1, m=16, steps=30, n_drift=20, **DATA)
    mine = init.cell(init="paired", **params)
    assert init.equivalent_cell({**params, "init": "paired"}) == ("ntk", params)
    for key in set(mine) - {"cpu_seconds"}:
        np.testing.assert_array_equal(mine[key], ntk_cells[1, 16][key])
    assert mine["min_train_loss"] == width.cell(seed=1, teacher="diagonal", m=16, n=120, K=32, steps=30,
                                                T=4)["min_train_loss"]
    assert all(init.equivalent_cell(p) is None for p in tiny["computed"] if p["init"] != "paired" or
               p["kind"] == "start")


def test_full_size_copies_the_committed_ntk_cells():
    # at full size the paired training cells of seeds 1..5 are the ntk target's committed cells
    pairs = [(c, init.equivalent_cell(c)) for c in init.cells(**init.SIZES["full"]) if init.equivalent_cell(c)]
    assert len(pairs) == 5 * 6 and all(c["init"] == "paired" and c["kind"] == "train" for c, _ in pairs)
    ntk_full = {sweep.cell_key(c) for c in ntk.cells(**ntk.SIZES["full"]) if c["kind"] == "train"}
    shared = [c for c, (name, params) in pairs if name == "ntk" and sweep.cell_key(params) in ntk_full]
    assert sorted({c["seed"] for c in shared}) == [1, 2, 3, 4, 5] and len(shared) == 5 * 6
    committed = Path(__file__).resolve().parent.parent / "docs" / "results" / "ntk" / "full" / "cells"
    assert all((committed / f"{sweep.cell_key(init.equivalent_cell(c)[1])}.npz").is_file() for c in shared)


def test_summary_numbers_are_the_cells(tiny):
    s, rows = tiny["summary"], tiny["rows"]
    assert (tiny["out"] / "init" / "tiny" / "init.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert tiny["again"].table == s.table                                          # --summarize-only
    train = {(p["init"], p["seed"], p["m"]): a for p, a in rows if p["kind"] == "train"}
    for name in init.INITS:
        loss = {m: [train[name, seed, m]["min_train_loss"] for seed in (1, 2, 3)] for m in (4, 16)}
        assert s.numbers[f"loss_slope_{name}"] == pytest.approx(
            np.log(np.median(loss[16]) / np.median(loss[4])) / np.log(4), rel=1e-12)
        heads = [np.median(train[name, seed, 16]["ratio"][-1].max(axis=0)) for seed in (1, 2, 3)]
        assert s.numbers[f"median_head_ratio_m16_{name}"] == np.median(heads)
        assert s.numbers[f"drift_m16_{name}"] == np.median([train[name, seed, 16]["drift"][-1] for seed in (1, 2, 3)])
        assert s.numbers[f"lambda_min_0_m16_{name}"] == np.median([train[name, seed, 16]["lambda_min_0"]
                                                                    for seed in (1, 2, 3)])
        if name != "paired":
            ratios = [train[name, seed, 16]["min_train_loss"] / train["paired", seed, 16]["min_train_loss"]
                      for seed in (1, 2, 3)]
            assert s.numbers[f"loss_ratio_m16_{name}"] == np.median(ratios)
            lo, hi = stats.bootstrap_interval(ratios)
            assert f"{np.median(ratios):.3g} [{lo:.3g}, {hi:.3g}]" in s.table
    # measured at this size: the unpaired start (f(0) ≠ 0, L(θ(0)) 15x the paired one) ends 20x worse, and its
    # kernel moves two orders of magnitude more; the paired x2 start ends below the paired one
    assert s.numbers["loss_ratio_m16_unpaired"] > 5
    assert s.numbers["drift_m16_unpaired"] > 10 * s.numbers["drift_m16_paired"]
    assert s.numbers["loss_ratio_m16_paired-x2"] < 1
    # the kernel at θ(0) grows with the scale s (its U and W gradients carry factors of c and U)
    lam = [s.numbers[f"lambda_min_0_m16_{name}"] for name in ("paired-x0.5", "paired", "paired-x2")]
    assert lam[0] < lam[1] < lam[2]
    f0 = {line.split()[0]: line.split()[-1] for line in s.table.split("max |f(0)|")[1].splitlines()[2:6]}
    assert f0 == {"paired": "(exactly)", "unpaired": f0["unpaired"], "paired-x0.5": "(exactly)",
                  "paired-x2": "(exactly)"} and float(f0["unpaired"]) > 0.1


def test_bootstrap_interval_is_a_percentile_bootstrap_of_the_seeds():
    values = np.array([3.0, 1.0, 4.0, 1.5, 9.0])
    idx = np.random.default_rng(0).integers(0, 5, size=(stats.BOOTSTRAP_DRAWS, 5))
    direct = [np.median([values[i] for i in row]) for row in idx]
    assert stats.bootstrap_interval(values) == tuple(np.percentile(direct, [2.5, 97.5]))
    assert stats.bootstrap_interval(values, np.mean)[0] < values.mean() < stats.bootstrap_interval(values, np.mean)[1]
    assert stats.bootstrap_interval([2.0]) is None
