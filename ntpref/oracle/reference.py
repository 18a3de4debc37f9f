"""Stored reference runs: manifest, integrity, ``ntpref verify`` / ``regen`` / ``export`` (docs/contract.md).

Layout of the reference directory (``reference_runs/`` of the repository by default; the
environment variable ``NTPREF_REFERENCE_RUNS`` or ``--root DIR`` selects another one)::

    manifest.json
    CASE/input.npz           the arrays given to ``ntpref eval`` / ``ntpref train`` (kind "ntk": see below)
    CASE/expected.npz        what the oracle returned for them (exactly the ``ntpref eval/train`` outputs)
    CASE/intermediates.npz   optional: internal states that help locate a mismatch (see :func:`intermediates`)

``manifest.json``::

    {"format_version": 1, "provenance": {...},                   # of the last write (see provenance())
     "cases": {CASE: {"model", "kind": "eval" | "train" | "ntk", "description", "config", "seed",
                      "provenance": {...},                        # what produced the case's files
                      "files": {"input.npz": SHA256, "expected.npz": SHA256[, "intermediates.npz": SHA256]},
                      "inputs": {NAME: {"shape", "dtype", "sha256"}},
                      "arrays": {NAME: {"shape", "dtype", "sha256", "bitwise", "rtol", "atol", "atol_max_scale",
                                        "atol_per_step", "reason"[, "head"][, "certified"][, "calibrated"]}},
                      "intermediates": {NAME: {same fields as "arrays"}}}}}

SHA-256 of an array is taken over its raw bytes in C order; the file hashes catch a changed byte
that lies outside every array (zip headers). Tolerances are those of :mod:`ntpref.oracle.compare`,
set by the float64 policy of :mod:`ntpref.oracle.tolerance` (docs/tolerance.md) whenever a case is
written. ``bitwise`` (true / false; absent means false) says whether the array is promised bit-identical
across x86-64 CPUs (docs/contract.md, "Stored reference cases"): the generator declares it, ``regen``
keeps it. ``certified`` (the oracle's largest error against the exact backend over its tolerance) and
``calibrated`` (the array's calibrated tolerance, :mod:`ntpref.oracle.calibrated`, or "bound" where it keeps
the tolerance above) are written by ``ntpref certify --record`` and dropped when the values or the tolerance
change. A manifest that is not of this form (bad JSON, a missing key, a wrong type) is an
InputError naming the file, the case and the key. Unknown keys of the manifest and of a case are
ignored; the keys of an array's record are :data:`RECORD_FIELDS` and its tolerance's, so a new per-array
field is added to :data:`RECORD_FIELDS`.

Besides the tolerance check, ``verify`` and ``regen`` measure how far every recomputed array lies from its
stored bits, in ulp of the stored value (:func:`ulp_distance`): "bit-identical" tells an unchanged oracle
from one whose rounding moved within the tolerances.

Kinds: "eval" and "train" run through :func:`ntpref.oracle.contract.evaluate` / ``train``; any other kind
is one of a model's ``extra_kinds`` (its specification), not part of the interchange contract (no
``ntpref eval`` for it): "ntk" of model "shallow", whose input holds ``X`` [n, T, d], ``c`` [m], ``U``
[m, d], ``W`` [m, d, d] and optional ``tau_att``, ``mask_last_key``, ``activation``, and whose output is
``gram`` [n, n], the finite-width NTK Gram matrix of :func:`ntpref.shallow.ntk.ntk_gram`.

The cases themselves (configurations, seeds, builders) are defined beside each model (its specification's
``stored``: ``ntpref/twostage/cases.py``, ``ntpref/shallow/cases.py``) and written by
``tests/make_reference_runs.py``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
import os
import platform
import re
import subprocess
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ..checks import did_you_mean
from ..errors import ComparisonError, InputError
from .compare import Report, check_tolerance, compare_arrays
from ..jsonio import load_json
from ..npzio import atomic_write, load_npz, save_npz
from ..models import SPECS, spec_named
from ..numba_target import configured_target
from .tolerance import default_tolerances

FORMAT_VERSION = 1
#: The kinds of stored case: eval, train and every model's extra kinds ("ntk").
KINDS = ("eval", "train") + tuple(dict.fromkeys(k for spec in SPECS.values() for k in spec.extra_kinds))
ENV_ROOT = "NTPREF_REFERENCE_RUNS"
FILES = ("input.npz", "expected.npz")
INTERMEDIATES = "intermediates.npz"
#: Which manifest section records the arrays of each file of a case.
SECTIONS = {"input.npz": "inputs", "expected.npz": "arrays", INTERMEDIATES: "intermediates"}
#: The fields of an array's record that describe its bytes: rewritten whenever the array is.
BYTES_FIELDS = ("shape", "dtype", "sha256")
#: Every field of an array's record besides its tolerance (whose keys, checked by
#: :func:`ntpref.oracle.compare.check_tolerance`, are all the others). The fields after :data:`BYTES_FIELDS`
#: describe the array rather than its bytes; ``regen`` and ``--tolerances-only`` keep them as they are.
RECORD_FIELDS = BYTES_FIELDS + ("bitwise", "certified", "calibrated")
#: The fields that describe the array's values under its tolerance (``ntpref certify --record``): kept only
#: while both stay as they are.
MEASURED_FIELDS = ("certified", "calibrated")
#: The ``calibrated`` field of an array that keeps its running error bound under the calibrated policy.
KEEPS_BOUND = "bound"

# --- hashing, provenance, manifest ----------------------------------------------------------------
def sha256_array(a: np.ndarray) -> str:
    """SHA-256 (hex) of the raw bytes of ``a`` in C order (dtype and shape are recorded separately)."""
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def provenance() -> dict:
    """What produces a result in this process: the ntpref version and git commit (:func:`git_commit`), the
    NumPy, Numba and Python versions, the system and architecture, the CPU model (:func:`cpu_model`) and the
    Numba CPU target the kernels are compiled for (:func:`ntpref.numba_target.configured_target`: CPU name
    and features, hence the vector width the ``ntpref`` command configured)."""
    import numba

    from .. import __version__

    return {"ntpref": __version__, "git": git_commit(), "numpy": np.__version__, "numba": numba.__version__,
            "python": platform.python_version(), "machine": f"{platform.system()} {platform.machine()}",
            "cpu": cpu_model(), "numba_target": configured_target()}


@functools.cache
def git_commit() -> str:
    """The commit of the git checkout ntpref is imported from, with "+modified" when its ``ntpref/`` sources
    differ from it (changed or new files); "unknown" for an installed copy or without git. Git runs without
    optional locks, so it never competes with another git process for the index."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists() or not (root / "ntpref" / "__init__.py").is_file():
        return "unknown"
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, env=env,
                              timeout=30, check=True).stdout.strip()

    try:
        commit = git("rev-parse", "HEAD")
        modified = git("status", "--porcelain", "--", "ntpref")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + ("+modified" if modified else "")


