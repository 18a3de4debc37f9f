"""Stored reference runs: verify, tamper detection, regen (refusal, atomic writes), export, manifest contents,
the bit-identical promises and distances in ulp."""
import hashlib
import json
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

import make_reference_runs
from ntpref.cli import main
from ntpref.errors import ComparisonError, InputError
from ntpref.npzio import load_npz
from ntpref.oracle import bits, kinds, reference
from ntpref.oracle.policies.bound import bound_tolerances
from ntpref.oracle import manifest as mf

REPO_RUNS = Path(mf.__file__).resolve().parents[2] / "reference_runs"
EVAL_CASE = "twostage_eval_onehot_succ"
#: The stored cases the models' specifications define (ntpref/twostage/cases.py, ntpref/shallow/cases.py).
SPEC_CASES = {c.name for c in make_reference_runs.CASES}
#: The stored bits and the bit-identical promises are those of x86-64 (docs/contract.md).
x86_64_only = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                 reason="the stored bits and their promises are those of x86-64 CPUs")


@pytest.fixture(scope="module")
def manifest():
    return mf.load_manifest(REPO_RUNS)


@pytest.fixture
def runs(tmp_path, monkeypatch):
    """A private copy of reference_runs, selected through NTPREF_REFERENCE_RUNS."""
    root = tmp_path / "runs"
    shutil.copytree(REPO_RUNS, root)
    monkeypatch.setenv(mf.ENV_ROOT, str(root))
    return root


def test_verify_passes_on_stored_cases(capsys, monkeypatch):
    monkeypatch.delenv(mf.ENV_ROOT, raising=False)
    assert main(["verify"]) == 0
    out = capsys.readouterr().out
    assert f"{len(SPEC_CASES)}/{len(SPEC_CASES)} cases ok" in out


def test_verify_numpy_backend_within_tolerances(monkeypatch, capsys):
    """The stored tolerances hold for the other backend too (spec: numba vs numpy rtol 1e-12)."""
    monkeypatch.delenv(mf.ENV_ROOT, raising=False)
    assert main(["verify", "--backend", "numpy"]) == 0


def test_inputs_rebuild_from_config_and_seed(manifest, capsys):
    """Every stored input is reproduced bit for bit by the registry's build(config, seed)."""
    names = [c.name for c in make_reference_runs.CASES]
    assert len(names) == len(set(names)) and set(names) == set(manifest["cases"])
    for case in make_reference_runs.CASES:
        entry = manifest["cases"][case.name]
        assert (case.model, case.kind, case.config, case.seed) == (entry["model"], entry["kind"], entry["config"],
                                                                   entry["seed"])
    assert make_reference_runs.check(make_reference_runs.CASES, REPO_RUNS)


def test_manifest_lists_cases_with_provenance_hashes_and_tolerances(manifest):
    assert manifest["format_version"] == 1
    produced_by = {"ntpref", "git", "numpy", "numba", "python", "machine", "cpu", "numba_target"}
    assert produced_by <= set(manifest["provenance"])
    assert SPEC_CASES <= set(manifest["cases"])
    total = 0
    for name, case in manifest["cases"].items():
        assert case["kind"] in kinds.KINDS and case["description"] and isinstance(case["seed"], int)
        assert produced_by <= set(case["provenance"]) and {"cpu", "features"} <= set(case["provenance"]["numba_target"])
        expected = load_npz(REPO_RUNS / name / "expected.npz")
        inputs = load_npz(REPO_RUNS / name / "input.npz")
        assert set(expected) == set(case["arrays"]) and set(inputs) == set(case["inputs"])
        if "intermediates" in case:
            expected.update(load_npz(REPO_RUNS / name / mf.INTERMEDIATES))
        for arr, rec in {**case["arrays"], **case.get("intermediates", {})}.items():
            a = expected[arr]
            assert rec["shape"] == list(a.shape) and rec["dtype"] == str(a.dtype)
            assert rec["sha256"] == hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()
            assert rec["reason"].startswith(("float64 policy", "max-margin solution"))
        total += sum((REPO_RUNS / name / f).stat().st_size for f in case["files"])
    assert total < 4 << 20


