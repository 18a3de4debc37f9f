"""Vectorizable elementary functions for the Numba kernels: exp, expm1 and tanh in float64.

Numba lowers ``math.exp`` / ``math.tanh`` to scalar libm calls (pip's llvmlite has no SVML), so a loop
that calls them cannot be vectorized (docs/performance.md gives the cost). The functions here are plain
arithmetic (no calls, no data-dependent branches: every case is a select), so LLVM inlines them and
vectorizes the loops that call them (AVX2 / AVX-512). They never use fastmath and contain no FMA
contraction, so a result is the same whether a loop runs vectorized or scalar, on any thread.

exp(x)    Cody–Waite reduction x = n ln2 + r, n = round(x / ln2) (shifter 1.5·2^52, ties to even),
          ln2 = LN2_HI + LN2_LO (LN2_HI has 32 trailing zero bits, so n·LN2_HI is exact), |r| ≤ ln2/2;
          e^r − 1 = r + r² P(r), P the Taylor polynomial of degree 11 (so e^r to degree 13, truncation
          < 2^-55 relative) evaluated by Estrin's scheme (short dependency chains for scalar callers);
          then 2^n (1 + q) with 2^n = 2^n1 · 2^n2 (n1 = round(n/2)) built from exponent bits, so the
          subnormal range rounds once and overflow gives inf. x is clamped to [−746, 710] first
          (e^−746 rounds to 0, e^710 overflows), NaN passes through. Accuracy: ≤ 1 ulp measured
          (tests/test_vmath.py checks ≤ 2 ulp against np.exp over the whole range).
expm1(x)  the same reduction; 2^n q + (2^n − 1), for |x| ≤ 50 only (used by tanh).
tanh(x)   |x| < 0.3: the odd Taylor polynomial to x^27 (Horner in x²); otherwise
          t = expm1(2|x|) / (expm1(2|x|) + 2) (no 1 − … cancellation), |x| clamped to 20 (tanh = 1 in
          float64 beyond 19.06); the sign of x last. ≤ 1.5 ulp measured against a long-double
          reference, ≤ 2 ulp against np.tanh (tests/test_vmath.py checks 2).

Division: Numba's default error model checks every float division for zero, which blocks
vectorization; kernels that call :func:`tanh` should be compiled with ``error_model="numpy"`` (the
results are the same; only a division by zero would give inf/NaN instead of raising).

Bit manipulation uses NumPy scalar views (``np.float64(x).view(np.int64)``), which Numba lowers to a
bitcast and which also run interpreted under NUMBA_DISABLE_JIT=1.
Note: Numba's on-disk cache does not notice edits to this file from kernels in other modules; clear
the ``__pycache__`` directories after changing it.
"""
import numpy as np
from numba import njit

LOG2E = 1.4426950408889634
LN2_HI = 6.93147180369123816490e-01     # 0x3fe62e42fee00000
LN2_LO = 1.90821492927058770002e-10     # 0x3dea39ef35793c76
SHIFTER = 6755399441055744.0            # 1.5 * 2^52: x + SHIFTER rounds x to an integer (|x| < 2^51)
SHIFTER_BITS = 0x4338000000000000       # bit pattern of SHIFTER; bits(SHIFTER + n) = SHIFTER_BITS + n
EXP_HI = 710.0                          # e^x = inf in float64 for x ≥ 709.79
EXP_LO = -746.0                         # e^x rounds to 0 for x ≤ −745.14
TANH_SAT = 20.0                         # tanh(x) rounds to 1 for x ≥ 19.06
TANH_POLY = 0.3                         # tanh uses its Taylor polynomial below this |x|

# 1/k! for k = 2..13 (the Taylor coefficients of (e^r − 1 − r)/r²)
_C2 = 1.0 / 2.0
_C3 = 1.0 / 6.0
_C4 = 1.0 / 24.0
_C5 = 1.0 / 120.0
_C6 = 1.0 / 720.0
_C7 = 1.0 / 5040.0
_C8 = 1.0 / 40320.0
_C9 = 1.0 / 362880.0
_C10 = 1.0 / 3628800.0
_C11 = 1.0 / 39916800.0
_C12 = 1.0 / 479001600.0
_C13 = 1.0 / 6227020800.0

