"""The shallow-transformer paper's own PyTorch model as a correct implementation for the mutation benchmark
(benchmarks/mutations.py): the classes ``Transformer`` and ``IndiRNN`` of the module
``transformer_ntk.model`` of the repository enesarda22/nonasymptotic-transformer, wrapped as
docs/conformance.md ("Wrapping the shallow paper's PyTorch model") describes.

Their model supplies the forward pass (``forward``, run on ntpref's parameters by
``torch.func.functional_call``, the input as their ``(B, d, T)``; a module per sequence length, since
``forward`` asserts its ``T``) and the projection (``project_`` on a module whose parameters are the block
and its centre). The rest is the PyTorch restatement's (examples/adapters/torch_restatement.py): the loss,
the autograd gradients, the ProjGD / ProjSGD loop and the float64 gradient norms (their
``train_pgd_fullbatch`` logs the norms in float32), with the restatement's model function and
``project`` replaced by theirs while the adapter runs. Cases their model cannot express raise
NotImplementedError (the report skips them, with the reason): the two-stage model, ``tau_att ≠ 1``, an
IndRNN of odd width.

Their code is not part of ntpref: :func:`load` imports ``src/transformer_ntk/model.py`` from a checkout.
"""
from __future__ import annotations

import importlib.util
import math
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import torch

from examples.adapters import torch_restatement as tr
from ntpref.errors import InputError

#: Inside a checkout of the repository.
MODEL_FILE = Path("src") / "transformer_ntk" / "model.py"
#: Their buffer holding the centre of each parameter block's projection ball.
CENTRES = {"c": "c0", "U": "U0", "W": "W0", "u": "u0", "W_in": "W0"}


def load(checkout: str | Path):
    """Their ``transformer_ntk.model`` module from the repository checkout ``checkout``."""
    path = Path(checkout) / MODEL_FILE
    if not path.is_file():
        raise InputError(f"{checkout}: no {MODEL_FILE} (a checkout of enesarda22/nonasymptotic-transformer)")
    spec = importlib.util.spec_from_file_location("nonasymptotic_transformer_model", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class AuthorsModel:
    """evaluate / train of docs/conformance.md with their model's forward pass and projection (module
    docstring); ``module`` is :func:`load`'s."""

    def __init__(self, module):
        self.module = module
        self.restatement = tr.TorchModels(torch.float64)
        self._nets = {}

    def evaluate(self, model: str, inputs: dict) -> dict:
        with self._theirs(model):
            return self.restatement.evaluate(model, inputs)

    def train(self, model: str, inputs: dict) -> dict:
        with self._theirs(model):
            return self.restatement.train(model, inputs)

    def _theirs(self, model: str):
        """The restatement with their model function and projection of ``model`` switched in."""
        if model == "twostage":
            raise NotImplementedError("their code has no two-stage model")
        stack = ExitStack()
        stack.enter_context(mock.patch.dict(tr.MODEL_F, {model: self._function(model)}))
        stack.enter_context(mock.patch.object(tr, "project", self._projection(model)))
        return stack

    def _net(self, model: str, d: int, T: int, m: int, opts: dict):
        """Their module for these sizes and options (built once; its own parameters are never used)."""
        key = (model, d, T, m, opts["activation"], opts["mask_last_key"])
        if key not in self._nets:
            activation = tr.ACTIVATIONS[opts["activation"]]
            if model == "shallow":
                net = self.module.Transformer(d, T, m, activation, dtype=torch.float64,
                                              mask_last_key=opts["mask_last_key"])
            elif m % 2:
                raise NotImplementedError(f"their IndiRNN needs an even width, the case has m = {m}")
            else:
                net = self.module.IndiRNN(d, T, m, activation, dtype=torch.float64)
            self._nets[key] = net
        return self._nets[key]

    def _function(self, model: str):
        """The restatement's model function f(opts, X [n, T, d], *params) computed by their forward."""
        def f(opts, X, *params):
            if opts["tau_att"] != 1.0:
                raise NotImplementedError(f"their attention has no temperature; the case has tau_att = {opts['tau_att']}")
            net = self._net(model, X.shape[2], X.shape[1], len(params[0]), opts)
            return torch.func.functional_call(net, dict(zip(tr.PARAMS[model], params)), (X.transpose(1, 2),))
        return f

    def _projection(self, model: str):
        """The restatement's project(B, B0, radius) by their ``project_``: a module holding B as its block
        and B0 as that block's centre, the other blocks at their centres (so left alone). The block is told
        by its number of axes; the IndRNN's c and u both have one, and their projections of c and u are the
        same clamp, so a vector is projected as c."""
        names = tr.PARAMS[model]
        by_axes = {3: "W", 2: "W_in" if model == "indrnn" else "U", 1: "c"}

        def project(B, B0, radius: float):
            m, d = B.shape[0], (B.shape[1] if B.dim() > 1 else 1)
            block = by_axes[B.dim()]
            net = self._net(model, d, 1, m, {"activation": "tanh", "mask_last_key": False})
            with torch.no_grad():
                for name in names:
                    param = getattr(net, name)
                    if name == block:
                        param.data = B.detach().clone()
                        getattr(net, CENTRES[name]).data = B0.detach().clone()
                    else:      # no movement: their projection leaves the block as it is
                        getattr(net, CENTRES[name]).data = param.detach().clone()
                rho = radius * math.sqrt(m)
                net.project_(rho, rho, rho)
            return getattr(net, block).detach().clone()
        return project
