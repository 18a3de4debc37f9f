"""The ``eval`` / ``train`` contract (docs/contract.md) of models "shallow" and "indrnn".

Inputs: ``X`` [n, T, d], ``y`` [n] and the parameter blocks (shallow: ``c`` [m], ``U`` [m, d],
``W`` [m, d, d]; indrnn: ``c`` [m], ``u`` [m], ``W_in`` [m, d]); optional ``kappa`` (2.0) and the
model's options (shallow: ``tau_att`` (1.0), ``mask_last_key`` (False), ``activation`` ("tanh" |
"erf"); indrnn: ``activation``; attention options are not accepted for the RNN).
eval outputs: ``f`` [n], ``loss`` (0-d, = (κ/2n) Σ r²), ``grad_<block>`` per block.
train inputs (in addition): ``eta``, ``steps``, optional ``rho`` [3] (ρ per block; inf = that block
unprojected; absent = no projection), ``X_val`` + ``y_val``, ``batch`` (1 ≤ batch ≤ n) + ``seed`` (ProjSGD).
train outputs: the final blocks, ``train_loss`` [steps], ``val_loss`` [steps] (with validation data),
``grad_norm_W`` (shallow) / ``grad_norm_u`` (indrnn) [steps]. Unknown array names are errors.

:func:`input_options` and :func:`input_data` read the model's data from an input's arrays; the oracle's
other uses of shallow inputs (the NTK cases, tolerances) read them with these too.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..checks import MAX_STEPS, as_float, as_scalar, check_names
from ..errors import InputError
from ..progress import silent
from ..spec import ABSENT, OPTIONAL, REQUIRED, Input, names_of
from . import evaluation
from .model import MODEL as TRANSFORMER
from .model import head_states
from .projgd import check_minibatch, model_named
from .projgd import train as train_model

_OPTION_KINDS = {"tau_att": "float", "mask_last_key": "bool", "activation": "str"}
_OPTION_DEFAULTS = {"tau_att": "1.0", "mask_last_key": "False", "activation": '"tanh"'}


def inputs_of(model: str) -> tuple[Input, ...]:
    """The input arrays of ``model`` ("shallow" | "indrnn"): data, blocks and training first (the required
    ones in the order a missing-array error lists them), then the options."""
    spec = model_named(model)
    shapes = dict(zip(spec.blocks, spec.block_shapes))
    return (Input("X", "[n, T, d]", "float", REQUIRED, REQUIRED), Input("y", "[n]", "float", REQUIRED, REQUIRED),
            *(Input(b, shapes[b], "float", REQUIRED, REQUIRED) for b in spec.blocks),
            Input("eta", "0-d", "float", ABSENT, REQUIRED), Input("steps", "0-d", "int", ABSENT, REQUIRED),
            Input("kappa", "0-d", "float", OPTIONAL, OPTIONAL, "2.0"),
            *(Input(k, "0-d", _OPTION_KINDS[k], OPTIONAL, OPTIONAL, _OPTION_DEFAULTS[k]) for k in spec.options),
            Input("rho", f"[{len(spec.blocks)}]", "float", ABSENT, OPTIONAL, "no projection"),
            Input("X_val", "[n_val, T, d]", "float", ABSENT, OPTIONAL, "no val_loss"),
            Input("y_val", "[n_val]", "float", ABSENT, OPTIONAL),
            Input("batch", "0-d", "int", ABSENT, OPTIONAL, "full batches (ProjGD)"),
            Input("seed", "0-d", "int", ABSENT, OPTIONAL))


def train_only(model: str) -> tuple[str, ...]:
    """The inputs of ``model`` only training reads."""
    return names_of(inputs_of(model), "eval", ABSENT)


def eval_outputs(model: str) -> tuple[str, ...]:
    """f [n], loss (0-d) and grad_<block> per block."""
    return ("f", "loss") + tuple(f"grad_{b}" for b in model_named(model).blocks)


def trajectories(model: str) -> tuple[str, ...]:
    """The per-step logs of a training run: train_loss, val_loss (with validation data), grad_norm_<logged>."""
    return ("train_loss", "val_loss", f"grad_norm_{model_named(model).logged}")


def timeline(model: str, name: str, expected: Mapping[str, np.ndarray]) -> np.ndarray:
    """When ``name`` is computed, for ordering failures (``expected``: the oracle's outputs of the run): eval
    outputs in the order head states (:data:`HEAD_STATES`), f, loss, grad_<block>; in training at step t first train_loss[t], then the logged
    gradient norm (both at θ(t)), then val_loss[t] (at θ(t+1), after the update); the final blocks last."""
    evaluated = HEAD_STATES + eval_outputs(model)         # the head states come first
    if name in evaluated:
        return np.array(float(evaluated.index(name)))
    steps = len(expected["train_loss"])
    if name in model_named(model).blocks:
        return np.array(3.0 * steps)
    within = {"train_loss": 0.0, f"grad_norm_{model_named(model).logged}": 1.0, "val_loss": 2.0}
    return 3.0 * np.arange(len(expected[name])) + within[name]


def train_outputs(model: str) -> tuple[str, ...]:
    """The final blocks and the per-step logs."""
    return model_named(model).blocks + trajectories(model)


#: Seconds of the NumPy backend per sample, position and parameter of one pass (n · T · the blocks' sizes), an
#: estimate rounded up from timed runs: larger for the IndRNN, whose recurrence steps through T in Python.
NUMPY_UNIT = {"shallow": 3e-9, "indrnn": 2e-8}


def numpy_cost(model: str, kind: str, arrays: Mapping[str, np.ndarray]) -> tuple[int, float]:
    """(passes, seconds per pass) of the NumPy backend on an eval / train input of ``model``, from its sizes
    alone (:mod:`ntpref.backend`): one pass for an evaluation, ``steps`` for training, each over the
    ``batch`` (default n) training and the n_val validation samples: (batch + n_val) · T · Σ |block| ·
    NUMPY_UNIT (X [n, T, d], X_val [n_val, T, d])."""
    n, T, _ = np.shape(arrays["X"])
    size = sum(np.size(arrays[b]) for b in model_named(model).blocks)
    if kind == "eval":
        return 1, NUMPY_UNIT[model] * n * T * size
    samples = int(arrays["batch"]) if "batch" in arrays else n
    samples += np.shape(arrays["X_val"])[0] if "X_val" in arrays else 0
    return int(arrays["steps"]), NUMPY_UNIT[model] * samples * T * size


def input_options(model: str, arrays: Mapping[str, np.ndarray]) -> dict:
    """The options of ``model``'s ``prepare`` present in the arrays of an input (shallow: tau_att,
    mask_last_key, activation; indrnn: activation), as Python values; absent options are left out."""
    return {k: as_scalar(k, arrays[k], kind=_OPTION_KINDS[k]) for k in model_named(model).options if k in arrays}


def input_kappa(arrays: Mapping[str, np.ndarray]) -> float:
    """The loss scale κ of an input (2.0 when absent)."""
    return as_scalar("kappa", arrays["kappa"]) if "kappa" in arrays else 2.0


def input_data(model: str, arrays: Mapping[str, np.ndarray]):
    """The prepared data of an input: ``X``, ``y`` (when present) and the options, by the model's
    ``prepare`` (a :class:`ntpref.shallow.model.Batch` or :class:`ntpref.shallow.indrnn.Batch`)."""
    return model_named(model).prepare(arrays["X"], arrays.get("y"), **input_options(model, arrays))


def _parse(model: str, arrays: Mapping[str, np.ndarray], what: str):
    """(the model's evaluation.Model record, prepared data, params, kappa) after checking the names of
    ``arrays`` as those of a ``what`` ("eval" | "train") input."""
    spec, inputs = model_named(model), inputs_of(model)
    check_names(arrays, names_of(inputs, what, REQUIRED), names_of(inputs, what, OPTIONAL),
                f"{what} input of model {model!r}", train_names=names_of(inputs, "eval", ABSENT))
    return spec, input_data(model, arrays), [arrays[b] for b in spec.blocks], input_kappa(arrays)


def evaluate(model: str, arrays: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, np.ndarray]:
    """``ntpref eval``: f, loss and the gradient of every block."""
    spec, data, params, kappa = _parse(model, arrays, "eval")
    result = evaluation.loss_and_grad(spec, data, params, kappa=kappa, backend=backend)
    out = {"f": result.f, "loss": np.array(result.loss)}
    out.update({f"grad_{b}": g for b, g in spec.block_gradients(result)._asdict().items()})
    return out


def train(model: str, arrays: Mapping[str, np.ndarray], backend: str = "numba",
          progress: Callable[[str, int, int], None] = silent) -> dict[str, np.ndarray]:
    """``ntpref train``: ProjGD / ProjSGD from the given parameters; final blocks and per-step logs."""
    spec, data, params, kappa = _parse(model, arrays, "train")
    rho = None
    if "rho" in arrays:
        rho = as_float("rho", arrays["rho"], (len(spec.blocks),), finite=False)
    ints = {k: as_scalar(k, arrays[k], kind="int") for k in ("steps", "batch", "seed") if k in arrays}
    as_scalar("steps", ints["steps"], kind="int", high=MAX_STEPS)
    batch_size, seed = check_minibatch(ints.get("batch"), ints.get("seed"), data.X.shape[0], names=("batch", "seed"))
    if ("X_val" in arrays) != ("y_val" in arrays):
        raise InputError("validation data needs both 'X_val' and 'y_val'")
    val = None
    if "X_val" in arrays:
        X_val = evaluation.check_X(arrays["X_val"], "X_val", data.X.shape[2])
        val = spec.prepare(X_val, as_float("y_val", arrays["y_val"], (X_val.shape[0],)),
                           **input_options(model, arrays))
    result = train_model(data, params, eta=as_scalar("eta", arrays["eta"]), steps=ints["steps"], rho=rho,
                         batch_size=batch_size, seed=seed, val=val, kappa=kappa, backend=backend, progress=progress)
    out = dict(result.params)
    out["train_loss"] = result.train_loss
    if result.val_loss is not None:
        out["val_loss"] = result.val_loss
    out[f"grad_norm_{spec.logged}"] = result.grad_norms[spec.logged]
    return out


def ntk_outputs(arrays: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, np.ndarray]:
    """The stored case kind "ntk" of the shallow transformer (not an ``ntpref eval`` input): ``model``, ``X``
    [n, T, d], ``c`` [m], ``U`` [m, d], ``W`` [m, d, d] and optional ``tau_att``, ``mask_last_key``,
    ``activation`` → ``gram`` [n, n], the finite-width NTK Gram matrix (:func:`ntpref.shallow.ntk.ntk_gram`)."""
    from .ntk import ntk_gram

    check_names(arrays, ("model", "X") + TRANSFORMER.blocks, TRANSFORMER.options, what="ntk input")
    gram = ntk_gram(arrays["X"], *(arrays[b] for b in TRANSFORMER.blocks), backend=backend,
                    **input_options(TRANSFORMER.name, arrays))
    return {"gram": np.asarray(gram, dtype=np.float64)}


#: The head states an evaluation keeps beside its outputs (:func:`head_state_intermediates`), in the order
#: they are computed: the attention outputs, the pre-activations, M_i U_i.
HEAD_STATES = ("head_a", "head_s", "head_MU")


def head_state_intermediates(kind: str, arrays: Mapping[str, np.ndarray], backend: str = "numba") -> dict:
    """The shallow transformer's head states stored beside an eval / ntk case's outputs to help locate a
    mismatch: ``head_s`` [n, m] (pre-activations U_i^T a_i), ``head_a`` [n, m, d] (attention outputs
    a_i = Σ_t α_t x_t) and ``head_MU`` [n, m, d] (M_i U_i), from :func:`ntpref.shallow.head_states`;
    none for a train case (its outputs hold the per-step losses)."""
    if kind == "train":
        return {}
    states = head_states(input_data(TRANSFORMER.name, arrays), arrays["U"], arrays["W"], backend=backend)
    return {f"head_{name}": np.asarray(value) for name, value in states._asdict().items()}
