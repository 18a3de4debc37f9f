"""The `length-kernel` target (ntpref.reproduce.length_kernel) at tiny sizes: λ_min against numpy's eigvalsh of
a Gram matrix built here from the dense tangent features, the normalised teacher's output scale at every T and
its labels against the teacher of scaled coefficients, the cells shared with the `length` target, and the
summary against the cells."""
import io
import math

import numpy as np
import pytest

from ntpref import shallow
from ntpref.errors import InputError
from ntpref.progress import Progress
from ntpref.reproduce import length, length_kernel as lk, ntk, run_target, stats, teacher_student
from ntpref.shallow.ntk import ntk_gram, tangent_features
from ntpref.shallow.teacher import teacher_labels
from ntpref.sweep import load_results, run_sweep

SIZE = dict(seeds=(1, 2), Ts=(4, 8), m=8, n=120, K=32, steps=20, teacher="diagonal", T_ref=8, gram_widths=(8,),
            n_gram=40, n_levels=2, draws=128)


@pytest.fixture(autouse=True)
def one_numba_thread():
    """One Numba thread (the results do not depend on it; spinning threads on a busy machine are slow)."""
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    yield
    numba.set_num_threads(before)


def dense_gram(X, c, U, W) -> np.ndarray:
    """K = F Fᵀ with F the per-sample gradient of f with respect to every (c_i, U_i, W_i), flattened."""
    tf = tangent_features(X, c, U, W, backend="numpy")
    F = np.concatenate([tf.c, tf.U.reshape(len(X), -1), tf.W().reshape(len(X), -1)], axis=1)
    return F @ F.T


def test_lambda_min_is_eigvalsh_of_a_gram_matrix_built_from_the_features():
    X = teacher_student.teacher_data(3, 120, 6, 32).X_train[:40]
    theta = shallow.paired_init(8, teacher_student.D, 3 + teacher_student.INIT_SEED_OFFSET)
    G = ntk_gram(X, *theta)
    ref = dense_gram(X, *theta)
    np.testing.assert_allclose(G, ref, rtol=1e-12, atol=1e-15 * np.abs(ref).max())
    sizes = lk.gram_sizes(40, 3)
    assert sizes == [10, 20, 40]
    got = lk.leading_spectrum(G, sizes)
    for i, k in enumerate(sizes):
        np.testing.assert_array_equal(ntk_gram(X[:k], *theta), G[:k, :k])   # a leading block is the smaller Gram
        want = np.linalg.eigvalsh(ref[:k, :k])
        assert got["lambda_min"][i] == pytest.approx(want[0], abs=1e-12 * want[-1])
        assert got["mean_diag"][i] == pytest.approx(np.trace(ref[:k, :k]) / k, rel=1e-12)
    # the cell computes exactly this, and the limit cell is the ntk target's limit cell on the first n inputs
    cell = lk.cell(kind="gram", seed=3, T=6, n=120, K=32, teacher="diagonal", m=8, n_gram=40, n_levels=3)
    np.testing.assert_array_equal(cell["lambda_min"], got["lambda_min"])
    limit = lk.cell(kind="limit", seed=3, T=6, n=120, K=32, teacher="diagonal", n_gram=40, n_levels=3, draws=64)
    for i, k in enumerate(sizes):
        assert limit["lambda_min"][i] == ntk.cell(kind="limit", seed=3, n=120, K=32, T=6, teacher="diagonal",
                                                  n_gram=k, draws=64)["lambda_min"]
    assert (limit["lambda_min"] > 0).all() and (np.diff(limit["lambda_min"]) < 0).all()   # more inputs, smaller