@functools.cache
def cpu_model() -> str:
    """The CPU's model name ("model name" of /proc/cpuinfo, else :func:`platform.processor`, else "unknown")."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return " ".join(value.split())
    except OSError:
        pass
    return platform.processor() or "unknown"


def provenance_text(prov: Mapping) -> str:
    """A provenance record (:func:`provenance`) on one line; fields an older record lacks are left out."""
    target = prov.get("numba_target")
    parts = (f"ntpref {prov['ntpref']}" if "ntpref" in prov else "",
             f"git {prov['git']}" if "git" in prov else "",
             *(f"{label} {prov[key]}" for label, key in (("NumPy", "numpy"), ("Numba", "numba"), ("Python", "python"))
               if key in prov),
             prov.get("machine", ""), prov.get("cpu", ""),
             f"Numba target {target.get('cpu')} ({target.get('features') or 'no features'})"
             if isinstance(target, Mapping) else "")
    return ", ".join(p for p in parts if p) or "(no provenance)"


# --- distances in ulp ------------------------------------------------------------------------------
def ulp_distance(stored, new) -> float | None:
    """The largest distance between an entry of ``new`` and the same entry of ``stored``, in units in the last
    place of the stored value: |new − stored| / spacing(|stored|), spacing(x) being the gap from x to the next
    float of larger magnitude. 0 exactly when every entry has the same bits.

    Zeros and subnormals: their spacing is the smallest subnormal, 2^-1074, so a stored zero that became
    nonzero counts as a huge number (inf from 2^-50 on): a change of an exact zero is never "a few ulp".
    Entries that differ only in the sign of a zero count 1 (the two zeros are neighbours); NaN or inf in
    ``new`` where ``stored`` has other bits counts inf. Arrays that are not floating point count 0 when
    equal. None when the two cannot be compared entry by entry: other shapes, dtypes of another kind, or
    unequal non-float arrays.
    """
    s, a = np.asarray(stored), np.asarray(new)
    if s.shape != a.shape or s.dtype.kind != a.dtype.kind:
        return None
    if s.dtype.kind != "f":
        return 0.0 if np.array_equal(s, a) else None
    s, a = s.astype(np.float64), a.astype(np.float64)
    same = (s == a) & (np.signbit(s) == np.signbit(a))
    if same.all():
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        units = np.abs(a - s) / np.spacing(np.abs(s))     # a power of two: the division is exact
    units = np.where(np.isnan(units), np.inf, units)
    units = np.where(same, 0.0, np.where(units == 0.0, 1.0, units))   # 0 where only the sign of a zero differs
    return float(units.max())


def ulp_text(ulp: float | None) -> str:
    """"identical", "64 ulp", "0.5 ulp", "1.2e+17 ulp", or "differs" (None: not comparable entry by entry)."""
    if ulp is None:
        return "differs"
    return "identical" if ulp == 0.0 else f"{ulp:.4g} ulp"


class ArrayBits(NamedTuple):
    """One recomputed array against its stored bits: ``ulp`` (:func:`ulp_distance`; None when the stored
    arrays lack it or it is not comparable) and ``promised``, the manifest's ``bitwise`` flag."""

    name: str
    ulp: float | None
    promised: bool

    @property
    def identical(self) -> bool:
        """Whether every entry kept its bits."""
        return self.ulp == 0.0


def bit_distances(stored: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray],
                  entry: Mapping) -> list[ArrayBits]:
    """:class:`ArrayBits` of every array of ``new`` (a case's recomputed outputs and intermediates) against
    the ``stored`` ones, with the promises of the case's manifest ``entry``."""
    records = array_records(entry)
    return [ArrayBits(name, ulp_distance(stored[name], a) if name in stored else None,
                      records.get(name, {}).get("bitwise") is True) for name, a in new.items()]


def changes_text(bits: Iterable[ArrayBits]) -> str:
    """"unchanged, all N arrays bit-identical to the stored ones", or "K of N arrays changed (max M ulp):
    NAME 3 ulp, NAME 0.5 ulp, ..." for new arrays against their stored bits."""
    bits = list(bits)
    changed = [b for b in bits if not b.identical]
    if not changed:
        return f"unchanged, all {len(bits)} arrays bit-identical to the stored ones"
    return (f"{len(changed)} of {len(bits)} arrays changed ({bits_summary(changed)}): "
            + ", ".join(f"{b.name} {ulp_text(b.ulp)}" for b in changed))


