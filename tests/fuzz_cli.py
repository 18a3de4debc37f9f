"""Fuzz the ``ntpref`` command line: malformed inputs, awkward outputs, misbehaving adapters, damaged JSON
and reference directories, closed pipes and killed workers.

The default run (``--mode main``) calls ``ntpref.cli.main`` in-process and mixes these surfaces (the share
of each, in fortieths, is in SURFACES):

npz (25)  ``ntpref eval`` / ``ntpref train`` of a valid input of one of the three models (twostage,
          shallow, indrnn; eval and train) after one to three mutations: array-level (dtype changes, shape
          and rank changes, NaN / inf injection, out-of-range values, removed, renamed or unknown arrays, a
          wrong model name or option, object arrays) and file-level (byte flips, truncation, appended or
          prepended garbage, random bytes, a lying zip directory, a zip bomb, raw non-.npy members, a plain
          .npy file, a member stored twice, too many members, zero-byte dtypes, truncated or lying .npy
          headers, bytes after an array's data).
output (4)  a valid input with an awkward ``-o`` (a FIFO, a directory, a character device, a dangling or
          looping symbolic link, a path under a regular file, a name ending in '/', an empty name; or, to
          be accepted, a symbolic link to a file, missing parent directories, an existing file whose mode
          must be kept, stale temporaries of a killed writer). Refused outputs must leave the folder exactly
          as it was (special files untouched, no directory or temporary left); accepted ones must hold the
          result.
environment (2)  a valid input in an odd environment (ENVIRONMENTS: Numba thread counts and threading
          layers, the npz memory budget).
adapter (3)  ``ntpref conformance ADAPTER.py --model M --kind K --no-stored --random N`` (one random case)
          with an adapter file that computes the oracle's outputs and then misbehaves (ADAPTER_FAULTS): at
          import or in its function it calls sys.exit, raises KeyboardInterrupt, SystemExit, GeneratorExit
          or any exception; it returns a non-dict, a mapping that cannot be read, values that are not
          arrays or whose conversion raises, the wrong dtype or shape, NaN, only some outputs, unknown
          names, huge arrays; or it prints, warns, changes directory or modifies its inputs and is correct.
command (1)  the same with ``--command CMD`` (COMMANDS): a command that exits non-zero, is killed, writes
          nothing, garbage, a FIFO, the input or a .npy header of an absurd shape, floods stderr, outlasts
          ``--timeout 1``, is not found or names an unknown placeholder; that starts processes which escape
          its process group or session (a fork, setsid, a daemon's double fork writing into the case's
          folder, shell job control, GNU timeout); that clears the case's folder, puts a FIFO or a link to
          /dev/zero where the stderr log used to be, or locks a folder; or runs ``ntpref`` itself and is
          correct. Besides the verdict, a process the command started that still runs after the case
          (marked by the environment variable MARK) or a temporary folder left is a crash.
tolerances (2)  ``ntpref compare A.npz B.npz --tolerances T.json`` with a mutated tolerance file (an exported
          case.json or a plain one): bad types, unknown, renamed, removed or duplicate keys, NaN, inf,
          negative, huge or 31-digit numbers, deep nesting, long strings; then maybe byte damage (flips,
          truncation, garbage, non-UTF-8, UTF-16, a BOM, NUL, empty, more than 16 MiB); the file may also
          be a FIFO, a directory, a device, a dangling or looping link, or missing.
reference (2)  ``ntpref verify --root DIR CASE`` (also ``-v`` and ``--list``) and ``ntpref export --root DIR
          CASE -o OUT`` on a copy of reference_runs/ with one or two kinds of damage (REFERENCE_MUTATIONS):
          manifest.json mutated like a tolerance file, a field of a case's entry removed or of another
          type, a case directory or file removed, a file, a case
          directory, the manifest or the root replaced by a FIFO, a directory, a symbolic link (to its own
          moved copy, to another case's file, to an awkward path) or a regular file, a changed hash, a
          flipped byte.
cells (1)  ``ntpref reproduce TARGET --full --summarize-only`` on a copy of a target's committed cells
          (CELL_TARGETS) with one or two cells damaged by the npz surface's array mutations (a negative or
          huge value, NaN, an array removed, renamed, of another dtype or shape, a string).

Each run is classified (:func:`classify`):

  accepted  exit 0 and no message on stderr (only "ntpref: warning:" lines)
  failed    exit 1 and no message, or one message that is not an error (``export`` of a damaged case): a
            comparison or conformance verdict
  rejected  exit 2 and exactly one stderr line "ntpref: error: ..."
  crash     anything else: an "internal error", a traceback / escaped exception, several messages, another
            exit status

and each surface adds its own rules. npz, output, environment: exit 1 is a crash; an accepted run's output
file exists, loads, and every output array is finite; a rejected one writes no output file. adapter and
command: the verdict must be the one the fault calls for: exit 0 with a PASS verdict only for a correct
adapter, exit 1 with a FAIL verdict for wrong values, missing required outputs or a failing command, and
exit 2 for an adapter that raises or returns something other than a dict of arrays, with the error line the
last line of stderr (after the adapter's own traceback and output) and naming the adapter file; anything
else is a crash. tolerances and reference: any of accepted, failed, rejected; ``export`` must write its
three files when it succeeds (case.json a readable tolerance file) and nothing when it does not. cells:
accepted (its summary written, naming every damaged cell that holds NaN or inf as left out) or rejected
with the line naming a damaged cell; exit 1 is a crash.

``--mode commands`` runs the command surface alone (twice as many runs as COMMANDS has commands).

Two slower modes run ``ntpref`` as a subprocess, a handful of runs each:

``--mode pipes``  a command with plenty of output (pipe_commands: ``reproduce --list``, ``--help``, ...)
          whose standard output is a pipe closed after reading 0, 1, 100, 4096 or 65536 bytes (``| head -c
          N``), or read to its end. Accepted: exit 0 (the output fitted, or was read to its end); rejected:
          exit 141 (128 + SIGPIPE); both with nothing on stderr. Read to its end, only exit 0 is accepted.
``--mode workers``  ``ntpref reproduce twostage --quick --workers 2`` with one or both worker processes killed
          (SIGKILL) as they start, after the first finished cell or after a delay. Rejected: exit 2 and one
          error line; accepted: exit 0 (the run finished before the kill). Either way every cell file left
          loads, no worker outlives the run, and a rerun exits 0, keeps the finished cells untouched and
          completes the others.

Usage:  python tests/fuzz_cli.py [-n 10000] [--seed 0] [--show 10] [--mode main|commands|pipes|workers]
(-n defaults to 10000, twice the commands, 50 and 4 for the four modes.) Exit status 0 when there is no
crash, 1 otherwise.
The generators are driven by a ``Chooser`` so the property-based test (tests/test_robust_fuzz.py) reuses
them with Hypothesis choosing instead of a seed.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import io
import json
import math
import os
import shlex
import shutil
import signal
import stat
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import zipfile
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ntpref.cli import main
from ntpref.jsonio import MAX_JSON_BYTES
from ntpref.npzio import MAX_MEMBERS, load_npz, save_npz
from ntpref.oracle.compare import load_tolerances
from ntpref.oracle.adapters import FUNCTIONS
from ntpref.oracle.manifest import default_root, load_manifest
from ntpref.oracle.reference import export


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

def _call(argv) -> tuple[int | None, str, str]:
    """Run ``ntpref ARGV`` in-process: (exit status or None when an exception escaped, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in argv])
    except BaseException as exc:  # noqa: BLE001 - an escaped exception is exactly what we look for
        return None, out.getvalue(), f"escaped {type(exc).__name__}: {exc}"
    return rc, out.getvalue(), err.getvalue()


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
    rc, _, text = _call([command, inp, "-o", out, "--backend", backend, "-q"])
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
    rc, _, text = _call([command, inp, "-o", out, "--backend", backend, "-q"])
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


