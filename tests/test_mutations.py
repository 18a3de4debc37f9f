"""The mutation benchmark (benchmarks/mutations.py, ``python -m benchmarks.mutations``) on a small NumPy-only
slice: relative perturbations of the oracle's outputs are caught and the report names the perturbed array,
broken NumPy implementations (tests/conformance_adapters/) fail with the departure at the first quantity
the bug changes, and the oracle's NumPy backend on symmetry-moved inputs passes. The whole benchmark (with
the PyTorch bugs and the framework adapters) is the slow test at the end.
"""
import re
from pathlib import Path

import numpy as np
import pytest

from benchmark_harness import harness as bm
from ntpref.oracle import contract
from ntpref.oracle.cases import cases

ADAPTERS = Path(__file__).resolve().parent / "conformance_adapters"
EVAL_IDS = ("shallow_eval_perturbed", "twostage_eval_lengths_repeats", "r0_twostage_1_eval_saturated",
            "r0_shallow_0_eval_paired_mask")
TRAIN_IDS = ("r0_shallow_2_train_projgd",)


@pytest.fixture(scope="module")
def selected():
    """Stored and random eval cases of the two-stage and shallow models (a paired initialisation among
    them, f = 0 exactly) and one ProjGD case."""
    chosen = {c.id: c for c in cases(models=["twostage", "shallow"], random=3)}
    return [chosen[i] for i in EVAL_IDS + TRAIN_IDS]


def test_perturbations_are_caught_and_named(selected):
    records = bm.sweeps.perturbation_sweep(selected[:len(EVAL_IDS)], exponents=(3, 8),
                                        arrays=("f", "loss", "attn", "grad_U"))
    records += bm.sweeps.perturbation_sweep(selected[len(EVAL_IDS):], precisions=("float64",), exponents=(3, 8),
                                         arrays=("val_loss", "grad_norm_W", "W"))
    visible = [r for r in records if r["visible"]]
    assert {(r["case"], r["array"]) for r in records if not r["visible"]} == {("r0_shallow_0_eval_paired_mask", "f")}
    for r in visible:
        assert r["named"] == r["caught"], r
        if r["precision"] == "float64":
            assert r["caught"] == [3, 8] and r["k_star"] == 8, r
        elif r["array"] != "grad_U":    # float32 computes the gradients of a saturated attention with cancellation
            assert r["caught"] == [3] and r["k_star"] == 3, r


def test_a_perturbation_moves_one_array_by_the_relative_amount(selected):
    case = selected[0]
    out = bm.sweeps.perturbed(case, "grad_U", 6)["evaluate"]("shallow", {})
    ratio = out["grad_U"] / case.expected["grad_U"]
    assert np.allclose(np.abs(ratio - 1.0), 1e-6, rtol=1e-6)
    assert set(np.sign(ratio - 1.0).ravel()) == {-1.0, 1.0}
    assert all(out[k] is case.expected[k] for k in out if k != "grad_U")


def test_numpy_bugs_fail_at_the_first_quantity_they_change(selected):
    bugs = [bm.sweeps.Bug("1/m", "shallow", ADAPTERS / "one_over_m.py", bm.sweeps.forward),
            bm.sweeps.Bug("padding", "twostage", ADAPTERS / "softmax_over_padding.py", bm.sweeps.forward),
            bm.sweeps.Bug("detached", "shallow", ADAPTERS / "detached_attention.py",
                       bm.sweeps.by_kind(bm.sweeps.at("grad_W"), bm.sweeps.at("grad_norm_W", 0)))]
    records = {(r["bug"], r["case"]): r for r in bm.sweeps.bug_sweep(bugs, selected)}
    expected = {("1/m", "shallow_eval_perturbed"): ("f", None),
                ("1/m", "r0_shallow_0_eval_paired_mask"): ("grad_c", None),   # f = 0 whatever the scale
                ("padding", "twostage_eval_lengths_repeats"): ("attn", None),
                ("padding", "r0_twostage_1_eval_saturated"): ("attn", None),
                ("detached", "shallow_eval_perturbed"): ("grad_W", None),
                ("detached", "r0_shallow_0_eval_paired_mask"): ("grad_W", None),
                ("detached", "r0_shallow_2_train_projgd"): ("grad_norm_W", 0)}
    assert {k: r["departure"] for k, r in records.items() if r["status"] == "FAIL"} == expected   # every case run fails
    assert records[("1/m", "r0_shallow_0_eval_paired_mask")]["placement"] == "later"
    assert records[("1/m", "r0_shallow_0_eval_paired_mask")]["origin_move"] == 0.0
    assert all(r["placement"] == "origin" for k, r in records.items() if k != ("1/m", "r0_shallow_0_eval_paired_mask"))


