"""The exact backend's loops in a rounded arithmetic (``ntpref.exact.arith.rounded``): every sum and dot
product is the float format's own left-to-right computation, checked bit for bit against Python floats
(IEEE float64) and NumPy float32 scalars, and a fused multiply-add against the correctly rounded exact
value of each step; the block leaves the exact arithmetic and mpmath's context as they were; the
max-margin solutions stay exact inside it."""
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from ntpref import exact
from ntpref.exact import arith

from small_inputs import shallow_eval, twostage_train


def _kahan(terms) -> float:
    """Kahan's compensated sum in Python floats."""
    total = carry = 0.0
    for t in terms:
        y = t - carry
        s = total + y
        carry = (s - total) - y
        total = s
    return total


def _nearest_float32(x: Fraction) -> np.float32:
    """The float32 nearest to the rational x, ties to the even significand (no double rounding)."""
    f = np.float32(float(x))
    candidates = [np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf))]
    distance = [abs(Fraction(float(c)) - x) for c in candidates]
    best = min(distance)
    ties = [c for c, dist in zip(candidates, distance) if dist == best]
    return min(ties, key=lambda c: int(c.view(np.uint32)) & 1)


def _rounded(bits, sums, function, *vectors):
    with arith.rounded(bits, sums), arith.precision():
        return float(function(*([mpmath.mpf(float(v)) for v in vec] for vec in vectors)))


@pytest.mark.parametrize("seed", range(5))
def test_rounded_sums_are_the_float_formats_own(seed):
    rng = np.random.default_rng(seed)
    n = 200
    a64, b64 = rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n)), rng.standard_normal(n)
    a32, b32 = a64.astype(np.float32), b64.astype(np.float32)

    assert _rounded(53, "compensated", arith.fsum, a64) == _kahan(a64.tolist())
    assert _rounded(53, "compensated", arith.fdot, a64, b64) == _kahan((a64 * b64).tolist())

    separate = np.float32(0)
    for x, y in zip(a32, b32):
        separate = np.float32(separate + np.float32(x * y))
    assert _rounded(24, "separate", arith.fdot, a32, b32) == float(separate)
    plain = np.float32(0)
    for x in a32:
        plain = np.float32(plain + x)
    assert _rounded(24, "separate", arith.fsum, a32) == _rounded(24, "fused", arith.fsum, a32) == float(plain)

    fused = np.float32(0)
    for x, y in zip(a32, b32):
        fused = _nearest_float32(Fraction(float(fused)) + Fraction(float(x)) * Fraction(float(y)))
    assert _rounded(24, "fused", arith.fdot, a32, b32) == float(fused)
    assert float(fused) != float(separate)    # the two float32 programs round differently


def test_compensated_summation_is_more_accurate_than_one_rounding_per_addition():
    """Σ of 1 and 10^4 terms 1e-16: the plain sum loses every small term, Kahan's keeps them."""
    terms = [1.0] + [1e-16] * 10_000
    exact_sum = float(sum(Fraction(t) for t in terms))
    assert _rounded(53, "separate", arith.fsum, terms) == 1.0
    assert abs(_rounded(53, "compensated", arith.fsum, terms) - exact_sum) <= 2 ** -52 * exact_sum


def test_the_block_leaves_the_exact_arithmetic_and_mpmaths_context_as_they_were():
    inputs = shallow_eval()
    before, prec = exact.evaluate(inputs), mpmath.mp.prec
    with arith.rounded(24, "fused"):
        inside = exact.evaluate(inputs)
    after = exact.evaluate(inputs)
    assert mpmath.mp.prec == prec and arith._arithmetic == [arith.EXACT]
    assert all(after[k].tobytes() == before[k].tobytes() for k in before)
    scale = max(np.max(np.abs(before["grad_W"])), 1e-300)
    assert 1e-9 < np.max(np.abs(inside["grad_W"] - before["grad_W"])) / scale < 1e-5   # float32, not float64
    with pytest.raises(ValueError, match="sums must be one of compensated, fused, separate"):
        with arith.rounded(24, "pairwise"):
            pass
    with pytest.raises(ValueError, match="bits must be an integer"):
        with arith.rounded(24.0, "fused"):
            pass
    assert arith._arithmetic == [arith.EXACT]


def test_the_max_margin_solutions_stay_exact_in_a_rounded_arithmetic():
    """The one-hot embeddings are exact in float32, so the solutions are those of the exact run, bit for bit,
    while the trajectory is float32's."""
    inputs = twostage_train()
    whole = exact.train(inputs)
    with arith.rounded(24, "separate"):
        rounded = exact.train(inputs)
    for name in ("W_ov_star", "W_kq_star"):
        assert rounded[name].tobytes() == whole[name].tobytes(), name
    assert not np.array_equal(rounded["W_kq"], whole["W_kq"])
    assert np.allclose(rounded["W_kq"], whole["W_kq"], rtol=1e-4, atol=1e-5)
