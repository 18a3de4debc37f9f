"""The common checks of tests/common_checks.py over every model: finite differences (both backends),
NumPy against Numba under the float64 policy, bitwise thread determinism, and parameter validation."""
import pytest

from common_checks import (CASES, FAULTS, check_backends_agree, check_gradients, check_rejects_bad_parameter,
                           check_thread_determinism, default_input, numba_threads_available)

IDS = [case.id for case in CASES]


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradients_match_finite_differences(case, backend):
    check_gradients(case, default_input(case), backend)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_numba_agrees_with_numpy(case):
    check_backends_agree(case, default_input(case))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_numba_agrees_with_numpy_on_the_parallel_path(case, monkeypatch):
    for module, attribute, value in case.parallel_switches:
        monkeypatch.setattr(module, attribute, value)
    check_backends_agree(case, default_input(case, n=case.parallel_n))


@pytest.mark.skipif(not numba_threads_available(), reason="Numba was started with a single thread")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_numba_bitwise_identical_for_one_and_two_threads(case, monkeypatch):
    check_thread_determinism(case, default_input(case, n=case.parallel_n), monkeypatch)


@pytest.mark.parametrize("fault", FAULTS)
@pytest.mark.parametrize("case,param", [(case, p) for case in CASES for p in case.params],
                         ids=[f"{case.id}-{p}" for case in CASES for p in case.params])
def test_bad_parameter_is_an_input_error_naming_it(case, param, fault):
    check_rejects_bad_parameter(case, default_input(case), param, fault)
