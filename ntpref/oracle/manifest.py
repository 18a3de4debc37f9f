"""The reference directory's manifest: its schema, reading and writing it, the records of a case's arrays,
and a case's files checked against it (docs/contract.md, "Stored reference cases").

Layout of the reference directory (``reference_runs/`` of the repository by default; the
environment variable ``NTPREF_REFERENCE_RUNS`` or ``--root DIR`` selects another one)::

    manifest.json
    CASE/input.npz           the arrays given to ``ntpref eval`` / ``ntpref train`` (kind "ntk": see below)
    CASE/expected.npz        what the oracle returned for them (exactly the ``ntpref eval/train`` outputs)
    CASE/intermediates.npz   optional: internal states that help locate a mismatch
                             (:func:`ntpref.oracle.kinds.intermediates`)

``manifest.json``::

    {"format_version": 1, "provenance": {...},                   # of the last write (ntpref.oracle.provenance)
     "cases": {CASE: {"model", "kind": "eval" | "train" | "ntk", "description", "config", "seed",
                      "provenance": {...},                        # what produced the case's files
                      "files": {"input.npz": SHA256, "expected.npz": SHA256[, "intermediates.npz": SHA256]},
                      "inputs": {NAME: {"shape", "dtype", "sha256"}},
                      "arrays": {NAME: {"shape", "dtype", "sha256", "bitwise", "rtol", "atol", "atol_max_scale",
                                        "atol_per_step", "reason"[, "head"][, "certified"][, "calibrated"]}},
                      "intermediates": {NAME: {same fields as "arrays"}}}}}

SHA-256 of an array is taken over its raw bytes in C order; the file hashes catch a changed byte
that lies outside every array (zip headers). Tolerances are those of :mod:`ntpref.oracle.compare`,
set by the float64 policy of :mod:`ntpref.oracle.policies.bound` (docs/tolerance.md) whenever a case is
written. ``bitwise`` (true / false; absent means false) says whether the array is promised bit-identical
across x86-64 CPUs (docs/contract.md, "Stored reference cases"): the generator declares it, ``regen``
keeps it. ``certified`` (the oracle's largest error against the exact backend over its tolerance) and
``calibrated`` (the array's calibrated tolerance, :mod:`ntpref.oracle.policies.calibrated`, or "bound" where it keeps
the tolerance above) are written by ``ntpref certify --record`` and dropped when the values or the tolerance
change. A manifest that is not of this form (bad JSON, a missing key, a wrong type) is an
InputError naming the file, the case and the key. Unknown keys of the manifest and of a case are
ignored; the keys of an array's record are :data:`RECORD_FIELDS` and its tolerance's, so a new per-array
field is added to :data:`RECORD_FIELDS`.

The kinds (:data:`ntpref.oracle.kinds.KINDS`): "eval" and "train", the interchange contract's, and the
models' ``extra_kinds`` ("ntk" of model "shallow"). The cases themselves (configurations, seeds, builders)
are defined beside each model (its specification's ``stored``: ``ntpref/twostage/cases.py``,
``ntpref/shallow/cases.py``) and written by ``tests/make_reference_runs.py``; the workflows that read and
rewrite them (``ntpref verify``, ``regen``, ``export``) are :mod:`ntpref.oracle.reference`.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from ..checks import did_you_mean
from ..errors import InputError
from ..jsonio import load_json
from ..models import NAMES
from ..npzio import atomic_write, load_npz, save_npz
from ..shipped import shipped_dir
from ..tolerance import Tolerance
from .kinds import KINDS
from .provenance import provenance

FORMAT_VERSION = 1
ENV_ROOT = "NTPREF_REFERENCE_RUNS"
FILES = ("input.npz", "expected.npz")
INTERMEDIATES = "intermediates.npz"
#: Which manifest section records the arrays of each file of a case.
SECTIONS = {"input.npz": "inputs", "expected.npz": "arrays", INTERMEDIATES: "intermediates"}
#: The fields of an array's record that describe its bytes: rewritten whenever the array is.
BYTES_FIELDS = ("shape", "dtype", "sha256")
#: Every field of an array's record besides its tolerance (whose keys, checked by
#: :meth:`ntpref.tolerance.Tolerance.from_json`, are all the others). The fields after :data:`BYTES_FIELDS`
#: describe the array rather than its bytes; ``regen`` and ``--tolerances-only`` keep them as they are.
RECORD_FIELDS = BYTES_FIELDS + ("bitwise", "certified", "calibrated")
#: The fields that describe the array's values under its tolerance (``ntpref certify --record``): kept only
#: while both stay as they are.
MEASURED_FIELDS = ("certified", "calibrated")
#: The ``calibrated`` field of an array that keeps its running error bound under the calibrated policy.
KEEPS_BOUND = "bound"


# --- hashing ---------------------------------------------------------------------------------------
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


# --- the manifest: where, reading, checking, writing -------------------------------------------------
def default_root() -> Path:
    """``$NTPREF_REFERENCE_RUNS`` if set, else the repository's ``reference_runs/`` (a source checkout or an
    editable install), else the copy installed with the package (``ntpref/reference_runs``)."""
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
            Tolerance.from_json(f"{at} 'calibrated'", calibrated)
        if tolerances:
            Tolerance.from_json(at, _tolerance_part(rec))


def check_manifest(path, manifest) -> None:
    """Raise InputError naming ``path``, the case and the key when ``manifest`` is not a format_version 1
    reference manifest (module docstring): a missing key, a wrong type, an unknown model, kind or file, a case
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
        if entry["model"] not in NAMES:
            raise InputError(f"{where}: 'model' must be one of {', '.join(NAMES)}, got {entry['model']!r}")
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
    """Write ``root/manifest.json`` atomically (provenance refreshed), never through a symbolic link."""
    refuse_links([Path(root) / "manifest.json"])
    manifest = {**manifest, "provenance": provenance()}
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]",
                  json.dumps(manifest, indent=1)) + "\n"   # shapes on one line
    atomic_write(Path(root) / "manifest.json", lambda fh: fh.write(text.encode("utf-8")))


