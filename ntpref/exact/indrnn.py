"""The IndRNN baseline of Paper 2 (docs/shallow.md §6) in multiprecision, written from the equations as
plain Python loops; the readout, the squared loss and ProjGD are those of :mod:`ntpref.exact.shallow`.

Input arrays as in docs/contract.md: X [n, T, d], y [n], c [m], u [m], W_in [m, d], options kappa (2)
and activation ("tanh" | "erf"). Per sample and unit i:

    h_0 = 0,   p_t = W_in,i x_t + u_i h_{t−1},   h_t = σ(p_t)   (t = 1..T),   f = m^{−1/2} Σ_i c_i h_{T,i}

and backpropagation through time, with g_j = κ r_j / n:

    δ_T = g c_i/√m;   for t = T..1:  ε_t = δ_t σ'(p_t),  ∂W_in,i += ε_t x_t,  ∂u_i += ε_t h_{t−1},
                                     δ_{t−1} = ε_t u_i
"""
from __future__ import annotations

import mpmath
import numpy as np

from .arith import fdot, zeros
from .shallow import Evaluation, Model, Samples, evaluate_model, grad_readout, readout, samples, squared_loss, \
    train_model


def hidden_states(data: Samples, u: list, W_in: list) -> list:
    """Per sample j and unit i the pre-activations and states [(p_t, h_{t−1}) for t = 1..T] and h_T."""
    sigma, _ = data.sigma
    out = []
    for Xj in data.X:
        units = []
        for u_i, w_i in zip(u, W_in, strict=True):
            h, steps = mpmath.mpf(0), []
            for x in Xj:
                p = fdot(w_i, x) + u_i * h
                steps.append((p, h))
                h = sigma(p)
            units.append((steps, h))
        out.append(units)
    return out


def loss_and_grad(data: Samples, params: tuple) -> Evaluation:
    """f, loss and (∂L/∂c [m], ∂L/∂u [m], ∂L/∂W_in [m][d]) by backpropagation through time (module
    docstring)."""
    c, u, W_in = params
    m, d = len(c), len(W_in[0])
    _, dsigma = data.sigma
    states = hidden_states(data, u, W_in)
    h_T = [[h for _, h in units] for units in states]
    f = readout(c, h_T)
    loss, g = squared_loss(f, data.y, data.kappa)
    grad_u, grad_W_in = zeros(m), zeros(m, d)
    scale = 1 / mpmath.sqrt(m)
    for Xj, gj, units in zip(data.X, g, states):
        for i, (steps, _) in enumerate(units):
            delta = gj * c[i] * scale                                       # δ_T
            for x, (p, h_prev) in zip(reversed(Xj), reversed(steps)):
                eps = delta * dsigma(p)                                     # ε_t
                grad_W_in[i] = [gw + eps * xk for gw, xk in zip(grad_W_in[i], x)]
                grad_u[i] += eps * h_prev
                delta = eps * u[i]                                          # δ_{t−1}
    return Evaluation(f, loss, (grad_readout(g, h_T), grad_u, grad_W_in))


MODEL = Model("indrnn", ("c", "u", "W_in"), "u", samples, loss_and_grad)


def evaluate(arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """``ntpref eval`` of an IndRNN input: f [n], loss, grad_c [m], grad_u [m], grad_W_in [m, d]."""
    return evaluate_model(MODEL, arrays, as_float)


def train(arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """``ntpref train`` of an IndRNN input (ProjGD / ProjSGD of :func:`ntpref.exact.shallow.train_model`)."""
    return train_model(MODEL, arrays, as_float)


#: kind of case → its outputs (arrays, as_float) → dict.
KINDS = {"eval": evaluate, "train": train}
#: kind of case → the intermediates stored beside its outputs (none for the IndRNN).
INTERMEDIATES: dict = {}
#: The inputs counting a train run's updates.
STEPS = ("steps",)
#: Outputs of the oracle the exact backend does not compute (name → why), and inputs it does not read.
NOT_COMPUTED: dict[str, str] = {}
IGNORED: dict[str, str] = {}