def test_normalised_teacher_has_the_reference_scale_at_every_T():
    n, K, seed, T_ref = 120, 32, 2, 8
    ref = teacher_student.teacher_data(seed, n, T_ref, K)
    L0_ref = float(np.mean(ref.y_train ** 2))
    for T in (4, 8, 16):
        raw = teacher_student.teacher_data(seed, n, T, K)
        scaled = lk.normalised_teacher(seed, n, T, K, "diagonal", T_ref)
        assert lk.output_scale(scaled) == pytest.approx(L0_ref, rel=1e-14)     # the same L(0) at every T
        np.testing.assert_array_equal(scaled.X_train, raw.X_train)
        c = math.sqrt(L0_ref / float(np.mean(raw.y_train ** 2)))
        np.testing.assert_allclose(scaled.y_train, c * raw.y_train, rtol=1e-15)
        np.testing.assert_allclose(scaled.y_val, c * raw.y_val, rtol=1e-15)    # validation labels alike
        if T == T_ref:
            np.testing.assert_array_equal(scaled.y_train, raw.y_train)         # c = 1 exactly
        # the normalised teacher is the teacher with coefficients c·α (the labels are linear in α): the
        # teacher's heads redrawn in the documented order (tokens, anchor indices, g, U, W)
        rng = np.random.default_rng(seed)
        rng.standard_normal((n, T, teacher_student.D))
        rng.choice(n, size=teacher_student.R, replace=False)
        rng.standard_normal(teacher_student.R)
        U = rng.standard_normal((K, teacher_student.D))
        W = rng.standard_normal((K, teacher_student.D, teacher_student.D))
        y = teacher_labels(raw.X_train, raw.anchors, c * raw.alpha, U, W, teacher_student.NU,
                           teacher_attention="diagonal")
        np.testing.assert_allclose(y, scaled.y_train, rtol=1e-11, atol=1e-13 * np.abs(y).max())
    # a normalised run starts from that loss: the paired initialisation has f = 0
    a = lk.cell(kind="scaled", seed=seed, T=4, T_ref=T_ref, m=8, n=n, K=K, teacher="diagonal", steps=5)
    assert a["train_loss"][0] == pytest.approx(L0_ref, rel=1e-12)


def test_cells_and_their_refusals():
    cells = lk.cells(**SIZE)
    kinds = [c["kind"] for c in cells]
    assert len(cells) == 2 * 2 * 4 and kinds[:4] == ["raw", "scaled", "gram", "limit"] and cells[0]["T"] == 8
    assert lk.equivalent_cell(cells[0])[0] == "length"
    assert lk.equivalent_cell(cells[1]) == lk.equivalent_cell(cells[0])                 # scaled at T_ref
    assert lk.equivalent_cell(cells[5]) is None and cells[5]["T"] == 4                  # scaled at T = 4
    with pytest.raises(InputError, match=r"T_ref \(16\) must be one of the lengths Ts \(4, 8\)"):
        lk.cells(**{**SIZE, "T_ref": 16})
    with pytest.raises(InputError, match=r"n_gram \(200\) must not exceed the 96 training inputs"):
        lk.cells(**{**SIZE, "n_gram": 200})
    with pytest.raises(InputError, match="unknown length-kernel cell kind 'other'"):
        lk.cell(kind="other", seed=1, T=4, n=120, K=32, teacher="diagonal", n_gram=40, n_levels=2)


def test_trend_and_support_read_the_intervals():
    assert lk.trend((-0.9, -0.1)) == "falls with T" and lk.trend((0.1, 0.4)) == "rises with T"
    assert lk.trend((-0.1, 0.2)).startswith("no trend resolved") and lk.trend(None).startswith("no interval")
    assert lk.support({"raw_slope_lo": 0.05, "raw_slope_hi": 0.3}).startswith("no: the raw error at fixed ν rises")
    assert lk.support({"raw_slope_lo": -0.2, "raw_slope_hi": 0.3}).endswith("containing 0)")
    assert lk.support({}).startswith("undecided")


