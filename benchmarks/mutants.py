"""Structural bugs injected into the PyTorch float64 restatement of the shipped adapters
(examples/adapters/torch_restatement.py), for the mutation benchmark (benchmarks/mutations.py).

The restatement is not edited. Each bug is switched in only while its adapter runs, by one of

* a patch (unittest.mock) of one function or attribute of the restatement module: its model function
  ``MODEL_F[model]`` wrapped so that one parameter passes through a change first, ``Sentences.scores``
  wrapped likewise, ``Sentences`` replaced by a subclass, ``project`` wrapped;
* a gradient scaling (identity forward, gradient times −1 or 0 backward) in front of one parameter;
* a change of the adapter's inputs (the step sizes) or of its outputs (the logged gradient norms);
* a stand-in for ``np.random.default_rng`` while the restatement draws its ProjSGD minibatches.

Two bugs live inside a function the restatement offers no seam in: the key masked under
``mask_last_key`` and the position of the query of the shallow transformer. For them
:func:`transformer_f` is a copy of the restatement's ``transformer_f`` with the query's position and
the masked key as parameters (the restatement's: the last position for both).

| bug | models | injection | origin (first quantity changed) |
|---|---|---|---|
| gradient sign | twostage W_kq, shallow U, indrnn W_in | gradient scaled by −1 | its gradient; in training the first update using it |
| transposed W | twostage W_kq, shallow W_i | W_kqᵀ, W_iᵀ in the attention scores | the forward pass |
| 1/m for 1/√m | shallow, indrnn | f divided by √m once more | f; train_loss[0] |
| softmax over padding | twostage | scores with an all-true mask (padding read as token 0) | attn; stage2_loss[0] |
| detached attention | twostage W_kq, shallow W | gradient scaled by 0 (W enters the attention only) | its gradient; next update / norm |
| tau_att ignored | shallow | the model function called with tau_att = 1 | f; train_loss[0] |
| mask_last_key off by one | shallow | key T−1 (the one before the query) masked instead of key T | f; train_loss[0] |
| query from the wrong position | twostage, shallow | the first token as the query instead of the last | attn / f; the first loss |
| projection skipped | shallow W, indrnn W_in | ``project`` returns that block unprojected | the first update |
| step size × (1 + 1e-6) | all | every step-size input (eta, eta0) scaled | the first update (stage 1's for twostage) |
| gradient norm logged after the update | shallow, indrnn | grad_norm[t] taken at θ(t+1) (note below) | grad_norm[0] |
| ProjSGD draws in another order | shallow, indrnn | one [batch, steps] draw, step t taking column t | grad_norm[0] |

The norm logged after the update: the log shifted by one step, its last entry the gradient norm at the
final parameters (for ProjSGD with the generator's next minibatch). The draws in another order: the
same generator's numbers as the contract's, drawn as one [batch, steps] array.
"""
from __future__ import annotations

import copy
import itertools
import math
from contextlib import nullcontext
from functools import partial
from unittest import mock

import numpy as np
import torch

from examples.adapters import torch_restatement as tr
from ntpref.models import SPECS
from ntpref.oracle.adapters import FUNCTIONS

from .sweeps import Bug, at, by_kind, first_update, forward

#: The restatement the bugs are injected into (and, without a bug, the benchmark's reference).
MODELS = tr.TorchModels(torch.float64)
#: numpy's generator factory, before any patch.
_DEFAULT_RNG = np.random.default_rng


class _ScaledGradient(torch.autograd.Function):
    """The identity forward; backward the gradient times ``factor``."""

    @staticmethod
    def forward(ctx, x, factor):
        ctx.factor = factor
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None


def scaled_gradient(factor: float):
    """``x ↦ x`` whose gradient is multiplied by ``factor`` (−1: its sign flipped; 0: none flows)."""
    return lambda x: _ScaledGradient.apply(x, factor)


def transformer_f(opts, X, c, U, W, *, query: int = -1, masked: int = -1):
    """The restatement's ``transformer_f`` with the query taken from position ``query`` and, under
    mask_last_key, the key at position ``masked`` masked (the restatement: −1 for both)."""
    z = torch.einsum("ntd,mde,ne->nmt", X, W, X[:, query, :]) / opts["tau_att"]
    if opts["mask_last_key"]:
        hidden = torch.zeros(z.shape[-1], dtype=torch.bool)
        hidden[masked] = True
        z = z.masked_fill(hidden, -math.inf)
    a = torch.einsum("nmt,ntd->nmd", torch.softmax(z, dim=2), X)
    return tr.sigma(torch.einsum("nmd,md->nm", a, U), opts["activation"]) @ c / math.sqrt(len(c))


