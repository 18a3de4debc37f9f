"""The bits of the stored reference runs: distances in ulp, the arrays promised bit-identical (the models'
declaration, kept by the default backend on this machine and on a generic x86-64 CPU), and what verify and
regen say about bits that moved."""
import os
import platform
import re
import subprocess
import sys

import numpy as np
import pytest

import make_reference_runs
from ntpref.cli import main
from ntpref.npzio import load_npz
from ntpref.oracle import bits, kinds, reference
from ntpref.oracle import manifest as mf

from reference_support import EVAL_CASE, REPO_RUNS, SPEC_CASES

#: The stored bits and the bit-identical promises are those of x86-64 (docs/contract.md).
x86_64_only = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                 reason="the stored bits and their promises are those of x86-64 CPUs")


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
