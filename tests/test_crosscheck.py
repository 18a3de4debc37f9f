"""The shipped framework adapters (examples/adapters/) under ``ntpref conformance``, and the NTK Gram matrix
against autograd Jacobians.

torch_float64.py and jax_float64.py must pass every stored and random case under the float64 policy;
torch_float32.py and jax_float32.py must pass under --precision float32, and torch_float32.py fails
without it. Deliberately broken
PyTorch implementations must fail with the case and array named: the plain autograd NGD direction
in the late stage of Algorithm 1, and a 1e-3 gradient error in float32. (NumPy-only broken
implementations are in tests/test_conformance_judging.py.) Skipped with a reason when the framework is
absent, except under NTPREF_CROSSCHECK_REQUIRED=1 (CI), where a missing framework is a failure.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ntpref.oracle.cases import random_cases, stored_cases
from ntpref.oracle.conformance import cases, check
from ntpref.npzio import load_npz
from ntpref.oracle.manifest import default_root
from ntpref.shallow.activation import ACTIVATIONS
from ntpref.oracle.policies.bound import bound_tolerances

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples" / "adapters"
FRAMEWORK = {"torch_float64": "torch", "torch_float32": "torch", "jax_float64": "jax", "jax_float32": "jax"}
#: name → (adapter, extra arguments of ntpref conformance)
RUNS = {"torch_float64": ("torch_float64", ()), "jax_float64": ("jax_float64", ()),
        "torch_float32": ("torch_float32", ("--precision", "float32")),
        "jax_float32": ("jax_float32", ("--precision", "float32")),
        "torch_float32_strict": ("torch_float32", ("--model", "shallow", "--random", "2", "--no-stored"))}


def _need(framework):
    """Skip without the framework, unless NTPREF_CROSSCHECK_REQUIRED is set (CI): then its absence fails."""
    if os.environ.get("NTPREF_CROSSCHECK_REQUIRED"):
        __import__(framework)
    pytest.importorskip(framework, reason=f"{framework} is not installed (pip install ntpref[crosscheck])")


@pytest.fixture(scope="module")
def adapter_runs(tmp_path_factory):
    """Every run of RUNS whose framework is installed, started together (the frameworks' start-up overlaps):
    name → (exit status, stdout, stderr, JSON report or None)."""
    out = tmp_path_factory.mktemp("conformance")
    procs = {}
    for name, (adapter, args) in RUNS.items():
        try:
            __import__(FRAMEWORK[adapter])
        except ImportError:
            continue
        cmd = [sys.executable, "-m", "ntpref.cli", "conformance", str(EXAMPLES / f"{adapter}.py"), *args,
               "--json", str(out / f"{name}.json")]
        procs[name] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    results = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=1800)
        path = out / f"{name}.json"
        results[name] = (proc.returncode, stdout, stderr, json.loads(path.read_text()) if path.is_file() else None)
    return results


@pytest.mark.parametrize("name", ["torch_float64", "jax_float64", "torch_float32", "jax_float32"])
def test_adapter_passes_every_case(name, adapter_runs):
    _need(FRAMEWORK[name])
    rc, out, err, report = adapter_runs[name]
    assert rc == 0, f"{name}: exit {rc}\n{out}\n{err}"
    ids = [c.id for c in stored_cases()] + [c.id for c in random_cases()]
    assert [c["case"] for c in report["cases"]] == ids
    assert all(c["status"] == "pass" for c in report["cases"]), out
    assert report["precision"] == name[-7:]
    unchecked = sum(len(c["unchecked"]) for c in report["cases"])   # tolerances admitting every value on a case
    assert re.search(r"arrays compared" + (f", {unchecked} of them unchecked \\(.*\\)" if unchecked else "") + ": PASS$",
                     out.splitlines()[-1]), out
    assert unchecked == 0 or report["precision"] == "float32", out


def test_float32_adapter_fails_the_float64_policy(adapter_runs):
    _need("torch")
    rc, out, err, report = adapter_runs["torch_float32_strict"]
    assert rc == 1, out + err
    rows = [r for c in report["cases"] for r in c["rows"]]
    assert len(rows) == 10 and all(not r["ok"] and r["note"] == "adapter is float32, less precise than oracle float64"
                                   for r in rows)
    assert "(float32 results cannot meet the float64 policy: judge them with --precision float32)" in out


def test_adapter_loaded_by_path_shares_the_package():
    """By path (as ntpref conformance loads it) a shipped adapter is a module of the package examples.adapters:
    its relative import reaches the restatement that ``from examples.adapters import ...`` gives."""
    _need("torch")
    from examples.adapters import torch_restatement
    from ntpref.oracle.conformance import load_adapter

    adapter = load_adapter(EXAMPLES / "torch_float64.py")
    assert type(adapter.evaluate.__self__) is torch_restatement.TorchModels
    assert adapter.train.__self__ is adapter.evaluate.__self__


def test_autograd_direction_fails_the_late_stage():
    """The plain float64 gradient (what autograd gives) has no direction once every p_v underflows."""
    _need("torch")
    import torch

    from examples.adapters.torch_restatement import TorchModels

    models = TorchModels(torch.float64)
    autograd = {"train": lambda model, inputs: models.train(model, {**inputs, "direction": np.array("naive")})}
    late, other = (next(c for c in random_cases(["twostage"]) if c.id.endswith(end))
                   for end in ("train_late_stage", "train_naive"))
    report = check(autograd, late)
    assert not report.ok
    assert {"W_kq", "stage2_norm"} <= {r.name for r in report.rows if not r.ok}, report
    assert check(autograd, other).ok                         # the case that asks for "naive" anyway
    assert check({"train": models.train}, late).ok           # the log-scale direction


def test_float32_gradient_error_fails_the_float32_envelope():
    _need("torch")
    import torch

    from examples.adapters.torch_restatement import TorchModels

    models = TorchModels(torch.float32)

    def wrong(model, inputs):
        out = models.evaluate(model, inputs)
        return {**out, "grad_U": out["grad_U"] * np.float32(1 + 1e-3)}

    # well-conditioned cases (where float32 cancels, e.g. in a saturated attention, the envelope is wide too)
    chosen = [c for c in cases(["shallow"], random=2) if c.id in ("shallow_eval_perturbed", "r0_shallow_1_eval_T1_erf")]
    assert len(chosen) == 2
    for case in chosen:
        assert check({"evaluate": models.evaluate}, case, precision="float32").ok
        report = check({"evaluate": wrong}, case, precision="float32")
        assert [r.name for r in report.rows if not r.ok] == ["grad_U"], report
        assert f"FAIL  {case.id}: 4/5 arrays within tolerance; failing: grad_U" == report.summary()


def _ntk_case():
    root = default_root()
    inputs, expected = (load_npz(root / "shallow_ntk_gram" / f) for f in ("input.npz", "expected.npz"))
    return inputs, expected, bound_tolerances("shallow", "ntk", inputs, {"gram": expected["gram"]})["gram"]


def _options(inputs):
    return {"model": "shallow", "kappa": 2.0, "tau_att": float(inputs.get("tau_att", 1.0)),
            "mask_last_key": bool(inputs.get("mask_last_key", False)), "activation": str(inputs.get("activation", "tanh"))}


def test_ntk_gram_torch_jacobian():
    """K = J J^T, J [n, P] the per-sample Jacobian of f from torch.func.jacrev (docs/shallow.md §4)."""
    _need("torch")
    import torch

    from examples.adapters import torch_restatement as tr
    from ntpref.oracle.compare import compare_one

    inputs, expected, tol = _ntk_case()
    X = torch.tensor(inputs["X"])
    params = tuple(torch.tensor(inputs[k]) for k in ("c", "U", "W"))
    jac = torch.func.jacrev(lambda *p: tr.transformer_f(_options(inputs), X, *p), argnums=(0, 1, 2))(*params)
    J = torch.cat([j.reshape(len(X), -1) for j in jac], dim=1)
    row = compare_one("gram", expected["gram"], (J @ J.T).numpy(), tol)
    assert row.ok, row


def test_ntk_gram_jax_jacobian():
    _need("jax")
    import jax

    from examples.adapters import jax_float64 as jx
    from ntpref.oracle.compare import compare_one

    inputs, expected, tol = _ntk_case()
    params = tuple(jax.numpy.asarray(inputs[k]) for k in ("c", "U", "W"))
    opts = _options(inputs)
    jac = jax.jacrev(lambda p: jx.transformer_f(opts, jax.numpy.asarray(inputs["X"]), *p))(params)
    J = np.concatenate([np.asarray(j).reshape(len(inputs["X"]), -1) for j in jac], axis=1)
    row = compare_one("gram", expected["gram"], J @ J.T, tol)
    assert row.ok, row


@pytest.mark.parametrize("framework, module", [("torch", "torch_restatement"), ("jax", "jax_float64")])
def test_adapter_activation_tables_refuse_an_unknown_name(framework, module):
    """The shipped restatements compute σ from a table of the known activations; any other name is an error,
    never erf in disguise."""
    _need(framework)
    import importlib

    adapter = importlib.import_module(f"examples.adapters.{module}")
    lib = importlib.import_module("torch" if framework == "torch" else "jax.numpy")
    x = lib.linspace(-2.0, 2.0, 5) if framework == "jax" else lib.linspace(-2.0, 2.0, 5, dtype=lib.float64)
    assert sorted(adapter.ACTIVATIONS) == sorted(ACTIVATIONS)
    np.testing.assert_allclose(np.asarray(adapter.sigma(x, "tanh")), np.tanh(np.linspace(-2.0, 2.0, 5)), rtol=1e-6)
    with pytest.raises(ValueError, match="activation 'relu' is not implemented here"):
        adapter.sigma(x, "relu")


def test_a_shipped_adapter_runs_by_name(capsys):
    """ntpref conformance --adapter NAME runs the installed copy of a shipped adapter."""
    _need("torch")
    from ntpref.cli import main

    assert main(["conformance", "--adapter", "torch-float64", "--model", "indrnn", "--no-stored", "--random", "2"]) == 0
    out = capsys.readouterr().out
    assert "torch_float64.py" in out.splitlines()[0] and out.splitlines()[-1].endswith(": PASS")
