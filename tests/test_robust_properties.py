"""Property-based runs of the common checks (tests/common_checks.py) over random shapes and scales, for
every model: for each drawn problem the closed-form gradients match central finite differences, the Numba
and NumPy backends agree under the float64 policy, and the Numba backend is bitwise identical with 1 and
2 threads. tests/test_common_checks.py runs the same checks on one fixed small input per model."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common_checks import (CASES, Size, check_backends_agree, check_gradients, check_thread_determinism,
                           numba_threads_available)

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)

CASE = st.sampled_from(CASES)
SEED = st.integers(0, 2 ** 31)
SIZES = st.builds(Size, n=st.integers(1, 7), T=st.integers(1, 9), d=st.integers(1, 5), m=st.integers(1, 9),
                  scale=st.sampled_from([0.1, 0.5, 1.0, 3.0]))


@SETTINGS
@given(CASE, SEED, SIZES)
def test_gradients_match_finite_differences(case, seed, size):
    inputs = case.draw(np.random.default_rng(seed), size)
    check_gradients(case, inputs, "numba")


@SETTINGS
@given(CASE, SEED, SIZES)
def test_backends_agree(case, seed, size):
    check_backends_agree(case, case.draw(np.random.default_rng(seed), size))


@pytest.mark.skipif(not numba_threads_available(), reason="Numba was started with a single thread")
@settings(max_examples=15, deadline=None, derandomize=True)
@given(CASE, SEED, st.integers(33, 80))
def test_bitwise_identical_across_thread_counts(case, seed, n):
    """n > 32 samples so every parallel kernel has several work items (the two-stage kernels are forced onto
    their parallel path)."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        check_thread_determinism(case, case.draw(np.random.default_rng(seed), Size(n, 6, 4, 6, 1.0)), monkeypatch)