# Taylor coefficients of tanh(x) = x + Σ_k T_k x^k (k odd, 2^{k+1}(2^{k+1} − 1) B_{k+1} / (k+1)!), used for
# |x| < TANH_POLY, where the truncation after x^27 is below 2^-60 relative
_T3 = -1.0 / 3.0
_T5 = 2.0 / 15.0
_T7 = -17.0 / 315.0
_T9 = 62.0 / 2835.0
_T11 = -1382.0 / 155925.0
_T13 = 21844.0 / 6081075.0
_T15 = -929569.0 / 638512875.0
_T17 = 6404582.0 / 10854718875.0
_T19 = -443861162.0 / 1856156927625.0
_T21 = 18888466084.0 / 194896477400625.0
_T23 = -113927491862.0 / 2900518163668125.0
_T25 = 58870668456604.0 / 3698160658676859375.0
_T27 = -8374643517010684.0 / 1298054391195577640625.0


@njit(cache=True, inline="always")
def _pow2(n):
    """2^n as float64 for an integer-valued float n with −1022 ≤ n ≤ 1023 (from the exponent bits)."""
    bits = np.float64(n + SHIFTER).view(np.int64) - SHIFTER_BITS + 1023
    return np.int64(bits << 52).view(np.float64)


@njit(cache=True, inline="always")
def _reduce(x):
    """(n, r, q): x = n ln2 + r with n integer-valued (float), |r| ≤ ln2/2, q = e^r − 1."""
    n = (x * LOG2E + SHIFTER) - SHIFTER
    r = (x - n * LN2_HI) - n * LN2_LO
    r2 = r * r
    r4 = r2 * r2
    p = ((_C2 + _C3 * r) + (_C4 + _C5 * r) * r2) + ((_C6 + _C7 * r) + (_C8 + _C9 * r) * r2) * r4
    p = p + ((_C10 + _C11 * r) + (_C12 + _C13 * r) * r2) * (r4 * r4)
    q = r + r2 * p
    return n, r, q


@njit(cache=True, inline="always")
def exp(x):
    """e^x for a float64 x, every input (±inf, NaN, overflow to inf, underflow through the subnormals
    to 0); within 1 ulp of the correctly rounded value (module docstring)."""
    xc = EXP_HI if x > EXP_HI else x
    xc = EXP_LO if xc < EXP_LO else xc
    xc = 0.0 if x != x else xc
    n, r, q = _reduce(xc)
    n1 = (n * 0.5 + SHIFTER) - SHIFTER
    y = ((1.0 + q) * _pow2(n1)) * _pow2(n - n1)
    return x if x != x else y


@njit(cache=True, inline="always")
def expm1(x):
    """e^x − 1 for finite |x| ≤ 50 (the callers clamp), accurate also near 0."""
    n, r, q = _reduce(x)
    s = _pow2(n)
    return s * q + (s - 1.0)


@njit(cache=True, inline="always")
def tanh(x):
    """tanh(x) for a float64 x, every input (±inf → ±1, NaN → NaN, −0 → −0); within 2 ulp of np.tanh
    (module docstring). Both branches are computed and one is selected, so loops stay vectorizable."""
    ax = abs(x)
    ax = TANH_SAT if ax > TANH_SAT else ax
    ax = 0.0 if x != x else ax
    w = ax * ax
    p = _T25 + w * _T27
    p = _T23 + w * p
    p = _T21 + w * p
    p = _T19 + w * p
    p = _T17 + w * p
    p = _T15 + w * p
    p = _T13 + w * p
    p = _T11 + w * p
    p = _T9 + w * p
    p = _T7 + w * p
    p = _T5 + w * p
    p = _T3 + w * p
    small = ax + ax * (w * p)
    u = expm1(2.0 * ax)
    t = u / (u + 2.0)
    t = small if ax < TANH_POLY else t
    t = -t if x < 0.0 else t
    t = x if x == 0.0 else t
    return x if x != x else t


@njit(cache=True, error_model="numpy")
def exp_array(x, out):
    """out[i] = exp(x[i]) for 1-D float64 arrays (a vectorized loop; tests and benchmarks)."""
    for i in range(x.shape[0]):
        out[i] = exp(x[i])


@njit(cache=True, error_model="numpy")
def tanh_array(x, out):
    """out[i] = tanh(x[i]) for 1-D float64 arrays (a vectorized loop; tests and benchmarks)."""
    for i in range(x.shape[0]):
        out[i] = tanh(x[i])
