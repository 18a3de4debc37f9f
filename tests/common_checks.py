"""Checks every model of the oracle must pass, written once and run over all three models.

A :class:`ModelCase` describes one model (and one choice of its options): how to draw a small random
input, how to call the library's loss-and-gradient function on it, and the names of its parameters.
An input is a dict of arrays in the interchange layout of docs/contract.md (``model``, the data, the
parameters, the options as 0-d arrays), so the float64 tolerance policy
(:func:`ntpref.oracle.policies.bound.bound_tolerances`) applies to it directly. The checks:

* :func:`check_gradients` — every closed-form gradient entry against central finite differences of the
  loss (:func:`ntpref.oracle.gradcheck.gradcheck`);
* :func:`check_backends_agree` — the NumPy backend (which restates the equations) against the Numba
  kernels, array by array, under the float64 policy (:func:`ntpref.oracle.compare.compare_arrays`);
* :func:`check_thread_determinism` — the Numba backend returns bitwise the same arrays with 1 and 2 threads;
* :func:`check_rejects_bad_parameter` — a parameter of the wrong shape or dtype, or holding NaN, is an
  InputError whose message names the array.

tests/test_common_checks.py runs each check over :data:`CASES`; tests/test_robust_properties.py runs them
on inputs of random shapes and scales.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.oracle.compare import compare_arrays
from ntpref.oracle.gradcheck import gradcheck
from ntpref.oracle.policies.bound import bound_tolerances
from ntpref import shallow
from ntpref.shallow import indrnn, indrnn_kernels
from ntpref.shallow.contract import input_data, input_kappa
from ntpref.twostage import kernels as twostage_kernels
from ntpref.twostage import model as twostage_model
from ntpref.twostage import Dataset

FAULTS = ("shape", "dtype", "nan")


class Size(NamedTuple):
    """Sizes of a drawn input: n samples (sentences), T tokens per sample (the longest sentence), d the
    token dimension (twostage: the vocabulary size K), m heads / units (unused by twostage), and the
    scale of the random parameters."""

    n: int = 6
    T: int = 5
    d: int = 3
    m: int = 4
    scale: float = 0.7


@dataclass(frozen=True)
class ModelCase:
    """One model with one choice of options.

    draw(rng, size) -> input dict; loss_and_grad(inputs, backend) -> outputs named as by ``ntpref eval``
    ("loss", "grad_<param>", and "f" for the shallow models); extras(inputs, backend) -> further outputs
    of the same evaluation that the tolerance policy covers (logits and attention, or head states).
    parallel_n: a sample count at which every parallel Numba kernel of the model has several work items;
    parallel_switches: (module, attribute, value) settings that force the parallel code path.
    """

    id: str
    model: str
    params: tuple[str, ...]
    draw: Callable[[np.random.Generator, Size], dict]
    loss_and_grad: Callable[[Mapping, str], dict]
    extras: Callable[[Mapping, str], dict]
    parallel_n: int
    parallel_switches: tuple = ()

    def outputs(self, inputs: Mapping, backend: str) -> dict:
        """Every output the checks compare: loss, gradients, f, and the extras."""
        return {**self.loss_and_grad(inputs, backend), **self.extras(inputs, backend)}


# --- two-stage transformer (docs/twostage.md §2–§3) ------------------------------------------------------

def _twostage_draw(embedding: str):
    def draw(rng: np.random.Generator, size: Size) -> dict:
        """Sentences of lengths 1..T (every length once n >= T), each with a repeated token (twice the
        query when long enough), random targets; one-hot embeddings (K = d) or Gaussian E [d + 1, d]."""
        K = size.d
        lengths = 1 + np.arange(size.n) % size.T
        tokens = np.where(np.arange(size.T)[None, :] < lengths[:, None], rng.integers(0, K, (size.n, size.T)), -1)
        for i, L in enumerate(lengths):
            if L >= 2:
                tokens[i, 0] = tokens[i, L - 1]
        d = K if embedding == "onehot" else K + 1
        inputs = {"model": np.array("twostage"), "tokens": tokens, "lengths": lengths,
                  "targets": rng.integers(0, K, size.n),
                  "W_ov": size.scale * rng.standard_normal((d, d)), "W_kq": size.scale * rng.standard_normal((d, d))}
        if embedding == "onehot":
            inputs["K"] = np.array(K)
        else:
            inputs["E"] = rng.standard_normal((d, K))
        return inputs
    return draw


def _dataset(inputs: Mapping) -> Dataset:
    E = inputs["E"] if "E" in inputs else np.eye(int(inputs["K"]))
    return Dataset(inputs["tokens"], inputs["lengths"], inputs["targets"], E)


def _twostage_loss_and_grad(inputs: Mapping, backend: str) -> dict:
    loss, g_ov, g_kq = twostage_model.loss_and_grad(_dataset(inputs), inputs["W_ov"], inputs["W_kq"], backend=backend)
    return {"loss": np.array(loss), "grad_W_ov": g_ov, "grad_W_kq": g_kq}


def _twostage_extras(inputs: Mapping, backend: str) -> dict:
    fw = twostage_model.forward(_dataset(inputs), inputs["W_ov"], inputs["W_kq"], backend=backend)
    return {"logits": fw.logits, "attn": fw.attn}


# --- shallow transformer (docs/shallow.md §1–§2) and IndRNN (docs/shallow.md §6) -------------------------

def _sequence_draw(model: str, options: Mapping):
    def draw(rng: np.random.Generator, size: Size) -> dict:
        """Tokens N(0, I) scaled into the unit ball (docs/shallow.md §5), targets N(0, 1), generic
        (unpaired) parameters: c N(0, 1); shallow U N(0, 1), W scale·N(0, 1); indrnn u uniform on
        ±1.2·scale, W_in scale·N(0, 1)."""
        n, T, d, m, scale = size
        inputs = {"model": np.array(model), "X": shallow.scale_tokens(rng.standard_normal((n, T, d))),
                  "y": rng.standard_normal(n), "c": rng.standard_normal(m)}
        if model == "shallow":
            inputs.update(U=rng.standard_normal((m, d)), W=scale * rng.standard_normal((m, d, d)))
        else:
            inputs.update(u=scale * rng.uniform(-1.2, 1.2, m), W_in=scale * rng.standard_normal((m, d)))
        return {**inputs, **{k: np.array(v) for k, v in options.items()}}
    return draw


def _sequence_loss_and_grad(model: str):
    api = shallow if model == "shallow" else indrnn

    def loss_and_grad(inputs: Mapping, backend: str) -> dict:
        """The model's loss_and_grad on the input's prepared data (X, y and the options)."""
        result = api.loss_and_grad(input_data(model, inputs), *(inputs[p] for p in api.Params._fields),
                                   kappa=input_kappa(inputs), backend=backend)
        return {"f": result.f, "loss": np.array(result.loss),
                **{f"grad_{p}": g for p, g in zip(api.Params._fields, result[1:-1])}}
    return loss_and_grad


def _shallow_extras(inputs: Mapping, backend: str) -> dict:
    s, a, MU = shallow.head_states(input_data("shallow", inputs), inputs["U"], inputs["W"], backend=backend)
    return {"head_s": s, "head_a": a, "head_MU": MU}


def _no_extras(inputs: Mapping, backend: str) -> dict:
    return {}


def twostage_case(id: str, embedding: str) -> ModelCase:
    """The two-stage model with one-hot ("onehot") or Gaussian ("gaussian") embeddings."""
    return ModelCase(id, "twostage", ("W_ov", "W_kq"), _twostage_draw(embedding), _twostage_loss_and_grad,
                     _twostage_extras, parallel_n=2 * twostage_kernels.BLOCK + 13,
                     parallel_switches=((twostage_model, "PARALLEL_MIN_WORK", 0),))


def shallow_case(id: str, **options) -> ModelCase:
    """The shallow multi-head transformer with the given options (kappa, tau_att, mask_last_key, activation)."""
    return ModelCase(id, "shallow", ("c", "U", "W"), _sequence_draw("shallow", options),
                     _sequence_loss_and_grad("shallow"), _shallow_extras, parallel_n=101)    # several samples in each of the kernels' 32 sample blocks


def indrnn_case(id: str, **options) -> ModelCase:
    """The IndRNN baseline with the given options (kappa, activation)."""
    return ModelCase(id, "indrnn", ("c", "u", "W_in"), _sequence_draw("indrnn", options),
                     _sequence_loss_and_grad("indrnn"), _no_extras, parallel_n=9 * indrnn_kernels.BLOCK + 5)


#: Every model, each with its defaults and with every non-default option at least once.
CASES = (
    twostage_case("twostage-onehot", "onehot"),
    twostage_case("twostage-gaussian", "gaussian"),
    shallow_case("shallow-defaults"),
    shallow_case("shallow-options", kappa=1.0, tau_att=0.6, mask_last_key=True, activation="erf"),
    indrnn_case("indrnn-defaults"),
    indrnn_case("indrnn-options", kappa=1.0, activation="erf"),
)
#: The default input size per model (twostage: d = K = 5 tokens, sentences of 1..6 tokens).
SIZES = {"twostage": Size(n=12, T=6, d=5), "shallow": Size(), "indrnn": Size(T=7)}


def default_input(case: ModelCase, seed: int = 12345, n: int | None = None) -> dict:
    """A small random input of ``case`` (``n`` samples instead of the default when given)."""
    size = SIZES[case.model]
    return case.draw(np.random.default_rng(seed), size if n is None else size._replace(n=n))


# --- the checks -----------------------------------------------------------------------------------------

@contextmanager
def numba_threads(count: int) -> Iterator[None]:
    """Run the block with ``count`` Numba threads, then restore the previous count."""
    before = numba.get_num_threads()
    numba.set_num_threads(count)
    try:
        yield
    finally:
        numba.set_num_threads(before)


def check_gradients(case: ModelCase, inputs: Mapping, backend: str, max_entries: int | None = None,
                    rtol: float = 1e-7, atol: float = 1e-8) -> None:
    """Every gradient of ``case`` (or ``max_entries`` random entries per parameter) equals the central
    finite difference of its loss, entry by entry: |grad − fd| <= atol + rtol |fd| (gradcheck defaults:
    rounding ~2e-10 |L| and truncation ~1e-12 at eps = 1e-6 for losses of order one).

    Runs on one Numba thread: the outputs are bitwise those of any thread count
    (:func:`check_thread_determinism`), and the hundreds of evaluations of a tiny input would otherwise
    each start the thread pool."""
    def fun(**arrays):
        out = case.loss_and_grad(arrays, backend)
        return float(out["loss"]), {p: out[f"grad_{p}"] for p in case.params}

    with numba_threads(1):
        report = gradcheck(fun, inputs, rtol=rtol, atol=atol, names=case.params, max_entries=max_entries)
    assert [row.name for row in report.rows] == list(case.params)
    assert report.ok, report.table()


def check_backends_agree(case: ModelCase, inputs: Mapping) -> None:
    """Numba against NumPy for every output (loss, gradients, f and the extras), each within its float64
    policy tolerance (a first-order rounding bound of the evaluation, docs/tolerance.md)."""
    expected = case.outputs(inputs, "numpy")
    actual = case.outputs(inputs, "numba")
    tolerances = bound_tolerances(case.model, "eval", inputs, expected)
    report = compare_arrays(expected, actual, tolerances, labels=("numpy", "numba"))
    assert sorted(row.name for row in report.rows) == sorted(expected)
    assert report.ok, report.table()


def numba_threads_available() -> bool:
    """True when Numba was started with at least 2 threads (else the thread check is skipped)."""
    return numba.config.NUMBA_NUM_THREADS >= 2


def check_thread_determinism(case: ModelCase, inputs: Mapping, monkeypatch) -> None:
    """The Numba backend on its parallel path returns bitwise identical outputs with 1 and 2 threads."""
    for module, attribute, value in case.parallel_switches:
        monkeypatch.setattr(module, attribute, value)
    runs = []
    for threads in (1, 2):
        with numba_threads(threads):
            runs.append(case.outputs(inputs, "numba"))
    one, two = runs
    assert list(one) == list(two)
    for name in one:
        assert np.array_equal(one[name], two[name]), name


def bad_parameter(value: np.ndarray, fault: str) -> tuple[np.ndarray, str]:
    """(``value`` spoilt by ``fault``, the regular expression of the message's text after "array 'P': ")."""
    value = np.asarray(value)
    if fault == "shape":
        bad = value[..., None]
        return bad, r"expected shape \[[^\]]*\], got " + re.escape(str(list(bad.shape)))
    if fault == "dtype":
        return value.astype(np.complex128), "expected real numbers, got dtype complex128"
    bad = value.copy()
    bad.flat[-1] = np.nan
    index = tuple(int(i) for i in np.unravel_index(value.size - 1, value.shape))
    return bad, re.escape(f"non-finite value nan at index {index}")


def check_rejects_bad_parameter(case: ModelCase, inputs: Mapping, param: str, fault: str) -> None:
    """A parameter of the wrong shape, a complex dtype, or holding NaN: InputError naming the array."""
    bad, message = bad_parameter(inputs[param], fault)
    for backend in ("numba", "numpy"):
        with pytest.raises(InputError, match=f"^array '{re.escape(param)}': {message}$"):
            case.loss_and_grad({**inputs, param: bad}, backend)
