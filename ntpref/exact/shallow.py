"""Paper 2's shallow multi-head transformer (docs/shallow.md §1–§3) in multiprecision, and the parts it
shares with the IndRNN baseline (:mod:`ntpref.exact.indrnn`): the readout, the squared loss and
ProjGD / ProjSGD, written from the equations as plain Python loops.

Input arrays as in docs/contract.md: X [n, T, d] (row t is x_t, the query q = x_T is the last row),
y [n], c [m], U [m, d], W [m, d, d], options kappa (2), tau_att (1), mask_last_key (False), activation
("tanh" | "erf"). Values are nested lists of mpf (:mod:`ntpref.exact.arith`); the functions other than
:func:`evaluate` and :func:`train` expect to run inside ``arith.precision()``.

Per sample X and head i (keys t = 1..T, or 1..T−1 with mask_last_key):

    z_{i,t} = x_tᵀ W_i q / τ_att,   α_i = softmax_t(z_i),   a_i = Σ_t α_{i,t} x_t,   s_i = U_iᵀ a_i
    f = m^{−1/2} Σ_i c_i σ(s_i),    loss = (κ/2n) Σ_j (f_j − y_j)²,   g_j = κ (f_j − y_j)/n
    e_ji = g_j c_i σ'(s_ji)/√m,   ∂L/∂c_i = m^{−1/2} Σ_j g_j σ(s_ji),   ∂L/∂U_i = Σ_j e_ji a_ji
    ∂L/∂W_i = τ_att^{−1} Σ_j e_ji (M_ji U_i) q_jᵀ,   M U = Σ_t α_t x_t (x_tᵀ U − s)

The stored kind "ntk" (§4): the finite-width NTK Gram matrix K_jl = ⟨∇_θ f_j, ∇_θ f_l⟩ over every
parameter of every head, from the gradient of f alone (§2):

    ∂f/∂c_i = σ(s_i)/√m,   ∂f/∂U_i = c_i σ'(s_i) a_i/√m,   ∂f/∂W_i = c_i σ'(s_i) (M_i U_i) qᵀ/(τ_att √m)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import mpmath
import numpy as np

from ..checks import as_scalar
from .arith import activation, add_outer, combine, fdot, flatten, matvec, norm, option, precision, softmax, \
    to_mp, to_numpy, zeros


class Samples(NamedTuple):
    """Samples and the options of the model: X [n][T][d], y [n] (None without targets), kappa κ, the
    transformer's tau_att (mpf) and mask_last_key (bool), and the activation's (σ, σ')."""

    X: list
    y: list | None
    kappa: mpmath.mpf
    tau_att: mpmath.mpf
    mask_last_key: bool
    sigma: tuple


class Evaluation(NamedTuple):
    """f [n], the loss and the gradient of every parameter block (shaped like the block), in block order."""

    f: list
    loss: mpmath.mpf
    grads: tuple


class Model(NamedTuple):
    """What ProjGD needs of a model: its name, parameter blocks (in the contract's order), the block whose
    gradient norm is logged, ``samples(arrays, X_name, y_name)`` and ``loss_and_grad(data, params)``."""

    name: str
    blocks: tuple
    logged: str
    samples: Callable
    loss_and_grad: Callable


def samples(arrays, X: str = "X", y: str = "y") -> Samples:
    """The samples ``arrays[X]``, ``arrays[y]`` (None when absent) and the transformer's options of an
    input dict, with the contract's defaults."""
    return Samples(to_mp(arrays[X]), to_mp(arrays[y]) if y in arrays else None,
                   mpmath.mpf(option(arrays, "kappa", "float", 2.0)),
                   mpmath.mpf(option(arrays, "tau_att", "float", 1.0)),
                   option(arrays, "mask_last_key", "bool", False),
                   activation(option(arrays, "activation", "str", "tanh")))


# --- the readout and loss shared with the IndRNN -------------------------------------------------
def readout(c: list, h: list) -> list:
    """f_j = m^{−1/2} Σ_i c_i h_ji for every sample j, h [n][m] (σ(s_ji), or the IndRNN's h_{T,ji})."""
    scale = 1 / mpmath.sqrt(len(c))
    return [scale * fdot(c, hj) for hj in h]


def squared_loss(f: list, y: list, kappa) -> tuple:
    """(loss, g): loss = (κ/2n) Σ_j r_j² and g_j = ∂loss/∂f_j = κ r_j / n, r_j = f_j − y_j."""
    n = len(f)
    r = [fj - yj for fj, yj in zip(f, y, strict=True)]
    return kappa / (2 * n) * fdot(r, r), [kappa * rj / n for rj in r]


def grad_readout(g: list, h: list) -> list:
    """∂L/∂c_i = m^{−1/2} Σ_j g_j h_ji [m]."""
    scale = 1 / mpmath.sqrt(len(h[0]))
    return [scale * fdot(g, [hj[i] for hj in h]) for i in range(len(h[0]))]


# --- the transformer -------------------------------------------------------------------------------
def head(keys: list, q: list, U_i: list, W_i: list, tau) -> tuple:
    """(s, a [d], M U [d]) of one head on one sample: z_t = x_tᵀ W_i q/τ over the keys x_t, α = softmax(z),
    a = Σ_t α_t x_t, s = U_iᵀ a, M U = Σ_t α_t x_t (x_tᵀ U_i − s)."""
    Wq = matvec(W_i, q)
    alpha = softmax([fdot(x, Wq) / tau for x in keys])
    columns = list(zip(*keys))                                              # [d][keys]
    a = [fdot(col, alpha) for col in columns]
    s = fdot(U_i, a)
    gamma = [al * (fdot(x, U_i) - s) for al, x in zip(alpha, keys)]
    return s, a, [fdot(col, gamma) for col in columns]


def head_states(data: Samples, U: list, W: list) -> list:
    """Per sample j and head i the (s, a [d], M U [d]) of :func:`head` over the sample's keys (every row,
    or every row but the query with mask_last_key): [n][m] triples."""
    out = []
    for Xj in data.X:
        keys = Xj[:-1] if data.mask_last_key else Xj
        out.append([head(keys, Xj[-1], U_i, W_i, data.tau_att) for U_i, W_i in zip(U, W, strict=True)])
    return out


def loss_and_grad(data: Samples, params: tuple) -> Evaluation:
    """f, loss and (∂L/∂c [m], ∂L/∂U [m][d], ∂L/∂W [m][d][d]) by the closed forms of §2 (module
    docstring)."""
    c, U, W = params
    m, d = len(c), len(U[0])
    sigma, dsigma = data.sigma
    states = head_states(data, U, W)
    h = [[sigma(s) for s, _, _ in sj] for sj in states]
    f = readout(c, h)
    loss, g = squared_loss(f, data.y, data.kappa)
    grad_U, grad_W = zeros(m, d), zeros(m, d, d)
    scale = 1 / mpmath.sqrt(m)
    for Xj, gj, sj in zip(data.X, g, states):
        for i, (s, a, MU) in enumerate(sj):
            e = gj * c[i] * dsigma(s) * scale                               # e_ji
            grad_U[i] = combine(grad_U[i], a, e)
            add_outer(grad_W[i], e / data.tau_att, MU, Xj[-1])              # e_ji (M_ji U_i) q_jᵀ / τ
    return Evaluation(f, loss, (grad_readout(g, h), grad_U, grad_W))


def f_gradients(data: Samples, params: tuple) -> list:
    """Per sample j the gradient of f_j alone (module docstring), shaped like the blocks:
    (∂f_j/∂c [m], ∂f_j/∂U [m][d], ∂f_j/∂W [m][d][d])."""
    c, U, W = params
    sigma, dsigma = data.sigma
    scale = 1 / mpmath.sqrt(len(c))
    out = []
    for Xj, sj in zip(data.X, head_states(data, U, W), strict=True):
        q = Xj[-1]
        grad_c = [sigma(s) * scale for s, _, _ in sj]
        e = [c_i * dsigma(s) * scale for c_i, (s, _, _) in zip(c, sj)]          # c_i σ'(s_i)/√m
        grad_U = [[e_i * ak for ak in a] for e_i, (_, a, _) in zip(e, sj)]
        grad_W = [[[e_i / data.tau_att * mk * ql for ql in q] for mk in MU] for e_i, (_, _, MU) in zip(e, sj)]
        out.append((grad_c, grad_U, grad_W))
    return out


def params_of(model: Model, arrays) -> tuple:
    """The model's parameter blocks of an input dict, in block order."""
    return tuple(to_mp(arrays[b]) for b in model.blocks)


def evaluate_model(model: Model, arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """The outputs of ``ntpref eval`` for an input of ``model``: f [n], loss, grad_<block> per block;
    float64 (``as_float``) or object arrays of mpf."""
    with precision():
        ev = model.loss_and_grad(model.samples(arrays), params_of(model, arrays))
        out = {"f": ev.f, "loss": ev.loss, **{f"grad_{b}": g for b, g in zip(model.blocks, ev.grads)}}
        return {k: to_numpy(v, as_float) for k, v in out.items()}


# --- ProjGD and ProjSGD (§3) -----------------------------------------------------------------------
def project(B: list, B0: list, radius) -> list:
    """Π of one block onto the per-head balls ‖B_i − B0_i‖ ≤ radius (Frobenius norm over the head's
    entries; ``radius`` None: no projection): B_i ← B0_i + Δ_i · min(1, radius/‖Δ_i‖), Δ_i = B_i − B0_i."""
    if radius is None:
        return B
    out = []
    for Bi, B0i in zip(B, B0, strict=True):
        delta = combine(Bi, B0i, -1)
        size = norm(delta)
        out.append(combine(B0i, delta, radius / size) if size > radius else Bi)
    return out


def projgd_step(model: Model, data: Samples, params: tuple, centre: tuple, eta, radii: tuple) -> tuple:
    """One step θ ← Π_Ω(θ − η ∇L(θ)) of ``model`` on ``data``; Ω = per-head balls of radius r_b = ρ_b/√m
    (``radii``, None = block b unprojected) around ``centre`` = θ(0). Returns (θ(t+1), the
    :class:`Evaluation` at θ(t) whose gradient made the step)."""
    ev = model.loss_and_grad(data, params)
    stepped = [combine(p, g, -eta) for p, g in zip(params, ev.grads, strict=True)]
    return tuple(project(B, B0, r) for B, B0, r in zip(stepped, centre, radii, strict=True)), ev


def train_model(model: Model, arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """``ntpref train`` of ``model`` (docs/contract.md: eta, steps, optional rho, X_val + y_val, batch +
    seed): ``steps`` projgd_step updates from θ(0) = the given blocks, on the whole training set, or for
    ProjSGD on the minibatch ``rng.integers(0, n, size=batch)`` of ``rng = np.random.default_rng(seed)``
    drawn at every step. Returns the final blocks, train_loss [steps] (L_train(θ(t)) before update t),
    val_loss [steps] (L_val(θ(t+1)), with validation data) and grad_norm_<logged> [steps] (the norm of
    the gradient update t used)."""
    with precision():
        data = model.samples(arrays)
        val = model.samples(arrays, "X_val", "y_val") if "X_val" in arrays else None
        theta = centre = params_of(model, arrays)
        m = len(theta[0])
        rho = np.asarray(arrays["rho"], dtype=np.float64).tolist() if "rho" in arrays else [np.inf] * len(model.blocks)
        radii = tuple(None if r == np.inf else mpmath.mpf(r) / mpmath.sqrt(m) for r in rho)
        eta = mpmath.mpf(as_scalar("eta", arrays["eta"]))
        rng = np.random.default_rng(as_scalar("seed", arrays["seed"], kind="int")) if "batch" in arrays else None
        logged = f"grad_norm_{model.logged}"
        logs = {"train_loss": [], "val_loss": [], logged: []}
        for _ in range(as_scalar("steps", arrays["steps"], kind="int")):
            batch = data
            if rng is not None:
                idx = rng.integers(0, len(data.X), size=as_scalar("batch", arrays["batch"], kind="int")).tolist()
                batch = data._replace(X=[data.X[j] for j in idx], y=[data.y[j] for j in idx])
            before = theta
            theta, ev = projgd_step(model, batch, theta, centre, eta, radii)
            logs["train_loss"].append(ev.loss if batch is data else model.loss_and_grad(data, before).loss)
            logs[logged].append(norm(ev.grads[model.blocks.index(model.logged)]))
            if val is not None:
                logs["val_loss"].append(model.loss_and_grad(val, theta).loss)
        out = {**dict(zip(model.blocks, theta)), **{k: v for k, v in logs.items() if v}}
        return {k: to_numpy(v, as_float) for k, v in out.items()}


def ntk(arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """The stored kind "ntk" of a transformer input (X, c, U, W and the options, no targets): gram [n, n],
    K_jl = ⟨∇_θ f_j, ∇_θ f_l⟩, the dot product of the tangent features of :func:`f_gradients` over every
    entry of every block."""
    with precision():
        data = samples(arrays)
        features = [flatten(list(g)) for g in f_gradients(data, params_of(MODEL, arrays))]
        return {"gram": to_numpy([[fdot(a, b) for b in features] for a in features], as_float)}


def head_state_outputs(arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """The head states the stored eval and ntk cases keep beside their outputs: head_s [n, m] (s_i),
    head_a [n, m, d] (a_i) and head_MU [n, m, d] (M_i U_i) of :func:`head_states`."""
    with precision():
        states = head_states(samples(arrays), to_mp(arrays["U"]), to_mp(arrays["W"]))
        out = {name: [[state[k] for state in sj] for sj in states]
               for k, name in enumerate(("head_s", "head_a", "head_MU"))}
        return {k: to_numpy(v, as_float) for k, v in out.items()}


MODEL = Model("shallow", ("c", "U", "W"), "W", samples, loss_and_grad)


def evaluate(arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """``ntpref eval`` of a transformer input (:func:`evaluate_model` of :data:`MODEL`)."""
    return evaluate_model(MODEL, arrays, as_float)


def train(arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """``ntpref train`` of a transformer input (:func:`train_model` of :data:`MODEL`)."""
    return train_model(MODEL, arrays, as_float)


#: kind of case → its outputs (arrays, as_float) → dict.
KINDS = {"eval": evaluate, "train": train, "ntk": ntk}
#: kind of case → the intermediates stored beside its outputs.
INTERMEDIATES = {"eval": head_state_outputs, "ntk": head_state_outputs}
#: The inputs counting a train run's updates.
STEPS = ("steps",)
#: Outputs of the oracle the exact backend does not compute (name → why), and inputs it does not read.
NOT_COMPUTED: dict[str, str] = {}
IGNORED: dict[str, str] = {}