@pytest.mark.parametrize("case", sorted(SPEC_CASES))
def test_manifest_tolerances_follow_the_float64_policy(manifest, case):
    """Every recorded tolerance is the policy's for the stored input. A training tolerance rests on a
    measured response to rounding, which may differ by a small factor on another machine: the twostage_train_K20
    response of stage1_corr, a few roundings per step, gives 4.4e-15 per step on the machine that wrote the
    manifest (a znver5 target) and 2.7e-15 on a znver4, so a training tolerance is held to a factor of 2."""
    entry = manifest["cases"][case]
    arrays = load_npz(REPO_RUNS / case / "expected.npz")
    if "intermediates" in entry:
        arrays.update(load_npz(REPO_RUNS / case / mf.INTERMEDIATES))
    inputs = load_npz(REPO_RUNS / case / "input.npz")
    policy = bound_tolerances(entry["model"], entry["kind"], inputs, arrays)
    recorded = mf.tolerances_of(entry)
    assert set(recorded) == set(policy)
    factor = 2.0 if entry["kind"] == "train" else 1.0 + 1e-9
    for name, tol in policy.items():
        assert recorded[name].rtol == pytest.approx(tol.rtol, rel=1e-12), name
        for key in ("atol", "atol_per_step"):
            a, b = getattr(recorded[name], key), getattr(tol, key)
            assert (a == b == 0) or (b / factor <= a <= b * factor), (name, key, a, b)
        assert recorded[name].atol_max_scale == 0.0 and recorded[name].head is None


def test_five_token_reference_matches_spec_values():
    """docs/twostage.md §8: W_ov*, W_kq* in closed form and rho(W_kq, W_kq*) at t = 100, 1000."""
    e = load_npz(REPO_RUNS / "twostage_train_five_token" / "expected.npz")
    K = 5
    assert np.allclose(e["W_ov_star"], (np.arange(K)[:, None] == (np.arange(K)[None, :] + 1) % K) - 0.2, atol=1e-9)
    W = np.zeros((K, K))
    W[:, 0] = [-0.8, 0.2, -0.8, 1.2, 0.2]
    W[:, 2] = [0.2, 1.2, -0.8, 0.2, -0.8]
    assert np.allclose(e["W_kq_star"], W, atol=1e-9)
    assert round(float(e["stage2_corr"][100]), 5) == 0.98865
    assert round(float(e["stage2_corr"][1000]), 5) == 0.99701
    # stage 1 from zero init with E = I, C = V stays on the ray of W_ov*: L0(t) in closed form (docs/twostage.md §6)
    t = np.arange(501)
    eta0 = 0.2 / np.sqrt(K)
    assert np.allclose(e["stage1_loss"], np.log1p((K - 1) * np.exp(-eta0 * t / np.sqrt(K - 1))), rtol=1e-12)


def test_stored_input_runs_through_the_cli_and_compares_cleanly(manifest, tmp_path):
    """docs/contract.md: a case's input runs unchanged through ntpref eval/train and its expected file
    compares cleanly through ntpref compare (default tolerances); a few fast cases covering all three models."""
    for case in (EVAL_CASE, "twostage_train_five_token", "shallow_eval_mask_tau", "indrnn_eval"):
        kind = manifest["cases"][case]["kind"]
        out = tmp_path / f"{case}.npz"
        assert main([kind, str(REPO_RUNS / case / "input.npz"), "-o", str(out), "-q"]) == 0
        assert main(["compare", str(REPO_RUNS / case / "expected.npz"), str(out)]) == 0


# --- tamper detection ---------------------------------------------------------------------------
def _layout(path: Path) -> dict:
    """Byte offsets inside an uncompressed npz: per member its local header, npy header and raw data,
    and its central directory record."""
    raw = path.read_bytes()
    out = {}
    with zipfile.ZipFile(path) as zf:
        central = zf.start_dir
        for info in zf.infolist():
            h = info.header_offset
            n, extra = struct.unpack("<HH", raw[h + 26:h + 30])
            data = h + 30 + n + extra
            hlen = struct.unpack("<H", raw[data + 8:data + 10])[0]
            cd = raw.index(b"PK\x01\x02", central)
            out[info.filename[:-4]] = {"local": h, "name": h + 30, "npy_header": data + 10, "data": data + 10 + hlen,
                                       "end": data + info.file_size, "central": cd}
            central = cd + 4
    return out


