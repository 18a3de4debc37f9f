"""Reading and writing interchange ``.npz`` files (docs/contract.md, "Files").

Reading: the input must be a regular file (a directory, FIFO or device is refused before it is opened, so
a FIFO never blocks); it is never unpickled. The zip directory is checked before anything is decompressed:
at most :data:`MAX_MEMBERS` members, each named ``NAME.npy`` and each name once, adding up to at most the
memory budget (:func:`memory_budget`, 4 GiB unless ``NTPREF_MAX_NPZ_BYTES`` says otherwise). Then each
member's ``.npy`` header is read and checked (ntpref.npyheader) and the member must hold exactly
that header and the data it describes, no byte less or more; its CRC is verified as it is read. A member
matching its own header is legitimate whatever its compression ratio (zeros compress 1000x); only memory
counts, against the budget. A single ``.npy`` file (:func:`load_npy`) gets the same checks: a regular file
within the budget, holding exactly a checked header and the data it describes.

Writing (:func:`atomic_write`): a temporary ``.NAME.XXXXXXXX.tmp`` next to the target, flushed, fsynced and
renamed over it, so an interrupted write leaves the old file or the new one, never half of one; several
files are written all or none by :func:`atomic_write_all` (all temporaries first, then the renames).
Temporaries left by a killed writer of the same name are removed by the next write. Only a regular file is
replaced; a symbolic link is written through (its target file is replaced); a new file gets mode
0666 & ~umask, a replaced file keeps its mode. Missing parent directories are created, and removed again
when the write fails. :func:`check_output` refuses a path that cannot be written before a command spends
time computing what goes into it.
"""
from __future__ import annotations

import errno
import fcntl
import os
import re
import secrets
import stat
import zipfile
import zlib
from collections.abc import Callable, Mapping
from contextlib import suppress
from pathlib import Path

import numpy as np

from .errors import InputError
from .npyheader import dtype_problem, read_header

#: Most members (arrays) an npz file may hold, read or written.
MAX_MEMBERS = 256
#: Memory budget of one npz file's arrays, decompressed, unless NTPREF_MAX_NPZ_BYTES sets another (bytes).
DEFAULT_BUDGET = 4 << 30
BUDGET_VARIABLE = "NTPREF_MAX_NPZ_BYTES"
#: A refused member expanding more than this ratio (and to over 1 MiB) is reported as a likely zip bomb.
BOMB_RATIO = 1000
_CHUNK = 1 << 24
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def memory_budget() -> int:
    """Largest total decompressed size of one npz file's members (bytes): NTPREF_MAX_NPZ_BYTES, e.g. "8G"
    or "8589934592" (units K, M, G, T are powers of 1024), or 4 GiB when unset."""
    text = os.environ.get(BUDGET_VARIABLE, "").strip()
    if not text:
        return DEFAULT_BUDGET
    m = re.fullmatch(r"(\d+)\s*([KMGT]?)(?:i?B)?", text, re.IGNORECASE)
    if not m:
        raise InputError(f"{BUDGET_VARIABLE}={text!r}: expected a number of bytes such as 8G or 8589934592")
    return int(m.group(1)) * _UNITS[m.group(2).upper()]


# --- what a path is --------------------------------------------------------------------------------
def _kind(mode: int) -> str:
    """'a regular file', 'a directory', 'a FIFO', ... for a file mode."""
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def _not_a_directory(path: Path) -> str:
    """"'A' is a regular file, not a directory" for the nearest existing ancestor of ``path`` that is not a
    directory ("" when every existing ancestor is one)."""
    for d in path.parents:
        with suppress(OSError):
            mode = os.stat(d).st_mode
            return "" if stat.S_ISDIR(mode) else f"'{d}' is {_kind(mode)}, not a directory"
    return ""


def _reason(exc: OSError, path: Path) -> str:
    """Why an operating-system call on ``path`` failed, in words (no errno numbers)."""
    if exc.errno == errno.ELOOP:
        return "symbolic link loop"
    if exc.errno == errno.ENOENT and os.path.islink(path):
        return f"dangling symbolic link to '{os.readlink(path)}'"
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        why = _not_a_directory(path)
        return f"no such file ({why})" if why else "no such file"
    return exc.strerror or str(exc)


def _check_name(path, what: str) -> None:
    text = os.fsdecode(os.fspath(path))
    if not text:
        raise InputError(f"{what} file name is empty")
    if text.endswith(("/", os.sep)):
        raise InputError(f"{text}: {what} file name ends with '/': give a file, not a directory")