# ---- commands that report: the classification shared by the surfaces below ---------------------------------

def _messages(err: str) -> list[str]:
    """ntpref's own lines on stderr, warnings left out."""
    return [line for line in err.splitlines()
            if line.startswith("ntpref:") and not line.startswith("ntpref: warning: ")]


def classify(rc: int | None, err: str, strict: bool = True) -> tuple[str, str | None]:
    """(outcome, why it is a crash or None) of a run that exited with ``rc`` after writing ``err``: exit 0 with
    no message accepted, 1 with none (or one that is not an error) failed, 2 with exactly one error line
    rejected (see the module docstring). ``strict``: stderr holds nothing but ntpref's lines; otherwise
    (a conformance adapter's own traceback and output) the error line must be the last line."""
    if rc is None:
        return "crash", err
    if "internal error" in err:
        return "crash", "an internal error"
    messages, lines = _messages(err), err.splitlines()
    if strict and any(not line.startswith("ntpref:") for line in lines):
        return "crash", f"exit {rc} with other output on stderr"
    if rc == 0 and not messages:
        return "accepted", None
    if rc == 1 and (not messages or (len(messages) == 1 and not messages[0].startswith("ntpref: error"))):
        return "failed", None
    if rc == 2 and len(messages) == 1 and lines[-1] == messages[0] and messages[0].startswith("ntpref: error: "):
        return "rejected", None
    return "crash", f"exit {rc} with {len(messages)} message line(s)"


class Result(NamedTuple):
    """One fuzz run: what was run, the generator's steps (for the per-step counts), the outcome, the exit
    status (-1: an exception escaped) and the reason of a crash (else stderr)."""

    what: str
    steps: list[str]
    outcome: str
    rc: int
    text: str


def _result(what: str, steps: list[str], rc: int | None, err: str, why: str | None, outcome: str) -> Result:
    return Result(what, steps, "crash" if why else outcome, -1 if rc is None else rc,
                  f"{why}: {err.strip()}" if why else err)


class Fixtures:
    """What the runs share, made once in ``workdir``: the valid npz inputs, a copy of the reference directory
    (``pristine``) and the names of its quickly verified cases, its first eval case exported (``expected``,
    the case's expected.npz, and its case.json), ``perturbed`` (those outputs times 1 + 1e-9), the
    tolerance files that the tolerance runs start from, and ``wide``, a result file of 250 arrays with long
    names (comparing it with itself prints more than a pipe holds)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.bases = valid_inputs()
        self.pristine = workdir / "reference_runs"
        shutil.copytree(default_root(), self.pristine)
        cases = load_manifest(self.pristine)["cases"]
        self.cases = [c for c, e in cases.items() if e["kind"] != "train" or e["model"] == "twostage"]
        exported = workdir / "exported_case"
        export(self.pristine, next(c for c, e in cases.items() if e["kind"] == "eval"), exported)
        self.expected = exported / "expected.npz"
        outputs = load_npz(self.expected)
        self.perturbed = workdir / "perturbed.npz"
        save_npz(self.perturbed, {k: v * (1 + 1e-9) if v.dtype.kind == "f" else v for k, v in outputs.items()})
        self.wide = workdir / "wide.npz"
        save_npz(self.wide, {"w" * 200 + str(i): np.arange(3.0) for i in range(250)})
        first = sorted(outputs)[0]
        self.tolerance_files = {
            "case.json": json.loads((exported / "case.json").read_text()),
            "plain": {**{k: {"rtol": 1e-8, "atol": 1e-300, "reason": "fuzz"} for k in outputs},
                      "default": {"rtol": 1e-12, "atol_max_scale": 1e-14}},
            "head": {first: {"rtol": 1e-10, "atol_per_step": 1e-15, "head": {"n": 1, "rtol": 1e-6, "atol": 0.0}}},
        }

    def fresh(self, name: str) -> Path:
        """An empty folder ``name`` of the work directory (whatever was there removed first)."""
        path = self.workdir / name
        _clear(path)
        path.mkdir()
        return path


def _clear(path: Path) -> None:
    """Remove whatever ``path`` is (a folder with its contents, a file, a link, a FIFO), if anything."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()


# ---- npz inputs, awkward outputs, odd environments (the surfaces above) as runs --------------------------------

BACKENDS = ("numba", "numpy")


def npz_run(ch, fx: Fixtures) -> Result:
    backend = ch.choice(BACKENDS)
    command, raw, what = generate(ch, fx.bases)
    outcome, rc, text = run_case(command, raw, fx.workdir, backend)
    return Result(what, what.split(" ", 2)[2].split("+"), outcome, rc, text)


def output_run(ch, fx: Fixtures) -> Result:
    backend = ch.choice(BACKENDS)
    command, arrays = fx.bases[ch.integer(0, len(fx.bases) - 1)]
    kind = ch.choice(sorted(OUTPUTS))
    outcome, rc, text = run_output_case(kind, command, _npz_bytes(arrays), fx.workdir, backend)
    return Result(f"{arrays['model']} {command} output:{kind}", [f"output:{kind}"], outcome, rc, text)


def environment_run(ch, fx: Fixtures) -> Result:
    backend = ch.choice(BACKENDS)
    command, arrays = fx.bases[ch.integer(0, len(fx.bases) - 1)]
    env = ENVIRONMENTS[ch.integer(0, len(ENVIRONMENTS) - 1)]
    outcome, rc, text = run_env_case(env, command, _npz_bytes(arrays), fx.workdir, backend)
    return Result(f"{arrays['model']} {command} env:{env[0]}={env[1]!r}", [f"env:{env[0]}"], outcome, rc, text)


# ---- conformance adapters that misbehave --------------------------------------------------------------------

#: The start of every adapter file: the oracle's outputs (what a correct adapter returns) and helpers.
ADAPTER_HEAD = '''"""A conformance adapter written by tests/fuzz_cli.py: the oracle's own outputs, then a fault."""
import collections.abc
import os
import sys
import warnings

import numpy as np

from ntpref.oracle import contract
from ntpref.oracle.conformance import OPTIONAL


def oracle(kind, model, inputs):
    arrays = {"model": np.array(model), **inputs}
    return dict((contract.evaluate if kind == "eval" else contract.train)(arrays, "numpy"))


class Lazy:
    """An array-like that np.asarray converts (as it does a tensor), or whose conversion raises ``fault``."""

    def __init__(self, value, fault=None):
        self.value, self.fault = value, fault

    def __array__(self, dtype=None, copy=None):
        if self.fault is not None:
            raise self.fault
        return np.asarray(self.value, dtype)


class Unreadable(collections.abc.Mapping):
    """A mapping of the right names whose every look-up raises."""

    def __init__(self, names):
        self.names = list(names)

    def __getitem__(self, name):
        raise RuntimeError(f"cannot look up {name}")

    def __iter__(self):
        return iter(self.names)

    def __len__(self):
        return len(self.names)


def recurse():
    return recurse()
'''