class FirstTokenQuery(tr.Sentences):
    """Two-stage sentences whose query is the first token instead of the last."""

    def __init__(self, E, tokens, lengths, targets):
        super().__init__(E, tokens, lengths, targets)
        self.q = E.T[torch.as_tensor(np.asarray(tokens)[:, 0])]


class _ColumnDraws:
    """Stands in for ``np.random.default_rng(seed)`` in a ProjSGD run of ``steps`` minibatches of ``batch``
    samples out of ``n``: its t-th ``integers`` call returns column t of one [batch, steps] draw of that
    generator, the same numbers as the contract's draws in another order."""

    def __init__(self, seed, batch: int, steps: int, n: int):
        self._columns = iter(_DEFAULT_RNG(seed).integers(0, n, size=(batch, steps)).T)

    def integers(self, low, high, size):
        return next(self._columns)


# --- patches: inputs -> context manager -------------------------------------------------------------
def _model_function(model: str, new):
    """A patch replacing the restatement's model function of ``model`` by ``new(f)``, f the original."""
    f = tr.MODEL_F[model]
    return lambda inputs: mock.patch.dict(tr.MODEL_F, {model: new(f)})


def _through(model: str, block: str, change):
    """A patch of the model function of ``model`` that passes parameter ``block`` through ``change`` first."""
    index = tr.PARAMS[model].index(block)

    def new(f):
        def changed(opts, X, *params):
            return f(opts, X, *params[:index], change(params[index]), *params[index + 1:])
        return changed
    return _model_function(model, new)


def _over_sqrt_m(f):
    """The model function ``f`` with its output divided by √m once more (1/m instead of 1/√m)."""
    return lambda opts, X, c, *params: f(opts, X, c, *params) / math.sqrt(len(c))


def _kq_through(change):
    """A patch of ``Sentences.scores`` that passes W_kq through ``change`` first."""
    scores = tr.Sentences.scores
    return lambda inputs: mock.patch.object(tr.Sentences, "scores", lambda self, W_kq: scores(self, change(W_kq)))


def _scores_over_padding(inputs):
    """A patch of ``Sentences.scores`` computing every score with an all-true mask (padding read as token 0)."""
    scores = tr.Sentences.scores

    def over_padding(self, W_kq):
        whole = copy.copy(self)
        whole.mask = torch.ones_like(self.mask)
        return scores(whole, W_kq)
    return mock.patch.object(tr.Sentences, "scores", over_padding)


def _first_token_query(inputs):
    """A patch replacing ``Sentences`` by :class:`FirstTokenQuery`."""
    return mock.patch.object(tr, "Sentences", FirstTokenQuery)


def _unprojected(model: str, block: str):
    """A patch of ``project`` that returns ``block`` unprojected (the restatement projects the blocks in
    their order, once each per step)."""
    index, count = tr.PARAMS[model].index(block), len(tr.PARAMS[model])

    def patch(inputs):
        calls, project = itertools.count(), tr.project
        return mock.patch.object(tr, "project", lambda B, B0, r: B if next(calls) % count == index else project(B, B0, r))
    return patch


def _draws_in_columns(inputs):
    """A patch of ``np.random.default_rng`` by :class:`_ColumnDraws` for a ProjSGD input (none otherwise)."""
    if "batch" not in inputs:
        return nullcontext()
    sizes = int(inputs["batch"]), int(inputs["steps"]), len(inputs["y"])
    return mock.patch.object(np.random, "default_rng", lambda seed: _ColumnDraws(seed, *sizes))


# --- input and output changes -----------------------------------------------------------------------
def _step_sizes_scaled(factor: float):
    """The inputs with every step-size input of the model (eta; eta0 and eta) multiplied by ``factor``."""
    def change(model, inputs):
        return {**inputs, **{k: np.asarray(inputs[k]) * factor for k in set(SPECS[model].blocks.values())}}
    return change