# --- reading -------------------------------------------------------------------------------------------
def open_regular(path: Path, what: str = "an npz file") -> int:
    """A read-only descriptor of ``path``, which must be a regular file: checked before opening (a FIFO would
    block, a device may act on open) and again on the open descriptor; ``what`` names the expected file in
    the InputError ("is a FIFO, not an npz file")."""
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISREG(mode):
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            mode = os.fstat(fd).st_mode
            if stat.S_ISREG(mode):
                return fd
            os.close(fd)
    except OSError as exc:
        raise InputError(f"{path}: {_reason(exc, path)}") from None
    raise InputError(f"{path}: is {_kind(mode)}, not {what}")


def _where(path: Path, name: str, info: zipfile.ZipInfo) -> str:
    """"FILE: array 'NAME' (member 'NAME.npy')", the start of a message about one member."""
    return f"{path}: array '{name}' (member '{info.filename}')"


def _bomb_hint(info: zipfile.ZipInfo) -> str:
    ratio = info.file_size // max(info.compress_size, 1)
    if info.file_size > 1 << 20 and ratio > BOMB_RATIO:
        return f" (it expands {ratio}x: zip bomb?)"
    return ""


def _check_directory(path: Path, zf: zipfile.ZipFile) -> dict[str, zipfile.ZipInfo]:
    """Array name → zip member, after checking names, count, encryption and total size; nothing is read."""
    infos = zf.infolist()
    if len(infos) > MAX_MEMBERS:
        raise InputError(f"{path}: {len(infos)} members, more than the {MAX_MEMBERS} an npz file may hold")
    members: dict[str, zipfile.ZipInfo] = {}
    for info in infos:
        name = info.filename.removesuffix(".npy")
        if name in members:
            raise InputError(f"{path}: array '{name}' is stored twice (members '{members[name].filename}' "
                             f"and '{info.filename}')")
        members[name] = info
    for name, info in members.items():
        if not info.filename.endswith(".npy"):
            raise InputError(f"{path}: member '{info.filename}' is not a .npy array (its name does not end "
                             f"in .npy){_bomb_hint(info)}")
        if info.flag_bits & 0x1:
            raise InputError(f"{_where(path, name, info)}: encrypted (ntpref reads plain zip files)")
    total, budget = sum(i.file_size for i in infos), memory_budget()
    if total > budget:
        raise InputError(f"{path}: its arrays take {total} bytes decompressed, more than the memory budget of "
                         f"{budget} bytes (set {BUDGET_VARIABLE}, e.g. to 16G, to allow more)")
    return members


def _read_array(stream, size: int) -> np.ndarray:
    """The array of a ``.npy`` stream of ``size`` bytes: header checked against the size, data read into
    place. InputError (a message completing "array 'NAME': ...") when the header is malformed or the
    stream holds a byte less or more than the header describes."""
    header = read_header(stream)
    need = header.size + header.nbytes
    if size < need:
        raise InputError(f"truncated: its header describes {header.describe()}, {header.nbytes} bytes of "
                         f"data, but only {size - header.size} follow")
    if size > need:
        raise InputError(f"{size - need} unexpected bytes after its data ({header.describe()})")
    raw = np.empty(header.nbytes, dtype=np.uint8)
    view, pos = memoryview(raw), 0
    while pos < header.nbytes:
        chunk = stream.read(min(_CHUNK, header.nbytes - pos))
        if not chunk:
            raise InputError(f"truncated: {pos} of its {header.nbytes} bytes of data are present")
        view[pos: pos + len(chunk)] = chunk
        pos += len(chunk)
    return raw.view(header.dtype).reshape(header.shape, order="F" if header.fortran_order else "C")


def _read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> np.ndarray:
    """The array of one member (:func:`_read_array`). Reading the member's last byte makes zipfile verify its
    CRC (a mismatch raises BadZipFile)."""
    with zf.open(info) as stream:
        return _read_array(stream, info.file_size)


