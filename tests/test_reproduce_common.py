"""Shared helpers of the reproduction targets (ntpref.reproduce.configs, ntpref.reproduce.stats): time grid,
configuration selection, grouping by an axis and the 95% CI; the seed count of ``--seeds``; the worker thread
split of ntpref.sweep.worker_threads."""
import math
import os

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.cli import main
from ntpref.reproduce import configs, rnn, stats, with_seeds
from ntpref.sweep import worker_threads


def test_time_grid():
    g = configs.time_grid(10000)
    assert g[0] == 0 and g[-1] == 10000 and np.all(np.diff(g) > 0)
    assert set(range(0, 10001, 10)) <= set(g.tolist())                   # every 10th step
    assert {1, 2, 3} <= set(g.tolist()) and g.size < 1300                # log-spaced start, subsampled
    np.testing.assert_array_equal(configs.time_grid(5), np.arange(6))     # short runs: every step
    np.testing.assert_array_equal(configs.time_grid(0), [0])


def test_time_grid_refuses_negative_length():
    with pytest.raises(InputError, match="^time_grid: T must be >= 0, got -1$"):
        configs.time_grid(-1)


def test_select_config_most_cells_then_largest():
    quick = [({"seed": s, "m": 8, "T": 10}, {"x": s}) for s in (2, 1)]
    full = [({"seed": 1, "m": 8, "T": 100}, {"x": 9})]
    # the most complete configuration wins; its rows come sorted by seed; the other one is named
    config, rows, note = configs.select_config(quick + full)
    assert config == {"m": 8, "T": 10} and [p["seed"] for p, _ in rows] == [1, 2]
    assert "'T': 100" in note and "(1 cells)" in note
    # equally many cells: the larger parameter values (a full run over a quick one)
    config, rows, note = configs.select_config(quick[:1] + full)
    assert config == {"m": 8, "T": 100} and rows == full
    # several varying axes
    config, rows, note = configs.select_config(quick + [({"seed": 1, "m": 16, "T": 10}, {})], ("seed", "m"))
    assert config == {"T": 10} and len(rows) == 3 and note == ""


def test_select_config_needs_a_finished_cell():
    with pytest.raises(InputError, match="^no finished cells to summarize$"):
        configs.select_config([])


def test_by_axis_and_stats():
    rows = [({"seed": s, "m": m}, {"v": np.float64(m * 10 + s), "curve": np.array([2.0, s])})
            for s in (2, 1, 3) for m in (16, 8)]
    xs, groups = configs.by_axis(rows, "m", "v")
    np.testing.assert_array_equal(xs, [8, 16])
    np.testing.assert_array_equal(groups[0], [81, 82, 83])       # ordered by seed
    xs, groups = configs.by_axis(rows, "m", lambda a: a["curve"][1] / a["curve"][0])
    np.testing.assert_array_equal(groups[1], [0.5, 1.0, 1.5])
    mean, ci = stats.stats(groups)
    # 3 seeds: t_{0.975, 2} = 4.303, sample sd 0.5, so the half-width is 4.303 · 0.5 / √3
    np.testing.assert_allclose(mean, [1.0, 1.0])
    np.testing.assert_allclose(ci, 4.303 * 0.5 / np.sqrt(3))