#: Statements that end the adapter's code by raising; each is a fault at import and one in its function.
RAISES = {"exit_0": "sys.exit(0)", "exit_1": "sys.exit(1)", "exit_message": 'sys.exit("adapter gave up")',
          "keyboard_interrupt": "raise KeyboardInterrupt", "system_exit": "raise SystemExit",
          "generator_exit": "raise GeneratorExit", "value_error": 'raise ValueError("adapter bug")',
          "zero_division": "1 / 0"}


def _each(expr: str) -> str:
    """A function body returning ``expr`` of every correct output ``v``, under its name ``k``."""
    return "return {k: " + expr + " for k, v in out.items()}"


#: fault → (code run when the adapter is imported, after its functions; the verdict it calls for). In the code
#: "{function}" is the function of the case's kind.
MODULE_FAULTS = {
    **{name: (code, "error") for name, code in RAISES.items()},
    "prints": ('print("adapter: loading"); print("adapter: loading", file=sys.stderr)', "pass"),
    "chdir": ('os.chdir("/")', "pass"),
    "import_error": ("import ntpref_no_such_module", "error"),
    "syntax_error": ("def broken(:", "error"),
    "defines_neither": ("del evaluate, train", "error"),
    "not_a_function": ("{function} = 5", "error"),
    "other_kind_only": ("del {function}", "fail"),      # no case of the kind run: nothing compared
}

#: fault → (the body of the case's function, where ``out`` holds the correct outputs; the verdict it calls for)
CALL_FAULTS = {
    **{name: (code, "error") for name, code in RAISES.items()},
    "correct": ("return out", "pass"),
    "prints": ('print("adapter: computing"); print("adapter: note", file=sys.stderr); return out', "pass"),
    "warns": ('warnings.warn("adapter warning"); return out', "pass"),
    "chdir": ('os.chdir("/"); return out', "pass"),
    "modifies_inputs": ('[a.fill(0) for a in inputs.values() if a.dtype.kind == "f"]; inputs.clear(); return out',
                        "pass"),
    "tensors": (_each("Lazy(v)"), "pass"),
    "lists": (_each("v.tolist()"), "pass"),
    "longdouble": (_each("v.astype(np.longdouble)"), "pass"),
    "big_endian": (_each('v.astype(v.dtype.newbyteorder(">"))'), "pass"),
    "ordered_dict": ("return collections.OrderedDict(out)", "pass"),
    "no_diagnostics": ("return {k: v for k, v in out.items() if k not in OPTIONAL}", "pass"),
    "memory_error": ("raise MemoryError", "error"),
    "stop_iteration": ("raise StopIteration", "error"),
    "recursion": ("return recurse()", "error"),
    "returns_none": ("return None", "error"),
    "returns_list": ("return list(out.values())", "error"),
    "returns_text": ('return "loss"', "error"),
    "returns_array": ("return np.zeros(3)", "error"),
    "returns_items": ("return out.items()", "error"),
    "returns_generator": ("return (v for v in out.values())", "error"),
    "unreadable_mapping": ("return Unreadable(out)", "error"),
    "ragged": (_each("[1.0, [2.0, 3.0]]"), "error"),
    "conversion_raises": (_each('Lazy(v, ValueError("no conversion"))'), "error"),
    "conversion_exits": (_each("Lazy(v, SystemExit(0))"), "error"),
    "conversion_interrupted": (_each("Lazy(v, KeyboardInterrupt())"), "error"),
    "not_implemented": ('raise NotImplementedError("not this case")', "fail"),   # every case skipped
    "none_values": (_each("None"), "fail"),
    "text_values": (_each('"0.5"'), "fail"),
    "object_values": (_each("object()"), "fail"),
    "dict_values": (_each('{"value": v}'), "fail"),
    **{f"dtype_{d}": (_each(f"v.astype({d!r})"), "fail") for d in ("float32", "float16", "int64", "bool", "complex128",
                                                                    "object", "datetime64[s]", "V8", "<U8")},
    "added_axis": (_each("v[None]"), "fail"),
    "trailing_axis": (_each("v[..., None]"), "fail"),
    "one_more": (_each("np.resize(v, v.size + 1)"), "fail"),
    "empty_arrays": (_each("np.zeros((0,))"), "fail"),
    "nan": (_each("np.full_like(v, np.nan)"), "fail"),
    "one_inf": ("k = sorted(out)[0]; out[k] = out[k] + np.inf; return out", "fail"),
    "perturbed": (_each("v * (1 + 1e-3) + 1e-3"), "fail"),
    "drops_required": ("del out[sorted(set(out) - OPTIONAL)[0]]; return out", "fail"),
    "one_output": ("return {k: out[k] for k in sorted(out)[:1]}", "fail"),
    "empty_dict": ("return {}", "fail"),
    "misspelt": ('out[sorted(out)[0].upper() + "_"] = 0.0; return out', "fail"),
    "int_key": ("out[1] = 0.0; return out", "fail"),
    "returns_inputs": ("return inputs", "fail"),
    "huge_view": (_each("np.broadcast_to(0.0, (10 ** 6, 10 ** 6))"), "fail"),
    "huge_array": ("out[sorted(out)[0]] = np.zeros(1 << 22); return out", "fail"),
}

#: "import:NAME" and "call:NAME" → (module code, function body, verdict)
ADAPTER_FAULTS = {**{f"import:{k}": (code, "return out", v) for k, (code, v) in MODULE_FAULTS.items()},
                  **{f"call:{k}": ("", body, v) for k, (body, v) in CALL_FAULTS.items()}}

_PYTHON = shlex.quote(sys.executable)
#: Python code run by the commands below (``python -c CODE``): a process writing files into the case's
#: folder (``sys.argv[1]``'s) until it is killed, started by a fork, a fork in a session of its own, or a
#: daemon's double fork (the command itself exits 1 a moment later); a {output_dir} file whose header
#: declares an empty array of a shape no array can have.
_SCRIBBLE = "\nwhile True:\n    [open(os.path.join(folder, f'x{i}'), 'w').close() for i in range(100)]"
_ESCAPES = {
    "fork": "import os, sys, time\nfolder = os.path.dirname(sys.argv[1])\nif os.fork() == 0:" + _SCRIBBLE.replace(
        "\n", "\n    ") + "\ntime.sleep(0.3)\nsys.exit(1)",
    "setsid": "import os, sys, time\nfolder = os.path.dirname(sys.argv[1])\nif os.fork() == 0:\n    os.setsid()"
              + _SCRIBBLE.replace("\n", "\n    ") + "\ntime.sleep(0.3)\nsys.exit(1)",
    "daemon": "import os, sys, time\nfolder = os.path.dirname(sys.argv[1])\nif os.fork() == 0:\n    os.setsid()\n"
              "    if os.fork():\n        os._exit(0)" + _SCRIBBLE.replace("\n", "\n    ")
              + "\ntime.sleep(0.3)\nsys.exit(1)",
}
_ABSURD = ("import sys; h = repr({'descr': '<f8', 'fortran_order': False, 'shape': (0, 2 ** 62)}).encode() + b'\\n'; "
           "open(sys.argv[1] + '/loss.npy', 'wb').write(b'\\x93NUMPY\\x01\\x00' + len(h).to_bytes(2, 'little') + h)")


def _literal(code: str) -> str:
    """``code`` as one word of a --command line: quoted, its braces doubled (not placeholders)."""
    return shlex.quote(code.replace("{", "{{").replace("}", "}}"))


