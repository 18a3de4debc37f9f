"""Multiprecision building blocks of the exact backend: the working precision, conversion between
float64 arrays and nested lists of ``mpmath.mpf``, and the few operations every model uses.

Every value is a Python ``mpmath.mpf`` held in nested lists shaped like the array it stands for
(``[d][K]`` for an array [d, K]); every loop is a plain Python loop. All arithmetic runs inside
:func:`precision`, ``mpmath.workdps(DPS)`` with ``DPS = 50`` significant digits, which restores the
caller's mpmath context on exit, so the process's global ``mpmath.mp`` is never changed. A float64 input
converts to an mpf exactly (53 bits fit in the ~169 bits of 50 digits); sums and dot products use
:func:`fsum` / :func:`fdot`, which are ``mpmath.fsum`` / ``mpmath.fdot``: they form the products exactly
and round the sum once (terms more than about twice the precision below the running sum are dropped, far
below any rounding that matters).

The same loops also run in a *rounded* arithmetic (:class:`Arithmetic`, :func:`rounded`): every operation
and every input rounded to a float format's significand (53 bits for float64, 24 for float32), and every
sum and dot product formed left to right in one of three ways (:data:`SUMS`): compensated (Kahan's
summation of the rounded products), with a fused multiply-add per term (one rounding of ``acc + a·b``), or
with the product and the addition rounded separately. Such a run is a correct float64 or float32 program
that rounds differently from the oracle's backends (docs/exact.md, "Rounded arithmetics"); the exponent
stays unbounded, so nothing underflows or overflows. The max-margin solutions (:mod:`.maxmargin`) are
solved in the exact arithmetic whatever the arithmetic around them (:func:`exact`).
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from typing import NamedTuple

import mpmath
import numpy as np

from ..checks import as_scalar

#: Significant decimal digits of the working precision.
DPS = 50
ACTIVATIONS = ("tanh", "erf")


#: How a rounded arithmetic forms a sum Σ t_i or a dot product Σ a_i b_i, left to right.
SUMS = ("compensated", "fused", "separate")


class Arithmetic(NamedTuple):
    """The arithmetic of a run: ``bits`` of significand every operation rounds to (None: DPS decimal
    digits) and ``sums``, how sums and dot products round: "once" (exact: ``mpmath.fsum`` / ``fdot``) or
    one of :data:`SUMS`."""

    bits: int | None
    sums: str


EXACT = Arithmetic(None, "once")
_arithmetic = [EXACT]   # the innermost arithmetic of :func:`rounded` / :func:`exact` last


@contextmanager
def rounded(bits: int, sums: str):
    """Run the exact backend's loops within the block in ``bits``-bit rounded arithmetic with the sums of
    ``sums`` (module docstring): e.g. ``with rounded(24, "fused"): evaluate(arrays)``."""
    if sums not in SUMS:
        raise ValueError(f"sums must be one of {', '.join(SUMS)}, got {sums!r}")
    if not (isinstance(bits, int) and bits >= 2):
        raise ValueError(f"bits must be an integer >= 2, got {bits!r}")
    _arithmetic.append(Arithmetic(bits, sums))
    try:
        yield
    finally:
        _arithmetic.pop()


@contextmanager
def exact():
    """The exact arithmetic within the block, whatever arithmetic surrounds it: :func:`precision` is
    ``mpmath.workdps(DPS)`` there and sums are rounded once."""
    _arithmetic.append(EXACT)
    try:
        with precision():
            yield
    finally:
        _arithmetic.pop()


def precision():
    """The context manager of the working precision: ``mpmath.workdps(DPS)``, or in a rounded arithmetic
    ``mpmath.workprec(bits)``."""
    bits = _arithmetic[-1].bits
    return mpmath.workdps(DPS) if bits is None else mpmath.workprec(bits)


def fsum(terms) -> mpmath.mpf:
    """``Σ_i t_i`` (any iterable of mpf): rounded once, or left to right in a rounded arithmetic (compensated:
    Kahan's summation; fused and separate: one rounding per addition)."""
    sums = _arithmetic[-1].sums
    if sums == "once":
        return mpmath.fsum(terms)
    total = mpmath.mpf(0)
    if sums == "compensated":
        carry = mpmath.mpf(0)
        for t in terms:
            y = t - carry
            s = total + y
            carry = (s - total) - y
            total = s
        return total
    for t in terms:
        total = total + t
    return total


def fdot(a: Sequence, b: Sequence) -> mpmath.mpf:
    """``Σ_i a_i b_i``: products exact and the sum rounded once, or left to right in a rounded arithmetic
    (compensated: Kahan's summation of the rounded products; fused: ``acc ← round(acc + a_i b_i)``;
    separate: ``acc ← round(acc + round(a_i b_i))``)."""
    sums = _arithmetic[-1].sums
    if sums == "once":
        return mpmath.fdot(a, b)
    pairs = zip(a, b, strict=True)
    if sums == "fused":
        total = mpmath.mpf(0)
        for x, y in pairs:
            total = mpmath.fadd(total, mpmath.fmul(x, y, exact=True))
        return total
    return fsum(x * y for x, y in pairs)


def to_mp(x):
    """A float64 array (any shape, any real dtype converted to float64 first, as the oracle does) as nested
    lists of mpf, or one mpf for a 0-d array; exact. Call inside :func:`precision`."""
    def convert(v):
        return [convert(w) for w in v] if isinstance(v, list) else mpmath.mpf(v)
    return convert(np.asarray(x, dtype=np.float64).tolist())


def to_numpy(value, as_float: bool = True) -> np.ndarray:
    """Nested lists of mpf (or one mpf) as an array of the same shape: float64, each entry rounded to the
    nearest float64 (``as_float``), or an object array of the mpf values themselves."""
    shape, v = [], value
    while isinstance(v, list):
        shape.append(len(v))
        v = v[0]
    entries = flatten(value)
    out = np.empty(len(entries), dtype=np.float64 if as_float else object)
    for i, x in enumerate(entries):
        out[i] = float(x) if as_float else x
    return out.reshape(shape)


def flatten(value) -> list:
    """The mpf entries of nested lists (or of one mpf) in row-major order."""
    if not isinstance(value, list):
        return [value]
    return [v for w in value for v in flatten(w)]


def zeros(*shape):
    """Nested lists of mpf zeros of ``shape``."""
    if not shape:
        return mpmath.mpf(0)
    return [zeros(*shape[1:]) for _ in range(shape[0])]


def norm(value) -> mpmath.mpf:
    """Frobenius (Euclidean) norm ``sqrt(Σ v²)`` over every entry of nested lists."""
    entries = flatten(value)
    return mpmath.sqrt(fdot(entries, entries))


def combine(a, b, alpha):
    """``a + alpha · b`` entrywise for nested lists of the same shape (or two mpf)."""
    if isinstance(a, list):
        return [combine(u, v, alpha) for u, v in zip(a, b, strict=True)]
    return a + alpha * b


def matvec(A: Sequence[Sequence], x: Sequence) -> list:
    """``A x`` for A [r][k], x [k]: ``(A x)_i = Σ_k A_ik x_k``."""
    return [fdot(row, x) for row in A]


def rmatvec(A: Sequence[Sequence], x: Sequence) -> list:
    """``Aᵀ x`` for A [r][k], x [r]: ``(Aᵀ x)_k = Σ_i A_ik x_i``."""
    return [fdot([row[k] for row in A], x) for k in range(len(A[0]))]


def add_outer(G: list, w, a: Sequence, b: Sequence) -> None:
    """``G += w · a bᵀ`` in place, G [len a][len b]."""
    for i, ai in enumerate(a):
        wa, row = w * ai, G[i]
        for k, bk in enumerate(b):
            row[k] += wa * bk


def softmax(v: Sequence) -> list:
    """``softmax(v)_t = e^{v_t − max v} / Σ_k e^{v_k − max v}`` (the shift only keeps the numbers small)."""
    top = max(v)
    e = [mpmath.exp(x - top) for x in v]
    total = fsum(e)
    return [x / total for x in e]


def activation(name: str):
    """(σ, σ') of an activation (docs/shallow.md §1): "tanh": σ = tanh, σ' = sech² (= 1 − tanh², formed
    without the cancellation); "erf": σ(x) = erf(x/√2), σ'(x) = √(2/π) e^{−x²/2}."""
    if name == "tanh":
        return mpmath.tanh, lambda x: mpmath.sech(x) ** 2
    if name == "erf":
        return (lambda x: mpmath.erf(x / mpmath.sqrt(2)),
                lambda x: mpmath.sqrt(2 / mpmath.pi) * mpmath.exp(-x * x / 2))
    raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}, got {name!r}")


def option(arrays, name: str, kind: str, default):
    """The 0-d option ``name`` of an input dict as a Python value (``default`` when absent); kind as for
    :func:`ntpref.checks.as_scalar` ("float" | "bool" | "str" | "int"): strings may be ``<U`` or ASCII ``S``."""
    return as_scalar(name, arrays[name], kind=kind) if name in arrays else default