def test_target_shares_length_cells_and_its_summary_is_what_the_cells_give(tmp_path, monkeypatch):
    monkeypatch.setitem(lk.SIZES, "tiny", SIZE)
    # the length target's T sweep of the same setting, as a run of its size "tiny" leaves it in OUT/length/tiny/cells
    monkeypatch.setitem(length.SIZES, "tiny", dict(seeds=(1, 2), Ts=(4, 8), m_T=8, ns=(120,), widths=(8,), n=120,
                                                   K=32, steps=20, T_n=4, teacher="diagonal"))
    t_sweep = [c for c in length.cells(**length.SIZES["tiny"]) if c["sweep"] == "T"]
    run_sweep(length.cell, t_sweep, tmp_path / "length" / "tiny" / "cells")
    out = io.StringIO()
    s = run_target("length-kernel", "tiny", tmp_path, progress=Progress(stream=out))
    # the raw cells (2 seeds × 2 T) and the normalised ones at T_ref (2) are the length target's T-sweep cells
    assert "reproduce length-kernel (tiny): 6 cells copied from another target's results" in out.getvalue()
    rows = load_results(tmp_path / "length-kernel" / "tiny" / "cells")
    raw = {(p["seed"], p["T"]): a for p, a in rows if p["kind"] == "raw"}
    scaled = {(p["seed"], p["T"]): a for p, a in rows if p["kind"] == "scaled"}
    for seed in (1, 2):
        again = lk.cell(kind="scaled", seed=seed, T=8, T_ref=8, m=8, n=120, K=32, teacher="diagonal", steps=20)
        np.testing.assert_array_equal(again["train_loss"], scaled[seed, 8]["train_loss"])   # a copy, bit for bit
        for T in (4, 8):
            assert scaled[seed, T]["train_loss"][0] == pytest.approx(raw[seed, 8]["train_loss"][0], rel=1e-12)
    # the summary's numbers are those of the cells
    for kind, cells in (("raw", raw), ("scaled", scaled)):
        med = [np.median([cells[s, T]["min_train_loss"] for s in (1, 2)]) for T in (4, 8)]
        assert s.numbers[f"{kind}_slope"] == pytest.approx(stats.loglog_slope([4, 8], med)[0], rel=1e-12)
        rel = [np.median([length.relative_loss(cells[s, T]) for s in (1, 2)]) for T in (4, 8)]
        assert s.numbers[f"{kind}_rel_ratio"] == pytest.approx(rel[1] / rel[0], rel=1e-12)
    c4 = np.median([math.sqrt(scaled[s, 4]["train_loss"][0] / raw[s, 4]["train_loss"][0]) for s in (1, 2)])
    assert s.numbers["scale_factor_T4"] == pytest.approx(c4, rel=1e-12) and s.numbers["scale_factor_T8"] == 1.0
    assert s.numbers["scale_deviation"] < 1e-12
    lam = {(p["kind"], p["seed"], p["T"]): a["lambda_min"][-1] for p, a in rows if p["kind"] in ("gram", "limit")}
    for key, kind in (("m8", "gram"), ("limit", "limit")):
        med = [np.median([lam[kind, s, T] for s in (1, 2)]) for T in (4, 8)]
        assert s.numbers[f"lambda_{key}_ratio"] == pytest.approx(med[1] / med[0], rel=1e-12)
    lo, hi = s.numbers["raw_slope_lo"], s.numbers["raw_slope_hi"]
    assert lo <= s.numbers["raw_slope"] <= hi
    assert f"Do the runs support it? {lk.support(s.numbers)}" in s.table
    assert s.table.index("λ_min of the NTK Gram matrix") < s.table.index("T sweep, teacher at fixed ν")
    # --summarize-only rebuilds the summary byte for byte
    summary = tmp_path / "length-kernel" / "tiny" / "summary.txt"
    first = summary.read_bytes()
    run_target("length-kernel", "tiny", tmp_path, summarize_only=True)
    assert summary.read_bytes() == first and (tmp_path / "length-kernel" / "tiny" / "length-kernel.png").is_file()
