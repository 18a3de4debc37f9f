"""Fuzz the ``ntpref eval`` / ``ntpref train`` command line with malformed input files.

Every generated input starts from a valid input of one of the three models (twostage, shallow, indrnn;
eval and train) and applies one to three mutations: array-level (dtype changes, shape and rank changes,
NaN / inf injection, out-of-range values, removed, renamed or unknown arrays, a wrong model name or
option, object arrays) and file-level (byte flips, truncation, appended or prepended garbage, random
bytes, a lying zip directory, a zip bomb, raw non-.npy members, a plain .npy file). ``ntpref.cli.main``
is called in-process and the outcome classified:

  accepted  exit 0, the output file exists, loads, and every output array is finite
  rejected  exit 2, exactly one stderr line starting "ntpref: error:", no output file written
  crash     anything else: an "internal error", a traceback / escaped exception, several stderr lines,
            another exit status, a non-finite or missing output

Usage:  python scripts/fuzz_cli.py [-n 10000] [--seed 0] [--show 10]
Exit status 0 when there is no crash, 1 otherwise. The mutation engine is driven by a ``Chooser`` so the
property-based test (tests/test_robust_fuzz.py) reuses it with Hypothesis choosing instead of a seed.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import struct
import sys
import tempfile
import time
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np

from ntpref.cli import main
from ntpref.oracle.npzio import load_npz


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
    from ntpref.shallow.model import iid_init
    from ntpref.shallow.rnn import rnn_paired_init
    from ntpref.twostage.data import five_token_example

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
    c, u, W_in = rnn_paired_init(4, 3, seed=1)
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


FILE_MUTATIONS = {f.__name__[2:]: f for f in (f_flip, f_truncate, f_append, f_prepend, f_random, f_lie_size,
                                                f_bomb, f_raw_member, f_npy)}


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

def run_case(command: str, raw: bytes, workdir: Path, backend: str = "numba") -> tuple[str, int, str]:
    """Write ``raw`` to INPUT.npz, run ``ntpref COMMAND`` in-process; (outcome, exit status, stderr)."""
    inp, out = workdir / "input.npz", workdir / "out.npz"
    inp.write_bytes(raw)
    out.unlink(missing_ok=True)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            rc = main([command, str(inp), "-o", str(out), "--backend", backend, "-q"])
    except BaseException as exc:  # noqa: BLE001 - an escaped exception is exactly what we look for
        return "crash", -1, f"escaped {type(exc).__name__}: {exc}"
    text = err.getvalue()
    lines = text.splitlines()
    if rc == 0:
        try:
            result = load_npz(out)
        except Exception as exc:  # noqa: BLE001
            return "crash", rc, f"exit 0 but the output does not load: {exc}"
        bad = [k for k, v in result.items() if v.dtype.kind != "f" or not np.isfinite(v).all()]
        return ("crash", rc, f"exit 0 with non-finite / non-float outputs {bad}") if bad else ("accepted", rc, text)
    clean = (rc == 2 and len(lines) == 1 and text.endswith("\n") and lines[0].startswith("ntpref: error: ")
             and "internal error" not in text and not out.exists())
    return ("rejected" if clean else "crash"), rc, text


def fuzz(n: int, seed: int = 0, show: int = 10, log=print) -> Counter:
    """Run ``n`` generated cases; returns the outcome counts (and logs a summary)."""
    ch = RandomChooser(seed)
    bases = valid_inputs()
    counts, by_mutation, crashes = Counter(), Counter(), []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ntpref-fuzz-") as tmp:
        for i in range(n):
            command, raw, what = generate(ch, bases)
            outcome, rc, text = run_case(command, raw, Path(tmp), ch.choice(("numba", "numpy")))
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
        log(f"  {s:<18}" + "  ".join(f"{k} {by_mutation[(s, k)]:>5}" for k in ("accepted", "rejected", "crash")))
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
