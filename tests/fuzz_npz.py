"""The npz surface of the command-line fuzzer (tests/fuzz_cli.py): ``ntpref eval`` / ``ntpref train`` of a
valid input after array-level and file-level mutations."""
from __future__ import annotations

import contextlib
import io
import struct
import warnings
import zipfile
from pathlib import Path

import numpy as np

from ntpref.npzio import MAX_MEMBERS

from fuzz_common import Fixtures, Result, _call, _one_error_line, _output_problem, valid_inputs


# ---- array-level mutations ------------------------------------------------------------------------------

DTYPES = ("float64", "float32", "float16", "int64", "int32", "uint8", "uint64", "bool", "complex128", "<U4",
          "S4", "datetime64[s]", "object", "V8", "struct")
SPECIALS = (np.nan, np.inf, -np.inf)
VALUES = (-1, -2, 0, 1, 2, 5, 6, 1000, 2 ** 40, 2 ** 62, -(2 ** 62), 0.5, -0.5, 1e-300, 1e300, -1e300)
WORDS = ("twostage", "shallow", "indrnn", "Shallow", "", "transformer", "stable", "naive", "tanh", "erf", "relu")


def _pick_name(arrays, ch):
    return ch.choice(sorted(arrays))


def _as_dtype(a: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "object":
        return np.array(list(a.ravel()) + [None], dtype=object)
    if dtype == "struct":
        return np.zeros(a.shape, dtype=[("x", "f8"), ("y", "i4")])
    if dtype == "V8":
        return np.zeros(a.shape, dtype="V8")
    with np.errstate(all="ignore"), contextlib.suppress(Exception):
        return a.astype(dtype)
    return np.zeros(a.shape, dtype=dtype)


def m_dtype(arrays, ch):
    name = _pick_name(arrays, ch)
    return {**arrays, name: _as_dtype(np.asarray(arrays[name]), ch.choice(DTYPES))}


def m_shape(arrays, ch):
    name = _pick_name(arrays, ch)
    a = np.asarray(arrays[name])
    op = ch.choice(("add_axis", "drop_axis", "shrink", "grow", "empty", "transpose", "flatten", "scalar"))
    if op == "add_axis":
        a = np.expand_dims(a, ch.integer(0, a.ndim))
    elif op == "scalar":
        a = a.ravel()[0] if a.size else np.array(0.0)
    elif a.ndim == 0:
        a = a.reshape(1)
    elif op == "drop_axis":
        a = a.take(0, axis=ch.integer(0, a.ndim - 1)) if a.shape[0] else a.reshape(a.shape[1:] or (0,))
    elif op in ("shrink", "grow", "empty"):
        axis = ch.integer(0, a.ndim - 1)
        size = {"shrink": max(a.shape[axis] - 1, 0), "grow": a.shape[axis] + 1, "empty": 0}[op]
        a = np.resize(np.moveaxis(a, axis, 0), (size,) + tuple(np.delete(a.shape, axis)))
        a = np.moveaxis(a, 0, axis)
    elif op == "transpose":
        a = a.T if a.ndim > 1 else a[::-1]
    else:
        a = a.ravel()
    return {**arrays, name: np.array(a)}


def m_nonfinite(arrays, ch):
    name = _pick_name(arrays, ch)
    a = np.asarray(arrays[name])
    if a.dtype.kind not in "fiub" or a.size == 0:
        return {**arrays, name: np.array(ch.choice(SPECIALS))}
    a = a.astype(np.float64)
    a.reshape(-1)[ch.integer(0, a.size - 1)] = ch.choice(SPECIALS)
    return {**arrays, name: a}


def m_value(arrays, ch):
    name = _pick_name(arrays, ch)
    a = np.asarray(arrays[name])
    v = ch.choice(VALUES)
    if a.dtype.kind not in "fiub" or a.size == 0:
        return {**arrays, name: np.array(v)}
    a = a.astype(np.float64 if (a.dtype.kind == "f" or isinstance(v, float)) else np.int64)
    a.reshape(-1)[ch.integer(0, a.size - 1)] = v
    return {**arrays, name: a}


def m_scale(arrays, ch):
    """Multiply a float array by a large or tiny factor (saturation, overflow, underflow)."""
    name = _pick_name(arrays, ch)
    a = np.asarray(arrays[name])
    if a.dtype.kind != "f":
        return arrays
    with np.errstate(over="ignore"):  # 1e300 * 1e300 = inf is a fine non-finite input too
        return {**arrays, name: a * ch.choice((1e-300, 1e-8, 1e8, 1e30, 1e150, 1e300, -1e8))}


def m_remove(arrays, ch):
    name = _pick_name(arrays, ch)
    return {k: v for k, v in arrays.items() if k != name}


def m_rename(arrays, ch):
    name = _pick_name(arrays, ch)
    op = ch.choice(("upper", "lower", "drop", "add", "swapcase", "space"))
    new = {"upper": name.upper(), "lower": name.lower(), "drop": name[:-1] or "x", "add": name + "_",
           "swapcase": name.swapcase(), "space": name + " "}[op]
    return {(new if k == name else k): v for k, v in arrays.items()}


def m_unknown(arrays, ch):
    return {**arrays, ch.choice(("W_KQ", "extra", "Wov", "x", "step", "backend", "eta1")): np.array(1.0)}


def m_word(arrays, ch):
    """Replace a string option (or any array) by a word: an unknown model, direction or activation."""
    strings = [k for k, v in arrays.items() if np.asarray(v).dtype.kind in "US"]
    name = ch.choice(strings + [_pick_name(arrays, ch)])
    word = ch.choice(WORDS)
    return {**arrays, name: np.array(word.encode() if ch.integer(0, 3) == 0 else word)}


def m_swap(arrays, ch):
    a, b = _pick_name(arrays, ch), _pick_name(arrays, ch)
    return {**arrays, a: arrays[b], b: arrays[a]}


ARRAY_MUTATIONS = {f.__name__[2:]: f for f in (m_dtype, m_shape, m_nonfinite, m_value, m_scale, m_remove,
                                                 m_rename, m_unknown, m_word, m_swap)}


# ---- file-level mutations (bytes of a valid npz file in, bytes out) ---------------------------------------

def _zip(members: dict[str, bytes], compression=zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _npz_bytes(arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # np.savez, not save_npz: object arrays must reach the file
    return buf.getvalue()


_BOMB: list[bytes] = []


def f_flip(raw, ch):
    b = bytearray(raw)
    for _ in range(ch.integer(1, 8)):
        b[ch.integer(0, len(b) - 1)] ^= 1 << ch.integer(0, 7)
    return bytes(b)


def f_truncate(raw, ch):
    return raw[: ch.integer(0, len(raw) - 1)]


def f_append(raw, ch):
    return raw + bytes(ch.integer(0, 255) for _ in range(ch.integer(1, 64)))


def f_prepend(raw, ch):
    return bytes(ch.integer(0, 255) for _ in range(ch.integer(1, 64))) + raw


def f_random(raw, ch):
    prefix = ch.choice((b"", b"PK\x03\x04", b"\x93NUMPY", b"PK\x05\x06"))
    return prefix + bytes(ch.integer(0, 255) for _ in range(ch.integer(0, 200)))


def f_lie_size(raw, ch):
    """Patch the uncompressed size of a member in the central directory (a lying zip header)."""
    b = bytearray(raw)
    at = b.find(b"PK\x01\x02")
    if at < 0:
        return raw
    b[at + 24: at + 28] = struct.pack("<I", ch.choice((0, 1, 2 ** 31, 2 ** 32 - 1)))
    return bytes(b)


def f_bomb(raw, ch):
    """A valid-looking member that inflates about 1000x (8 MiB of zeros), next to the real members."""
    if not _BOMB:
        _BOMB.append(_zip({"bomb.npy": bytes(8 << 20)}, zipfile.ZIP_DEFLATED))
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    with zipfile.ZipFile(io.BytesIO(_BOMB[0])) as zb:
        info = zb.infolist()[0]
    buf = io.BytesIO(raw if ch.integer(0, 1) else _zip(members))
    with zipfile.ZipFile(buf, "a", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(info.filename, bytes(info.file_size), compresslevel=9)
    return buf.getvalue()


def f_raw_member(raw, ch):
    """A member that is not an .npy array (np.load would hand back its raw bytes)."""
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    name = ch.choice(sorted(members))
    members[ch.choice((name, name[:-4], "notes.txt"))] = ch.choice((b"twostage", b"", b"\x93NUMPY\x01\x00"))
    return _zip(members)


def f_npy(raw, ch):
    buf = io.BytesIO()
    np.save(buf, np.arange(ch.integer(0, 5), dtype=np.float64))
    return buf.getvalue()


def _members(raw) -> dict[str, bytes]:
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        return {n: zf.read(n) for n in zf.namelist()}


def _npy(descr, shape, data=b"", fortran=False, text=None) -> bytes:
    """A version 1.0 .npy member: magic, version, header length, header (``text`` replaces the dict), data."""
    text = repr({"descr": descr, "fortran_order": fortran, "shape": shape}) if text is None else text
    header = text.encode("latin-1") + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header + data


def f_duplicate(raw, ch):
    """A member stored twice: the same name again, or NAME next to NAME.npy (the last must not win)."""
    members = _members(raw)
    name = ch.choice(sorted(members))
    other = members[ch.choice(sorted(members))]
    buf = io.BytesIO()
    with warnings.catch_warnings(), zipfile.ZipFile(buf, "w") as zf:
        warnings.simplefilter("ignore")                     # zipfile warns about a duplicate name
        for n, data in members.items():
            zf.writestr(n, data)
        zf.writestr(ch.choice((name, name.removesuffix(".npy"))), other)
    return buf.getvalue()


def f_many(raw, ch):
    """Extra tiny .npy members: just over the member limit, far over it, or just under it."""
    members = _members(raw)
    count = ch.choice((MAX_MEMBERS + 1 - len(members), 1000, MAX_MEMBERS - len(members)))
    extra = _npy("<f8", (), struct.pack("<d", 1.0))
    members.update({f"extra{i}.npy": extra for i in range(count)})
    return _zip(members, ch.choice((zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)))


def f_zero_itemsize(raw, ch):
    """A member of zero-byte items (V0, S0, U0), possibly of a huge shape, holding no data."""
    members = _members(raw)
    descr = ch.choice(("|V0", "|S0", "<U0", [("a", "|V0")]))
    shape = ch.choice(((0,), (5,), (2 * 10 ** 9,), (10 ** 18, 10 ** 18)))
    members[ch.choice(sorted(members))] = _npy(descr, shape)
    return _zip(members)


def f_header(raw, ch):
    """A damaged .npy header: cut short, lying length, version, garbage, missing keys, bad shape or descr."""
    members = _members(raw)
    name = ch.choice(sorted(members))
    data = members[name]
    length = struct.unpack("<H", data[8:10])[0] if data[:6] == b"\x93NUMPY" else 0
    op = ch.choice(("cut", "long", "short", "version", "garbage", "keys", "negative", "float_shape", "descr",
                    "fortran", "grow", "shrink", "huge", "deep"))
    if op == "cut":
        new = data[: ch.integer(0, 10 + length)]
    elif op in ("long", "short"):
        new = data[:8] + struct.pack("<H", min(length + ch.choice((1, 100, 60000)), 65535) if op == "long"
                                     else max(length - ch.integer(1, 60), 0)) + data[10:]
    elif op == "version":
        new = data[:6] + bytes((ch.choice((0, 2, 3, 9, 255)), ch.choice((0, 1)))) + data[8:]
    elif op == "garbage":
        new = _npy(None, None, text=ch.choice(("", "{", "{'descr': '<f8'", "[1, 2]", "x" * 300, "(" * 150,
                                               "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }}")))
    elif op == "keys":
        new = _npy(None, None, text=ch.choice(("{'descr': '<f8', 'shape': (3,)}", "{'descr': '<f8', "
                                               "'fortran_order': False, 'shape': (), 'extra': 1}", "{}")))
    elif op == "negative":
        new = _npy("<f8", ch.choice(((-1,), (3, -2), (-(2 ** 63),))), bytes(8))
    elif op == "float_shape":
        new = _npy("<f8", ch.choice(((2.0,), (True,), ("3",), [3], None, 3)), bytes(16))
    elif op == "descr":
        new = _npy(ch.choice(("xyz", "<f9", "", 5, None, "|O", [("a", "|O")], ("<f8", 2))), (2,), bytes(16))
    elif op == "fortran":
        new = _npy("<f8", (2,), bytes(16), fortran=ch.choice((1, None, "no")))
    elif op in ("grow", "shrink"):
        k = ch.integer(1, 5)
        new = _npy("<f8", (k + 1,) if op == "grow" else (k - 1,), bytes(8 * k))
    elif op == "huge":
        new = _npy("<f8", ch.choice(((2 ** 40,), (10 ** 6, 10 ** 6), (1,) * 40, (2 ** 64,))), bytes(8))
    else:
        new = _npy("<f8", (1,) * ch.integer(33, 70), bytes(8))
    members[name] = new
    return _zip(members, ch.choice((zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)))


def f_trailing(raw, ch):
    """Bytes after an array's data: a few, or megabytes of zeros deflated to almost nothing."""
    members = _members(raw)
    name = ch.choice(sorted(members))
    members[name] += ch.choice((b"\0", b"garbage", bytes(ch.integer(1, 4096)), bytes(4 << 20)))
    return _zip(members, ch.choice((zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED)))


FILE_MUTATIONS = {f.__name__[2:]: f for f in (f_flip, f_truncate, f_append, f_prepend, f_random, f_lie_size,
                                                f_bomb, f_raw_member, f_npy, f_duplicate, f_many,
                                                f_zero_itemsize, f_header, f_trailing)}


def generate(ch, bases=None) -> tuple[str, bytes, str]:
    """(command, file bytes, description) of one fuzz case: a valid input, 1-3 mutations, maybe a file one."""
    bases = valid_inputs() if bases is None else bases
    command, arrays = bases[ch.integer(0, len(bases) - 1)]
    model = str(arrays.get("model"))
    steps = []
    for _ in range(ch.integer(0 if ch.integer(0, 2) == 0 else 1, 3)):
        name = ch.choice(sorted(ARRAY_MUTATIONS))
        arrays = ARRAY_MUTATIONS[name](arrays, ch) if arrays else arrays
        steps.append(name)
    raw = _npz_bytes(arrays)
    if not steps or ch.integer(0, 3) == 0:
        name = ch.choice(sorted(FILE_MUTATIONS))
        raw = FILE_MUTATIONS[name](raw, ch)
        steps.append("file:" + name)
    return command, raw, f"{model} {command} " + "+".join(steps or ["none"])


# ---- running a case, and the npz surface as runs ------------------------------------------------------------

def run_case(command: str, raw: bytes, workdir: Path, backend: str = "numba") -> tuple[str, int, str]:
    """Write ``raw`` to INPUT.npz, run ``ntpref COMMAND`` in-process; (outcome, exit status, stderr)."""
    inp, out = workdir / "input.npz", workdir / "out.npz"
    inp.write_bytes(raw)
    out.unlink(missing_ok=True)
    rc, _, text = _call([command, inp, "-o", out, "--backend", backend, "-q"])
    if rc is None:
        return "crash", -1, text
    if rc == 0:
        problem = _output_problem(out)
        return ("crash", rc, problem) if problem else ("accepted", rc, text)
    return ("rejected" if _one_error_line(rc, text) and not out.exists() else "crash"), rc, text


BACKENDS = ("numba", "numpy")


def npz_run(ch, fx: Fixtures) -> Result:
    backend = ch.choice(BACKENDS)
    command, raw, what = generate(ch, fx.bases)
    outcome, rc, text = run_case(command, raw, fx.workdir, backend)
    return Result(what, what.split(" ", 2)[2].split("+"), outcome, rc, text)
