"""The cases ``ntpref conformance`` runs (ntpref.oracle.cases): the random cases are reproducible and
independent of the selection and cover every regime of every model; the stored cases are the eval and train
cases of the manifest, with its tolerances.
"""
import numpy as np
import pytest

from ntpref.models import SPECS
from ntpref.oracle.cases import random_cases, stored_cases
from ntpref.npzio import load_npz
from ntpref.oracle.manifest import default_root, load_manifest, tolerances_of


def test_random_cases_are_reproducible_and_independent_of_the_selection():
    every = {c.id: c for c in random_cases(n=6, seed=3)}
    assert len(every) == 18
    some = random_cases(["indrnn"], n=2, seed=3)
    assert [c.id for c in some] == ["r3_indrnn_0_eval_paired", "r3_indrnn_1_eval_T1_erf"]
    for case in some:
        assert case.inputs.keys() == every[case.id].inputs.keys()
        for k, v in case.inputs.items():
            np.testing.assert_array_equal(v, every[case.id].inputs[k])
    other = random_cases(["indrnn"], n=1, seed=4)[0]
    assert not np.array_equal(other.inputs["X"], some[0].inputs["X"]) or other.inputs["X"].shape != some[0].inputs["X"].shape
    assert [c.id.split("_", 3)[3] for c in every.values() if c.model == "shallow"] == [
        "eval_paired_mask", "eval_T1_erf", "train_projgd", "train_projsgd", "eval_overflow", "eval_paired_mask"]


def test_random_cases_cover_the_regimes():
    by_name = {c.id.split("_", 3)[3] + ":" + c.model: c for c in random_cases(seed=0)}
    assert len(by_name) == sum(len(spec.regimes) for spec in SPECS.values())
    general = by_name["eval_general_E:twostage"].inputs
    assert general["E"].shape[0] != general["E"].shape[1]
    assert 1 in general["lengths"] and np.any(general["tokens"] == -1) and np.any(general["succ"] == -1)
    assert len(np.unique(general["tokens"][2])) == 1                                       # repeated tokens
    assert np.max(by_name["eval_saturated:twostage"].expected["attn"]) > 1 - 1e-9            # saturated softmax
    overflow = np.log(np.finfo(np.float64).max)                                   # beyond exp's overflow
    assert by_name["eval_overflow:twostage"].expected["logits"].min() > overflow
    heads = by_name["eval_overflow:shallow"].inputs
    scores = np.einsum("ntd,mde,ne->nmt", heads["X"], heads["W"], heads["X"][:, -1]) / float(heads["tau_att"])
    assert np.abs(scores).max() == pytest.approx(1500.0)                          # above 709.8
    assert str(by_name["train_naive:twostage"].inputs["direction"]) == "naive"
    for model in ("shallow", "indrnn"):
        np.testing.assert_array_equal(by_name[f"eval_paired{'_mask' if model == 'shallow' else ''}:{model}"].expected["f"], 0.0)
        t1 = by_name[f"eval_T1_erf:{model}"].inputs
        assert t1["X"].shape[1] == 1 and str(t1["activation"]) == "erf" and float(t1["kappa"]) == 1.0
        sgd = by_name[f"train_projsgd:{model}"].inputs
        assert {"batch", "seed", "X_val", "y_val"} <= set(sgd)
    mask = by_name["eval_paired_mask:shallow"].inputs
    assert bool(mask["mask_last_key"]) and float(mask["tau_att"]) == pytest.approx(np.sqrt(mask["X"].shape[2]))
    projgd = by_name["train_projgd:shallow"]
    np.testing.assert_array_equal(projgd.inputs["rho"], [np.inf, 0.0, 0.05])
    np.testing.assert_array_equal(projgd.expected["U"], projgd.inputs["U"])                   # rho_U = 0: frozen
    m = len(projgd.inputs["c"])
    radius = np.linalg.norm((projgd.expected["W"] - projgd.inputs["W"]).reshape(m, -1), axis=1)
    np.testing.assert_allclose(radius, 0.05 / np.sqrt(m), rtol=1e-12)                         # W's ball active


def test_stored_cases_are_the_eval_and_train_cases_of_the_manifest():
    stored = stored_cases()
    assert {c.kind for c in stored} == {"eval", "train"}
    assert "shallow_ntk_gram" not in {c.id for c in stored}
    assert [c.id for c in stored_cases(["indrnn"])] == ["indrnn_eval", "indrnn_train"]
    case = stored_cases(["indrnn"])[0]
    np.testing.assert_array_equal(case.expected["f"], load_npz(default_root() / "indrnn_eval" / "expected.npz")["f"])
    assert case.tolerances("float64", "bound") == tolerances_of(load_manifest()["cases"]["indrnn_eval"])     # as ntpref verify
