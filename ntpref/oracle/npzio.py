"""Reading and writing interchange ``.npz`` files (spec/interchange.md, "Files").

Files are never unpickled (``allow_pickle=False``), members are size-checked before they are
decompressed (no zip bombs), and every write is atomic: a temporary file in the target directory,
flushed and fsynced, then renamed over the target, so an interrupted write leaves the old file or
the new one, never half of one.
"""
from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from ..errors import InputError

#: Largest total uncompressed size accepted when reading an npz file (bytes).
MAX_UNCOMPRESSED = 4 << 30
#: Largest accepted compression ratio of one member (a zip bomb has ratios in the thousands).
MAX_RATIO = 1000


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All arrays of an npz file as a dict (name → array), read eagerly.

    Raises InputError, naming the file, when it is missing, not an npz/zip file, truncated,
    oversized when decompressed, or holds object arrays.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        with zipfile.ZipFile(path) as zf:
            total = 0
            for info in zf.infolist():
                total += info.file_size
                if info.file_size > 1 << 20 and info.file_size > MAX_RATIO * max(info.compress_size, 1):
                    raise InputError(f"{path}: member '{info.filename}' expands {info.file_size // max(info.compress_size, 1)}x (zip bomb?)")
            if total > MAX_UNCOMPRESSED:
                raise InputError(f"{path}: {total} bytes uncompressed exceeds the limit of {MAX_UNCOMPRESSED}")
            bad = zf.testzip()
            if bad is not None:
                raise InputError(f"{path}: member '{bad}' is corrupted (CRC mismatch)")
    except zipfile.BadZipFile as exc:
        raise InputError(f"{path}: not an npz file ({exc})") from None
    except InputError:
        raise
    except Exception as exc:  # zipfile raises OSError, EOFError, RuntimeError ("File is encrypted"), ...
        raise InputError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    out: dict[str, np.ndarray] = {}
    try:
        with np.load(path, allow_pickle=False) as data:
            for name in data.files:
                try:
                    out[name] = data[name]
                except ValueError as exc:
                    raise InputError(f"{path}: array '{name}' cannot be read without unpickling ({exc})") from None
                if not isinstance(out[name], np.ndarray):  # np.load hands back raw bytes for non-.npy members
                    raise InputError(f"{path}: member '{name}' is not a .npy array")
    except InputError:
        raise
    except Exception as exc:  # truncated members, bad headers: numpy raises several types
        raise InputError(f"{path}: unreadable npz file ({type(exc).__name__}: {exc})") from None
    return out


def atomic_write(path: str | os.PathLike, write: Callable[[object], None]) -> None:
    """Call ``write(fileobj)`` on a temporary file next to ``path``, fsync it, then rename it to ``path``.

    An operating-system error (unwritable directory, ``path`` is a directory, disk full) is an InputError
    naming ``path``; the temporary file is removed and an existing ``path`` is left untouched."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError):  # e.g. the target is a directory, or the disk is full
            raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise


def save_npz(path: str | os.PathLike, arrays: Mapping[str, object]) -> None:
    """Write ``arrays`` to ``path`` as an uncompressed npz, atomically.

    Each value is stored as a C-order array; object arrays are refused (files must never need pickle).
    """
    clean = {}
    for name, value in arrays.items():
        a = np.asarray(value, order="C")
        if a.dtype.kind == "O":
            raise InputError(f"array '{name}': object arrays cannot be written (they would need pickle)")
        clean[name] = a
    atomic_write(path, lambda fh: np.savez(fh, **clean))