#: name → (command line, the verdict it calls for, --timeout or None)
COMMANDS = {
    "correct": (f"{_PYTHON} -m ntpref.cli {{kind}} {{input}} -o {{output}} --backend numpy -q", "pass", None),
    "exit_1": ("sh -c 'exit 1' sh {input} {output}", "fail", None),
    "declines": ("sh -c 'echo not this case >&2; exit 3' sh {input} {output}", "fail", None),   # every case skipped
    "killed": ("sh -c 'kill -9 $$' sh {input} {output}", "fail", None),
    "writes_nothing": ("true {input} {output}", "fail", None),
    "garbage": ("sh -c 'echo garbage > \"$1\"' sh {output} {input}", "fail", None),
    "empty_file": ("sh -c ': > \"$1\"' sh {output} {input}", "fail", None),
    "copies_input": ("cp {input} {output}", "fail", None),
    "stray_file": ("sh -c 'echo x > \"$1/notes.txt\"' sh {output_dir} {input_dir}", "fail", None),
    "fifo": ("sh -c 'mkfifo \"$1\"' sh {output} {input}", "fail", None),
    "dev_zero": ("sh -c 'ln -s /dev/zero \"$1\"' sh {output} {input}", "fail", None),
    "timeout": ("sh -c 'sleep 5' sh {input} {output}", "fail", 1),
    "background": ("sh -c 'sleep 30 & exit 1' sh {input} {output}", "fail", None),
    **{f"escapes_{how}": (f"{_PYTHON} -c {_literal(code)} {{output}} {{input}}", "fail", None)
       for how, code in _ESCAPES.items()},
    "job_control": ("bash -c 'set -m; sleep 30 & sleep 0.3; exit 1' sh {input} {output}", "fail", None),
    "gnu_timeout": ("sh -c 'timeout 30 sleep 30 & sleep 0.3; exit 1' sh {input} {output}", "fail", None),
    "setsid_sleep": ("sh -c 'setsid sleep 30 & sleep 0.3; exit 1' sh {input} {output}", "fail", None),
    "clears_folder": ("sh -c 'rm -rf \"$(dirname \"$1\")\"/*; echo cleared >&2; exit 1' sh {output} {input}",
                      "fail", None),
    "fifo_log": ("sh -c 'mkfifo \"$(dirname \"$1\")/stderr\"; exit 1' sh {output} {input}", "fail", None),
    "dev_zero_log": ("sh -c 'ln -s /dev/zero \"$(dirname \"$1\")/stderr\"; exit 1' sh {output} {input}", "fail",
                     None),
    "locked_folder": ("sh -c 'mkdir \"$1/d\" && touch \"$1/d/f\" && chmod 0 \"$1/d\" \"$1\"; exit 1' sh {output_dir} "
                      "{input}", "fail", None),
    "absurd_header": (f"{_PYTHON} -c {_literal(_ABSURD)} {{output_dir}} {{input}}", "fail", None),
    "stderr_flood": ("sh -c 'yes flood | head -c 2000000 >&2; exit 1' sh {input} {output}", "fail", None),
    "binary_stderr": ("sh -c 'printf \"\\377\\376\\n\" >&2; exit 2' sh {input} {output}", "fail", None),
    "not_found": ("ntpref-no-such-program {input} {output}", "error", None),
    "unknown_placeholder": ("cat {inptu} {output}", "error", None),
    "no_output": ("cat {input}", "error", None),
    "unbalanced_quote": ("sh -c 'exit 1 {input} {output}", "error", None),
    "empty": ("", "error", None),
}

#: verdict → (the outcome it is, the exit status it must have)
VERDICTS = {"pass": ("accepted", 0), "fail": ("failed", 1), "error": ("rejected", 2)}


def adapter_source(fault: str, kind: str) -> str:
    """The adapter file of ``fault`` (ADAPTER_FAULTS) for a case of ``kind``: both functions, the faulty body in
    the one of ``kind``, then the module code."""
    module, body, _ = ADAPTER_FAULTS[fault]
    functions = "".join(f"\n\ndef {fn}(model, inputs):\n    out = oracle({k!r}, model, inputs)\n"
                        f"    {body if k == kind else 'return out'}\n" for k, fn in FUNCTIONS.items())
    return ADAPTER_HEAD + functions + "\n" + module.replace("{function}", FUNCTIONS[kind]) + "\n"


@contextlib.contextmanager
def _adapter_process():
    """Keep what an in-process adapter changes from the next run: the working directory, and no bytecode
    written (a rewritten adapter of the same size within a second would load the old file's)."""
    cwd, bytecode = os.getcwd(), sys.dont_write_bytecode
    sys.dont_write_bytecode = True
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.dont_write_bytecode = bytecode


def _conformance(source: list[str], model: str, kind: str, verdict: str, name: str | None) -> tuple:
    """Run ``ntpref conformance SOURCE`` on one random case of ``model`` and ``kind``: (exit status, stderr, why
    it is a crash or None, outcome). ``name``: what the error line must name (the adapter file)."""
    args = ["conformance", *source, "--model", model, "--kind", kind, "--no-stored",
            "--random", "1" if kind == "eval" else "3"]          # the first random case of that kind
    with _adapter_process():
        rc, out, err = _call(args)
    outcome, why = classify(rc, err, strict=False)
    want, status = VERDICTS[verdict]
    last = (out.strip().splitlines() or [""])[-1]
    if why is None and outcome != want:
        why = f"exit {rc}, but this adapter calls for {status}"
    elif why is None and outcome == "accepted" and not last.endswith(": PASS"):
        why = f"exit 0 without a PASS verdict (last line {last!r})"
    elif why is None and outcome == "failed" and ": FAIL" not in last:
        why = f"exit 1 without a FAIL verdict (last line {last!r})"
    elif why is None and outcome == "rejected" and name is not None and name not in _messages(err)[0]:
        why = "the error line does not name the adapter"
    return rc, err, why, outcome


def run_adapter_case(fault: str, model: str, kind: str, workdir: Path) -> Result:
    """Write the adapter of ``fault`` into ``workdir`` and run it on one case (see :func:`_conformance`)."""
    path = workdir / "adapter.py"
    path.write_text(adapter_source(fault, kind))
    rc, err, why, outcome = _conformance([path], model, kind, ADAPTER_FAULTS[fault][2], str(path))
    return _result(f"conformance {model} {kind} adapter {fault}", [f"adapter:{fault}"], rc, err, why, outcome)


#: The environment variable that marks the processes of one command case: every process the command starts
#: inherits it, so one still running after the case (found in /proc) is a leaked process.
MARK = "NTPREF_FUZZ_COMMAND_CASE"


def _marked(token: str) -> list[int]:
    """The pids of the processes (this one aside) whose environment holds ``MARK=token``."""
    found, needle = [], f"{MARK}={token}".encode()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
    return found


@contextlib.contextmanager
def _watched_command():
    """Run a command case marked (MARK) and with its temporary folders in a folder of their own; yields a
    list that receives what it left behind: processes still running (killed then) and temporary folders."""
    token, left = f"{os.getpid()}-{time.monotonic_ns()}", []
    folder, tempdir = tempfile.mkdtemp(prefix="ntpref-fuzz-tmp-"), tempfile.tempdir
    os.environ[MARK], tempfile.tempdir = token, folder
    try:
        yield left
    finally:
        del os.environ[MARK]
        tempfile.tempdir = tempdir
        leaked = _marked(token) if os.path.isdir("/proc") else []
        for pid in leaked:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        left += [f"leaked process {pid}" for pid in leaked] + [f"temporary folder {e}" for e in os.listdir(folder)]
        shutil.rmtree(folder, ignore_errors=True)