def bits_summary(bits: Iterable[ArrayBits]) -> str:
    """"bit-identical" when every array kept its bits, else "max N ulp" over the arrays with a distance
    ("differs" when none has one)."""
    bits = list(bits)
    if all(b.identical for b in bits):
        return "bit-identical"
    worst = [b.ulp for b in bits if b.ulp is not None]
    return f"max {ulp_text(max(worst))}" if worst else "differs"


def default_root() -> Path:
    """``$NTPREF_REFERENCE_RUNS`` if set, else the repository's ``reference_runs/`` (a source checkout or an
    editable install), else the copy installed with the package (``ntpref/reference_runs``)."""
    from ..shipped import shipped_dir

    env = os.environ.get(ENV_ROOT)
    return Path(env) if env else shipped_dir("reference_runs", "manifest.json")


def load_manifest(root: str | os.PathLike | None = None) -> dict:
    """The manifest of ``root`` (an empty one when the directory has none yet), checked by
    :func:`check_manifest`."""
    path = Path(root if root is not None else default_root()) / "manifest.json"
    try:
        exists = path.exists()
    except OSError as exc:  # e.g. a --root name longer than the system allows
        raise InputError(f"--root {path.parent}: unusable directory ({exc.strerror or exc})") from None
    if not exists:
        return {"format_version": FORMAT_VERSION, "provenance": provenance(), "cases": {}}
    manifest = load_json(path, "a reference manifest")
    check_manifest(path, manifest)
    return manifest


def load_cases(root: Path) -> dict:
    """The manifest of the reference directory ``root`` (:func:`load_manifest`) for reading its cases:
    InputError when it holds none, since the directory is missing or has no manifest yet and there is
    nothing to verify, list, export or run (a mistyped ``--root``)."""
    manifest = load_manifest(root)
    if not manifest["cases"]:
        raise InputError(f"{root}: no reference cases (manifest.json missing or empty)")
    return manifest


def _require(where: str, obj: Mapping, key: str, types, what: str):
    if key not in obj:
        raise InputError(f"{where}: missing key '{key}'")
    value = obj[key]
    if not isinstance(value, types) or (types is int and isinstance(value, bool)):
        raise InputError(f"{where}: '{key}' must be {what}, got {json.dumps(value)[:60]}")
    return value


def _check_records(where: str, section: Mapping, tolerances: bool) -> None:
    for name, rec in section.items():
        at = f"{where} array '{name}'"
        if not isinstance(rec, Mapping):
            raise InputError(f"{at}: must be an object, got {json.dumps(rec)[:60]}")
        shape = _require(at, rec, "shape", list, "a list of sizes")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise InputError(f"{at}: 'shape' must be a list of sizes >= 0, got {json.dumps(shape)[:60]}")
        _require(at, rec, "dtype", str, "a dtype string")
        digest = _require(at, rec, "sha256", str, "a SHA-256 hex digest")
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise InputError(f"{at}: 'sha256' must be 64 hex digits, got {digest[:70]!r}")
        if "bitwise" in rec and not isinstance(rec["bitwise"], bool):
            raise InputError(f"{at}: 'bitwise' must be true or false, got {json.dumps(rec['bitwise'])[:60]}")
        certified = rec.get("certified")
        if "certified" in rec and (isinstance(certified, bool) or not isinstance(certified, (int, float))
                                   or not math.isfinite(certified) or certified < 0):
            raise InputError(f"{at}: 'certified' must be a number >= 0 (the oracle's error / its tolerance "
                             f"against the exact backend), got {json.dumps(certified)[:60]}")
        calibrated = rec.get("calibrated", KEEPS_BOUND)
        if calibrated != KEEPS_BOUND:
            if not isinstance(calibrated, Mapping):
                raise InputError(f"{at}: 'calibrated' must be \"{KEEPS_BOUND}\" or a tolerance object, got "
                                 f"{json.dumps(calibrated)[:60]}")
            check_tolerance(f"{at} 'calibrated'", calibrated)
        if tolerances:
            check_tolerance(at, _tolerance_part(rec))


def check_manifest(path, manifest) -> None:
    """Raise InputError naming ``path``, the case and the key when ``manifest`` is not a format_version 1
    reference manifest (module docstring): a missing key, a wrong type, an unknown kind or file, a case
    name that is not a plain directory name, an invalid tolerance."""
    if not isinstance(manifest, dict):
        raise InputError(f"{path}: a reference manifest must be a JSON object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise InputError(f"{path}: 'format_version' must be {FORMAT_VERSION}, got "
                         f"{json.dumps(manifest.get('format_version'))}")
    cases = _require(str(path), manifest, "cases", dict, "an object mapping case names to cases")
    for case, entry in cases.items():
        where = f"{path}: case '{case}'"
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", case) or case in (".", ".."):
            raise InputError(f"{where}: a case name is a directory name of letters, digits, '_', '-', '.'")
        if not isinstance(entry, dict):
            raise InputError(f"{where}: must be an object")
        for key, types, what in (("model", str, "a string"), ("description", str, "a string"),
                                 ("config", dict, "an object"), ("seed", int, "an integer"),
                                 ("files", dict, "an object"), ("inputs", dict, "an object"),
                                 ("arrays", dict, "an object")):
            _require(where, entry, key, types, what)
        if "provenance" in entry and not isinstance(entry["provenance"], dict):
            raise InputError(f"{where}: 'provenance' must be an object, got {json.dumps(entry['provenance'])[:60]}")
        kind = _require(where, entry, "kind", str, "a string")
        if kind not in KINDS:
            raise InputError(f"{where}: 'kind' must be one of {', '.join(KINDS)}, got {kind!r}")
        for f, digest in entry["files"].items():
            if f not in SECTIONS:
                raise InputError(f"{where}: unknown file '{f}' in 'files' (known: {', '.join(SECTIONS)})")
            if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
                raise InputError(f"{where}: 'files' entry '{f}' must be a SHA-256 hex digest")
        missing = [f for f in FILES if f not in entry["files"]]
        if missing:
            raise InputError(f"{where}: 'files' lacks '{missing[0]}'")
        if INTERMEDIATES in entry["files"]:
            _require(where, entry, "intermediates", dict, "an object")
        _check_records(where, entry["inputs"], tolerances=False)
        _check_records(where, entry["arrays"], tolerances=True)
        _check_records(where, entry.get("intermediates", {}), tolerances=True)


