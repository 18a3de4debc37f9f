"""Stored reference runs as ``ntpref verify`` reads them: every stored case passes (with either backend) and
rebuilds from its configuration and seed; the manifest's provenance, hashes and float64-policy tolerances; the
five-token values of the specification; a stored input through eval/train and compare. Tamper detection: a
flipped or truncated byte anywhere names the file and the array, as do a changed input or intermediate and
changed values with valid hashes. Malformed, hostile and unknown manifest contents; mistyped case names."""
import hashlib
import os
import re

import numpy as np
import pytest

import make_reference_runs
from ntpref.cli import main
from ntpref.npzio import load_npz
from ntpref.oracle import kinds, reference
from ntpref.oracle.policies.bound import bound_tolerances
from ntpref.oracle import manifest as mf

from reference_support import EVAL_CASE, REPO_RUNS, SPEC_CASES, edit_manifest, flip, layout


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
@pytest.mark.parametrize("where", ["data_start", "data_middle", "data_last", "npy_header", "local_name",
                                   "central_crc"])
def test_flipped_byte_inside_an_array_names_it(runs, capsys, where):
    path = runs / EVAL_CASE / "expected.npz"
    lay = layout(path)
    target = {"data_start": "logits", "data_middle": "attn", "data_last": "grad_W_kq", "npy_header": "grad_W_ov",
              "local_name": "loss0", "central_crc": "logits"}[where]
    m = lay[target]
    pos = {"data_start": m["data"], "data_middle": (m["data"] + m["end"]) // 2, "data_last": m["end"] - 1,
           "npy_header": m["npy_header"] + 12, "local_name": m["name"] + 1, "central_crc": m["central"] + 16}[where]
    flip(path, pos)
    assert main(["verify", EVAL_CASE]) == 1
    out = capsys.readouterr().out
    assert f"{EVAL_CASE}/expected.npz" in out and f"array '{target}'" in out


@pytest.mark.parametrize("where", ["local_time", "end_of_central_directory"])
def test_flipped_byte_in_zip_structure_names_the_file(runs, capsys, where):
    path = runs / EVAL_CASE / "expected.npz"
    pos = layout(path)["loss"]["local"] + 10 if where == "local_time" else path.stat().st_size - 12
    flip(path, pos)
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
    member = layout(path)["gram"]
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
    m = layout(path)["W"]
    flip(path, (m["data"] + m["end"]) // 2)
    assert main(["verify", "shallow_eval_perturbed"]) == 1
    out = capsys.readouterr().out
    assert "shallow_eval_perturbed/input.npz" in out and "array 'W'" in out


def test_intermediates_are_verified_and_exported(runs, tmp_path, capsys):
    case = "shallow_eval_perturbed"
    assert main(["verify", "-v", case]) == 0
    out = capsys.readouterr().out
    assert "head_a" in out and "head_MU" in out
    path = runs / case / mf.INTERMEDIATES
    m = layout(path)["head_a"]
    flip(path, (m["data"] + m["end"]) // 2)
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


# --- malformed manifest -------------------------------------------------------------------------
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
    edit_manifest(runs, edit)
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


def test_unknown_manifest_and_case_keys_are_ignored(runs, capsys):
    """Keys a reader does not know at the top of the manifest or of a case do not make it invalid."""
    edit_manifest(runs, lambda m: (m.update(note="x"), m["cases"][EVAL_CASE].update(note="y")))
    assert main(["verify", EVAL_CASE]) == 0
