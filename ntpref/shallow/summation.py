"""The fixed summation orders shared by the shallow transformer and IndRNN kernels
(ntpref/shallow/kernels.py, ntpref/shallow/indrnn_kernels.py).

Every sum in those kernels runs left to right in index order, and the parallel ones reduce over fixed
blocks of samples, so a result never depends on the vector width or the number of threads:

- :func:`add4` is the one step of a left-to-right sum that the kernels use: they walk the summation index
  (over d, over T, or over samples) four terms at a time, ``acc = add4(acc, t0, t1, t2, t3)``, then one
  term at a time for the last < 4. The additions happen in the order of the plain one-term loop, so the
  result is that loop's, bit for bit.
- :func:`sum_blocks` is the reduction of the gradient kernels: each block of samples writes its own
  partial gradient (its samples in order), then the blocks are added serially in block order.

Note: Numba's on-disk cache does not notice edits to this file from the kernels that call it; clear the
``__pycache__`` directories after changing it.
"""
from numba import njit


@njit(cache=True, inline="always")
def add4(acc, t0, t1, t2, t3):
    """(((acc + t0) + t1) + t2) + t3: four terms of a left-to-right sum added to the running value acc."""
    return (((acc + t0) + t1) + t2) + t3


@njit(cache=True)
def sum_blocks(parts, total):
    """total = Σ_b parts[b], the blocks b = 0..nb−1 added in index order, element by element.

    parts [nb, *shape] and total [*shape] (overwritten), both C-contiguous."""
    nb = parts.shape[0]
    size = total.size
    block_parts = parts.reshape((nb, size))
    flat_total = total.reshape(size)
    for k in range(size):
        flat_total[k] = 0.0
    for b in range(nb):
        for k in range(size):
            flat_total[k] += block_parts[b, k]
