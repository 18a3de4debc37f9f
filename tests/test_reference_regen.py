"""Rewriting stored reference runs: ``ntpref regen`` (refused beyond tolerance without --force, atomic, a
changed input only with --force, never through a symbolic link, refused when the manifest names another model
than the files, the float64 policy's tolerances written), ``ntpref export`` (files compare reads, all of them
or none, a damaged case refused) and ``ntpref regen --tolerances-only``."""
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import ComparisonError, InputError
from ntpref.npzio import load_npz
from ntpref.oracle import kinds, reference
from ntpref.oracle.policies.bound import bound_tolerances
from ntpref.oracle import manifest as mf

from reference_support import EVAL_CASE, edit_manifest, flip, layout


# --- regen --------------------------------------------------------------------------------------
def _perturbed_compute(factor):
    original = kinds.compute

    def compute(kind, inputs, backend="numba"):
        out = original(kind, inputs, backend)
        out["logits"] = out["logits"] * factor
        return out
    return compute


def test_regen_refuses_beyond_tolerance_without_force(runs, monkeypatch, capsys):
    before = {f: (runs / EVAL_CASE / f).read_bytes() for f in mf.FILES}
    manifest_before = (runs / "manifest.json").read_bytes()
    original = kinds.compute
    monkeypatch.setattr(reference, "compute", _perturbed_compute(1 + 1e-9))
    assert main(["regen", EVAL_CASE]) == 1
    assert "logits" in capsys.readouterr().err
    assert {f: (runs / EVAL_CASE / f).read_bytes() for f in mf.FILES} == before
    assert (runs / "manifest.json").read_bytes() == manifest_before

    assert main(["regen", EVAL_CASE, "--force"]) == 0
    assert main(["verify", EVAL_CASE]) == 0                              # consistent with the "new code"
    monkeypatch.setattr(reference, "compute", original)
    assert main(["verify", EVAL_CASE]) == 1                              # the real code disagrees
    assert main(["regen", EVAL_CASE]) == 1
    assert main(["regen", EVAL_CASE, "--force"]) == 0
    assert main(["verify", EVAL_CASE]) == 0


def test_regen_within_tolerance_rewrites(runs, monkeypatch):
    monkeypatch.setattr(reference, "compute", _perturbed_compute(1 + 1e-14))
    result = reference.regen(runs, EVAL_CASE)
    assert result.report.ok and "logits" in [b.name for b in result.changed]
    man = mf.load_manifest(runs)
    e = load_npz(runs / EVAL_CASE / "expected.npz")
    assert man["cases"][EVAL_CASE]["arrays"]["logits"]["sha256"] == mf.sha256_array(e["logits"])
    assert man["cases"][EVAL_CASE]["files"]["expected.npz"] == mf.sha256_file(runs / EVAL_CASE / "expected.npz")


def test_regen_writes_atomically(runs, monkeypatch):
    """An interrupted write leaves the old expected.npz and manifest intact (no partial file, no temp file)."""
    before = (runs / EVAL_CASE / "expected.npz").read_bytes()
    manifest_before = (runs / "manifest.json").read_bytes()

    def broken_savez(fh, **arrays):
        fh.write(b"PK partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez", broken_savez)
    monkeypatch.setattr(reference, "compute", _perturbed_compute(1 + 1e-14))    # new values: files are rewritten
    with pytest.raises(InputError, match="cannot write.*disk full"):
        reference.regen(runs, EVAL_CASE, force=True)
    assert (runs / EVAL_CASE / "expected.npz").read_bytes() == before
    assert (runs / "manifest.json").read_bytes() == manifest_before
    assert sorted(p.name for p in (runs / EVAL_CASE).iterdir()) == ["expected.npz", "input.npz"]


def test_regen_refuses_a_changed_input_without_force(runs):
    from ntpref.npzio import save_npz

    path = runs / EVAL_CASE / "input.npz"
    arrays = load_npz(path)
    save_npz(path, {**arrays, "W_ov": arrays["W_ov"] * 1.5})
    with pytest.raises(ComparisonError, match="W_ov"):
        reference.regen(runs, EVAL_CASE)
    reference.regen(runs, EVAL_CASE, force=True)             # an intended change of the input
    assert reference.verify(runs, [EVAL_CASE])[0].ok


