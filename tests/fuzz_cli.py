"""Fuzz the ``ntpref eval`` / ``ntpref train`` command line with malformed input files and awkward outputs.

Every generated input starts from a valid input of one of the three models (twostage, shallow, indrnn;
eval and train) and applies one to three mutations: array-level (dtype changes, shape and rank changes,
NaN / inf injection, out-of-range values, removed, renamed or unknown arrays, a wrong model name or
option, object arrays) and file-level (byte flips, truncation, appended or prepended garbage, random
bytes, a lying zip directory, a zip bomb, raw non-.npy members, a plain .npy file, a member stored twice,
too many members, zero-byte dtypes, truncated or lying .npy headers, bytes after an array's data).
``ntpref.cli.main`` is called in-process and the outcome classified:

  accepted  exit 0, the output file exists, loads, and every output array is finite
  rejected  exit 2, exactly one stderr line starting "ntpref: error:", no output file written
  crash     anything else: an "internal error", a traceback / escaped exception, several stderr lines,
            another exit status, a non-finite or missing output

One case in ten instead runs a valid input with an awkward ``-o`` (a FIFO, a directory, a character
device, a dangling or looping symbolic link, a path under a regular file, a name ending in '/', an empty
name; or, to be accepted, a symbolic link to a file, missing parent directories, an existing file whose
mode must be kept, stale temporaries of a killed writer). Refused outputs must leave the folder exactly as
it was (special files untouched, no directory or temporary left); accepted ones must hold the result.
One case in twenty runs a valid input in an odd environment (see ENVIRONMENTS: Numba thread counts and
threading layers, the npz memory budget); it must be accepted or rejected like any other case.

Usage:  python tests/fuzz_cli.py [-n 10000] [--seed 0] [--show 10]
Exit status 0 when there is no crash, 1 otherwise. The mutation engine is driven by a ``Chooser`` so the
property-based test (tests/test_robust_fuzz.py) reuses it with Hypothesis choosing instead of a seed.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import stat
import struct
import sys
import tempfile
import time
import warnings
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np

from ntpref.cli import main
from ntpref.npzio import MAX_MEMBERS, load_npz


# ---- choices: a seeded generator here, Hypothesis in the tests --------------------------------------

class RandomChooser:
    """The choice interface of the mutation engine, backed by ``np.random.default_rng(seed)``."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def choice(self, options):
        options = list(options)
        return options[int(self.rng.integers(len(options)))]

    def integer(self, low: int, high: int) -> int:
        """An integer in [low, high] (both inclusive)."""
        return int(self.rng.integers(low, high + 1))


# ---- valid inputs -------------------------------------------------------------------------------------

def valid_inputs() -> list[tuple[str, dict[str, np.ndarray]]]:
    """(command, arrays) for a small valid input of every model and command."""
    from ntpref.shallow import iid_init, indrnn as indrnn_model
    from ntpref.twostage import five_token_example

    rng = np.random.default_rng(7)
    five = five_token_example()
    twostage = {"model": np.array("twostage"), "tokens": five.tokens, "lengths": five.lengths,
                "targets": five.targets, "W_ov": 0.1 * rng.standard_normal((5, 5)),
                "W_kq": 0.1 * rng.standard_normal((5, 5)), "K": np.array(5), "succ": five.succ}
    twostage_E = {**{k: v for k, v in twostage.items() if k != "K"}, "E": rng.standard_normal((5, 5))}
    X, y = rng.standard_normal((6, 4, 3)) / 2, rng.standard_normal(6)
    c, U, W = iid_init(4, 3, seed=1)
    shallow = {"model": np.array("shallow"), "X": X, "y": y, "c": c, "U": U, "W": W, "kappa": np.array(2.0),
               "tau_att": np.array(1.0), "mask_last_key": np.array(False), "activation": np.array("tanh")}
    c, u, W_in = indrnn_model.paired_init(4, 3, seed=1)
    indrnn = {"model": np.array("indrnn"), "X": X, "y": y, "c": c, "u": u, "W_in": W_in,
              "activation": np.array("erf")}
    two_train = {**twostage, "eta0": np.array(0.1), "eta": np.array(0.05), "T0": np.array(3), "T": np.array(3),
                 "direction": np.array("stable")}
    sgd = {"eta": np.array(0.1), "steps": np.array(3), "rho": np.array([1.0, np.inf, 2.0]),
           "X_val": X[:2], "y_val": y[:2], "batch": np.array(3), "seed": np.array(5)}
    return [("eval", twostage), ("eval", twostage_E), ("train", two_train), ("eval", shallow),
            ("train", {**shallow, **sgd}), ("eval", indrnn), ("train", {**indrnn, **sgd})]


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