def run_command_case(name: str, model: str, kind: str) -> Result:
    """Run the command of ``name`` (COMMANDS) on one case (see :func:`_conformance`); a process the command
    started that is still running afterwards, or a temporary folder left, is a crash."""
    command, verdict, timeout = COMMANDS[name]
    source = ["--command", command] + ([] if timeout is None else ["--timeout", timeout])
    with _watched_command() as left:
        rc, err, why, outcome = _conformance(source, model, kind, verdict, None)
    if left and why is None:
        why = "left behind: " + ", ".join(left)
    return _result(f"conformance {model} {kind} command {name}", [f"command:{name}"], rc, err, why, outcome)


def _model_kind(ch) -> tuple[str, str]:
    return ch.choice(("twostage", "shallow", "indrnn")), ch.choice(tuple(FUNCTIONS))


def adapter_run(ch, fx: Fixtures) -> Result:
    fault = ch.choice(sorted(ADAPTER_FAULTS))
    return run_adapter_case(fault, *_model_kind(ch), fx.workdir)


def command_run(ch, fx: Fixtures) -> Result:
    name = ch.choice(sorted(COMMANDS))
    return run_command_case(name, *_model_kind(ch))


# ---- JSON inputs: tolerance files and the reference manifest ----------------------------------------------

class Pairs(list):
    """A JSON object given as its (key, value) pairs, written in order, so that a key can appear twice."""


class Raw(str):
    """JSON text written as it is: a number no float holds (1e400), a 31-digit integer, a deep nesting."""


def json_text(value) -> str:
    """``value`` as JSON text (ASCII; NaN and Infinity as Python's json writes and reads them)."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, (dict, Pairs)):
        pairs = value.items() if isinstance(value, dict) else value
        return "{" + ", ".join(f"{json.dumps(str(k))}: {json_text(v)}" for k, v in pairs) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(json_text(v) for v in value) + "]"
    return json.dumps(value)


def _paths(value, at=()):
    """The path (keys and indices) of every node of a JSON value, the root's () first; Pairs and Raw are leaves."""
    yield at
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, at + (k,))
    elif isinstance(value, list) and not isinstance(value, Pairs):
        for i, v in enumerate(value):
            yield from _paths(v, at + (i,))


def _get(value, path):
    for key in path:
        value = value[key]
    return value