def _norm_logged_after_update(model: str, inputs: dict, out: dict) -> dict:
    """The outputs with grad_norm[t] taken at θ(t+1): the log shifted by one step, its last entry the
    gradient norm at the final parameters (for ProjSGD with the generator's next minibatch)."""
    logged, X, y = tr.LOGGED[model], np.asarray(inputs["X"]), np.asarray(inputs["y"])
    if "batch" in inputs:
        rng, batch = _DEFAULT_RNG(int(inputs["seed"])), int(inputs["batch"])
        idx = [rng.integers(0, len(y), size=batch) for _ in range(int(inputs["steps"]) + 1)][-1]
        X, y = X[idx], y[idx]
    final = MODELS.evaluate(model, {**inputs, "X": X, "y": y, **{b: out[b] for b in tr.PARAMS[model]}})
    key = f"grad_norm_{logged}"
    return {**out, key: np.append(out[key][1:], np.linalg.norm(final[f"grad_{logged}"]))}


def adapter(kinds=("eval", "train"), patch=None, before=None, after=None) -> dict:
    """evaluate / train (those of ``kinds``) of :data:`MODELS` with a bug switched in: ``patch(inputs)`` a
    context manager active during the call, ``before(model, inputs)`` the inputs it is given,
    ``after(model, inputs, outputs)`` the outputs it returns."""
    def wrap(fn):
        def call(model, inputs):
            with patch(inputs) if patch else nullcontext():
                out = fn(model, before(model, inputs) if before else inputs)
            return after(model, inputs, out) if after else out
        return call
    return {FUNCTIONS[k]: wrap(getattr(MODELS, FUNCTIONS[k])) for k in kinds}


def _tau_ignored(f):
    """The model function ``f`` called with tau_att = 1."""
    return lambda opts, *args: f({**opts, "tau_att": 1.0}, *args)


def catalogue() -> list[Bug]:
    """Every (bug, model) of the module docstring's table, in its order."""
    flip, detach = scaled_gradient(-1.0), scaled_gradient(0.0)
    both, train = ("eval", "train"), ("train",)
    stage2_update = at("stage2_loss", 1)
    table = [
        ("gradient sign", "twostage", both, dict(patch=_kq_through(flip)), by_kind(at("grad_W_kq"), stage2_update)),
        ("gradient sign", "shallow", both, dict(patch=_through("shallow", "U", flip)), by_kind(at("grad_U"), first_update)),
        ("gradient sign", "indrnn", both, dict(patch=_through("indrnn", "W_in", flip)),
         by_kind(at("grad_W_in"), first_update)),
        ("transposed W", "twostage", both, dict(patch=_kq_through(lambda W: W.T)), forward),
        ("transposed W", "shallow", both, dict(patch=_through("shallow", "W", lambda W: W.transpose(1, 2))), forward),
        ("1/m for 1/sqrt(m)", "shallow", both, dict(patch=_model_function("shallow", _over_sqrt_m)), forward),
        ("1/m for 1/sqrt(m)", "indrnn", both, dict(patch=_model_function("indrnn", _over_sqrt_m)), forward),
        ("softmax over padding", "twostage", both, dict(patch=_scores_over_padding), forward),
        ("detached attention", "twostage", both, dict(patch=_kq_through(detach)), by_kind(at("grad_W_kq"), stage2_update)),
        ("detached attention", "shallow", both, dict(patch=_through("shallow", "W", detach)),
         by_kind(at("grad_W"), at("grad_norm_W", 0))),
        ("tau_att ignored", "shallow", both, dict(patch=_model_function("shallow", _tau_ignored)), forward),
        ("mask_last_key off by one", "shallow", both,
         dict(patch=_model_function("shallow", lambda f: partial(transformer_f, masked=-2))), forward),
        ("query from the wrong position", "twostage", both, dict(patch=_first_token_query), forward),
        ("query from the wrong position", "shallow", both,
         dict(patch=_model_function("shallow", lambda f: partial(transformer_f, query=0))), forward),
        ("projection skipped", "shallow", train, dict(patch=_unprojected("shallow", "W")), first_update),
        ("projection skipped", "indrnn", train, dict(patch=_unprojected("indrnn", "W_in")), first_update),
        *(("step size x (1 + 1e-6)", model, train, dict(before=_step_sizes_scaled(1.0 + 1e-6)),
           at("stage1_loss", 1) if model == "twostage" else first_update) for model in SPECS),
        *((bug, model, train, injection, at(f"grad_norm_{tr.LOGGED[model]}", 0)) for model in ("shallow", "indrnn")
          for bug, injection in (("gradient norm logged after the update", dict(after=_norm_logged_after_update)),
                                 ("ProjSGD draws in another order", dict(patch=_draws_in_columns)))),
    ]
    return [Bug(name, model, adapter(kinds, **injection), origin) for name, model, kinds, injection, origin in table]
