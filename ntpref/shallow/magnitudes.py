"""The float64 policy's magnitude forms of paper (2)'s models, the shallow transformer and the IndRNN
(docs/tolerance.md), beside the models.

:func:`magnitudes` gives, for an eval input, name → (M, K) of every output (and of the head states
head_s, head_a, head_MU of the shallow transformer): M the evaluation magnitude (the output computed with
the absolute value of every term, shaped like it), K the operation count, so that any float64
implementation computes the output to within γ_K · M; kind "ntk" gives those of the NTK Gram matrix.
:func:`train_tolerances` is the policy of a ProjGD / ProjSGD run, and :func:`float32_scales`,
:func:`update_directions`, :func:`roundings_behind` what the float32 envelope needs
(``ntpref.oracle.policies.envelope``). Functions taking ``model`` take the model's name ("shallow" | "indrnn").
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from ..checks import as_scalar
from ..rounding import TRANSCENDENTAL_ULPS, Scales, U, final_tolerance, gamma, max_abs, trajectory_tolerance
from ..tolerance import Tolerance
from . import indrnn
from .activation import activation, dsigma_np, sigma_np
from .contract import input_data, input_kappa, train_only
from .model import head_states
from .projgd import model_named

class _Heads(NamedTuple):
    """Per sample j and head i: values and magnitudes of the head states (docs/shallow.md §1–§2)."""

    s: np.ndarray       # [n, m]
    a: np.ndarray       # [n, m, d]
    MU: np.ndarray      # [n, m, d]
    sig: np.ndarray     # σ(s) [n, m]
    dsig: np.ndarray    # σ'(s) [n, m]
    Ms: np.ndarray
    Ma: np.ndarray
    MMU: np.ndarray
    Msig: np.ndarray
    Mdsig: np.ndarray
    q: np.ndarray       # |q| [n, d]
    tau: float
    count: int


def _heads(data, U, W, backend: str = "numba") -> _Heads:
    """Head states from :func:`ntpref.shallow.head_states` on prepared data and their magnitudes.

    A_j = max_t |x_t| over the keys bounds every convex combination Σ_t α_t |x_t|;
    M(z_t) ≤ A^T |W_i| |q| / τ, R = 1 + 4 max M(z) the softmax factor; M(a) = R A, M(s) = R |U_i|^T A,
    M(MU) = R A (A^T |U_i| + |s|) + A (A^T |U_i| + M(s)) (MU = Σ_t α_t x_t (x_t^T U_i − s)),
    M(σ) = |σ| + |σ'| M(s), M(σ') = |σ'| + D M(s) (D ≥ sup |σ''|, the activation table's ``d2_bound``).
    """
    s, a, MU = head_states(data, U, W, backend=backend)
    X, tau, n_keys = data.X, data.tau_att, data.n_keys
    A = np.abs(X[:, :n_keys]).max(axis=1)                                   # [n, d]
    q = np.abs(X[:, -1])
    R = 1.0 + 4.0 * np.einsum("jk,ikl,jl->ji", A, np.abs(W), q) / tau      # [n, m]
    AU = A @ np.abs(U).T                                                    # [n, m]
    Ms = R * AU
    Ma = R[:, :, None] * A[:, None, :]
    MMU = Ma * (AU + np.abs(s))[:, :, None] + A[:, None, :] * (AU + Ms)[:, :, None]
    sig, dsig = sigma_np(s, data.activation), dsigma_np(s, data.activation)
    d = X.shape[2]
    count = 2 * n_keys + d * d + 2 * d + 2 * TRANSCENDENTAL_ULPS
    Mdsig = np.abs(dsig) + activation(data.activation).d2_bound * Ms
    return _Heads(s, a, MU, sig, dsig, Ms, Ma, MMU, np.abs(sig) + np.abs(dsig) * Ms, Mdsig, q, tau, count)


def _residual_scales(Mf: np.ndarray, r: np.ndarray, kappa: float):
    """M(loss) and (g, M(g)) of loss = (κ/2n) Σ r², g = κ r / n, r = f − y with M(r) = M(f) + |r|."""
    n = r.shape[0]
    Mr = Mf + np.abs(r)
    Mloss = kappa / (2 * n) * np.sum(r * r + 2 * np.abs(r) * Mr)
    return np.array(Mloss), kappa * r / n, kappa / n * Mr


def shallow_scales(data, c, U, W, kappa: float, backend: str = "numba") -> Scales:
    """Magnitudes of f, loss, grad_c, grad_U, grad_W and the head states (head_s, head_a, head_MU) on
    prepared data with targets (:func:`ntpref.shallow.prepare`)."""
    y = data.y
    h = _heads(data, U, W, backend)
    n, m = h.s.shape
    sm = math.sqrt(m)
    f = h.sig @ c / sm
    Mf = h.Msig @ np.abs(c) / sm
    Mloss, g, Mg = _residual_scales(Mf, f - y, kappa)
    ag = np.abs(g)
    Mgc = (Mg @ np.abs(h.sig) + ag @ h.Msig) / sm
    e = ag[:, None] * np.abs(c * h.dsig) / sm                               # |e_ji| [n, m]
    Me = np.abs(c) / sm * (Mg[:, None] * np.abs(h.dsig) + ag[:, None] * h.Mdsig)
    MgU = np.einsum("ji,jik->ik", Me, np.abs(h.a)) + np.einsum("ji,jik->ik", e, h.Ma)
    left = Me[:, :, None] * np.abs(h.MU) + e[:, :, None] * h.MMU             # [n, m, d]
    MgW = np.einsum("jik,jl->ikl", left, h.q) / h.tau
    M = {"f": Mf, "loss": Mloss, "grad_c": Mgc, "grad_U": MgU, "grad_W": MgW,
         "head_s": h.Ms, "head_a": h.Ma, "head_MU": h.MMU}
    return Scales(M, h.count + n + m)


def ntk_scales(data, c, U, W, backend: str = "numba") -> Scales:
    """Magnitudes of the NTK Gram matrix gram [n, n] and the head states (kind "ntk"):
    K_jl = (1/m) Σ_i [σ_ji σ_li + c_i² σ'_ji σ'_li (⟨a_ji, a_li⟩ + τ^{-2} ⟨MU_ji, MU_li⟩ ⟨q_j, q_l⟩)],
    M of each product = Σ over its factors of M(factor) · Π |other factors| (prepared data, no targets needed)."""
    h = _heads(data, U, W, backend)
    m = h.s.shape[1]
    qq = h.q @ h.q.T / h.tau ** 2

    sig, dsig, a, MU = np.abs(h.sig), np.abs(h.dsig), np.abs(h.a), np.abs(h.MU)
    inner = np.einsum("jik,lik->jli", a, a) + np.einsum("jik,lik->jli", MU, MU) * qq[:, :, None]
    Minner = (np.einsum("jik,lik->jli", h.Ma, a) + np.einsum("jik,lik->jli", a, h.Ma)
              + (np.einsum("jik,lik->jli", h.MMU, MU) + np.einsum("jik,lik->jli", MU, h.MMU)) * qq[:, :, None])
    dd = dsig[:, None, :] * dsig[None, :, :]
    Mdd = h.Mdsig[:, None, :] * dsig[None, :, :] + dsig[:, None, :] * h.Mdsig[None, :, :]
    gram = (h.Msig @ sig.T + sig @ h.Msig.T + np.einsum("i,jli->jl", c * c, Mdd * inner + dd * Minner)) / m
    return Scales({"gram": gram, "head_s": h.Ms, "head_a": h.Ma, "head_MU": h.MMU}, h.count + m + 2 * data.X.shape[2])


# --- IndRNN -----------------------------------------------------------------------------------------
def indrnn_scales(data, c, u, W_in, kappa: float, backend: str = "numba") -> Scales:
    """Magnitudes of f, loss, grad_c, grad_u, grad_W_in (docs/shallow.md §6), from the hidden states
    h_t and pre-activations p_t of the oracle's recurrence: M(p_t) = |W_in| |x_t| + |u| M(h_{t−1}),
    M(h_t) = |h_t| + |σ'(p_t)| M(p_t), and backwards through time M(ε_t) = M(δ_t)|σ'| + |δ_t|(|σ'| + D M(p_t))
    (D ≥ sup |σ''|, the activation table's ``d2_bound``). The recurrence is NumPy's whatever ``backend``."""
    X, y, name = data.X, data.y, data.activation
    d2 = activation(name).d2_bound
    n, T, d = X.shape
    m = c.shape[0]
    sm = math.sqrt(m)
    H = indrnn.hidden_states(data, u, W_in)                                 # [T + 1, n, m]
    absW, absu = np.abs(W_in), np.abs(u)
    Mh = [np.zeros((n, m))]
    Mp, dsig = [], []
    for t in range(T):
        Mp.append(np.abs(X[:, t]) @ absW.T + absu * Mh[t])
        dsig.append(np.abs(dsigma_np(X[:, t] @ W_in.T + u * H[t], name)))
        Mh.append(np.abs(H[t + 1]) + dsig[t] * Mp[t])
    f = H[T] @ c / sm
    Mf = Mh[T] @ np.abs(c) / sm
    Mloss, g, Mg = _residual_scales(Mf, f - y, kappa)
    Mgc = (Mg @ np.abs(H[T]) + np.abs(g) @ Mh[T]) / sm
    delta = np.abs(g)[:, None] * np.abs(c) / sm
    Mdelta = Mg[:, None] * np.abs(c) / sm
    MgW, Mgu = np.zeros((m, d)), np.zeros(m)
    for t in range(T - 1, -1, -1):
        Meps = Mdelta * dsig[t] + delta * (dsig[t] + d2 * Mp[t])
        eps = delta * dsig[t]
        MgW += Meps.T @ np.abs(X[:, t])
        Mgu += (Meps * np.abs(H[t]) + eps * Mh[t]).sum(axis=0)
        delta, Mdelta = eps * absu, Meps * absu
    return Scales({"f": Mf, "loss": Mloss, "grad_c": Mgc, "grad_u": Mgu, "grad_W_in": MgW},
                  n + m + T * (d + 2 + TRANSCENDENTAL_ULPS) + 2 * TRANSCENDENTAL_ULPS)


# --- the policy's entry points ------------------------------------------------------------------------
def magnitudes(model: str, scales: Callable, inputs: Mapping[str, np.ndarray], kind: str = "eval",
               backend: str = "numba"):
    """name → (M, K) of every output of an eval input of ``model`` (kind "eval", the magnitudes of
    ``scales(data, *params, kappa)``), or of the NTK Gram matrix and head states of a shallow input (kind
    "ntk", :func:`ntk_scales`); the head states they start from by ``backend``."""
    spec = model_named(model)
    data = input_data(model, inputs)
    params = spec.check_params(*(inputs[b] for b in spec.blocks), d=data.X.shape[2])
    sc = ntk_scales(data, *params, backend) if kind == "ntk" else scales(data, *params, input_kappa(inputs), backend)
    return {k: (v, sc.count) for k, v in sc.M.items()}


def _per_batch(inputs: Mapping[str, np.ndarray]) -> float:
    """n/B for a minibatch of B (ProjSGD), 1 for full batches."""
    return np.shape(inputs["X"])[0] / as_scalar("batch", inputs["batch"], kind="int") if "batch" in inputs else 1.0


def _ends(model: str, scales: Callable, inputs: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray],
          backend: str = "numba", **data):
    """name → (M, K) at the first and at the last parameters of a run (``data`` replaces X, y)."""
    base = {k: v for k, v in inputs.items() if k not in train_only(model)}
    final = {b: out[b] for b in model_named(model).blocks}
    return [magnitudes(model, scales, {**base, **data, **e}, backend=backend) for e in ({}, final)]


def train_tolerances(model: str, scales: Callable, inputs: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray],
                     names, response: Callable[[dict], dict], backend: str = "numba") -> dict[str, dict]:
    """The float64 tolerances of the outputs ``names`` of a ProjGD / ProjSGD run with the oracle's outputs ``out``.

    θ(t+1) = Π(θ(t) − η g). The injection per block is U·max|θ| + η γ_K max M(g)
    (M(g) at θ(0) and at the final θ; ×n/B for a minibatch of B); one rerun (``response``) with every block
    moved measures the responses D. train_loss[t] and grad_norm[t] (at θ(t)) have t injections behind them,
    val_loss[t] (at θ(t+1)) t + 1, the final blocks ``steps``."""
    spec = model_named(model)
    blocks, logged = spec.blocks, spec.logged
    eta = as_scalar("eta", inputs["eta"])
    steps = as_scalar("steps", inputs["steps"], kind="int")
    per_batch = _per_batch(inputs)
    train_sc = _ends(model, scales, inputs, out, backend)
    count = train_sc[0]["loss"][1]
    eps = {b: U * max(max_abs(inputs[b]), max_abs(out[b])) + eta * per_batch * gamma(count) * max(
        max_abs(sc[f"grad_{b}"][0]) for sc in train_sc) for b in blocks}
    D = response(eps)
    floors = {"train_loss": max(float(sc["loss"][0]) for sc in train_sc),
              f"grad_norm_{logged}": per_batch * max(float(np.linalg.norm(sc[f"grad_{logged}"][0])) for sc in train_sc)}
    if "X_val" in inputs:
        val = _ends(model, scales, inputs, out, backend, X=inputs["X_val"], y=inputs["y_val"])
        floors["val_loss"] = max(float(sc["loss"][0]) for sc in val)
    tols = {}
    for name in names:
        q = out[name]
        if name in blocks:
            tols[name] = final_tolerance(steps * max(max_abs(D[name]), eps[name]), f"final {name}")
        else:
            t = np.arange(q.shape[0]) + (name == "val_loss")
            tols[name] = trajectory_tolerance(q, gamma(count) * floors[name], count, t * Tolerance.running_max(D[name], 1), name)
    return tols


# --- the float32 envelope -----------------------------------------------------------------------------
def _largest(ends: list[dict], name: str, reduce=np.max) -> float:
    return max(float(reduce(sc[name][0])) for sc in ends)


def float32_scales(model: str, scales: Callable, inputs: Mapping[str, np.ndarray],
                   expected: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, float]:
    """name → M_q of the training outputs evaluated from terms (losses, the logged gradient norm, ×n/B for
    ProjSGD), the larger at the first and the last parameters."""
    ends = _ends(model, scales, inputs, expected, backend)
    logged = model_named(model).logged
    out = {"train_loss": _largest(ends, "loss"),
           f"grad_norm_{logged}": _per_batch(inputs) * _largest(ends, f"grad_{logged}", np.linalg.norm)}
    if "X_val" in inputs:
        out["val_loss"] = _largest(_ends(model, scales, inputs, expected, backend, X=inputs["X_val"], y=inputs["y_val"]),
                                   "loss")
    return out


def update_directions(model: str, scales: Callable, inputs: Mapping[str, np.ndarray],
                      expected: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, float]:
    """block → n/B · max M(∇θ) at the first and the last parameters: the magnitude of one update's direction."""
    ends = _ends(model, scales, inputs, expected, backend)
    return {b: _per_batch(inputs) * _largest(ends, f"grad_{b}") for b in model_named(model).blocks}


def roundings_behind(name: str, inputs: Mapping[str, np.ndarray], shape: tuple) -> np.ndarray | int:
    """The updates before the train output ``name``: t + 1 at step t of train_loss and the gradient norm,
    t + 2 of val_loss (at θ(t+1)), steps + 1 for the final blocks."""
    if name in ("train_loss", "val_loss") or name.startswith("grad_norm_"):
        return np.arange(shape[0]) + 1 + (name == "val_loss")
    return int(inputs["steps"]) + 1