# --- an array's record ------------------------------------------------------------------------------
def _bytes_entry(a: np.ndarray) -> dict:
    return {"shape": list(a.shape), "dtype": str(a.dtype), "sha256": sha256_array(a)}


def _tolerance_part(rec: Mapping) -> dict:
    """The tolerance held in an array's record: every key that is not one of :data:`RECORD_FIELDS`."""
    return {k: v for k, v in rec.items() if k not in RECORD_FIELDS}


def kept_fields(rec: Mapping, array: np.ndarray, tolerance: Tolerance) -> dict:
    """The fields of an array's record that stay when it is rewritten with the values ``array`` and the
    tolerance ``tolerance``: ``bitwise`` always; the :data:`MEASURED_FIELDS` (``certified``, its error /
    tolerance against the exact backend, and ``calibrated``, its calibrated tolerance: :func:`record_certified`)
    only when both are unchanged, since they describe them."""
    kept = {k: rec[k] for k in RECORD_FIELDS[len(BYTES_FIELDS):] if k in rec and k not in MEASURED_FIELDS}
    same_bytes = all(rec.get(k) == v for k, v in _bytes_entry(np.asarray(array)).items())
    if same_bytes and tolerance_of(rec) == tolerance:
        kept.update({k: rec[k] for k in MEASURED_FIELDS if k in rec})
    return kept


def record_certified(root: str | os.PathLike, ratios: Mapping[str, Mapping[str, float]],
                     calibrated: Mapping[str, Mapping[str, Tolerance]] | None = None) -> None:
    """Store what ``ntpref certify --record`` measured in each named array's record: ``certified`` = err/tol
    of the oracle against the exact backend (``ratios``: case → array → ratio) and ``calibrated`` = its
    calibrated tolerance (:mod:`ntpref.oracle.policies.calibrated`; ``calibrated``: case → array → tolerance, the
    running bound's own for an array that keeps it, stored as :data:`KEEPS_BOUND`), for stored cases
    certified whole."""
    root, calibrated = Path(root), calibrated or {}
    manifest = load_manifest(root)
    for case in {**ratios, **calibrated}:
        for name, rec in array_records(manifest["cases"][case]).items():
            if name in ratios.get(case, {}):
                rec["certified"] = float(ratios[case][name])
            if name in calibrated.get(case, {}):
                tol = calibrated[case][name]
                rec["calibrated"] = KEEPS_BOUND if tol == tolerance_of(rec) else tol.to_json()
    save_manifest(root, manifest)


def calibrated_of(entry: Mapping) -> dict[str, Tolerance] | None:
    """name → calibrated tolerance of a manifest case entry (its recorded ``calibrated`` field, the running
    bound where that is :data:`KEEPS_BOUND`), or None unless every array of the case has one."""
    recorded = array_records(entry)
    if not recorded or any("calibrated" not in rec for rec in recorded.values()):
        return None
    return {n: tolerance_of(rec) if rec["calibrated"] == KEEPS_BOUND
            else Tolerance.from_json(f"calibrated tolerance of '{n}'", rec["calibrated"]) for n, rec in recorded.items()}


def certified_text(entry: Mapping) -> str:
    """The largest recorded ``certified`` ratio of a case's arrays (how far the oracle's own error goes into
    its tolerance), "-" when none is recorded."""
    values = [rec["certified"] for rec in array_records(entry).values() if "certified" in rec]
    return f"{max(values):.1e}" if values else "-"


