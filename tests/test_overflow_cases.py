"""The cases beyond exp's overflow (the random regimes ``eval_overflow`` and the stored cases
``twostage_eval_overflow``, ``shallow_eval_overflow``): they reach scores and logits above log(max float) in
float64 (709.78) and float32 (88.72), the oracle stays finite there, implementations with a textbook formula
that is not stabilised (tests/conformance_adapters/naive_formulas.py: a softmax without its largest score
subtracted, a loss as −log of the softmax quotient) fail them in both precisions with the array the formula
first computes named, and correct implementations pass them. The shipped framework adapters run every case,
these included, in tests/test_crosscheck.py.
"""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from ntpref.oracle.cases import random_case, stored_cases
from ntpref.oracle.conformance import check

torch = pytest.importorskip("torch", reason="the naive adapters are PyTorch restatements (pip install torch)")

ADAPTERS = Path(__file__).resolve().parent / "conformance_adapters"
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "adapters"
#: log of the largest finite number: exp overflows above it.
OVERFLOW = {p: float(np.log(np.finfo(p).max)) for p in ("float64", "float32")}
#: Index of the overflow regime among each model's random regimes (ntpref/*/cases.py).
REGIME = {"twostage": 5, "shallow": 4}


def _naive_formulas():
    spec = importlib.util.spec_from_file_location("naive_formulas", ADAPTERS / "naive_formulas.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NAIVE = _naive_formulas()
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def overflow_cases(model):
    """The stored overflow case of ``model`` and its random overflow case of seed 0."""
    stored = [c for c in stored_cases([model]) if c.id == f"{model}_eval_overflow"]
    return stored + [random_case(model, REGIME[model], 0)]


def twostage_scores(inputs):
    """The attention scores s_l = W_kq[τ_l, q] of every position inside a sentence (one-hot E), flattened."""
    tokens, lengths, W_kq = inputs["tokens"], inputs["lengths"], inputs["W_kq"]
    inside = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    query = tokens[np.arange(len(lengths)), lengths - 1]
    return W_kq[np.where(inside, tokens, 0), query[:, None]][inside]


def shallow_scores(inputs):
    """The largest |score| |x_t^T W_i x_T| / tau_att of each head i over the samples and keys [m]."""
    z = np.einsum("ntd,mde,ne->mnt", inputs["X"], inputs["W"], inputs["X"][:, -1, :]) / float(inputs["tau_att"])
    return np.abs(z).reshape(len(z), -1).max(axis=1)


@pytest.mark.parametrize("model", REGIME)
def test_the_cases_reach_beyond_the_overflow_of_exp_and_the_oracle_stays_finite(model):
    cases = overflow_cases(model)
    assert [c.id for c in cases] == [f"{model}_eval_overflow", f"r0_{model}_{REGIME[model]}_eval_overflow"]
    for case in cases:
        if model == "twostage":
            assert twostage_scores(case.inputs).min() > OVERFLOW["float64"]
            assert case.expected["logits"].min() > OVERFLOW["float64"]
            assert np.all(np.asarray(case.inputs["W_ov"]) > OVERFLOW["float64"])   # L0's logits: columns of W_ov
        else:
            largest = shallow_scores(case.inputs)
            assert largest.max() > OVERFLOW["float64"]
            assert np.any((largest > OVERFLOW["float32"]) & (largest < OVERFLOW["float64"]))
            assert largest.min() < OVERFLOW["float32"]
        for name, value in case.expected.items():
            assert np.all(np.isfinite(value)), (case.id, name)
        for precision in OVERFLOW:
            for name, tol in case.tolerances(precision).items():
                assert np.isfinite(tol.atol) and np.isfinite(tol.rtol), (case.id, precision, name)


#: (formula, model) → (the arrays it makes fail, the first of them in the order of computation).
FAILS = {("softmax", "twostage"): ({"loss", "logits", "attn", "grad_W_ov", "grad_W_kq"}, "attn"),
         ("softmax", "shallow"): ({"f", "loss", "grad_c", "grad_U", "grad_W"}, "f"),
         ("cross-entropy", "twostage"): ({"loss", "grad_W_ov", "grad_W_kq", "loss0", "grad0_W_ov"}, "loss")}


@pytest.mark.parametrize("precision", DTYPES)
@pytest.mark.parametrize("formula, model", FAILS)
def test_a_naive_formula_fails_in_both_precisions_naming_the_array(formula, model, precision):
    failing, first = FAILS[(formula, model)]
    adapter = NAIVE.naive_adapter(formula, DTYPES[precision])
    for case in overflow_cases(model):
        report = check(adapter, case, precision=precision)
        assert not report.ok, report
        assert {r.name for r in report.rows if not r.ok} == failing, report
        assert report.departure == (first, None), report
        assert all(r.ok for r in report.rows if r.name not in failing), report


@pytest.mark.parametrize("formula", ["softmax", "cross-entropy"])
def test_a_naive_formula_passes_below_the_overflow(formula):
    """On the moderately saturated two-stage case (scores and logits below 709.8) the naive formulas are
    accurate in float64: the overflow cases, not a difference of the adapters, make them fail."""
    case = random_case("twostage", 1, 0)
    assert case.id == "r0_twostage_1_eval_saturated"
    assert np.abs(case.expected["logits"]).max() < OVERFLOW["float64"]
    report = check(NAIVE.naive_adapter(formula, torch.float64), case)
    assert report.ok, report


@pytest.mark.parametrize("adapter, precision", [(ADAPTERS / "oracle_numpy.py", "float64"),
                                                (ADAPTERS / "float32_outputs.py", "float32"),
                                                (EXAMPLES / "torch_float64.py", "float64"),
                                                (EXAMPLES / "torch_float32.py", "float32")])
def test_correct_implementations_pass_the_overflow_cases(adapter, precision):
    for model in REGIME:
        for case in overflow_cases(model):
            report = check(adapter, case, precision=precision)
            assert report.ok and report.rows, report
            assert all(r.ok for r in report.rows), report
