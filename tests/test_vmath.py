"""ntpref.vmath: the vectorizable exp and tanh against NumPy (ulp distance), special values, determinism."""
import math

import numpy as np
import pytest

from ntpref import vmath


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Number of representable float64 values between a and b (0 when equal, −0 == +0)."""
    def ordered(v):
        i = v.view(np.int64)
        return np.where(i < 0, np.int64(-(2 ** 63)) - i, i)
    return np.abs(ordered(np.asarray(a, dtype=np.float64)) - ordered(np.asarray(b, dtype=np.float64)))


def _exp(x):
    out = np.empty_like(x)
    with np.errstate(over="ignore"):        # overflow to inf is intended (NUMBA_DISABLE_JIT=1 warns)
        vmath.exp_array(x, out)
    return out


def _tanh(x):
    out = np.empty_like(x)
    vmath.tanh_array(x, out)
    return out


SPECIAL = np.array([0.0, -0.0, np.inf, -np.inf, 5e-324, -5e-324, 1e-300, -1e-300, 1e-8, -1e-8,
                    709.78, 709.79, 710.0, 1e300, -745.13, -745.14, -746.0, -1e300, -708.4, -708.39,
                    0.3, -0.3, np.nextafter(0.3, 0.0), 19.06, 19.07, 20.0, 20.5, -20.5])


@pytest.fixture(scope="module")
def exp_points():
    rng = np.random.default_rng(11)
    return np.concatenate([rng.uniform(-750.0, 712.0, 400_000), rng.uniform(-2.0, 2.0, 200_000),
                           rng.uniform(-746.0, -707.0, 200_000),            # subnormal results
                           rng.choice([-1.0, 1.0], 100_000) * 10.0 ** rng.uniform(-320, -1, 100_000),
                           SPECIAL])


@pytest.fixture(scope="module")
def tanh_points():
    rng = np.random.default_rng(12)
    return np.concatenate([rng.uniform(-25.0, 25.0, 400_000), rng.uniform(-0.6, 0.6, 200_000),
                           rng.choice([-1.0, 1.0], 200_000) * 10.0 ** rng.uniform(-320, 1.5, 200_000),
                           SPECIAL])


def test_exp_within_2_ulp_everywhere(exp_points):
    with np.errstate(over="ignore"):
        ref = np.exp(exp_points)
    got = _exp(exp_points)
    assert ulp_distance(got, ref).max() <= 2
    # overflow, underflow and infinities are exact
    big = exp_points > 709.79
    assert np.all(np.isinf(got[big]))
    assert np.all(got[exp_points < -745.2] == 0.0)


def test_exp_special_values():
    got = _exp(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0]))
    assert math.isnan(got[0])
    assert got[1] == np.inf and got[2] == 0.0 and got[3] == 1.0 and got[4] == 1.0
    assert ulp_distance(got[5:], np.array([math.e])).max() <= 1


def _long_double_ulps(got, x, f):
    """|got − f(x)| in ulps of the float64 result, f evaluated in long double (an independent reference)."""
    ref = f(x.astype(np.longdouble))
    return np.abs((got.astype(np.longdouble) - ref) / np.spacing(np.abs(ref.astype(np.float64))))


@pytest.mark.skipif(np.finfo(np.longdouble).nmant < 60, reason="needs an extended-precision long double")
def test_exp_and_tanh_against_long_double():
    rng = np.random.default_rng(13)
    x = rng.uniform(-700.0, 700.0, 100_000)
    assert _long_double_ulps(_exp(x), x, np.exp).max() <= 1.0
    t = np.concatenate([rng.uniform(-20.0, 20.0, 100_000), rng.uniform(-0.6, 0.6, 100_000)])
    assert _long_double_ulps(_tanh(t), t, np.tanh).max() <= 1.5


def test_tanh_within_2_ulp_everywhere(tanh_points):
    got = _tanh(tanh_points)
    assert ulp_distance(got, np.tanh(tanh_points)).max() <= 2


def test_tanh_special_values_and_symmetry(tanh_points):
    got = _tanh(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 25.0, -25.0, 1e-300]))
    assert math.isnan(got[0])
    assert list(got[1:3]) == [1.0, -1.0]
    assert got[3] == 0.0 and not np.signbit(got[3]) and got[4] == 0.0 and np.signbit(got[4])
    assert list(got[5:7]) == [1.0, -1.0]
    assert got[7] == 1e-300
    np.testing.assert_array_equal(_tanh(-tanh_points), -_tanh(tanh_points))   # odd, bitwise


def test_tanh_relative_accuracy_near_zero():
    # tanh x = x − x³/3 + 2x⁵/15 − …: the small-x branch keeps full relative accuracy
    x = 10.0 ** np.linspace(-12, -4, 200)
    ref = x - x ** 3 / 3.0 + 2.0 * x ** 5 / 15.0
    assert np.max(np.abs(_tanh(x) / ref - 1.0)) <= 2 * 2.0 ** -52


def test_deterministic_and_scalar_equals_vector(tanh_points):
    # the vectorized loop and the scalar function give identical bits
    x = tanh_points[:1000]
    scalar_exp = np.array([vmath.exp(v) for v in np.clip(x, -700, 700)])
    scalar_tanh = np.array([vmath.tanh(v) for v in x])
    np.testing.assert_array_equal(_exp(np.clip(x, -700, 700)), scalar_exp)
    np.testing.assert_array_equal(_tanh(x), scalar_tanh)
    np.testing.assert_array_equal(_tanh(x), _tanh(x.copy()))
