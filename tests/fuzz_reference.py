"""The reference surface of the command-line fuzzer (tests/fuzz_cli.py): ``ntpref verify`` and ``ntpref
export`` on a damaged copy of reference_runs/."""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ntpref.oracle.compare import load_tolerances

from fuzz_common import Fixtures, Result, _call, _clear, _result, classify
from fuzz_json import AWKWARD, BAD_VALUES, mutate_json
from fuzz_npz import FILE_MUTATIONS
from fuzz_outputs import OUTPUTS


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