def save_manifest(root: str | os.PathLike, manifest: Mapping) -> None:
    """Write ``root/manifest.json`` atomically (provenance refreshed)."""
    manifest = {**manifest, "provenance": provenance()}
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]",
                  json.dumps(manifest, indent=1)) + "\n"   # shapes on one line
    atomic_write(Path(root) / "manifest.json", lambda fh: fh.write(text.encode("utf-8")))


def _bytes_entry(a: np.ndarray) -> dict:
    return {"shape": list(a.shape), "dtype": str(a.dtype), "sha256": sha256_array(a)}


def _tolerance_part(rec: Mapping) -> dict:
    """The tolerance held in an array's record: every key that is not one of :data:`RECORD_FIELDS`."""
    return {k: v for k, v in rec.items() if k not in RECORD_FIELDS}


def kept_fields(rec: Mapping, array: np.ndarray, tolerance: Mapping) -> dict:
    """The fields of an array's record that stay when it is rewritten with the values ``array`` and the
    tolerance ``tolerance``: ``bitwise`` always; the :data:`MEASURED_FIELDS` (``certified``, its error /
    tolerance against the exact backend, and ``calibrated``, its calibrated tolerance: :func:`record_certified`)
    only when both are unchanged, since they describe them."""
    kept = {k: rec[k] for k in RECORD_FIELDS[len(BYTES_FIELDS):] if k in rec and k not in MEASURED_FIELDS}
    same_bytes = all(rec.get(k) == v for k, v in _bytes_entry(np.asarray(array)).items())
    if same_bytes and _tolerance_part(rec) == dict(tolerance):
        kept.update({k: rec[k] for k in MEASURED_FIELDS if k in rec})
    return kept


def record_certified(root: str | os.PathLike, ratios: Mapping[str, Mapping[str, float]],
                     calibrated: Mapping[str, Mapping[str, Mapping]] | None = None) -> None:
    """Store what ``ntpref certify --record`` measured in each named array's record: ``certified`` = err/tol
    of the oracle against the exact backend (``ratios``: case → array → ratio) and ``calibrated`` = its
    calibrated tolerance (:mod:`ntpref.oracle.calibrated`; ``calibrated``: case → array → tolerance dict, the
    running bound's own for an array that keeps it, stored as :data:`KEEPS_BOUND`), for stored cases
    certified whole."""
    root, calibrated = Path(root), calibrated or {}
    manifest = load_manifest(root)
    for case in {**ratios, **calibrated}:
        for name, rec in array_records(manifest["cases"][case]).items():
            if name in ratios.get(case, {}):
                rec["certified"] = float(ratios[case][name])
            if name in calibrated.get(case, {}):
                tol = dict(calibrated[case][name])
                rec["calibrated"] = KEEPS_BOUND if tol == _tolerance_part(rec) else tol
    save_manifest(root, manifest)


def calibrated_of(entry: Mapping) -> dict[str, dict] | None:
    """name → calibrated tolerance of a manifest case entry (its recorded ``calibrated`` field, the running
    bound where that is :data:`KEEPS_BOUND`), or None unless every array of the case has one."""
    recorded = array_records(entry)
    if not recorded or any("calibrated" not in rec for rec in recorded.values()):
        return None
    return {n: _tolerance_part(rec) if rec["calibrated"] == KEEPS_BOUND else dict(rec["calibrated"])
            for n, rec in recorded.items()}


def certified_text(entry: Mapping) -> str:
    """The largest recorded ``certified`` ratio of a case's arrays (how far the oracle's own error goes into
    its tolerance), "-" when none is recorded."""
    values = [rec["certified"] for rec in array_records(entry).values() if "certified" in rec]
    return f"{max(values):.1e}" if values else "-"


def _checked_entries(arrays: Mapping[str, np.ndarray], tolerances: Mapping[str, Mapping],
                     fields: Mapping[str, Mapping]) -> dict:
    missing = [n for n in arrays if n not in tolerances]
    if missing:
        raise InputError(f"no tolerance for array '{missing[0]}'")
    known = RECORD_FIELDS[len(BYTES_FIELDS):]
    unknown = sorted({k for n in arrays for k in fields.get(n, {}) if k not in known})
    if unknown:
        raise InputError(f"unknown array record field '{unknown[0]}'; known: {', '.join(known)}")
    return {name: _record(_bytes_entry(np.asarray(a)), fields.get(name, {}),
                          check_tolerance(f"tolerance of '{name}'", tolerances[name])) for name, a in arrays.items()}


def _record(bytes_entry: Mapping, fields: Mapping, tolerance: Mapping) -> dict:
    """An array's record in the manifest's order: bytes, ``bitwise``, the tolerance, ``certified``,
    ``calibrated``."""
    rest = {k: v for k, v in fields.items() if k not in MEASURED_FIELDS}
    measured = {k: fields[k] for k in MEASURED_FIELDS if k in fields}
    return {**bytes_entry, **rest, **tolerance, **measured}