def _checked_entries(arrays: Mapping[str, np.ndarray], tolerances: Mapping[str, Tolerance],
                     fields: Mapping[str, Mapping]) -> dict:
    missing = [n for n in arrays if n not in tolerances]
    if missing:
        raise InputError(f"no tolerance for array '{missing[0]}'")
    known = RECORD_FIELDS[len(BYTES_FIELDS):]
    unknown = sorted({k for n in arrays for k in fields.get(n, {}) if k not in known})
    if unknown:
        raise InputError(f"unknown array record field '{unknown[0]}'; known: {', '.join(known)}")
    return {name: ordered_record(_bytes_entry(np.asarray(a)), fields.get(name, {}),
                          tolerances[name]) for name, a in arrays.items()}


def ordered_record(bytes_entry: Mapping, fields: Mapping, tolerance: Tolerance) -> dict:
    """An array's record in the manifest's order: bytes, ``bitwise``, the tolerance (its JSON form),
    ``certified``, ``calibrated``."""
    rest = {k: v for k, v in fields.items() if k not in MEASURED_FIELDS}
    measured = {k: fields[k] for k in MEASURED_FIELDS if k in fields}
    return {**bytes_entry, **rest, **tolerance.to_json(), **measured}


def case_entry(model: str, kind: str, description: str, config: Mapping, seed: int,
               inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
               tolerances: Mapping[str, Tolerance], extra: Mapping[str, np.ndarray] | None = None,
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
    entry keeps the provenance recorded for the files. Each file is replaced atomically, never through a
    symbolic link (InputError before anything is written: :func:`refuse_links`); the manifest is *not* saved
    here (call :func:`save_manifest` once after writing all cases).
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise InputError(f"case name {name!r}: use letters, digits, '_', '-', '.' only")
    folder = Path(root) / name
    old = manifest["cases"].get(name)
    files = {"input.npz": inputs, "expected.npz": expected, **({INTERMEDIATES: extra} if extra else {})}
    rewrite = [f for f, arrays in files.items() if arrays is not None and not _holds(folder / f, arrays, old)]
    refuse_links([folder] + [folder / f for f in rewrite])
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


def tolerance_of(rec: Mapping) -> Tolerance:
    """The tolerance of an array's record (every key that is not one of :data:`RECORD_FIELDS`)."""
    return Tolerance.from_json("tolerance", _tolerance_part(rec))


def tolerances_of(entry: Mapping) -> dict[str, Tolerance]:
    """name → tolerance of a manifest case entry (expected arrays and intermediates)."""
    return {n: tolerance_of(a) for n, a in array_records(entry).items()}



# --- a case's files against the manifest ----------------------------------------------------------
def _member_array(message: str, known: Iterable[str]) -> str:
    """' (array NAME)' for a load_npz message naming a zip member, matched to the nearest known array."""
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
    if filename == "input.npz":
        problems += model_problems(root, case, entry, arrays)
    if not problems and sha256_file(path) != entry.get("files", {}).get(filename):
        problems.append(f"{where}: file bytes differ from the manifest although every array matches "
                        "(zip headers changed)")
    return arrays, problems


def model_problems(root: Path, case: str, entry: Mapping, inputs: Mapping[str, np.ndarray]) -> list[str]:
    """The manifest's ``model`` of a case against the ``model`` its stored input names (a manifest edited
    to name another model would otherwise pass its hashes and be computed as that model): [] when they
    agree, else one problem naming the file, the manifest, the case and the key."""
    named = inputs.get("model")
    if named is not None and np.ndim(named) == 0 and np.asarray(named).dtype.kind == "U":
        if str(named) == entry["model"]:
            return []
        what = f"names model {str(named)!r}"
    else:
        what = "has no 0-d string array 'model'"
    return [f"{case}/input.npz: {what}, but {Path(root) / 'manifest.json'} says 'model': {entry['model']!r} "
            f"for case '{case}'"]


def refuse_links(paths: Iterable[Path]) -> None:
    """InputError naming the first of ``paths`` (files of a reference directory about to be rewritten, or
    the folders holding them) that is a symbolic link: rewriting through it would replace a file outside
    the directory."""
    for path in paths:
        if os.path.islink(path):
            raise InputError(f"{path}: a symbolic link (to '{os.readlink(path)}'); files of a reference directory "
                             "are never written through a link: replace it by the file it points to")


def select_cases(manifest: Mapping, cases: Iterable[str] | None) -> list[str]:
    """The names ``cases`` (every case of ``manifest`` when None or empty), checked: InputError naming an unknown
    one and the nearest known name."""
    known = list(manifest["cases"])
    if not cases:
        return known
    unknown = [c for c in cases if c not in manifest["cases"]]
    if unknown:
        raise InputError(f"unknown case '{unknown[0]}'{did_you_mean(unknown[0], known)}; known: "
                         f"{', '.join(known) or '(none)'}")
    return list(cases)