def test_worker_threads_splits_the_cores(monkeypatch):
    monkeypatch.delenv("NUMBA_NUM_THREADS", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    with worker_threads(2):
        assert os.environ["NUMBA_NUM_THREADS"] == "2"     # spawned workers read it: 4 cores / 2 processes
    assert "NUMBA_NUM_THREADS" not in os.environ           # restored
    with worker_threads(8):
        assert os.environ["NUMBA_NUM_THREADS"] == "1"     # never below one thread
    with worker_threads(1):
        assert "NUMBA_NUM_THREADS" not in os.environ       # in-process run: this process's threads, untouched
    monkeypatch.setenv("NUMBA_NUM_THREADS", "3")
    with worker_threads(2):
        assert os.environ["NUMBA_NUM_THREADS"] == "3"     # the user's setting wins


def test_with_seeds_takes_the_first_seeds():
    assert with_seeds({"seeds": 10, "T": 5}, 3) == {"seeds": 3, "T": 5}          # a count: seeds 0..2
    full = rnn.SIZES["full"]
    assert with_seeds(full, 5)["seeds"] == (1, 2, 3, 4, 5)                      # a tuple: seeds 1..5
    assert {k: v for k, v in with_seeds(full, 5).items() if k != "seeds"} == \
        {k: v for k, v in full.items() if k != "seeds"}
    assert with_seeds(full, None) is full
    first = rnn.cells(**with_seeds(full, 5))
    assert first == rnn.cells(**full)[:len(first)] and len(first) == 5 * 4 * 2   # seed-major: a prefix
    with pytest.raises(InputError, match="--seeds: this target has no seeds"):
        with_seeds({"T": 5}, 2)


def test_seeds_must_be_a_positive_count(capsys):
    assert main(["reproduce", "twostage", "--seeds", "0"]) == 2
    assert "expected a whole number >= 1, got '0'" in capsys.readouterr().err


def test_ratio_interval_is_paired_pools_arrays_and_matches_a_direct_bootstrap():
    rng = np.random.default_rng(3)
    seed_factor = np.exp(rng.standard_normal(6))                       # shared by both ends: paired seeds
    first, last = seed_factor, 3.0 * seed_factor * np.exp(0.01 * rng.standard_normal(6))
    lo, hi = stats.ratio_interval(first, last)
    assert 2.9 < lo < hi < 3.1             # the seed factor (spread e^±1) cancels: both ends resample together
    idx = stats.paired_resamples(6)                                    # the same draws, written out
    direct = np.percentile(last[idx].mean(axis=1) / first[idx].mean(axis=1), [2.5, 97.5])
    assert np.allclose((lo, hi), direct, rtol=1e-14, atol=0)
    # arrays per seed are pooled, NaN left out; the median as the statistic
    blocks_a = [np.array([1.0, 2.0]), np.array([3.0, np.nan]), np.array([5.0, 6.0])]
    blocks_b = [2.0 * b for b in blocks_a]
    assert stats.ratio_interval(blocks_a, blocks_b, np.median) == pytest.approx((2.0, 2.0), rel=1e-15)
    assert stats.ratio_interval(first[:1], last[:1]) is None           # one seed
    assert stats.ratio_interval(first, last[:5]) is None               # unpaired ends
    assert stats.interval_text((1.2345, 6.789)) == " [1.23, 6.79]" and stats.interval_text(None) == ""


def test_median_slope_interval_covers_the_power_law_and_shrinks_with_seeds():
    rng = np.random.default_rng(7)
    m = np.array([8, 16, 32, 64, 128, 256])

    def groups(seeds, noise):
        # per-seed values 0.01 m^(-1/2) times a seed factor and per-cell noise (paired across m)
        seed_factor = np.exp(0.3 * rng.standard_normal(seeds))
        return [0.01 * w ** -0.5 * seed_factor * np.exp(noise * rng.standard_normal(seeds)) for w in m]

    few, many = groups(5, 0.05), groups(40, 0.05)
    lo5, hi5 = stats.median_slope_interval(m, few)
    lo40, hi40 = stats.median_slope_interval(m, many)
    assert lo5 < -0.5 < hi5 and lo40 < -0.5 < hi40
    assert hi40 - lo40 < hi5 - lo5                                     # more seeds, a tighter interval
    exact = [np.full(4, 0.01 * w ** -0.5) for w in m]                  # no scatter: the interval is the slope
    assert np.allclose(stats.median_slope_interval(m, exact), (-0.5, -0.5), atol=1e-12)
    assert stats.median_slope_interval(m, few) == stats.median_slope_interval(m, few)   # deterministic
    assert stats.median_slope_interval(m, [g[:1] for g in few]) is None
    slope = stats.loglog_slope(m, stats.medians(few))[0]
    assert stats.slope_text(slope, m, few) == (f"{slope:+.3f} (95% bootstrap interval over 5 seeds: "
                                               f"[{lo5:+.3f}, {hi5:+.3f}])")
    assert stats.slope_text(slope, m, [g[:1] for g in few]) == f"{slope:+.3f} (no interval: 1 seed)"


def test_line_fit_is_the_least_squares_line_rounded_once_from_exact_sums():
    from fractions import Fraction
    rng = np.random.default_rng(3)
    x, y = rng.standard_normal(7) * 1e3, rng.standard_normal(7) + 1e8       # large offsets: cancellation
    X, Y = [Fraction(v) for v in x], [Fraction(v) for v in y]
    xb, yb = sum(X) / 7, sum(Y) / 7
    exact = sum((a - xb) * (b - yb) for a, b in zip(X, Y)) / sum((a - xb) ** 2 for a in X)
    slope, intercept = stats.line_fit(x, y)
    assert abs(Fraction(slope) - exact) <= 4 * 2.0 ** -52 * abs(exact)
    assert abs(Fraction(intercept) - (yb - exact * xb)) <= 4 * 2.0 ** -52 * abs(yb)
    assert np.allclose(stats.line_fit(x, y), np.polyfit(x, y, 1), rtol=1e-9)
    # a power law is recovered by the log-log fit; a geometric decay by the rate
    assert np.allclose(stats.loglog_slope([2, 4, 8, 16], [3 * v ** -0.5 for v in (2, 4, 8, 16)]),
                       (-0.5, math.log(3)), atol=1e-14)
    assert stats.geometric_rate(np.arange(5), 2.0 * 0.9 ** np.arange(5)) == pytest.approx(0.9, rel=1e-14)


def test_config_text_is_sorted_names_and_values():
    assert configs.config_text({"n": 5000, "K": 8192, "teacher": "full"}) == "K = 8192, n = 5000, teacher = full"
    assert configs.config_text({"n": 5000, "K": 8192, "teacher": "full"}, ("teacher",)) == "K = 8192, n = 5000"


def test_a_seeds_run_summarizes_apart_and_shares_the_cells_quietly(tmp_path, monkeypatch):
    """--seeds N writes its summary to SIZE/seeds-N/, never over the size's own; each run takes the other's
    finished cells as its target's (no warning about them) and computes only what it lacks. The quick size
    of Figure 2 is shrunk to a tiny one (its 3 seeds kept): what is checked is where cells and summaries go."""
    import warnings

    from ntpref.reproduce import figure2, run_target

    monkeypatch.setitem(figure2.SIZES, "quick", {"seeds": 3, "K": 6, "N": 20, "T0": 100, "T": 600})
    quick = tmp_path / "twostage" / "quick"
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # a warning about the other seeds' cells fails
        run_target("twostage", "quick", tmp_path, seeds=1)
        assert (quick / "seeds-1" / "summary.txt").is_file() and not (quick / "summary.txt").exists()
        run_target("twostage", "quick", tmp_path)
        own = (quick / "summary.txt").read_bytes()
        one = (quick / "seeds-1" / "summary.txt").read_bytes()
        run_target("twostage", "quick", tmp_path, seeds=1, summarize_only=True)
    assert (quick / "summary.txt").read_bytes() == own != one
    assert (quick / "seeds-1" / "summary.txt").read_bytes() == one
    assert len(list((quick / "cells").glob("*.npz"))) == 3