def case_entry(model: str, kind: str, description: str, config: Mapping, seed: int,
               inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
               tolerances: Mapping[str, Mapping], extra: Mapping[str, np.ndarray] | None = None,
               fields: Mapping[str, Mapping] | None = None) -> dict:
    """The manifest entry of a case (file hashes are added by :func:`write_case`).

    tolerances: name → tolerance for every array of ``expected`` and of ``extra`` (the intermediates).
    fields: name → the other fields of that array's record (:func:`kept_fields`, e.g. {"bitwise": True}).
    """
    if kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    fields = fields or {}
    entry = {"model": model, "kind": kind, "description": description, "config": dict(config), "seed": int(seed),
             "provenance": provenance(), "files": {},
             "inputs": {n: _bytes_entry(np.asarray(a)) for n, a in inputs.items()},
             "arrays": _checked_entries(expected, tolerances, fields)}
    if extra:
        entry["intermediates"] = _checked_entries(extra, tolerances, fields)
    return entry


def write_case(root: str | os.PathLike, name: str, entry: dict, inputs: Mapping[str, np.ndarray] | None,
               expected: Mapping[str, np.ndarray], manifest: dict,
               extra: Mapping[str, np.ndarray] | None = None) -> None:
    """Write ``root/name/{input,expected,intermediates}.npz`` and record ``entry`` in ``manifest``.

    input.npz only when ``inputs`` is given, intermediates.npz only when ``extra`` is non-empty. A file
    that already holds exactly these arrays (its hash and its arrays' records in ``manifest`` match) is
    left as it is, since rewriting it would change its zip timestamps only; when no file is rewritten the
    entry keeps the provenance recorded for the files. Each file is replaced atomically; the manifest is
    *not* saved here (call :func:`save_manifest` once after writing all cases).
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise InputError(f"case name {name!r}: use letters, digits, '_', '-', '.' only")
    folder = Path(root) / name
    old = manifest["cases"].get(name)
    files = {"input.npz": inputs, "expected.npz": expected, **({INTERMEDIATES: extra} if extra else {})}
    rewrite = [f for f, arrays in files.items() if arrays is not None and not _holds(folder / f, arrays, old)]
    for f in rewrite:
        save_npz(folder / f, files[f])
    if not rewrite and old is not None and "provenance" in old:
        entry["provenance"] = old["provenance"]
    entry["files"] = {f: sha256_file(folder / f) for f in files}
    manifest["cases"][name] = entry


def _holds(path: Path, arrays: Mapping[str, np.ndarray], entry: Mapping | None) -> bool:
    """Whether the file ``path`` of a case holds exactly ``arrays``: the case's manifest ``entry`` records
    its present hash and, for the same names, the same shapes, dtypes and array hashes."""
    if entry is None or not path.is_file() or entry.get("files", {}).get(path.name) is None:
        return False
    recorded = {n: {k: rec.get(k) for k in BYTES_FIELDS} for n, rec in entry.get(SECTIONS[path.name], {}).items()}
    return (recorded == {n: _bytes_entry(np.asarray(a)) for n, a in arrays.items()}
            and sha256_file(path) == entry["files"][path.name])


def array_records(entry: Mapping) -> dict[str, dict]:
    """name → the record (the manifest's own object) of every expected array and intermediate of a manifest
    case entry."""
    return {**entry["arrays"], **entry.get("intermediates", {})}


def tolerances_of(entry: Mapping) -> dict[str, dict]:
    """name → tolerance dict of a manifest case entry (expected arrays and intermediates)."""
    return {n: _tolerance_part(a) for n, a in array_records(entry).items()}


# --- computing a case --------------------------------------------------------------------------
def intermediates(model: str, kind: str, inputs: Mapping[str, np.ndarray], backend: str = "numba") -> dict:
    """Internal states stored next to a case's outputs to help locate a mismatch: the model's own
    (its specification's ``intermediates``; the shallow transformer's eval / ntk cases: ``head_s``,
    ``head_a``, ``head_MU``). Returns {} when there are none."""
    return spec_named(model).intermediates(kind, inputs, backend)


def compute(kind: str, inputs: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, np.ndarray]:
    """Outputs of a case of ``kind`` ("eval" | "train" | "ntk") for its input arrays."""
    from . import contract

    if kind == "eval":
        return contract.evaluate(inputs, backend)
    if kind == "train":
        return contract.train(inputs, backend)
    spec = contract.model_of(inputs)
    if kind not in spec.extra_kinds:
        raise InputError(f"kind must be one of {', '.join(('eval', 'train', *spec.extra_kinds))} for model "
                         f"{spec.name!r}, got {kind!r}")
    return spec.extra_kinds[kind](inputs, backend)


# --- integrity and verification ----------------------------------------------------------------
def _member_array(message: str, known: Iterable[str]) -> str:
    """' (array NAME)' for a load_npz message naming a zip member, matched to the nearest known array."""
    import difflib

    m = re.search(r"member '([^']*?)(?:\.npy)?'", message)
    if not m:
        return ""
    name = m.group(1)
    if name not in known:
        close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
        if not close:
            return ""
        name = close[0]
    return f" (array '{name}')"


def check_file(root: Path, case: str, entry: Mapping, filename: str) -> tuple[dict | None, list[str]]:
    """Load ``root/case/filename`` and check it against the manifest.

    Returns (arrays or None when unreadable, problems). A problem names the case, the file and,
    whenever the damage lies inside one array, that array.
    """
    path = root / case / filename
    where = f"{case}/{filename}"
    recorded = entry.get(SECTIONS[filename], {})
    if not path.is_file():
        return None, [f"{where}: file missing"]
    try:
        arrays = load_npz(path)
    except InputError as exc:  # load_npz turns every kind of damage into an InputError naming the file
        return None, [f"{where}: damaged{_member_array(str(exc), recorded)}: {exc}"]
    problems = []
    for name, rec in recorded.items():
        if name not in arrays:
            problems.append(f"{where}: array '{name}' missing")
            continue
        a = arrays[name]
        if list(a.shape) != rec["shape"] or str(a.dtype) != rec["dtype"]:
            problems.append(f"{where}: array '{name}' is {a.dtype} {list(a.shape)}, manifest says "
                            f"{rec['dtype']} {rec['shape']}")
        elif sha256_array(a) != rec["sha256"]:
            problems.append(f"{where}: array '{name}' bytes differ from the manifest (sha256)")
    problems += [f"{where}: array '{n}' not in the manifest" for n in arrays if n not in recorded]
    if not problems and sha256_file(path) != entry.get("files", {}).get(filename):
        problems.append(f"{where}: file bytes differ from the manifest although every array matches "
                        "(zip headers changed)")
    return arrays, problems


class CaseResult(NamedTuple):
    """Outcome of verifying one case: integrity ``problems``, the comparison ``report`` and the recomputed
    arrays against their stored bits, ``bits`` (:class:`ArrayBits`; report None and bits empty if not run)."""

    case: str
    kind: str
    problems: list
    report: Report | None
    bits: list
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.problems and self.report is not None and self.report.ok

    @property
    def status(self) -> str:
        """"bit-identical", "within tolerance (max N ulp)" or "FAIL"."""
        if not self.ok:
            return "FAIL"
        summary = bits_summary(self.bits)
        return summary if summary == "bit-identical" else f"within tolerance ({summary})"

    @property
    def moved(self) -> list[str]:
        """The arrays promised bit-identical (manifest ``bitwise``) whose recomputed bits differ."""
        return [b.name for b in self.bits if b.promised and not b.identical]


def _select(manifest: Mapping, cases: Iterable[str] | None) -> list[str]:
    known = list(manifest["cases"])
    if not cases:
        return known
    unknown = [c for c in cases if c not in manifest["cases"]]
    if unknown:
        raise InputError(f"unknown case '{unknown[0]}'{did_you_mean(unknown[0], known)}; known: "
                         f"{', '.join(known) or '(none)'}")
    return list(cases)


def verify_case(root: Path, case: str, entry: Mapping, backend: str = "numba") -> CaseResult:
    """Check a case's files against the manifest, recompute it, compare at the manifest tolerances.

    The comparison covers the expected outputs and, when stored, the intermediates.
    """
    start = time.perf_counter()
    inputs, problems = check_file(root, case, entry, "input.npz")
    stored = {}
    for filename in entry["files"]:
        if filename != "input.npz":
            arrays, more = check_file(root, case, entry, filename)
            stored.update(arrays or {})
            problems += more
    report, bits = None, []
    if inputs is not None and not any(p.startswith(f"{case}/input.npz") for p in problems):
        try:
            actual = _outputs(entry, inputs, backend)
        except Exception as exc:  # one broken case must not hide the others' results
            if os.environ.get("NTPREF_DEBUG") == "1":
                raise
            problems.append(f"{case}: computing the stored input failed: {type(exc).__name__}: {exc}")
        else:
            tols = tolerances_of(entry)
            report = compare_arrays(stored, actual, tols, names=list(tols) + [n for n in actual if n not in tols])
            bits = bit_distances(stored, actual, entry)
    return CaseResult(case, entry["kind"], problems, report, bits, time.perf_counter() - start)


def _outputs(entry: Mapping, inputs: Mapping[str, np.ndarray], backend: str) -> dict[str, np.ndarray]:
    """Outputs and (when the case stores them) intermediates of a case, in one dict."""
    out = compute(entry["kind"], inputs, backend)
    if "intermediates" in entry:
        out.update(intermediates(entry["model"], entry["kind"], inputs, backend))
    return out


def verify(root: str | os.PathLike | None = None, cases: Iterable[str] | None = None,
           backend: str = "numba") -> list[CaseResult]:
    """Verify the named cases (all when None) of the reference directory ``root``."""
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    return [verify_case(root, c, manifest["cases"][c], backend) for c in _select(manifest, cases)]


class Regenerated(NamedTuple):
    """What :func:`regen` found: the comparison ``report`` of the new values with the stored ones at the
    case's old tolerances, and ``bits``, the new arrays against the stored bits (:class:`ArrayBits`)."""

    report: Report
    bits: list

    @property
    def changed(self) -> list[ArrayBits]:
        """The arrays whose bits changed (or that are new)."""
        return [b for b in self.bits if not b.identical]


def regen(root: str | os.PathLike | None, case: str, force: bool = False, backend: str = "numba") -> Regenerated:
    """Recompute ``case`` from its stored input and rewrite expected.npz (and intermediates.npz) and its
    manifest entry; returns what changed (:class:`Regenerated`).

    Refused (ComparisonError carrying the comparison table) when the stored input no longer matches
    the manifest, or the new values differ from the stored ones beyond the case's tolerances, unless
    ``force``. The rewritten entry's tolerances are the float64 policy's for the input
    (:func:`ntpref.oracle.tolerance.default_tolerances`); the other fields of each array's record
    (:func:`kept_fields`: ``bitwise``) stay. A file whose arrays keep their bits is not rewritten
    (:func:`write_case`). expected.npz is replaced atomically first, then manifest.json; if interrupted
    in between, ``verify`` reports a hash mismatch and rerunning ``regen`` repairs it.
    """
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    _select(manifest, [case])
    entry = manifest["cases"][case]
    inputs, in_problems = check_file(root, case, entry, "input.npz")
    if inputs is None:
        raise InputError("; ".join(in_problems))
    old = {}
    for filename in entry["files"]:
        if filename != "input.npz":
            old.update(check_file(root, case, entry, filename)[0] or {})
    new = compute(entry["kind"], inputs, backend)
    extra = intermediates(entry["model"], entry["kind"], inputs, backend) if "intermediates" in entry else {}
    tols = tolerances_of(entry)
    report = compare_arrays(old, {**new, **extra}, tols, labels=("stored", "new"))
    if not force and (in_problems or not report.ok):
        why = "; ".join(in_problems) if in_problems else report.summary()
        raise ComparisonError(f"regen {case}: refused without --force ({why})\n{report.table()}")
    bits = bit_distances(old, {**new, **extra}, entry)
    tols = default_tolerances(entry["model"], entry["kind"], inputs, {**new, **extra}, outputs=new, backend=backend)
    values = {**new, **extra}
    kept = {n: kept_fields(rec, values[n], check_tolerance(f"tolerance of '{n}'", tols[n]))
            for n, rec in array_records(entry).items() if n in values}
    fresh = case_entry(entry["model"], entry["kind"], entry["description"], entry["config"], entry["seed"],
                       inputs, new, tols, extra, kept)
    write_case(root, case, fresh, None, new, manifest, extra)
    save_manifest(root, manifest)
    return Regenerated(report, bits)


def retolerance(root: str | os.PathLike | None, case: str, backend: str = "numba") -> Report:
    """Replace the tolerances recorded for ``case`` by the float64 policy's for its stored input
    (:func:`ntpref.oracle.tolerance.default_tolerances`), leaving every stored file and hash as it is.

    Refused (ComparisonError) when the stored files do not match the manifest, or when the stored
    expected values no longer agree with a fresh computation under the new tolerances (then the
    values, not the tolerances, need attention: ``regen``). Returns that comparison.
    """
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    _select(manifest, [case])
    entry = manifest["cases"][case]
    stored, problems = {}, []
    for filename in entry["files"]:
        arrays, more = check_file(root, case, entry, filename)
        problems += more
        if filename != "input.npz":
            stored.update(arrays or {})
    if problems:
        raise ComparisonError(f"retolerance {case}: stored files do not match the manifest: " + "; ".join(problems))
    inputs = load_npz(root / case / "input.npz")
    tols = default_tolerances(entry["model"], entry["kind"], inputs, stored, backend=backend)
    report = compare_arrays(stored, _outputs(entry, inputs, backend), tols, labels=("stored", "new"))
    if not report.ok:
        raise ComparisonError(f"retolerance {case}: refused, the stored values fail the new tolerances "
                              f"({report.summary()})\n{report.table()}")
    for section in ("arrays", "intermediates"):
        for name, rec in entry.get(section, {}).items():
            tol = check_tolerance(f"tolerance of '{name}'", tols[name])
            entry[section][name] = _record({k: rec[k] for k in BYTES_FIELDS}, kept_fields(rec, stored[name], tol), tol)
    save_manifest(root, manifest)
    return report


def export(root: str | os.PathLike | None, case: str, outdir: str | os.PathLike) -> list[Path]:
    """Copy a case's input.npz, expected.npz (and intermediates.npz) to ``outdir``; write ``case.json``.

    The files are checked against the manifest first (ComparisonError when damaged). ``case.json``
    holds the case's float64-policy tolerances (docs/tolerance.md) and can be passed to
    ``ntpref compare --tolerances``.
    """
    root = Path(root if root is not None else default_root())
    manifest = load_cases(root)
    _select(manifest, [case])
    entry = manifest["cases"][case]
    problems = [p for f in entry["files"] for p in check_file(root, case, entry, f)[1]]
    if problems:
        raise ComparisonError(f"export {case}: stored files do not match the manifest: " + "; ".join(problems))
    outdir = Path(outdir)
    written = []
    for f in entry["files"]:
        data = (root / case / f).read_bytes()
        atomic_write(outdir / f, lambda fh, data=data: fh.write(data))
        written.append(outdir / f)
    run = "eval" if entry["kind"] == "eval" else "train"
    info = {"case": case, "format_version": FORMAT_VERSION, "model": entry["model"], "kind": entry["kind"],
            "description": entry["description"], "config": entry["config"], "seed": entry["seed"],
            "provenance": entry.get("provenance", manifest.get("provenance")),
            "usage": (f"ntpref {run} input.npz -o out.npz && ntpref compare expected.npz out.npz "
                      "--tolerances case.json  (or --input input.npz: the same float64 policy, "
                      "computed from the input)") if entry["kind"] != "ntk" else
                     "kind ntk: gram = ntpref.shallow.ntk.ntk_gram(X, c, U, W, ...); compare with expected.npz",
            "tolerances": tolerances_of(entry)}
    text = json.dumps(info, indent=1) + "\n"
    atomic_write(outdir / "case.json", lambda fh: fh.write(text.encode("utf-8")))
    return written + [outdir / "case.json"]


# --- command line ------------------------------------------------------------------------------
def _print_results(results: list[CaseResult], manifest: Mapping, verbose: bool, promises: bool) -> bool:
    """The table of ``verify`` (per case with -v: the stored provenance, the comparison and every array's
    bits); ``promises``: whether the run can be held to the ``bitwise`` promises (the numba backend).
    Returns whether every case passed its tolerances."""
    from tabulate import tabulate

    rows = []
    for r in results:
        n = len(r.report.rows) if r.report else 0
        good = sum(row.ok for row in r.report.rows) if r.report else 0
        rows.append((r.case, r.kind, f"{good}/{n}", f"{r.seconds:.2f}", certified_text(manifest["cases"][r.case]),
                     r.status))
    if verbose:
        print(f"this run: {provenance_text(provenance())}\n")
    print(tabulate(rows, headers=("case", "kind", "arrays ok", "seconds", "certified", "status"),
                   disable_numparse=True))
    for r in results:
        if verbose or not r.ok:
            print(f"\n== {r.case} ==")
            if verbose:
                print(f"stored by: {provenance_text(manifest['cases'][r.case].get('provenance', {}))}")
            for p in r.problems:
                print(f"  {p}")
            if r.report is not None:
                print(r.report)
            if verbose and r.bits:
                entry = manifest["cases"][r.case]
                records = array_records(entry)
                print(tabulate([(b.name, "yes" if b.promised else "no", ulp_text(b.ulp),
                                 f"{records[b.name]['certified']:.1e}" if "certified" in records.get(b.name, {})
                                 else "-") for b in r.bits],
                               headers=("array", "bitwise", "stored vs new bits", "certified err/tol"),
                               disable_numparse=True))
    failed = [r.case for r in results if not r.ok]
    identical = sum(r.status == "bit-identical" for r in results)
    print(f"\n{len(results) - len(failed)}/{len(results)} cases ok, {identical} bit-identical"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    moved = [r for r in results if r.moved] if promises else []
    if moved:
        print(f"arrays promised bit-identical whose bits moved: {sum(len(r.moved) for r in moved)}, in "
              f"{', '.join(r.case for r in moved)} (-v lists them): the oracle's rounding changed, or this "
              "platform's C library computes log, exp or erf differently (docs/contract.md)")
    return not failed


def _root(args) -> Path:
    return Path(args.root) if args.root else default_root()


def _handle_verify(args) -> int:
    root = _root(args)
    manifest = load_cases(root)
    if args.list:
        for name in _select(manifest, args.cases):
            c = manifest["cases"][name]
            print(f"{name} [{c['model']} {c['kind']}]: {c['description']}")
        return 0
    results = verify(root, args.cases, args.backend)
    return 0 if _print_results(results, manifest, args.verbose, promises=args.backend == "numba") else 1


def _handle_regen(args) -> int:
    root = _root(args)
    if args.tolerances_only and args.force:
        raise InputError("--tolerances-only never rewrites values; it cannot be combined with --force")
    for case in args.cases:
        if args.tolerances_only:
            report = retolerance(root, case, backend=args.backend)
            worst = max((r.ratio or 0.0) for r in report.rows)
            print(f"{case}: tolerances rewritten (float64 policy; stored values at {worst:.1e} of them)")
            continue
        result = regen(root, case, force=args.force, backend=args.backend)
        print(regen_text(case, result))
        if not result.report.ok:
            print(result.report)
    return 0


def regen_text(case: str, result: Regenerated) -> str:
    """What ``regen`` did, on one line: "CASE: unchanged, ..." or "CASE: rewritten, ..." (:func:`changes_text`),
    "(forced; differences below)" when the new values lie beyond the old tolerances."""
    if not result.changed:
        return f"{case}: {changes_text(result.bits)}"
    return f"{case}: rewritten, {changes_text(result.bits)}" + ("" if result.report.ok else
                                                               " (forced; differences below)")


def _handle_export(args) -> int:
    for path in export(_root(args), args.case, args.output):
        print(path)
    return 0


def register(subparsers) -> None:
    """Add ``ntpref verify [CASE ...]``, ``ntpref regen CASE ...`` and ``ntpref export CASE -o DIR``."""
    def common(p):
        p.add_argument("--root", metavar="DIR", help=f"reference directory (default ${ENV_ROOT} or the repository's "
                       "reference_runs/)")

    text = "recompute stored reference cases and compare them with their expected outputs"
    p = subparsers.add_parser("verify", help=text, description=text + "; also checks every stored array's "
                              "SHA-256 against manifest.json and reports each case as bit-identical or within "
                              "tolerance (max N ulp of the stored values) (exit 0 all within tolerance, 1 any "
                              "mismatch)")
    p.add_argument("cases", nargs="*", metavar="CASE", help="cases to verify (default all)")
    p.add_argument("--backend", choices=("numba", "numpy"), default="numba")
    p.add_argument("--list", action="store_true", help="list the cases and what they exercise, compute nothing")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="print every case's comparison table, each array's distance from its stored bits and "
                        "the provenance of this run and of the stored files")
    common(p)
    p.set_defaults(func=_handle_verify)

    text = "recompute reference cases from their stored inputs and rewrite expected.npz and the manifest"
    p = subparsers.add_parser("regen", help=text, description=text + " (after an intended change; refused when "
                              "values move beyond the case's tolerances unless --force); prints which arrays "
                              "changed and by how many ulp, or that none did")
    p.add_argument("cases", nargs="+", metavar="CASE")
    p.add_argument("--force", action="store_true", help="rewrite even when values change beyond tolerance")
    p.add_argument("--tolerances-only", action="store_true",
                   help="only replace the recorded tolerances by the float64 policy's (docs/tolerance.md); "
                        "stored files and hashes stay unchanged")
    p.add_argument("--backend", choices=("numba", "numpy"), default="numba")
    common(p)
    p.set_defaults(func=_handle_regen)

    text = "copy a reference case's input.npz, expected.npz and a case.json with its tolerances to a directory"
    p = subparsers.add_parser("export", help=text, description=text)
    p.add_argument("case", metavar="CASE")
    p.add_argument("-o", "--output", metavar="DIR", required=True)
    common(p)
    p.set_defaults(func=_handle_export)
