"""The public API of ntpref.shallow and ntpref.shallow.indrnn (docs/api.md): the exported names against the
documented ones, the example of the docs, a cheap import, and data prepared for the model called."""
import contextlib
import inspect
import io
import re
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from ntpref import shallow
from ntpref.errors import InputError
from ntpref.shallow import indrnn

API_MD = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def section() -> str:
    """The `## ntpref.shallow and ntpref.shallow.indrnn` section of docs/api.md."""
    return API_MD.read_text().split("## ntpref.shallow and ntpref.shallow.indrnn\n", 1)[1].split("\n## ", 1)[0]


def test_the_package_exports_exactly_the_documented_names():
    names = re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_]*)`", section(), flags=re.MULTILINE)
    assert len(names) == len(set(names)) and len(names) > 20
    assert sorted(shallow.__all__) == sorted(names)
    for name in names:
        value = getattr(shallow, name)
        home = value.__name__ if isinstance(value, types.ModuleType) else value.__module__
        assert home.startswith("ntpref.shallow."), name
    listed = {w for line in shallow.__doc__.splitlines() if line.startswith("    ") for w in re.findall(r"\w+", line)}
    assert set(names) <= listed                                   # the package docstring lists every name


def test_the_indrnn_module_exports_exactly_the_documented_names():
    names = re.findall(r"^\| `indrnn\.([A-Za-z_][A-Za-z0-9_]*)`", section(), flags=re.MULTILINE)
    assert len(names) == len(set(names)) and len(names) > 5
    assert sorted(indrnn.__all__) == sorted(names)
    assert all(hasattr(indrnn, name) for name in names)


def test_api_example_of_the_docs_runs_and_prints_what_it_shows():
    """The example of the section, run as written; each printed line is the comment below its print."""
    code = re.findall(r"```python\n(.*?)```", section(), flags=re.DOTALL)
    assert len(code) == 1
    shown = [line[2:] for line in code[0].splitlines() if line.startswith("# ")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code[0], str(API_MD), "exec"), {})
    assert out.getvalue().splitlines() == shown and len(shown) == 2


def test_importing_compiles_nothing():
    """Importing the package loads no Numba kernel: every dispatcher is still without a compiled signature."""
    code = ("import numba, sys\nimport ntpref.shallow\n"
            "mods = [m for n, m in sys.modules.items() if n.startswith('ntpref.shallow')]\n"
            "kernels = [v for m in mods for v in vars(m).values() if isinstance(v, numba.core.dispatcher.Dispatcher)]\n"
            "assert len(kernels) > 10, len(kernels)\n"
            "print(sum(len(k.signatures) for k in kernels))\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    assert out.stdout.strip() == "0"


# per model: its module, the other model's prepare, the name that module's Batch is printed as, and its
# state function (head_states for the transformer, hidden_states for the IndRNN)
MODELS = {
    "shallow": (shallow, indrnn.prepare, "ntpref.shallow.indrnn.Batch", "ntpref.shallow.prepare", shallow.head_states),
    "indrnn": (indrnn, shallow.prepare, "ntpref.shallow.model.Batch", "ntpref.shallow.indrnn.prepare",
               indrnn.hidden_states),
}


def _problem(model: str):
    """Tokens X [4, 3, 2] with ‖x_t‖ ≤ 1, targets y [4] and the model's paired parameters (m = 4)."""
    rng = np.random.default_rng(5)
    X = shallow.scale_tokens(rng.standard_normal((4, 3, 2)))
    return X, rng.standard_normal(4), MODELS[model][0].paired_init(4, 2, seed=3)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("other", [False, True], ids=["array", "other-model"])
def test_data_must_be_prepared_by_the_model(model, other):
    module, other_prepare, other_name, own_prepare, states = MODELS[model]
    X, y, params = _problem(model)
    data, got = (other_prepare(X, y), other_name) if other else (X, "numpy.ndarray")
    message = rf"^data: expected the prepared data of {re.escape(own_prepare)}\(X, y\), got {re.escape(got)}$"
    for call in (lambda: module.forward(data, *params), lambda: module.loss_and_grad(data, *params),
                 lambda: states(data, *params[1:])):
        with pytest.raises(InputError, match=message):
            call()


@pytest.mark.parametrize("model", MODELS)
def test_loss_needs_targets(model):
    module = MODELS[model][0]
    X, _, params = _problem(model)
    with pytest.raises(InputError, match=r"^array 'y': the loss needs targets y \[n\]$"):
        module.loss_and_grad(module.prepare(X), *params)


@pytest.mark.parametrize("model", MODELS)
def test_the_model_record_matches_the_public_api(model):
    """The record through which the trainer and the file contract handle a model (evaluation.Model) names
    the module's own prepare, types and results: options = prepare's keywords, LossAndGrad = (loss,
    grad_<block> per block in order, f), the logged block one of the blocks."""
    module, _, _, own_prepare, _ = MODELS[model]
    record = shallow.model.MODEL if model == "shallow" else indrnn.MODEL
    assert record.name == model and shallow.projgd.model_named(model) is record
    assert record.prepare is module.prepare and record.prepare_name == own_prepare
    assert record.Batch is module.Batch and record.Params is module.Params and record.LossAndGrad is module.LossAndGrad
    keywords = [p.name for p in inspect.signature(module.prepare).parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert record.options == tuple(keywords) and record.Batch._fields[:2] == ("X", "y")
    assert record.LossAndGrad._fields == ("loss", *(f"grad_{b}" for b in record.blocks), "f")
    assert record.logged in record.blocks
    X, y, _ = _problem(model)
    assert shallow.projgd.model_of(module.prepare(X, y)) is record