def test_symmetries_move_the_input():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3, 5, 2))
    moved = bm.symmetries.KEYS.apply("shallow", {"X": X}, rng.permutation)[0]["X"]
    assert np.array_equal(moved[:, -1], X[:, -1]) and not np.array_equal(moved, X)
    assert np.array_equal(np.sort(moved, axis=1), np.sort(X, axis=1))
    inputs = {"tokens": np.array([[0, 1, 2, 3], [4, 5, -1, -1]]), "lengths": np.array([4, 2]),
              "targets": np.array([1, 2])}
    moved, undo = bm.symmetries.KEYS.apply("twostage", inputs, bm.symmetries.reversal)
    assert list(moved["tokens"][0]) == [2, 1, 0, 3]
    assert list(moved["tokens"][1]) == [4, 5, -1, -1] and moved["tokens"][0, 3] == 3
    attn = np.where(moved["tokens"] >= 0, moved["tokens"], 0) * 1.0
    assert np.array_equal(undo({"attn": attn})["attn"], np.where(inputs["tokens"] >= 0, inputs["tokens"], 0))


def test_features_symmetry_is_exact_and_moves_the_outputs_back():
    """P X, P U_i, P W_i Pᵀ leave every output of the shallow transformer unchanged up to the moves back, and
    E → P E (the one-hot E given as the permutation) those of the two-stage model."""
    rng = np.random.default_rng(2)
    d, m = 3, 4
    inputs = {"model": "shallow", "X": rng.standard_normal((5, 4, d)), "y": rng.standard_normal(5),
              "c": rng.standard_normal(m), "U": rng.standard_normal((m, d)), "W": rng.standard_normal((m, d, d))}
    moved, undo = bm.symmetries.FEATURES.apply("shallow", inputs, bm.symmetries.reversal)
    assert np.array_equal(moved["X"], inputs["X"][..., ::-1]) and np.array_equal(moved["W"], inputs["W"][:, ::-1, ::-1])
    plain, theirs = contract.evaluate(inputs, backend="numpy"), contract.evaluate(moved, backend="numpy")
    back = undo(theirs)
    for name in ("f", "loss", "grad_c", "grad_U", "grad_W"):
        assert np.allclose(back[name], plain[name], rtol=1e-13, atol=1e-15), name
    assert not np.allclose(theirs["grad_W"], plain["grad_W"])
    K = 4
    inputs = {"model": "twostage", "tokens": np.array([[0, 1, 2, 3], [3, 1, 2, -1]]), "lengths": np.array([4, 3]),
              "targets": np.array([1, 0]), "K": np.array(K), "W_ov": rng.standard_normal((K, K)),
              "W_kq": rng.standard_normal((K, K))}
    moved, undo = bm.symmetries.FEATURES.apply("twostage", inputs, rng.permutation)
    assert "K" not in moved and sorted(np.argmax(moved["E"], axis=0)) == list(range(K))
    plain, back = contract.evaluate(inputs, backend="numpy"), undo(contract.evaluate(moved, backend="numpy"))
    for name in ("loss", "logits", "attn", "grad_W_ov", "grad_W_kq"):
        assert np.allclose(back[name], plain[name], rtol=1e-13, atol=1e-15), name


def test_symmetry_moved_numpy_backend_passes(selected):
    members = [bm.sweeps.Member(f"numpy {s.name}", "float64", bm.symmetries.adapter([s]), s.models)
               for s in bm.symmetries.SYMMETRIES]
    members.append(bm.sweeps.Member("numpy all", "float64", bm.symmetries.adapter(bm.symmetries.SYMMETRIES),
                                 bm.symmetries.applicable(bm.symmetries.SYMMETRIES)))
    members.append(bm.sweeps.Member("numba reversed", "float64",
                                    bm.symmetries.adapter(bm.symmetries.SYMMETRIES, backend="numba", reverse=True,
                                                          where_applicable=True), ("twostage", "shallow")))
    records = bm.sweeps.family_sweep(members, selected)
    assert {r["status"] for r in records} == {"pass"}
    assert {r["member"] for r in records} == {m.name for m in members}
    slack = bm.mutations.slack_summary(records)
    assert min(s["float64"]["min"] for s in slack.values()) > 1.0
    document = {"perturbations": bm.sweeps.perturbation_sweep(selected[:1], precisions=("float64",), exponents=(4,)),
                "family": records, "seconds": {}, "cases": [c.id for c in selected], "stored": True, "random": 3,
                "seed": 0, "policy": "calibrated"}
    text = bm.mutations.markdown(document)
    assert text.startswith("Policy: calibrated.")
    row = next(line for line in text.splitlines() if line.startswith("| grad_W "))
    assert [cell.strip() for cell in row.split("|")[1:4]] == ["grad_W", "1", "1e-04"]
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")]
    assert rows.index("head_s") > rows.index("grad_W")        # the intermediates too, after the outputs
    named = re.search(r"Departure of the caught perturbations: the perturbed array named in (\d+) of (\d+)\.", text)
    assert named and named.group(1) == named.group(2) and int(named.group(1)) >= 5
    assert "| numpy all " in text


