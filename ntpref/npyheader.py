"""The header of one ``.npy`` array, parsed without trusting it (docs/contract.md, "Files").

A ``.npy`` array is the magic string ``b"\\x93NUMPY"``, a major and a minor version byte, the header length
(uint16 little-endian in version 1.0, uint32 in 2.0 and 3.0), the header itself (a Python dict literal
``{'descr': ..., 'fortran_order': ..., 'shape': ...}``, latin-1 in versions 1.0 and 2.0, UTF-8 in 3.0), then
exactly prod(shape) × itemsize bytes of data. Every way a header can be malformed (truncated, lying about
its length, not a dict, missing keys, a negative or non-integer shape, a shape larger than any array, an
unknown dtype) is an InputError saying what is wrong; nothing here ever unpickles.
"""
from __future__ import annotations

import ast
import math
import struct
from dataclasses import dataclass

import numpy as np

from .errors import InputError

MAGIC = b"\x93NUMPY"
#: Longest header accepted (bytes); NumPy writes 128 bytes for the arrays of the contract.
MAX_HEADER = 1 << 16
#: Most dimensions an array may have (NumPy 1.x's limit; the contract's arrays have at most 3).
MAX_RANK = 32
#: Largest array NumPy can represent, in bytes, counting the nonzero sizes only (an array of shape (0, n)
#: holds no data, yet n × itemsize must not pass this either).
MAX_BYTES = int(np.iinfo(np.intp).max)
_LENGTH_FORMAT = {1: "<H", 2: "<I", 3: "<I"}


@dataclass(frozen=True)
class NpyHeader:
    """dtype, shape and memory order of one array; ``size`` is the length of everything before its data."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    size: int

    @property
    def nbytes(self) -> int:
        """Bytes of data that follow the header: prod(shape) × itemsize."""
        return math.prod(self.shape) * self.dtype.itemsize

    def describe(self) -> str:
        """'float64 [3, 4]', for messages."""
        return f"{self.dtype} {list(self.shape)}"


def dtype_problem(dtype: np.dtype) -> str | None:
    """Why arrays of ``dtype`` may not be stored in or read from an npz file, or None when they may."""
    if dtype.hasobject:
        return "dtype object: object arrays cannot be written without pickle nor read without unpickling"
    if dtype.subdtype is not None:
        return (f"dtype '{dtype}' is a subarray dtype (NumPy never writes one: store an array of shape "
                f"[..., {', '.join(map(str, dtype.shape))}] of '{dtype.base}' instead)")
    if dtype.itemsize == 0:
        return f"dtype '{dtype.str}' has zero-byte items (such an array holds no data, whatever its shape)"
    return None


def read_header(stream) -> NpyHeader:
    """Read and check the header at the start of ``stream`` (a binary file object); its data is not read.

    Raises InputError with a message that completes "array 'NAME': ..." (no file or array name in it).
    """
    start = _read(stream, len(MAGIC) + 2, "the .npy header")
    if start[: len(MAGIC)] != MAGIC:
        raise InputError("not a .npy array (it does not start with the .npy magic string)")
    major, minor = start[len(MAGIC)], start[len(MAGIC) + 1]
    if major not in _LENGTH_FORMAT or minor != 0:
        raise InputError(f"unsupported .npy format version {major}.{minor} (1.0, 2.0 and 3.0 are read)")
    fmt = _LENGTH_FORMAT[major]
    (length,) = struct.unpack(fmt, _read(stream, struct.calcsize(fmt), "the .npy header length"))
    if length > MAX_HEADER:
        raise InputError(f"the .npy header claims {length} bytes, more than the {MAX_HEADER} accepted")
    text = _read(stream, length, f"the {length}-byte .npy header")
    try:
        fields = ast.literal_eval(text.decode("utf-8" if major == 3 else "latin-1"))
    except Exception:  # noqa: BLE001 - SyntaxError, ValueError, MemoryError, RecursionError: all mean garbage
        raise InputError("the .npy header is not a Python dict literal") from None
    if not isinstance(fields, dict):
        raise InputError(f"the .npy header is a {type(fields).__name__}, not a dict of 'descr', 'fortran_order' "
                         "and 'shape'")
    if set(fields) != {"descr", "fortran_order", "shape"}:
        keys = ", ".join(sorted(map(repr, fields))) or "nothing"
        raise InputError(f"the .npy header holds {keys}; expected exactly 'descr', 'fortran_order' and 'shape'")
    shape, fortran = fields["shape"], fields["fortran_order"]
    if not isinstance(shape, tuple) or not all(type(n) is int for n in shape):
        raise InputError(f"the .npy header's shape {shape!r} is not a tuple of integers")
    if any(n < 0 for n in shape):
        raise InputError(f"the .npy header's shape {shape!r} has a negative dimension")
    if len(shape) > MAX_RANK:
        raise InputError(f"the .npy header's shape has {len(shape)} dimensions, more than {MAX_RANK}")
    if not isinstance(fortran, bool):
        raise InputError(f"the .npy header's fortran_order {fortran!r} is not True or False")
    try:
        dtype = np.lib.format.descr_to_dtype(fields["descr"])
    except Exception:  # noqa: BLE001 - TypeError, ValueError, KeyError, ... for a descr NumPy cannot read
        raise InputError(f"the .npy header's descr {fields['descr']!r} is not a NumPy dtype") from None
    problem = dtype_problem(dtype)
    if problem:
        raise InputError(problem)
    if math.prod(n for n in shape if n) * dtype.itemsize > MAX_BYTES:
        raise InputError(f"the .npy header's shape {shape!r} of {dtype} is larger than any array can be (its "
                         f"nonzero sizes times the item size pass {MAX_BYTES} bytes, even when a size is 0)")
    return NpyHeader(dtype, shape, fortran, len(start) + struct.calcsize(fmt) + length)


def _read(stream, n: int, what: str) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise InputError(f"{what} is truncated ({len(data)} of {n} bytes)")
    return data