@pytest.mark.parametrize("link", ["expected.npz", "manifest.json", "case folder"])
def test_regen_never_writes_through_a_link(runs, tmp_path, monkeypatch, capsys, link):
    """A stored file that is a symbolic link to a file outside the root: regen, forced or not, refuses in one
    line naming the link, and the file it points to keeps its bytes."""
    outside = tmp_path / "outside"
    outside.mkdir()
    path = {"expected.npz": runs / EVAL_CASE / "expected.npz", "manifest.json": runs / "manifest.json",
            "case folder": runs / EVAL_CASE}[link]
    shutil.move(path, outside / path.name)
    path.symlink_to(outside / path.name)
    before = {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()}
    monkeypatch.setattr(reference, "compute", _perturbed_compute(1 + 1e-14))    # new values: files are rewritten
    for argv in (["regen", EVAL_CASE], ["regen", EVAL_CASE, "--force"]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (f"ntpref: error: {path}: a symbolic link (to '{outside / path.name}'); "
                                           "files of a reference directory are never written through a link: "
                                           "replace it by the file it points to\n")
    assert {p: p.read_bytes() for p in outside.rglob("*") if p.is_file()} == before
    assert path.is_symlink()


def _name_model(root: Path, case: str, model: str) -> None:
    edit_manifest(root, lambda m: m["cases"][case].update(model=model))


@pytest.mark.parametrize("model", ["shallow", "indrnn"])
def test_a_manifest_naming_another_model_than_its_files(runs, tmp_path, capsys, model):
    """The manifest says one model, the stored input (hashes intact) another: every command that reads the
    case names the manifest, the case and the key in one line, and nothing is computed as the wrong model."""
    _name_model(runs, EVAL_CASE, model)
    line = (f"{EVAL_CASE}/input.npz: names model 'twostage', but {runs / 'manifest.json'} says 'model': "
            f"{model!r} for case '{EVAL_CASE}'")
    assert main(["verify", EVAL_CASE]) == 1
    out = capsys.readouterr().out
    assert f"  {line}" in out.splitlines() and f"FAILED: {EVAL_CASE}" in out
    for argv in (["regen", EVAL_CASE], ["regen", EVAL_CASE, "--force"], ["regen", "--tolerances-only", EVAL_CASE]):
        assert main(argv) == 2
        assert capsys.readouterr().err == f"ntpref: error: {line}\n", argv
    assert main(["certify", EVAL_CASE, "--root", str(runs)]) == 2
    err = capsys.readouterr().err                        # after certify's progress line
    assert err.count("ntpref: error") == 1 and err.splitlines()[-1].startswith("ntpref: error: ") and line in err
    assert main(["export", EVAL_CASE, "-o", str(tmp_path / "x")]) == 1
    assert line in capsys.readouterr().err and not (tmp_path / "x").exists()


# --- export -------------------------------------------------------------------------------------
def test_export_writes_files_usable_by_compare(runs, tmp_path, capsys):
    out = tmp_path / "export"
    assert main(["export", EVAL_CASE, "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["case.json", "expected.npz", "input.npz"]
    for f in mf.FILES:
        assert (out / f).read_bytes() == (runs / EVAL_CASE / f).read_bytes()
    info = json.loads((out / "case.json").read_text())
    assert info["case"] == EVAL_CASE and info["model"] == "twostage" and info["kind"] == "eval"
    assert info["tolerances"] == {n: t.to_json() for n, t in mf.tolerances_of(mf.load_manifest(runs)["cases"][EVAL_CASE]).items()}
    assert info["tolerances"]["logits"]["reason"].startswith("float64 policy, evaluation")
    assert "--input input.npz" in info["usage"]
    assert main(["eval", str(out / "input.npz"), "-o", str(tmp_path / "mine.npz"), "-q"]) == 0
    assert main(["compare", str(out / "expected.npz"), str(tmp_path / "mine.npz"),
                 "--tolerances", str(out / "case.json")]) == 0


def test_export_writes_all_files_or_none(runs, tmp_path, monkeypatch, capsys):
    """case.json that cannot be written (a directory in its place; the disk full as it is written): exit 2,
    and neither input.npz nor expected.npz is left in DIR (nor a temporary)."""
    out = tmp_path / "export"
    (out / "case.json").mkdir(parents=True)
    assert main(["export", EVAL_CASE, "-o", str(out)]) == 2
    assert capsys.readouterr().err == (f"ntpref: error: {out / 'case.json'}: cannot write: it is a directory, "
                                       "not a regular file (only regular files are replaced)\n")
    assert [p.name for p in out.iterdir()] == ["case.json"]
    (out / "case.json").rmdir()
    (out / "input.npz").write_bytes(b"old")
    real_fsync, calls = os.fsync, []

    def fsync(fd):
        calls.append(fd)
        if len(calls) == 3:                             # the third file, case.json
            raise OSError(28, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert main(["export", EVAL_CASE, "-o", str(out)]) == 2
    assert capsys.readouterr().err == f"ntpref: error: {out / 'case.json'}: cannot write (No space left on device)\n"
    assert [p.name for p in out.iterdir()] == ["input.npz"] and (out / "input.npz").read_bytes() == b"old"


def test_export_refuses_a_damaged_case(runs, tmp_path):
    path = runs / EVAL_CASE / "expected.npz"
    m = layout(path)["attn"]
    flip(path, m["data"] + 5)
    assert main(["export", EVAL_CASE, "-o", str(tmp_path / "x")]) == 1
    assert not (tmp_path / "x" / "expected.npz").exists()


def test_regen_writes_the_policy_tolerances(runs, monkeypatch):
    man = mf.load_manifest(runs)
    man["cases"][EVAL_CASE]["arrays"]["logits"].update(rtol=1e-3, atol=0.0)
    mf.save_manifest(runs, man)
    monkeypatch.setattr(reference, "compute", _perturbed_compute(1 + 1e-14))
    reference.regen(runs, EVAL_CASE)
    entry = mf.load_manifest(runs)["cases"][EVAL_CASE]
    inputs, expected = load_npz(runs / EVAL_CASE / "input.npz"), load_npz(runs / EVAL_CASE / "expected.npz")
    policy = bound_tolerances("twostage", "eval", inputs, expected)
    assert mf.tolerances_of(entry) == policy


# --- tolerances only ----------------------------------------------------------------------------
def test_regen_tolerances_only_keeps_files_and_hashes(runs, capsys):
    case = "shallow_train_projgd"
    files = {p: p.read_bytes() for p in (runs / case).iterdir()}
    man = mf.load_manifest(runs)
    for rec in man["cases"][case]["arrays"].values():
        rec.update(rtol=0.5, atol=0.0, atol_max_scale=0.0, atol_per_step=0.0, reason="loose")
    mf.save_manifest(runs, man)
    assert main(["regen", "--tolerances-only", case]) == 0
    assert re.fullmatch(rf"{case}: tolerances rewritten \(float64 policy; stored values at \S+ of them\)\n",
                        capsys.readouterr().out)
    assert {p: p.read_bytes() for p in (runs / case).iterdir()} == files
    entry = mf.load_manifest(runs)["cases"][case]
    assert all(rec["reason"].startswith("float64 policy") for rec in entry["arrays"].values())
    assert entry["arrays"]["train_loss"]["atol_per_step"] > 0
    assert entry["arrays"]["W"]["sha256"] == man["cases"][case]["arrays"]["W"]["sha256"]
    assert all(entry["arrays"][n]["bitwise"] is rec["bitwise"] for n, rec in man["cases"][case]["arrays"].items())
    assert main(["verify", case]) == 0
    assert main(["regen", "--tolerances-only", "--force", case]) == 2
    assert "--tolerances-only never rewrites values" in capsys.readouterr().err


def test_regen_tolerances_only_refuses_damaged_or_drifted_values(runs, capsys):
    path = runs / EVAL_CASE / "expected.npz"
    good = path.read_bytes()
    flip(path, layout(path)["attn"]["data"] + 5)
    assert main(["regen", "--tolerances-only", EVAL_CASE]) == 1
    assert f"retolerance {EVAL_CASE}: stored files do not match the manifest" in capsys.readouterr().err
    path.write_bytes(good)
    man = mf.load_manifest(runs)
    e = load_npz(path)
    e["logits"] = e["logits"] * (1 + 1e-9)
    entry = man["cases"][EVAL_CASE]
    mf.write_case(runs, EVAL_CASE, mf.case_entry(
        entry["model"], entry["kind"], entry["description"], entry["config"], entry["seed"],
        load_npz(runs / EVAL_CASE / "input.npz"), e, mf.tolerances_of(entry)), None, e, man)
    mf.save_manifest(runs, man)
    assert main(["regen", "--tolerances-only", EVAL_CASE]) == 1
    assert re.search(rf"retolerance {EVAL_CASE}: refused, the stored values fail the new tolerances \(FAIL: .*logits",
                     capsys.readouterr().err)