def load_npz(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """All arrays of an npz file as a dict (name → array), read eagerly.

    Raises InputError, naming the file and, when the problem lies in one member, the array: the path is not a
    regular file, not a zip, truncated, corrupted (CRC), over the memory budget, holds a member that is
    not a well-formed ``.npy`` array of exactly its header's size, an object array, or a name twice.
    """
    _check_name(path, "input")
    path = Path(path)
    out: dict[str, np.ndarray] = {}
    with os.fdopen(open_regular(path), "rb") as fh:
        try:
            zf = zipfile.ZipFile(fh)
        except zipfile.BadZipFile as exc:
            raise InputError(f"{path}: not an npz file ({exc})") from None
        except Exception as exc:  # noqa: BLE001 - OSError, EOFError, ValueError from a mangled zip directory
            raise InputError(f"{path}: not an npz file ({type(exc).__name__}: {exc})") from None
        with zf:
            for name, info in _check_directory(path, zf).items():
                try:
                    out[name] = _read_member(zf, info)
                except InputError as exc:
                    raise InputError(f"{_where(path, name, info)}: {exc}{_bomb_hint(info)}") from None
                except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:  # CRC mismatch, bad deflate data
                    raise InputError(f"{_where(path, name, info)}: corrupted ({exc})") from None
                except Exception as exc:  # noqa: BLE001 - unknown compression method, encrypted, ...
                    raise InputError(f"{_where(path, name, info)}: unreadable ({type(exc).__name__}: {exc})") from None
    return out


def load_npy(path: str | os.PathLike) -> np.ndarray:
    """The array of one ``.npy`` file, read eagerly and never unpickled (for directories of arrays, one file
    per array, such as ``ntpref conformance --command`` with ``{output_dir}``).

    Raises InputError naming the file: the path is not a regular file, is larger than the memory budget
    (:func:`memory_budget`), or is not a well-formed ``.npy`` array of exactly its header's size (an object
    array, a malformed or lying header, missing or extra bytes).
    """
    _check_name(path, "input")
    path = Path(path)
    with os.fdopen(open_regular(path, "a .npy file"), "rb") as fh:
        size, budget = os.fstat(fh.fileno()).st_size, memory_budget()
        if size > budget:
            raise InputError(f"{path}: {size} bytes, more than the memory budget of {budget} bytes (set "
                             f"{BUDGET_VARIABLE}, e.g. to 16G, to allow more)")
        try:
            return _read_array(fh, size)
        except InputError as exc:
            raise InputError(f"{path}: {exc}") from None
        except OSError as exc:
            raise InputError(f"{path}: unreadable ({exc.strerror or exc})") from None


# --- writing -------------------------------------------------------------------------------------------
def _output_file(path: Path) -> tuple[Path, int | None]:
    """(the file to replace, its mode) for an output ``path``; the mode is None for a new file.

    A symbolic link resolves to its target, which must exist; only a regular file may be replaced."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR) and not os.path.islink(path):
            return path, None  # a new file (a parent that is not a directory is reported by _make_parents)
        raise InputError(f"{path}: cannot write ({_reason(exc, path)})") from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: cannot write: it is {_kind(st.st_mode)}, not a regular file (only regular files "
                         "are replaced)")
    return (Path(os.path.realpath(path)) if os.path.islink(path) else path), stat.S_IMODE(st.st_mode)


def _missing_parents(path: Path, folder: Path) -> list[Path]:
    """The directories of ``folder`` that do not exist yet, innermost first; InputError when the nearest
    existing one is not a directory (or cannot be looked at)."""
    missing = []
    for d in (folder, *folder.parents):
        try:
            mode = os.stat(d).st_mode
        except (FileNotFoundError, NotADirectoryError):
            missing.append(d)
            continue
        except OSError as exc:
            raise InputError(f"{path}: cannot write ({_reason(exc, d)})") from None
        if not stat.S_ISDIR(mode):
            raise InputError(f"{path}: cannot write: '{d}' is {_kind(mode)}, not a directory")
        break
    return missing


def _make_parents(path: Path, folder: Path) -> list[Path]:
    """Create the missing directories of ``folder``; returns the ones created, outermost first."""
    created: list[Path] = []
    for d in reversed(_missing_parents(path, folder)):
        try:
            d.mkdir()
        except OSError as exc:
            _remove_dirs(created)
            raise InputError(f"{path}: cannot write (cannot create '{d}': {_reason(exc, d)})") from None
        created.append(d)
    return created


def _remove_dirs(created: list[Path]) -> None:
    for d in reversed(created):
        with suppress(OSError):
            d.rmdir()


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        now, st = os.lstat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _remove_stale_temporaries(target: Path) -> None:
    """Delete ``.NAME.XXXXXXXX.tmp`` files of ``target`` left by killed writers: regular files of this user
    that no live writer holds locked (a writer keeps an exclusive flock on its temporary until it is renamed)."""
    pattern = re.compile(re.escape(f".{target.name}.") + r"[A-Za-z0-9_]{8}\.tmp")
    with suppress(OSError), os.scandir(target.parent) as entries:
        names = [e.name for e in entries if pattern.fullmatch(e.name)]
    for name in names:
        full = target.parent / name
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError:  # a symbolic link, gone already, unreadable: not ours to remove
            continue
        try:
            st = os.fstat(fd)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)   # fails while a live writer holds it
                if _same_file(fd, full):
                    os.unlink(full)
        except OSError:
            pass
        finally:
            os.close(fd)


def _new_temporary(target: Path) -> tuple[int, Path]:
    """A new, exclusively locked temporary file next to ``target``: (descriptor, path). Created with mode
    0666 so that the umask (and a default ACL) applies as to any new file."""
    for _ in range(100):
        tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
        except FileExistsError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # a concurrent cleanup took it for a stale one and is removing it
            os.close(fd)
            continue
        except OSError:  # a file system without locks: no cleanup can lock, hence remove, it either
            pass
        if _same_file(fd, tmp):
            return fd, tmp
        os.close(fd)
    raise InputError(f"{target}: cannot write (no free temporary file name in {target.parent})")


def check_output(path: str | os.PathLike) -> None:
    """Raise the InputError :func:`atomic_write` would raise for ``path`` before writing anything (a name
    that is empty or ends in '/', a target that is not a regular file, a parent that is not a directory),
    so that a command can refuse a bad output path before a long computation; nothing is created."""
    _check_name(path, "output")
    path = Path(path)
    _missing_parents(path, _output_file(path)[0].parent)


def atomic_write(path: str | os.PathLike, write: Callable[[object], None]) -> None:
    """Call ``write(fileobj)`` on a temporary file next to ``path``, fsync it, then rename it to ``path``.

    ``path`` must be absent, a regular file (its mode is kept) or a symbolic link to one (the target is
    replaced). Anything else, an empty name, a name ending in '/', a parent that is not a directory, and
    any operating-system error (disk full, read-only) is an InputError naming ``path``; then the temporary
    file and the parent directories this call created are removed and an existing file is left untouched.
    """
    atomic_write_all({path: write})


def atomic_write_all(writes: Mapping[str | os.PathLike, Callable[[object], None]]) -> None:
    """:func:`atomic_write` of several files, all or none: every path is checked before anything is
    created, every file written and fsynced to its temporary, and only then are the temporaries renamed
    over their targets, so an InputError (a path that cannot be written, a full disk) leaves every target
    as it was, with no temporary file or created directory left."""
    plans = []
    for name, write in writes.items():
        _check_name(name, "output")
        path = Path(name)
        target, mode = _output_file(path)
        _missing_parents(path, target.parent)
        plans.append((path, target, mode, write))
    created: list[Path] = []
    staged: list[tuple[object, Path, Path, Path]] = []   # (open temporary, its name, target, path), still locked
    path = None
    try:
        for path, target, mode, write in plans:
            created += _make_parents(path, target.parent)
            _remove_stale_temporaries(target)
            fd, tmp = _new_temporary(target)
            fh = os.fdopen(fd, "wb")
            staged.append((fh, tmp, target, path))
            if mode is not None:
                os.fchmod(fh.fileno(), mode)
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        while staged:   # still holding the locks, so no cleanup can remove a temporary first
            fh, tmp, target, path = staged[0]
            os.replace(tmp, target)
            staged.pop(0)
            fh.close()
    except BaseException as exc:
        for fh, tmp, _, _ in staged:
            fh.close()
            with suppress(FileNotFoundError):
                os.unlink(tmp)
        _remove_dirs(created)
        if isinstance(exc, OSError):  # e.g. the disk is full
            raise InputError(f"{path}: cannot write ({exc.strerror or exc})") from None
        raise


def save_npz(path: str | os.PathLike, arrays: Mapping[str, object]) -> None:
    """Write ``arrays`` to ``path`` as an uncompressed npz, atomically (see :func:`atomic_write`).

    Each value is stored as a C-order array; what :func:`load_npz` would refuse is refused here: object
    arrays (files never need pickle), zero-byte items, more than :data:`MAX_MEMBERS` arrays.
    """
    if len(arrays) > MAX_MEMBERS:
        raise InputError(f"{path}: {len(arrays)} arrays, more than the {MAX_MEMBERS} an npz file may hold")
    clean = {}
    for name, value in arrays.items():
        a = np.asarray(value, order="C")
        problem = dtype_problem(a.dtype)
        if problem:
            raise InputError(f"array '{name}': {problem}")
        clean[name] = a
    atomic_write(path, lambda fh: np.savez(fh, **clean))