def test_the_exact_backends_loops_in_rounded_arithmetic_pass(selected):
    """benchmarks/rounded.py: float64 with compensated sums and float32 with and without fused multiply-adds
    pass every case of the slice in their precision, with room to spare, and round differently from one
    another and from the oracle."""
    members = bm.rounded.members()
    assert [(m.precision, m.name.split(", ", 2)[2]) for m in members] == [
        ("float64", "compensated sums"), ("float32", "fused multiply-adds"), ("float32", "separate multiply and add")]
    records = bm.sweeps.family_sweep(members, selected)
    assert len(records) == 3 * len(selected) and {r["status"] for r in records} == {"pass"}
    assert max(row["ratio"] for r in records for row in r["rows"]) < 0.5
    case = selected[0]
    inputs = {k: np.array(v) for k, v in case.inputs.items() if k != "model"}
    grads = [m.adapter["evaluate"](case.model, inputs)["grad_W"] for m in members]
    oracle = contract.evaluate(case.inputs)["grad_W"]
    assert not np.array_equal(grads[0], oracle) and not np.array_equal(grads[1], grads[2])


def test_command_refuses_a_bad_output_before_running(tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert bm.mutations.main(["--quick", "--json", str(tmp_path / "file" / "out.json")]) == 2
    assert "error" in capsys.readouterr().err


@pytest.mark.slow
def test_whole_quick_benchmark(tmp_path):
    """``python -m benchmarks.mutations --quick``: no correct implementation fails, every structural bug is
    caught wherever it changes an output, no departure precedes a bug's origin and every caught
    perturbation is named."""
    pytest.importorskip("torch")
    pytest.importorskip("jax")
    import json

    assert bm.mutations.main(["--quick", "-q", "--json", str(tmp_path / "m.json")]) == 0
    document = json.loads((tmp_path / "m.json").read_text())
    assert all(r["status"] != "FAIL" for r in document["family"])
    summary = bm.mutations.bug_summary(document["bugs"])
    assert all(s["caught"] and not s["missed"] and not s["placement"].get("earlier") for s in summary)
    assert all(r["named"] == r["caught"] for r in document["perturbations"])


def test_the_sweeps_judge_by_the_policy_they_are_given():
    """A 1e-9 error of the cancelling grad_W_kq of a general-E evaluation: caught under the calibrated
    default, not under the running error bound."""
    (case,) = [c for c in cases(["twostage"], random=1, stored=False) if c.id == "r0_twostage_0_eval_general_E"]
    caught = {policy: bm.sweeps.perturbation_sweep([case], ("float64",), (9,), ["grad_W_kq"], policy)[0]["caught"]
              for policy in ("calibrated", "bound")}
    assert caught == {"calibrated": [9], "bound": []}


def test_the_shallow_papers_own_model_passes_where_it_applies():
    """benchmarks/authors_model.py: the paper's Transformer and IndiRNN (their forward and project_) in the
    restatement's loop pass every shallow and IndRNN case they can express, and skip the others with the
    reason. Needs a checkout of their repository, named by NTPREF_AUTHORS_CHECKOUT."""
    import os
    from unittest import mock

    checkout = os.environ.get("NTPREF_AUTHORS_CHECKOUT")
    if not checkout:
        pytest.skip("NTPREF_AUTHORS_CHECKOUT (a checkout of enesarda22/nonasymptotic-transformer) is not set")
    pytest.importorskip("torch")
    authors = bm.authors_model
    module = authors.load(checkout)
    selected = [c for c in cases(models=["shallow", "indrnn"], random=4) if not c.id.startswith("shallow_eval")]
    calls = {"forward": 0, "project_": 0}

    def counting(cls, name):
        original = getattr(cls, name)

        def counted(self, *args):
            calls[name] += 1
            return original(self, *args)
        return mock.patch.object(cls, name, counted)

    member = bm.sweeps.Member("theirs", "float64", authors.AuthorsModel(module), ("shallow", "indrnn"))
    with counting(module.Transformer, "forward"), counting(module.Transformer, "project_"), \
            counting(module.IndiRNN, "forward"), counting(module.IndiRNN, "project_"):
        records = bm.sweeps.family_sweep([member], selected)
    status = {r["case"]: r["status"] for r in records}
    skipped = {c.id for c in selected if "tau_att" in c.inputs and float(c.inputs["tau_att"]) != 1.0}
    assert {k for k, v in status.items() if v == "skip"} == skipped
    assert all(v == "pass" for k, v in status.items() if k not in skipped) and len(status) > len(skipped) + 8
    assert calls["forward"] > 0 and calls["project_"] > 0
    with pytest.raises(NotImplementedError, match="two-stage"):
        authors.AuthorsModel(module).evaluate("twostage", {})