def _put(value, path, new):
    """A copy of ``value`` with the node at ``path`` replaced by ``new`` (only the nodes along the path copied)."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = _put(value[path[0]], path[1:], new)
    return copy


BAD_VALUES = ("text", "", None, True, False, [], {}, [1e-10], {"rtol": 1e-10}, 0, 1)
NUMBERS = (math.nan, math.inf, -math.inf, -1, -1e-300, -0.0, 0.0, 5e-324, 1e308, 10 ** 29, 2 ** 63, 1.5, True,
           Raw("1e400"), Raw("-1e400"), Raw("1e-400"), Raw("1" * 31), Raw("-" + "9" * 40))
KEYS = ("rtoll", "RTOL", "", " rtol", "default", "tolerances", "head", "n", "reason", "grad_w", "é", "\0",
        "\ud800", "format_version", "cases", "sha256", "bitwise", "files", "intermediates")


def _pick(ch, paths: list[tuple]) -> tuple:
    """One of ``paths``: a depth first, then a path of that depth (so that the few nodes near the root, such
    as a case's "provenance", are as likely to be hit as the thousands of array records)."""
    depth = ch.choice(sorted({len(p) for p in paths}))
    return ch.choice([p for p in paths if len(p) == depth])


def _objects(doc, paths):
    return [p for p in paths if isinstance(_get(doc, p), dict) and _get(doc, p)]


def j_type(doc, ch, paths):
    return _put(doc, _pick(ch, paths), ch.choice(BAD_VALUES))


def j_number(doc, ch, paths):
    numbers = [p for p in paths if type(_get(doc, p)) in (int, float)]
    return _put(doc, _pick(ch, numbers or paths), ch.choice(NUMBERS))


def j_key(doc, ch, paths):
    """An unknown (or misplaced) key added to an object."""
    where = _pick(ch, [p for p in paths if isinstance(_get(doc, p), dict)] or [()])
    node = _get(doc, where)
    if not isinstance(node, dict):
        return doc
    return _put(doc, where, {**node, ch.choice(KEYS): ch.choice(BAD_VALUES + NUMBERS[:3] + (1e-8,))})


def j_rename(doc, ch, paths):
    objects = _objects(doc, paths)
    if not objects:
        return doc
    where = _pick(ch, objects)
    node = _get(doc, where)
    old = ch.choice(list(node))
    new = ch.choice((old.upper(), old + "_", old[:-1], " " + old, old.swapcase()))
    return _put(doc, where, {(new if k == old else k): v for k, v in node.items()})


def j_remove(doc, ch, paths):
    objects = _objects(doc, paths)
    if not objects:
        return doc
    where = _pick(ch, objects)
    node = _get(doc, where)
    gone = ch.choice(list(node))
    return _put(doc, where, {k: v for k, v in node.items() if k != gone})


def j_duplicate(doc, ch, paths):
    """A key of an object written twice, with its own value or another one."""
    objects = _objects(doc, paths)
    if not objects:
        return doc
    where = _pick(ch, objects)
    node = _get(doc, where)
    key = ch.choice(list(node))
    return _put(doc, where, Pairs(list(node.items()) + [(key, ch.choice((node[key], 1e-8, None)))]))


def j_deep(doc, ch, paths):
    """A node replaced by a nesting of arrays or objects around the limit, or far over it."""
    depth = ch.choice((60, 63, 64, 65, 300, 100000))
    text = ch.choice(("[" * depth + "]" * depth, '{"a": ' * depth + "{}" + "}" * depth))
    return _put(doc, _pick(ch, paths), Raw(text))


def j_long(doc, ch, paths):
    return _put(doc, _pick(ch, paths), "x" * ch.choice((1000, 1 << 20)))


def j_wrap(doc, ch, paths):
    """The document inside a list or a "tolerances" object, or one of its nodes as the whole document."""
    op = ch.choice(("list", "tolerances", "node"))
    return [doc] if op == "list" else {"tolerances": doc} if op == "tolerances" else _get(doc, _pick(ch, paths))


JSON_MUTATIONS = {f.__name__[2:]: f for f in (j_type, j_number, j_key, j_rename, j_remove, j_duplicate, j_deep,
                                                j_long, j_wrap)}


def t_encoding(raw, ch):
    """Text that is not UTF-8 (a Latin-1 é, a stray byte, an encoded surrogate), UTF-16, a BOM, or a NUL."""
    at = ch.integer(0, len(raw))
    op = ch.choice(("latin1", "byte", "surrogate", "utf16", "bom", "nul"))
    if op == "utf16":
        return raw.decode("ascii").encode("utf-16")
    if op == "bom":
        return b"\xef\xbb\xbf" + raw
    insert = {"latin1": b"\xe9", "byte": b"\xff", "surrogate": b"\xed\xa0\x80", "nul": b"\0"}[op]
    return raw[:at] + insert + raw[at:]


def t_size(raw, ch):
    """An empty or blank file, or one padded with spaces to the size limit exactly or one byte beyond it."""
    op = ch.choice(("empty", "blank", "limit", "over"))
    if op in ("empty", "blank"):
        return b"" if op == "empty" else b" \n\t "
    return raw + b" " * (MAX_JSON_BYTES - len(raw) + (op == "over"))


BYTE_MUTATIONS = {"flip": f_flip, "truncate": f_truncate, "append": f_append, "prepend": f_prepend,
                  "encoding": t_encoding, "size": t_size}


def mutate_json(doc, ch, within: tuple = ()) -> tuple[bytes, list[str]]:
    """The bytes of ``doc`` after one to four mutations (value-level, then maybe a byte-level one), and their
    names; half of the value mutations pick a node under the path ``within``."""
    steps = []
    for _ in range(ch.integer(0 if ch.integer(0, 2) == 0 else 1, 3)):
        paths = list(_paths(doc))
        if within and ch.integer(0, 1):
            paths = [p for p in paths if p[:len(within)] == within] or paths
        name = ch.choice(sorted(JSON_MUTATIONS))
        doc = JSON_MUTATIONS[name](doc, ch, paths)
        steps.append("json:" + name)
    raw = json_text(doc).encode()
    if not steps or ch.integer(0, 3) == 0:
        name = ch.choice(sorted(BYTE_MUTATIONS))
        raw = BYTE_MUTATIONS[name](raw, ch)
        steps.append("bytes:" + name)
    return raw, steps


#: The awkward paths of OUTPUTS that an output must refuse: as inputs they must be refused too.
AWKWARD = sorted(kind for kind, (_, check) in OUTPUTS.items() if check is None)


def _json_file(raw: bytes, ch, d: Path) -> tuple[str, str]:
    """(path, kind) of the JSON input in the empty folder ``d``: usually a file holding ``raw``, else a symbolic
    link to one, or an awkward path of OUTPUTS (a FIFO, a directory, ...), or no file at all."""
    kind = ch.choice(("link", "missing", *AWKWARD)) if ch.integer(0, 4) == 0 else "file"
    if kind in AWKWARD:
        return OUTPUTS[kind][0](d), kind
    path = d / "tolerances.json"
    if kind == "link":
        (d / "target.json").write_bytes(raw)
        os.symlink("target.json", path)
    elif kind == "file":
        path.write_bytes(raw)
    return str(path), kind


def tolerance_run(ch, fx: Fixtures) -> Result:
    base = ch.choice(sorted(fx.tolerance_files))
    raw, steps = mutate_json(fx.tolerance_files[base], ch)
    path, kind = _json_file(raw, ch, fx.fresh("json"))
    actual = ch.choice((fx.expected, fx.perturbed))
    rc, _, err = _call(["compare", fx.expected, actual, "--tolerances", path])
    outcome, why = classify(rc, err)
    return _result(f"compare --tolerances {base} " + "+".join(steps), steps + [f"place:{kind}"], rc, err, why, outcome)


# ---- reference directories: a damaged copy of reference_runs/ -------------------------------------------------

def _case_files(root: Path, case: str) -> list[Path]:
    return sorted((root / case).glob("*.npz"))


def _read(path: Path) -> bytes:
    """The bytes of ``path``, which must be a regular file: an earlier damage may have made it a FIFO (that would
    block) or a link into another copy (ValueError, so that the damage is not applicable)."""
    if path.is_symlink() or not path.is_file():
        raise ValueError(f"{path} is not a regular file")
    return path.read_bytes()


def r_manifest(root, case, ch, fx):
    """manifest.json mutated like a tolerance file (half of the value mutations in the case's entry)."""
    raw, steps = mutate_json(json.loads(_read(root / "manifest.json")), ch, within=("cases", case))
    (root / "manifest.json").write_bytes(raw)
    return steps


def r_remove(root, case, ch, fx):
    """The case's directory, one of its files or manifest.json removed."""
    target = ch.choice([root / case, root / "manifest.json", *_case_files(root, case)])
    if target.is_dir():
        shutil.rmtree(target)
    else:
        target.unlink()
    return [f"remove:{target.name if target.name != case else 'case'}"]


def _replace_by(target: Path, how: str, other: Path, side: Path) -> None:
    """Put ``how`` where ``target`` was: a FIFO, a directory, a regular file, a symbolic link to its own moved
    copy, to ``other``, or to an awkward path of OUTPUTS made in ``side``."""
    if how == "own_link":
        os.replace(target, target.with_name(target.name + ".moved"))
        os.symlink(target.name + ".moved", target)
        return
    _clear(target)
    if how == "fifo":
        os.mkfifo(target)
    elif how == "directory":
        target.mkdir()
    elif how == "file":
        target.write_bytes(b"not what it should be")
    elif how == "other_link":
        os.symlink(other, target)
    else:
        os.symlink(OUTPUTS[how.removeprefix("link:")][0](side), target)


REPLACEMENTS = ("fifo", "directory", "file", "own_link", "other_link",
                *(f"link:{k}" for k in AWKWARD if k not in ("empty", "slash")))


def r_replace(root, case, ch, fx):
    """A file of the case, its directory, manifest.json or the root replaced (see :func:`_replace_by`); for
    "other_link" the link's target is the same path in a copy of the manifest and of another case (a copy,
    so that damage done through the link later cannot reach the pristine directory)."""
    target = ch.choice([root, root / case, root / "manifest.json", *_case_files(root, case)])
    where = target.relative_to(root).parts
    other_case, others = ch.choice([c for c in fx.cases if c != case]), fx.fresh("other")
    shutil.copytree(fx.pristine / other_case, others / other_case)
    shutil.copy(fx.pristine / "manifest.json", others)
    other = others.joinpath(*((other_case, *where[1:]) if where[:1] == (case,) else where))
    how = ch.choice(REPLACEMENTS)
    _replace_by(target, how, other, fx.fresh("side"))
    return [f"replace:{'root' if target == root else 'case' if target.name == case else target.name}:{how}"]


def r_field(root, case, ch, fx):
    """A field of the case's manifest entry (or of the manifest itself) removed or given a value of another type."""
    manifest = json.loads(_read(root / "manifest.json"))
    node = manifest["cases"][case] if ch.integer(0, 3) else manifest
    key = ch.choice(sorted(node))
    if ch.integer(0, 3) == 0:
        del node[key]
    else:
        node[key] = ch.choice(BAD_VALUES)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return [f"field:{key}"]


def r_hash(root, case, ch, fx):
    """One hash of the case in the manifest changed to other valid hex digits: a file's or an array's."""
    manifest = json.loads(_read(root / "manifest.json"))
    entry = manifest["cases"][case]
    records = [("files", f) for f in entry["files"]] + [(s, n) for s in ("inputs", "arrays", "intermediates")
                                                          for n in entry.get(s, {})]
    section, name = ch.choice(records)
    node = entry[section]
    digest = node[name] if section == "files" else node[name]["sha256"]
    digest = ("0" if digest[0] != "0" else "1") + digest[1:]
    if section == "files":
        node[name] = digest
    else:
        node[name]["sha256"] = digest
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return [f"hash:{section}"]


def r_damage(root, case, ch, fx):
    """Bytes of one of the case's files flipped or cut."""
    target = ch.choice(_case_files(root, case) or [root / case / "input.npz"])
    op = ch.choice(("flip", "truncate"))
    target.write_bytes(FILE_MUTATIONS[op](_read(target), ch))
    return [f"damage:{op}"]


REFERENCE_MUTATIONS = {f.__name__[2:]: f for f in (r_manifest, r_field, r_remove, r_replace, r_hash,
                                                     r_damage)}

#: name → argv of the command run on the damaged copy ROOT, verifying or exporting CASE (export into OUT)
REFERENCE_COMMANDS = {
    "verify": lambda root, case, out: ["verify", "--root", root, case],
    "verify -v": lambda root, case, out: ["verify", "--root", root, case, "-v", "--backend", "numpy"],
    "verify --list": lambda root, case, out: ["verify", "--root", root, "--list"],
    "export": lambda root, case, out: ["export", "--root", root, case, "-o", out],
}


def _export_problem(outcome: str, out: Path) -> str | None:
    """What is wrong with what ``ntpref export`` left in ``out``: its three files (case.json a tolerance file)
    after a success, nothing after a failure."""
    written = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if outcome != "accepted":
        return f"{outcome}, yet it wrote {written}" if out.exists() else None
    if not {"input.npz", "expected.npz", "case.json"} <= set(written):
        return f"exit 0, but it wrote only {written}"
    try:
        load_tolerances(out / "case.json")
    except Exception as exc:  # noqa: BLE001
        return f"exit 0, but its case.json is not a tolerance file: {exc}"
    return None


def reference_run(ch, fx: Fixtures) -> Result:
    root, out = fx.workdir / "reference", fx.workdir / "export"
    for path in (root, root.with_name("reference.moved"), out):
        _clear(path)
    shutil.copytree(fx.pristine, root)
    case = ch.choice(fx.cases)
    steps = []
    for _ in range(ch.integer(1, 2)):
        name = ch.choice(sorted(REFERENCE_MUTATIONS))
        try:
            steps += REFERENCE_MUTATIONS[name](root, case, ch, fx)
        except (OSError, ValueError, LookupError, TypeError, AttributeError, RecursionError):  # an earlier damage
            steps.append(f"{name}:not applicable")          # left nothing for this one to work on
    command = ch.choice(sorted(REFERENCE_COMMANDS))
    rc, _, err = _call(REFERENCE_COMMANDS[command](root, case, out))
    outcome, why = classify(rc, err)
    if why is None and command == "export":
        why = _export_problem(outcome, out)
    return _result(f"{command} {case} " + "+".join(steps), steps + [f"run:{command}"], rc, err, why, outcome)


# ---- reproduction cells: damaged copies of committed cells ---------------------------------------------------

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
#: Targets whose committed full-size cells the cells runs damage: few cells, quick summaries.
CELL_TARGETS = ("approx", "twostage")


def cells_run(ch, fx: Fixtures) -> Result:
    """``reproduce TARGET --full --summarize-only`` on committed cells, one or two of them damaged (module
    docstring)."""
    target, out = ch.choice(CELL_TARGETS), fx.fresh("cells")
    celldir = out / target / "full" / "cells"
    shutil.copytree(RESULTS / target / "full" / "cells", celldir)
    damaged, steps = set(), []
    for _ in range(ch.integer(1, 2)):
        path, name = ch.choice(sorted(celldir.iterdir())), ch.choice(sorted(ARRAY_MUTATIONS))
        arrays = load_npz(path)
        kept = {k: arrays.pop(k) for k in ("cell_params", "cell_version") if k in arrays}
        save_npz(path, {**ARRAY_MUTATIONS[name](arrays, ch), **kept})
        damaged.add(path)
        steps.append(name)
    rc, _, err = _call(["reproduce", target, "--full", "--summarize-only", "--out", out, "-q"])
    outcome, why = classify(rc, err)
    if outcome == "failed":
        why = "exit 1"
    elif outcome == "rejected" and not any(str(p) in err for p in damaged):
        why = "the error names no damaged cell"
    elif outcome == "accepted":
        summary = (out / target / "full" / "summary.txt").read_text()
        silent = [p for p in damaged if str(p) not in summary
                  and any(a.dtype.kind == "f" and not np.all(np.isfinite(a)) for a in load_npz(p).values())]
        why = f"NaN or inf of {silent[0].name} not named in the summary" if silent else None
    return _result(f"reproduce {target} --summarize-only, {'+'.join(steps)}", steps, rc, err, why, outcome)


# ---- subprocess modes: closed pipes and killed workers ----------------------------------------------------------

#: Seconds a subprocess run may take before it counts as hung (a crash).
PROCESS_TIMEOUT = 300


def _ntpref(argv, cwd: Path, **popen) -> subprocess.Popen:
    """``ntpref ARGV`` as a subprocess (``python -X faulthandler -m ntpref.cli``, this interpreter), stdin empty."""
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "ntpref.cli", *map(str, argv)], cwd=cwd,
                            stdin=subprocess.DEVNULL, **popen)


