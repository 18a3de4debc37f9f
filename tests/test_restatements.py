"""Knowledge stated twice on purpose stays in step (docs/architecture.md, "How to add ...").

The exact backend (ntpref/exact/) and the shipped adapters (examples/adapters/) restate the models
independently of the float64 backends, so each has its own table of activations and its own equations
for the outputs. These tests hold every copy to the models' own tables:

* every activation of ``ntpref.shallow.activation.ACTIVATIONS`` is known to the exact backend, with the
  same σ and σ' (to a few float64 roundings), and to every shipped adapter, whose outputs for it are the
  oracle's;
* every eval output of every model has its magnitude (the float64 tolerance policy's form) and an exact
  implementation, or is listed by the exact backend as not computed.
"""
import importlib.util

import mpmath
import numpy as np
import pytest

from ntpref import exact
from ntpref.exact import arith
from ntpref.models import SPECS
from ntpref.oracle import contract
from ntpref.oracle.adapters import load_adapter
from ntpref.oracle.cases import random_cases
from ntpref.shallow.activation import ACTIVATIONS
from ntpref.shipped import ADAPTERS, adapter_path

POINTS = np.array([-3.5, -0.7, 0.0, 0.3, 1.9, 6.0])


def test_the_exact_backend_knows_every_activation_with_the_same_formulas():
    assert set(arith.ACTIVATIONS) == set(ACTIVATIONS)
    for name, entry in ACTIVATIONS.items():
        sigma, dsigma = arith.activation(name)
        with mpmath.workdps(50):
            exact_sigma = np.array([float(sigma(mpmath.mpf(x))) for x in POINTS])
            exact_dsigma = np.array([float(dsigma(mpmath.mpf(x))) for x in POINTS])
        np.testing.assert_allclose(entry.sigma_np(POINTS), exact_sigma, rtol=4e-16, atol=1e-300, err_msg=name)
        # σ' = 1 − tanh² cancels for large |x|: its error is a few roundings of 1, not of σ'
        np.testing.assert_allclose(entry.dsigma_np(POINTS), exact_dsigma, rtol=1e-14, atol=1e-15, err_msg=name)


def _eval_input(model: str, activation: str) -> dict:
    """A small eval input of ``model`` (n = 3 samples of T = 3 tokens, d = 2, m = 4) with ``activation``;
    the scales put the pre-activations where tanh and erf(x/√2) differ."""
    rng = np.random.default_rng(7)
    n, T, d, m = 3, 3, 2, 4
    blocks = {"shallow": {"c": (m,), "U": (m, d), "W": (m, d, d)},
              "indrnn": {"c": (m,), "u": (m,), "W_in": (m, d)}}[model]
    arrays = {"X": rng.standard_normal((n, T, d)), "y": rng.standard_normal(n)}
    arrays.update({name: 1.5 * rng.standard_normal(shape) for name, shape in blocks.items()})
    return {"model": np.array(model), **arrays, "activation": np.array(activation)}


SHALLOW_MODELS = [name for name in SPECS if "activation" in {i.name for i in SPECS[name].inputs}]


#: The shipped restatements (PyTorch, JAX); the shipped NumPy adapters are the oracle itself or fail on purpose.
RESTATEMENTS = [name for name, (directory, _, _) in ADAPTERS.items() if directory == "adapters"]


@pytest.mark.parametrize("adapter", RESTATEMENTS)
def test_every_shipped_adapter_computes_every_activation(adapter):
    """Each activation through the adapter: its outputs are the oracle's (the activations' outputs differ
    from one another far beyond the tolerance, so an adapter that computed one as another would fail)."""
    framework = ADAPTERS[adapter][2]
    if importlib.util.find_spec(framework) is None:
        pytest.skip(f"{framework} is not installed")
    implementation = load_adapter(adapter_path(adapter))
    rtol = 1e-4 if adapter.endswith("float32") else 1e-10
    assert SHALLOW_MODELS
    for model in SHALLOW_MODELS:
        outputs = {a: contract.evaluate(_eval_input(model, a)) for a in ACTIVATIONS}
        for activation, expected in outputs.items():
            others = [o["f"] for a, o in outputs.items() if a != activation]
            assert all(np.max(np.abs(o - expected["f"])) > 10 * rtol * np.max(np.abs(expected["f"])) for o in others)
            inputs = {k: v for k, v in _eval_input(model, activation).items() if k != "model"}
            returned = implementation.evaluate(model, inputs)
            for name, value in expected.items():
                got = np.asarray(returned[name], dtype=np.float64)
                scale = np.max(np.abs(value))
                assert np.max(np.abs(got - value)) <= rtol * scale, (adapter, model, activation, name)


@pytest.mark.parametrize("model", list(SPECS))
def test_every_eval_output_has_a_magnitude_and_an_exact_implementation(model):
    """On the model's first random eval case: the policy's magnitudes name every eval output, and the exact
    backend computes every one of them or lists it in its NOT_COMPUTED."""
    spec = SPECS[model]
    case = next(c for c in random_cases([model], 8, 0) if c.kind == "eval")
    magnitudes = spec.magnitudes(case.inputs, "eval")
    assert set(spec.outputs("eval")) <= set(magnitudes), sorted(set(spec.outputs("eval")) - set(magnitudes))
    computed = exact.evaluate(case.inputs)
    not_computed = exact.MODELS[model].NOT_COMPUTED
    missing = [n for n in spec.outputs("eval") if n not in computed and n not in not_computed]
    assert not missing, missing
    assert set(computed) <= set(spec.outputs("eval"))