# ---- running and classifying ------------------------------------------------------------------------------

def _call(argv) -> tuple[int | None, str]:
    """Run ``ntpref ARGV`` in-process: (exit status or None when an exception escaped, stderr)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            rc = main(argv)
    except BaseException as exc:  # noqa: BLE001 - an escaped exception is exactly what we look for
        return None, f"escaped {type(exc).__name__}: {exc}"
    return rc, err.getvalue()


def _one_error_line(rc, text: str) -> bool:
    lines = text.splitlines()
    return (rc == 2 and len(lines) == 1 and text.endswith("\n") and lines[0].startswith("ntpref: error: ")
            and "internal error" not in text)


def _output_problem(out: Path) -> str | None:
    """Why the result file ``out`` is not a loadable file of finite float arrays, or None."""
    try:
        result = load_npz(out)
    except Exception as exc:  # noqa: BLE001
        return f"exit 0 but the output does not load: {exc}"
    bad = [k for k, v in result.items() if v.dtype.kind != "f" or not np.isfinite(v).all()]
    return f"exit 0 with non-finite / non-float outputs {bad}" if bad else None


def run_case(command: str, raw: bytes, workdir: Path, backend: str = "numba") -> tuple[str, int, str]:
    """Write ``raw`` to INPUT.npz, run ``ntpref COMMAND`` in-process; (outcome, exit status, stderr)."""
    inp, out = workdir / "input.npz", workdir / "out.npz"
    inp.write_bytes(raw)
    out.unlink(missing_ok=True)
    rc, text = _call([command, str(inp), "-o", str(out), "--backend", backend, "-q"])
    if rc is None:
        return "crash", -1, text
    if rc == 0:
        problem = _output_problem(out)
        return ("crash", rc, problem) if problem else ("accepted", rc, text)
    return ("rejected" if _one_error_line(rc, text) and not out.exists() else "crash"), rc, text


# ---- awkward outputs: each set-up gets an empty folder and returns the -o argument ----------------------------

def _fifo(d):
    os.mkfifo(d / "out.npz")
    return str(d / "out.npz")


def _directory(d):
    (d / "out.npz").mkdir()
    return str(d / "out.npz")


def _chardev(d):
    if os.geteuid() != 0:  # refusing /dev/null writes nothing, so an unprivileged run may name it
        return "/dev/null"
    os.mknod(d / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return str(d / "null")


def _dangling(d):
    os.symlink(d / "nowhere", d / "out.npz")
    return str(d / "out.npz")


def _loop(d):
    os.symlink(d / "b", d / "a")
    os.symlink(d / "a", d / "b")
    return str(d / "a")


def _link_to_dir(d):
    (d / "sub").mkdir()
    os.symlink(d / "sub", d / "out.npz")
    return str(d / "out.npz")


def _under_file(d):
    (d / "afile").write_bytes(b"x")
    return str(d / "afile" / "new" / "out.npz")


def _link(d):
    (d / "target.npz").write_bytes(b"old")
    os.symlink("target.npz", d / "out.npz")
    return str(d / "out.npz")


def _kept_mode(d):
    (d / "out.npz").write_bytes(b"old")
    os.chmod(d / "out.npz", 0o604)
    return str(d / "out.npz")


def _stale(d):
    """Temporaries of a killed writer (to be removed), and look-alikes that are not its to remove (kept)."""
    for name in (".out.npz.abcd1234.tmp", ".out.npz.zzzzzzzz.tmp"):
        (d / name).write_bytes(b"PK\x03\x04 half a file")
    (d / ".out.npz.dirdirdi.tmp").mkdir()
    (d / ".other.npz.abcd1234.tmp").write_bytes(b"another output's")
    (d / "victim").write_bytes(b"keep me")
    os.symlink(d / "victim", d / ".out.npz.linklink.tmp")
    return str(d / "out.npz")


def _stale_ok(d):
    return (sorted(p.name for p in d.iterdir()) == [".other.npz.abcd1234.tmp", ".out.npz.dirdirdi.tmp",
                                                     ".out.npz.linklink.tmp", "out.npz", "victim"]
            and (d / "victim").read_bytes() == b"keep me")


#: kind → (set-up, check after a successful run, or None: the output must be refused)
OUTPUTS = {
    "fifo": (_fifo, None), "directory": (_directory, None), "chardev": (_chardev, None),
    "dangling": (_dangling, None), "loop": (_loop, None), "link_to_dir": (_link_to_dir, None),
    "under_file": (_under_file, None), "slash": (lambda d: str(d / "newdir") + "/", None), "empty": (lambda d: "", None),
    "link": (_link, lambda d: (d / "out.npz").is_symlink() and _output_problem(d / "target.npz") is None),
    "new_dirs": (lambda d: str(d / "a" / "b" / "out.npz"), lambda d: (d / "a" / "b" / "out.npz").is_file()),
    "kept_mode": (_kept_mode, lambda d: stat.S_IMODE(os.stat(d / "out.npz").st_mode) == 0o604),
    "stale": (_stale, _stale_ok),
}


def _listing(d: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(d)), stat.S_IFMT(p.lstat().st_mode)) for p in d.rglob("*"))


def run_output_case(kind: str, command: str, raw: bytes, workdir: Path, backend: str = "numba") -> tuple[str, int, str]:
    """Run a valid input with the awkward output ``kind`` (see OUTPUTS); (outcome, exit status, stderr)."""
    setup, check = OUTPUTS[kind]
    inp, d = workdir / "input.npz", workdir / "out"
    inp.write_bytes(raw)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    out = setup(d)
    before = _listing(d)
    rc, text = _call([command, str(inp), "-o", out, "--backend", backend, "-q"])
    if rc is None:
        return "crash", -1, text
    if check is not None:
        problem = (f"exit {rc}, expected 0" if rc != 0 else _output_problem(Path(out))
                   or (None if check(d) else f"the {kind} output is not as it should be: {_listing(d)}"))
        return ("crash", rc, f"{problem}: {text}") if problem else ("accepted", rc, text)
    if _one_error_line(rc, text) and _listing(d) == before:
        return "rejected", rc, text
    return "crash", rc, f"{text.strip()} (folder {before} became {_listing(d)})"


#: odd values of the environment variables the command reads (the variable, then its value)
ENVIRONMENTS = [("NUMBA_NUM_THREADS", v) for v in ("0", "-1", "abc", "1.5", "100000", "", " 2")] + \
               [("NUMBA_THREADING_LAYER", v) for v in ("bogus", "", "TBB", "workqueue")] + \
               [("NTPREF_MAX_NPZ_BYTES", v) for v in ("-1", "abc", "0", "1", "1K", "16G", "")]


@contextlib.contextmanager
def _environment(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


def run_env_case(env: tuple[str, str], command: str, raw: bytes, workdir: Path, backend: str = "numba"):
    """Run a valid input with one variable of ENVIRONMENTS set; (outcome, exit status, stderr)."""
    with _environment(*env):
        return run_case(command, raw, workdir, backend)


def fuzz(n: int, seed: int = 0, show: int = 10, log=print) -> Counter:
    """Run ``n`` generated cases; returns the outcome counts (and logs a summary)."""
    ch = RandomChooser(seed)
    bases = valid_inputs()
    counts, by_mutation, crashes = Counter(), Counter(), []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ntpref-fuzz-") as tmp:
        for i in range(n):
            backend = ch.choice(("numba", "numpy"))
            if ch.integer(0, 19) == 0:
                command, arrays = bases[ch.integer(0, len(bases) - 1)]
                env = ENVIRONMENTS[ch.integer(0, len(ENVIRONMENTS) - 1)]
                what = f"{arrays['model']} {command} env:{env[0]}={env[1]!r}"
                outcome, rc, text = run_env_case(env, command, _npz_bytes(arrays), Path(tmp), backend)
            elif ch.integer(0, 9) == 0:
                command, arrays = bases[ch.integer(0, len(bases) - 1)]
                kind = ch.choice(sorted(OUTPUTS))
                what = f"{arrays['model']} {command} output:{kind}"
                outcome, rc, text = run_output_case(kind, command, _npz_bytes(arrays), Path(tmp), backend)
            else:
                command, raw, what = generate(ch, bases)
                outcome, rc, text = run_case(command, raw, Path(tmp), backend)
            counts[outcome] += 1
            for step in what.split(" ", 2)[2].split("+"):
                by_mutation[(step, outcome)] += 1
            if outcome == "crash":
                crashes.append(f"case {i}: {what}: exit {rc}: {text.strip()[:300]}")
    seconds = time.perf_counter() - start
    log(f"ntpref fuzz: {n} inputs (seed {seed}) in {seconds:.1f} s: "
        + ", ".join(f"{k} {counts[k]}" for k in ("accepted", "rejected", "crash")))
    steps = sorted({s for s, _ in by_mutation})
    for s in steps:
        log(f"  {s:<36} " + "  ".join(f"{k} {by_mutation[(s, k)]:>5}" for k in ("accepted", "rejected", "crash")))
    for line in crashes[:show]:
        log("  CRASH " + line)
    return counts


def main_fuzz(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=10000, help="number of generated inputs (default 10000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="crashes to print")
    args = parser.parse_args(argv)
    return 1 if fuzz(args.n, args.seed, args.show)["crash"] else 0


if __name__ == "__main__":
    sys.exit(main_fuzz())