def _finish(process: subprocess.Popen) -> int | None:
    """The exit status of ``process``, or None when it hangs past PROCESS_TIMEOUT: then it gets SIGABRT (on which
    faulthandler prints the stack of every thread on its stderr), and SIGKILL."""
    try:
        return process.wait(PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        process.kill()
        process.wait()
        return None


def _run_logged(argv, workdir: Path, watch=lambda process: None) -> tuple[int | None, str, object]:
    """Run ``ntpref ARGV`` with stderr into a file, ``watch(process)`` while it runs: (exit status, or None when it
    hung (:func:`_finish`), stderr, what ``watch`` returned)."""
    with tempfile.TemporaryFile() as log:
        process = _ntpref(argv, workdir, stdout=subprocess.DEVNULL, stderr=log)
        try:
            watched = watch(process)
            rc = _finish(process)
        finally:
            process.kill()
            process.wait()
        log.seek(0)
        return rc, log.read().decode(errors="replace"), watched


def pipe_commands(fx: Fixtures) -> dict[str, list]:
    """name → argv of the commands run with a closed standard output: each exits 0 when it is read."""
    return {"reproduce --list": ["reproduce", "--list"], "verify --list": ["verify", "--root", fx.pristine, "--list"],
            "--help": ["--help"], "conformance --help": ["conformance", "--help"], "adapters": ["adapters"],
            "docs": ["docs"], "compare": ["compare", fx.expected, fx.expected],
            "compare wide": ["compare", fx.wide, fx.wide]}


#: Bytes read from standard output before it is closed (None: read to its end).
PIPE_READS = (0, 1, 100, 4096, 65536, None)


def pipe_outcome(read: int | None, rc: int, err: str) -> tuple[str, str | None]:
    """(outcome, why it is a crash or None) of a command whose output was closed after ``read`` bytes."""
    if rc is None:
        return "crash", f"no exit within {PROCESS_TIMEOUT} s"
    if err:
        return "crash", "output on stderr"
    if rc == 0:
        return "accepted", None
    if rc == 128 + signal.SIGPIPE and read is not None:
        return "rejected", None
    return "crash", f"exit {rc}"


def run_pipe_case(argv, read: int | None, workdir: Path) -> tuple[str, int, str]:
    """Run ``ntpref ARGV`` with stdout a pipe closed after ``read`` bytes; (outcome, exit status, why or stderr)."""
    process = _ntpref(argv, workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if read is None:
        process.stdout.read()
    elif read:
        process.stdout.read(read)
    process.stdout.close()
    err = process.stderr.read().decode(errors="replace")
    rc = _finish(process)
    outcome, why = pipe_outcome(read, rc, err)
    return outcome, rc, f"{why}: {err.strip()}" if why else err


def pipe_run(ch, fx: Fixtures) -> Result:
    commands = pipe_commands(fx)
    name, read = ch.choice(sorted(commands)), ch.choice(PIPE_READS)
    outcome, rc, text = run_pipe_case(commands[name], read, fx.workdir)
    return Result(f"{name} | head -c {read}", [f"pipe:{name}", f"read:{read}"], outcome, rc, text)


#: The target of the worker runs (3 cells of a few seconds at --quick).
WORKER_TARGET = "twostage"
#: When the workers are killed: as soon as they run, after the first finished cell, after a few seconds.
KILL_TIMES = ("start", "first_cell", "delay")


def _workers(parent: int) -> set[int]:
    """The worker processes (multiprocessing's spawned children, not its resource tracker) of ``parent``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == parent and b"spawn_main" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.add(int(entry))
    return found


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that are still worker processes (not gone, and not a new process of the same id)."""
    alive = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                alive.add(pid)
    return alive


def _cells(out: Path) -> dict[str, tuple]:
    """Cell file → (inode, mtime, SHA-256) of every cell the reproduce run left in ``out``."""
    return {str(p.relative_to(out)): (p.stat().st_ino, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(out.rglob("cells/*.npz"))}


def _kill_workers(process: subprocess.Popen, when: str, both: bool, delay: float, out: Path) -> tuple[list, set]:
    """SIGKILL one worker (``both``: every worker) of ``process`` at ``when`` (KILL_TIMES); (killed, seen)."""
    seen, since, deadline = set(), None, time.monotonic() + PROCESS_TIMEOUT
    while process.poll() is None and time.monotonic() < deadline:
        workers = _workers(process.pid)
        seen |= workers
        since = since or (time.monotonic() if workers else None)
        ready = workers and (when == "start" or (when == "first_cell" and _cells(out))
                             or (when == "delay" and time.monotonic() - since > delay))
        if ready:
            killed = sorted(workers) if both else [min(workers)]
            for pid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return killed, seen
        time.sleep(0.05)
    return [], seen


def run_worker_case(when: str, both: bool, delay: float, workdir: Path, seeds: int | None = None) -> tuple:
    """``ntpref reproduce WORKER_TARGET --quick --workers 2`` with workers killed (see :func:`_kill_workers`), then
    the same command again; (outcome, exit status, why or stderr) by the rules of the module docstring."""
    from ntpref.reproduce import target_module, with_seeds

    module = target_module(WORKER_TARGET)
    total = len(module.cells(**with_seeds(module.SIZES["quick"], seeds)))
    out = workdir / "reproduce"
    _clear(out)
    argv = ["reproduce", WORKER_TARGET, "--quick", "--workers", "2", "--out", out, "-q"] + \
           ([] if seeds is None else ["--seeds", seeds])
    kill = functools.partial(_kill_workers, when=when, both=both, delay=delay, out=out)
    rc, err, (killed, seen) = _run_logged(argv, workdir, kill)
    outcome, why = classify(rc, f"no exit within {PROCESS_TIMEOUT} s" if rc is None else err)
    deadline = time.monotonic() + 10
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    kept = _cells(out)
    problems = [why] if why else []
    if outcome not in ("accepted", "rejected", "crash"):
        problems.append(f"exit {rc}")
    if _alive(seen):
        problems.append(f"workers {sorted(_alive(seen))} outlived the run")
    for name in kept:
        try:
            load_npz(out / name)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"the kept cell {name} does not load: {exc}")
    rerun, rerun_err, _ = _run_logged(argv, workdir)
    after = _cells(out)
    if rerun != 0 or rerun_err:
        problems.append(f"the rerun exited {rerun}: {rerun_err.strip()}")
    if len(after) != total:
        problems.append(f"the rerun left {len(after)} of {total} cells")
    changed = [name for name, mark in kept.items() if after.get(name) != mark]
    if changed:
        problems.append(f"the rerun replaced finished cells {changed}")
    text = f"killed {len(killed)} worker(s), {len(kept)} of {total} cells kept; {err.strip()}"
    return ("crash" if problems else outcome), rc, ("; ".join(problems) + ": " + text) if problems else text


def worker_run(ch, fx: Fixtures) -> Result:
    when, both, delay = ch.choice(KILL_TIMES), bool(ch.integer(0, 1)), ch.choice((1.0, 3.0, 6.0))
    outcome, rc, text = run_worker_case(when, both, delay, fx.workdir)
    what = f"reproduce {WORKER_TARGET} --workers 2, {'both workers' if both else 'a worker'} killed at {when}"
    return Result(what + (f" ({delay:g} s)" if when == "delay" else ""), [f"kill:{when}"], outcome, rc, text)


# ---- the fuzz run ----------------------------------------------------------------------------------------------

#: surface → (its share of the main run, in fortieths; the runner)
SURFACES = {"npz": (25, npz_run), "output": (4, output_run), "environment": (2, environment_run),
            "adapter": (3, adapter_run), "command": (1, command_run), "tolerances": (2, tolerance_run),
            "reference": (2, reference_run), "cells": (1, cells_run)}
#: mode → (surface → runner), and the number of runs by default
MODES = {"main": ({name: run for name, (_, run) in SURFACES.items()}, 10000),
         "commands": ({"command": command_run}, 2 * len(COMMANDS)),
         "pipes": ({"pipes": pipe_run}, 50), "workers": ({"workers": worker_run}, 4)}
OUTCOMES = ("accepted", "failed", "rejected", "crash")


def _surface(ch, mode: str) -> str:
    surfaces = MODES[mode][0]
    if len(surfaces) == 1:
        return next(iter(surfaces))
    k = ch.integer(0, sum(share for share, _ in SURFACES.values()) - 1)
    for name, (share, _) in SURFACES.items():
        if k < share:
            return name
        k -= share
    raise AssertionError("the shares add up")


def fuzz(n: int | None = None, seed: int = 0, show: int = 10, log=print, mode: str = "main") -> Counter:
    """Run ``n`` generated cases of ``mode`` (MODES; ``n`` None: its default); returns the outcome counts and
    logs them per surface and per generator step, with the first ``show`` crashes."""
    runners, default = MODES[mode]
    n = default if n is None else n
    ch = RandomChooser(seed)
    counts, by_surface, by_step, crashes = Counter(), Counter(), Counter(), []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ntpref-fuzz-") as tmp:
        fx = Fixtures(Path(tmp))
        for i in range(n):
            surface = _surface(ch, mode)
            result = runners[surface](ch, fx)
            counts[result.outcome] += 1
            by_surface[(surface, result.outcome)] += 1
            for step in result.steps:
                by_step[(surface, step, result.outcome)] += 1
            if result.outcome == "crash":
                crashes.append(f"case {i}: {result.what}: exit {result.rc}: {result.text.strip()[:300]}")
    seconds = time.perf_counter() - start
    log(f"ntpref fuzz ({mode}): {n} runs (seed {seed}) in {seconds:.1f} s: "
        + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES))
    for title, table in (("surface", by_surface), ("step", by_step)):
        for key in sorted({k[:-1] for k in table}):
            log(f"  {title} {' '.join(key):<44} " + "  ".join(f"{k} {table[(*key, k)]:>5}" for k in OUTCOMES))
    for line in crashes[:show]:
        log("  CRASH " + line)
    return counts


def main_fuzz(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, help="number of runs (default 10000; commands twice the commands, pipes 50, "
                                             "workers 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="crashes to print")
    parser.add_argument("--mode", choices=sorted(MODES), default="main",
                        help="main: in-process surfaces; commands: the command surface alone; pipes, workers: "
                             "subprocess runs (see the module docstring)")
    args = parser.parse_args(argv)
    return 1 if fuzz(args.n, args.seed, args.show, mode=args.mode)["crash"] else 0


if __name__ == "__main__":
    sys.exit(main_fuzz())