def _flip(path: Path, pos: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[pos] ^= 0x5A
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("where", ["data_start", "data_middle", "data_last", "npy_header", "local_name",
                                   "central_crc"])
def test_flipped_byte_inside_an_array_names_it(runs, capsys, where):
    path = runs / EVAL_CASE / "expected.npz"
    lay = _layout(path)
    target = {"data_start": "logits", "data_middle": "attn", "data_last": "grad_W_kq", "npy_header": "grad_W_ov",
              "local_name": "loss0", "central_crc": "logits"}[where]
    m = lay[target]
    pos = {"data_start": m["data"], "data_middle": (m["data"] + m["end"]) // 2, "data_last": m["end"] - 1,
           "npy_header": m["npy_header"] + 12, "local_name": m["name"] + 1, "central_crc": m["central"] + 16}[where]
    _flip(path, pos)
    assert main(["verify", EVAL_CASE]) == 1
    out = capsys.readouterr().out
    assert f"{EVAL_CASE}/expected.npz" in out and f"array '{target}'" in out


@pytest.mark.parametrize("where", ["local_time", "end_of_central_directory"])
def test_flipped_byte_in_zip_structure_names_the_file(runs, capsys, where):
    path = runs / EVAL_CASE / "expected.npz"
    pos = _layout(path)["loss"]["local"] + 10 if where == "local_time" else path.stat().st_size - 12
    _flip(path, pos)
    assert main(["verify", EVAL_CASE]) == 1
    out = capsys.readouterr().out
    assert f"{EVAL_CASE}/expected.npz" in out and f"FAILED: {EVAL_CASE}" in out


@pytest.mark.parametrize("keep", [0.5, 0.99])
def test_truncated_expected_file_names_the_file(runs, capsys, keep):
    path = runs / EVAL_CASE / "expected.npz"
    raw = path.read_bytes()
    path.write_bytes(raw[: int(len(raw) * keep)])
    assert main(["verify", EVAL_CASE]) == 1
    out = capsys.readouterr().out
    assert f"{EVAL_CASE}/expected.npz" in out and f"FAILED: {EVAL_CASE}" in out
    # the unreadable file is named; no stored bits were read, so none "moved" (no blame on rounding)
    assert out.splitlines()[-1] == (f"stored files that do not read, so their arrays were not compared: "
                                    f"{EVAL_CASE}/expected.npz (the reason is above)")
    assert "bits moved" not in out
    result = reference.verify(runs, [EVAL_CASE])[0]
    assert (result.unreadable, result.bits, result.moved) == ([f"{EVAL_CASE}/expected.npz"], [], [])


def test_every_flipped_byte_of_an_expected_file_is_detected(runs):
    """Exhaustive over the smallest expected file: each position, one bit flipped, must be reported;
    positions inside the array's npy member must name the array."""
    case = "shallow_ntk_gram"
    entry = mf.load_manifest(runs)["cases"][case]
    path = runs / case / "expected.npz"
    raw = path.read_bytes()
    member = _layout(path)["gram"]
    for pos in range(len(raw)):
        damaged = bytearray(raw)
        damaged[pos] ^= 0x01
        path.write_bytes(bytes(damaged))
        _, problems = mf.check_file(runs, case, entry, "expected.npz")
        assert problems, f"flipped byte at {pos} not detected"
        assert all(p.startswith(f"{case}/expected.npz") for p in problems)
        if member["npy_header"] - 10 <= pos < member["end"]:
            assert "array 'gram'" in problems[0], (pos, problems)


def test_tampered_input_names_the_array(runs, capsys):
    path = runs / "shallow_eval_perturbed" / "input.npz"
    m = _layout(path)["W"]
    _flip(path, (m["data"] + m["end"]) // 2)
    assert main(["verify", "shallow_eval_perturbed"]) == 1
    out = capsys.readouterr().out
    assert "shallow_eval_perturbed/input.npz" in out and "array 'W'" in out


def test_intermediates_are_verified_and_exported(runs, tmp_path, capsys):
    case = "shallow_eval_perturbed"
    assert main(["verify", "-v", case]) == 0
    out = capsys.readouterr().out
    assert "head_a" in out and "head_MU" in out
    path = runs / case / mf.INTERMEDIATES
    m = _layout(path)["head_a"]
    _flip(path, (m["data"] + m["end"]) // 2)
    assert main(["verify", case]) == 1
    assert f"{case}/intermediates.npz: damaged (array 'head_a')" in capsys.readouterr().out
    path.write_bytes((REPO_RUNS / case / mf.INTERMEDIATES).read_bytes())
    assert main(["export", case, "-o", str(tmp_path / "x")]) == 0
    assert (tmp_path / "x" / mf.INTERMEDIATES).read_bytes() == path.read_bytes()


def test_changed_values_with_valid_hashes_fail_the_comparison(runs, capsys):
    """A stored expected value off by 1e-9 (and hashes updated to match) fails the rtol 1e-12 comparison."""
    man = mf.load_manifest(runs)
    entry = man["cases"][EVAL_CASE]
    e = load_npz(runs / EVAL_CASE / "expected.npz")
    e["logits"] = e["logits"] * (1 + 1e-9)
    mf.write_case(runs, EVAL_CASE, mf.case_entry(
        entry["model"], entry["kind"], entry["description"], entry["config"], entry["seed"],
        load_npz(runs / EVAL_CASE / "input.npz"), e, mf.tolerances_of(entry)), None, e, man)
    mf.save_manifest(runs, man)
    assert main(["verify", EVAL_CASE]) == 1
    out = capsys.readouterr().out
    assert "logits" in out and "FAIL" in out


def test_unknown_case_and_missing_root(runs, tmp_path, capsys):
    assert main(["verify", "no_such_case"]) == 2
    assert "no_such_case" in capsys.readouterr().err
    assert main(["verify", "--root", str(tmp_path / "empty")]) == 2


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
    _edit_manifest(root, lambda m: m["cases"][case].update(model=model))


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
    m = _layout(path)["attn"]
    _flip(path, m["data"] + 5)
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
    _flip(path, _layout(path)["attn"]["data"] + 5)
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


# --- malformed manifest -------------------------------------------------------------------------
def _edit_manifest(root: Path, edit) -> None:
    data = json.loads((root / "manifest.json").read_text())
    edit(data)
    (root / "manifest.json").write_text(json.dumps(data))


@pytest.mark.parametrize("edit, message", [
    (lambda m: m.pop("cases"), r"manifest\.json: missing key 'cases'"),
    (lambda m: m.update(format_version="1"), r"manifest\.json: 'format_version' must be 1, got \"1\""),
    (lambda m: m.update(cases=[]), r"manifest\.json: 'cases' must be an object mapping case names to cases, got \[\]"),
    (lambda m: m["cases"][EVAL_CASE].pop("kind"), rf"manifest\.json: case '{EVAL_CASE}': missing key 'kind'"),
    (lambda m: m["cases"][EVAL_CASE].update(kind="fit"),
     rf"case '{EVAL_CASE}': 'kind' must be one of eval, train, ntk, got 'fit'"),
    (lambda m: m["cases"][EVAL_CASE].update(model="transformer"),
     rf"case '{EVAL_CASE}': 'model' must be one of twostage, shallow, indrnn, got 'transformer'"),
    (lambda m: m["cases"][EVAL_CASE].update(seed="1"), rf"case '{EVAL_CASE}': 'seed' must be an integer, got \"1\""),
    (lambda m: m["cases"][EVAL_CASE].update(files={"input.npz": "ab"}),
     rf"case '{EVAL_CASE}': 'files' entry 'input.npz' must be a SHA-256 hex digest"),
    (lambda m: m["cases"][EVAL_CASE]["files"].update({"other.npz": "0" * 64}),
     rf"case '{EVAL_CASE}': unknown file 'other.npz' in 'files'"),
    (lambda m: m["cases"][EVAL_CASE]["arrays"]["logits"].update(rtol=-1),
     rf"case '{EVAL_CASE}' array 'logits': 'rtol' must be a finite number >= 0, got -1"),
    (lambda m: m["cases"][EVAL_CASE]["arrays"]["logits"].pop("sha256"),
     rf"case '{EVAL_CASE}' array 'logits': missing key 'sha256'"),
    (lambda m: m["cases"][EVAL_CASE]["inputs"]["W_ov"].update(shape=[8, "8"]),
     rf"case '{EVAL_CASE}' array 'W_ov': 'shape' must be a list of sizes >= 0"),
    (lambda m: m["cases"].update({"../escape": m["cases"][EVAL_CASE]}),
     r"case '\.\./escape': a case name is a directory name"),
    (lambda m: m["cases"][EVAL_CASE]["arrays"]["logits"].update(bitwise="yes"),
     rf"case '{EVAL_CASE}' array 'logits': 'bitwise' must be true or false, got \"yes\""),
    (lambda m: m["cases"][EVAL_CASE]["arrays"]["logits"].update(certified=True),
     rf"case '{EVAL_CASE}' array 'logits': 'certified' must be a number >= 0"),
    (lambda m: m["cases"][EVAL_CASE]["arrays"]["logits"].update(calibrated="tight"),
     rf"case '{EVAL_CASE}' array 'logits': 'calibrated' must be \"bound\" or a tolerance object, got \"tight\""),
    (lambda m: m["cases"][EVAL_CASE]["arrays"]["logits"].update(calibrated={"atol": -1.0}),
     rf"case '{EVAL_CASE}' array 'logits' 'calibrated': 'atol' must be a finite number >= 0"),
    (lambda m: m["cases"][EVAL_CASE].update(provenance="x"),
     rf"case '{EVAL_CASE}': 'provenance' must be an object, got \"x\""),
    (lambda m: m["cases"][EVAL_CASE]["arrays"]["logits"].update(certifed=0.1),       # a misspelt record field
     rf"case '{EVAL_CASE}' array 'logits': unknown tolerance key 'certifed'"),
])
def test_malformed_manifest_is_a_clear_error(runs, capsys, edit, message):
    _edit_manifest(runs, edit)
    assert main(["verify", "--root", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ntpref: error: {runs / 'manifest.json'}: ")
    assert re.search(message, err), err


def test_manifest_that_is_not_json(runs, capsys):
    (runs / "manifest.json").write_text('{"format_version": 1, "cases": {')
    assert main(["verify", "--root", str(runs)]) == 2
    assert re.match(rf"ntpref: error: {re.escape(str(runs / 'manifest.json'))}: not a reference manifest \(Expecting",
                    capsys.readouterr().err)


@pytest.mark.parametrize("text, message", [
    ('{"format_version": 1, "cases": ' + "[" * 5000 + "]" * 5000 + "}", r"nested deeper than 64 levels"),
    ('{"format_version": ' + "1" * 5000 + "}", r"an integer of 5000 digits"),
    ('{"format_version": 1, "format_version": 1, "cases": {}}', r"key 'format_version' appears 2 times"),
])
def test_hostile_manifest_is_a_one_line_error(runs, capsys, text, message):
    (runs / "manifest.json").write_text(text)
    assert main(["verify", "--root", str(runs)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"ntpref: error: {runs / 'manifest.json'}: not a reference manifest (")
    assert re.search(message, err), err


def test_manifest_must_be_a_regular_file(runs, capsys):
    (runs / "manifest.json").unlink()
    os.mkfifo(runs / "manifest.json")
    assert main(["verify", "--root", str(runs)]) == 2
    assert capsys.readouterr().err == f"ntpref: error: {runs / 'manifest.json'}: is a FIFO, not a reference manifest\n"


def test_a_mistyped_case_name_gets_a_did_you_mean(capsys, tmp_path):
    for argv in (["verify", "twostage_eval_onehot_suc"], ["export", "twostage_eval_onehot_suc", "-o", str(tmp_path)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("ntpref: error: unknown case 'twostage_eval_onehot_suc' (did you mean "
                              "'twostage_eval_onehot_succ'?); known: ") and err.count("\n") == 1, err


# --- bits: distances in ulp, the bit-identical promises -------------------------------------------
def test_ulp_distance_counts_in_the_spacing_of_the_stored_value():
    ulp = bits.ulp_distance
    x = np.array([1.0, -2.0, 3.0])
    assert ulp(x, x.copy()) == 0.0
    assert ulp(np.array(1.0), np.nextafter(1.0, 2.0)) == 1.0
    assert ulp(np.array(1.0), np.nextafter(1.0, 0.0)) == 0.5            # the spacing halves below a power of two
    assert ulp(np.array([3.0, -5.0]), np.array([3.0, -5.0 - 4 * np.spacing(5.0)])) == 4.0
    sub = 5e-324                                                         # the smallest subnormal
    assert ulp(np.array(0.0), np.array(sub)) == 1.0 and ulp(np.array(3 * sub), np.array(sub)) == 2.0
    assert ulp(np.array(0.0), np.array(-0.0)) == 1.0                     # only the sign of a zero differs
    assert ulp(np.array(0.0), np.array(1e-300)) > 1e20                   # a changed exact zero is never a few ulp
    assert ulp(np.array(0.0), np.array(1e-10)) == np.inf
    assert ulp(np.array(1.0), np.array(np.nan)) == np.inf
    assert ulp(np.zeros(2), np.zeros(3)) is None and ulp(np.zeros(2), np.zeros(2, dtype=np.int64)) is None
    assert ulp(np.arange(3), np.arange(3)) == 0.0 and ulp(np.arange(3), np.arange(1, 4)) is None
    assert [bits.ulp_text(u) for u in (0.0, 64.0, 0.5, 1.25e17, None)] == [
        "identical", "64 ulp", "0.5 ulp", "1.25e+17 ulp", "differs"]


def test_promises_follow_the_declaration(manifest):
    """Every stored array's "bitwise" flag is the models' declaration (ModelSpec.not_bitwise), and the
    declaration names outputs of its model only."""
    from ntpref.models import SPECS

    for model, spec in SPECS.items():
        assert set(spec.not_bitwise) <= set(spec.eval_outputs) | set(spec.train_outputs), model
    for entry in manifest["cases"].values():
        records = {**entry["arrays"], **entry.get("intermediates", {})}
        assert {n: r["bitwise"] for n, r in records.items()} == {
            n: f["bitwise"] for n, f in make_reference_runs.bitwise_fields(entry["model"], records).items()}
    promised = sum(r["bitwise"] for e in manifest["cases"].values()
                   for r in {**e["arrays"], **e.get("intermediates", {})}.values())
    assert promised > 0


@x86_64_only
def test_promised_arrays_keep_their_stored_bits():
    """The default backend reproduces every array promised bit-identical bit for bit: a change of the oracle
    that moves them fails here until the cases are regenerated on purpose (ntpref regen CASE)."""
    moved = [f"{r.case}/{b.name} ({bits.ulp_text(b.ulp)})" for r in reference.verify(REPO_RUNS)
             for b in r.bits if b.promised and not b.identical]
    assert not moved, "arrays promised bit-identical moved; regenerate them on purpose: " + ", ".join(moved)


# One case per model (its eval kernels and intermediates): a fresh compilation for the generic target
# stays well under a minute. The slow variant covers every case.
FEW_CASES = ("twostage_eval_gaussian_E", "shallow_eval_mask_tau", "indrnn_eval")
GENERIC_SCRIPT = r"""
import sys
import numpy as np
from ntpref.npzio import load_npz
from ntpref.oracle.kinds import compute, intermediates
from ntpref.oracle.manifest import load_manifest
root, out, *cases = sys.argv[1:]
manifest = load_manifest(root)
arrays = {}
for case in cases:
    entry = manifest["cases"][case]
    inputs = load_npz(f"{root}/{case}/input.npz")
    results = compute(entry["kind"], inputs)
    if "intermediates" in entry:
        results.update(intermediates(entry["model"], entry["kind"], inputs))
    arrays.update({f"{case}/{name}": np.asarray(a) for name, a in results.items()})
np.savez(out, **arrays)
"""


@x86_64_only
@pytest.mark.parametrize("cases", [FEW_CASES, pytest.param(tuple(sorted(SPEC_CASES)), marks=pytest.mark.slow,
                                                           id="all")])
def test_promised_arrays_are_the_same_bits_on_generic_x86_64(tmp_path, manifest, cases):
    """An x86-64 without the host's SIMD extensions, as far as the oracle's code goes: Numba compiles for the
    generic CPU (no AVX), NumPy runs its baseline kernels (every dispatched SIMD target off) and OpenBLAS its
    Prescott kernels; the C library stays the host's (docs/contract.md). Every array promised bit-identical
    comes out with the stored bits, which the host reproduces (the test above)."""
    simd = np.show_config(mode="dicts")["SIMD Extensions"]
    env = {**os.environ, "NUMBA_CPU_NAME": "generic", "NUMBA_CPU_FEATURES": "",
           "NUMBA_CACHE_DIR": str(tmp_path / "numba-cache"), "OPENBLAS_CORETYPE": "Prescott",
           "NPY_DISABLE_CPU_FEATURES": " ".join(simd["found"] + simd.get("not found", []))}
    out = tmp_path / "generic.npz"
    subprocess.run([sys.executable, "-c", GENERIC_SCRIPT, str(REPO_RUNS), str(out), *cases], check=True, env=env)
    with np.load(out) as f:
        generic = dict(f)
    checked, moved = 0, []
    for case in cases:
        entry = manifest["cases"][case]
        stored = {}
        for filename in entry["files"]:
            if filename != "input.npz":
                stored.update(load_npz(REPO_RUNS / case / filename))
        for name, rec in {**entry["arrays"], **entry.get("intermediates", {})}.items():
            if rec["bitwise"]:
                checked += 1
                ulp = bits.ulp_distance(stored[name], generic[f"{case}/{name}"])
                if ulp != 0.0:
                    moved.append(f"{case}/{name} ({bits.ulp_text(ulp)})")
    assert checked >= 10 and not moved, moved


def _next_float_logits(kind, inputs, backend="numba", original=kinds.compute):
    out = original(kind, inputs, backend)
    out["logits"] = np.nextafter(out["logits"], np.inf)
    return out


def test_verify_reports_bits_per_case_and_array(runs, monkeypatch, capsys):
    """A case whose arrays keep their bits is "bit-identical"; one whose rounding moved (here: logits one float
    up) is "within tolerance (max N ulp)", with the promised arrays that moved counted; -v lists every array's
    bits and the provenance of this run and of the stored files."""
    assert main(["regen", "--force", EVAL_CASE]) == 0              # the stored bits are this machine's
    capsys.readouterr()
    assert main(["verify", EVAL_CASE]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"{EVAL_CASE} +eval +7/7 +\S+ +\S+ +bit-identical\n", out) and "1/1 cases ok, 1 bit-identical" in out
    monkeypatch.setattr(reference, "compute", _next_float_logits)
    assert main(["verify", "-v", EVAL_CASE]) == 0
    out = capsys.readouterr().out
    assert re.search(rf"{EVAL_CASE} +eval +7/7 +\S+ +\S+ +within tolerance \(max 1 ulp\)\n", out), out
    assert "1/1 cases ok, 0 bit-identical" in out
    assert f"arrays promised bit-identical whose bits moved: 1, in {EVAL_CASE}" in out
    assert re.search(r"logits +yes +1 ulp +\d\.\de-\d\d\n", out) and re.search(r"attn +yes +identical +\S+\n", out)
    assert re.search(r"this run: ntpref \S+, git \S+, NumPy .*, Numba target \S+ \(", out)
    assert re.search(r"stored by: ntpref \S+, git \S+, NumPy .*, Numba target \S+ \(", out)
    assert main(["verify", "--backend", "numpy", EVAL_CASE]) == 0   # the promises are the numba backend's
    assert "whose bits moved" not in capsys.readouterr().out


def test_regen_says_what_changed(runs, monkeypatch, capsys):
    """Without --force, regen names the arrays that changed and by how many ulp, or says nothing changed (and
    then rewrites no file); the records keep their "bitwise" promises."""
    assert main(["regen", "--force", EVAL_CASE]) == 0
    capsys.readouterr()
    files = {f: (runs / EVAL_CASE / f).read_bytes() for f in mf.FILES}
    assert main(["regen", EVAL_CASE]) == 0
    assert capsys.readouterr().out == f"{EVAL_CASE}: unchanged, all 7 arrays bit-identical to the stored ones\n"
    assert {f: (runs / EVAL_CASE / f).read_bytes() for f in mf.FILES} == files
    promises = {n: r["bitwise"] for n, r in mf.load_manifest(runs)["cases"][EVAL_CASE]["arrays"].items()}
    monkeypatch.setattr(reference, "compute", _next_float_logits)
    assert main(["regen", EVAL_CASE]) == 0
    assert capsys.readouterr().out == (f"{EVAL_CASE}: rewritten, 1 of 7 arrays changed (max 1 ulp): logits 1 ulp\n")
    entry = mf.load_manifest(runs)["cases"][EVAL_CASE]
    assert {n: r["bitwise"] for n, r in entry["arrays"].items()} == promises
    assert reference.verify(runs, [EVAL_CASE])[0].status == "bit-identical"


def test_unknown_manifest_and_case_keys_are_ignored(runs, capsys):
    """Keys a reader does not know at the top of the manifest or of a case do not make it invalid."""
    _edit_manifest(runs, lambda m: (m.update(note="x"), m["cases"][EVAL_CASE].update(note="y")))
    assert main(["verify", EVAL_CASE]) == 0
