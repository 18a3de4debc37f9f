#!/usr/bin/env python
"""Cross-check ntpref against PyTorch autograd (float64) on every stored reference case.

The models are restated here from the specs, not from ntpref's code:
  twostage  spec/twostage.md §2 (Eq. 1 with softmax attention, last token = query; collocation
            loss L0) and §4 (Algorithm 1: normalized GD, stage 1 on W_ov, stage 2 on W_kq);
  shallow   spec/shallow.md §1 (m-head transformer, MSE with kappa) and §3 (ProjGD / ProjSGD);
  indrnn    spec/shallow.md §6 (diagonal RNN) with the same training.
Gradients come from torch.autograd. The driver (case discovery, comparison, table) is
scripts/crosscheck_common.py.

    python scripts/crosscheck_torch.py [--cases CASE ...] [--root DIR] [--float32]
"""
from __future__ import annotations

import math
import sys

import numpy as np
import torch

import crosscheck_common as common


def _t(x, dtype):
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def _np(x) -> np.ndarray:
    return x.detach().to(torch.float64).numpy().copy()


def cross_entropy(z, y):
    """Per-row -log softmax(z)_y [B] for logits z [B, K], targets y [B].

    Written as log(1 + sum_{v != y} exp(z_v - z_y)) so that autograd gives p_y - 1 as
    -sum_{v != y} p_v (spec/twostage.md §3) and small losses keep their relative accuracy (log1p).
    """
    zy = z.gather(1, y[:, None])
    r = (z - zy).masked_fill(torch.nn.functional.one_hot(y, z.shape[1]).bool(), -math.inf)
    mx = torch.clamp(r.max(dim=1).values, min=0.0).detach()
    return mx + torch.log1p(torch.expm1(-mx) + torch.exp(r - mx[:, None]).sum(dim=1))


# ---------------------------------------------------------------------------------------------
# twostage (spec/twostage.md §2, §4)
# ---------------------------------------------------------------------------------------------

class TwoStage:
    """The data of a two-stage case as tensors: X [N, Lmax, d], queries x_L [N, d], mask, targets."""

    def __init__(self, inp: common.TwoStageInput, dtype):
        self.E = _t(inp.E, dtype)
        self.X = self.E.T[torch.as_tensor(inp.tokens)]
        self.xq = self.E.T[torch.as_tensor(inp.query)]
        self.mask = torch.as_tensor(inp.mask)
        self.y = torch.as_tensor(inp.targets)
        if inp.succ is not None:
            C = inp.colloc
            self.EC = self.E[:, torch.as_tensor(C)]
            self.nC = torch.as_tensor(inp.succ[C])

    def forward(self, W_ov, W_kq):
        """s = X^T W_kq x_L, φ = softmax(s) over the sentence, z = E^T W_ov X φ; returns (losses, z, φ)."""
        s = torch.einsum("nld,de,ne->nl", self.X, W_kq, self.xq)
        phi = torch.softmax(s.masked_fill(~self.mask, -math.inf), dim=1)
        z = torch.einsum("dk,de,nle,nl->nk", self.E, W_ov, self.X, phi)
        return cross_entropy(z, self.y), z, phi

    def loss(self, W_ov, W_kq):
        """Eq. 1: mean over sentences of -log p_y."""
        return self.forward(W_ov, W_kq)[0].mean()

    def loss0(self, W_ov):
        """L0 = mean over x in C of -log softmax(E^T W_ov e_x)_{n(x)}."""
        return cross_entropy((self.E.T @ W_ov @ self.EC).T, self.nC).mean()


def twostage_eval(inp: common.TwoStageInput, float32: bool) -> dict:
    dtype = torch.float32 if float32 else torch.float64
    data = TwoStage(inp, dtype)
    W_ov = _t(inp.W_ov, dtype).requires_grad_(True)
    W_kq = _t(inp.W_kq, dtype).requires_grad_(True)
    losses, z, phi = data.forward(W_ov, W_kq)
    loss = losses.mean()
    g_ov, g_kq = torch.autograd.grad(loss, (W_ov, W_kq))
    out = {"loss": _np(loss), "logits": _np(z), "attn": _np(phi), "grad_W_ov": _np(g_ov),
           "grad_W_kq": _np(g_kq)}
    if inp.succ is not None:
        loss0 = data.loss0(W_ov)
        out["loss0"], out["grad0_W_ov"] = _np(loss0), _np(torch.autograd.grad(loss0, W_ov)[0])
    return out


def _ngd(fn, W, eta, steps):
    """Normalized GD W <- W - eta G/||G||_F for ``steps`` steps; returns (W, losses, norms), logs at t = 0..steps.

    At G = 0 the iterate stays where it is, so the logs of a stopped stage repeat its last value.
    """
    losses, norms = [], []
    for t in range(steps + 1):
        W = W.detach().requires_grad_(True)
        loss = fn(W)
        losses.append(loss.item())
        norms.append(torch.linalg.norm(W).item())
        if t == steps:
            break
        (G,) = torch.autograd.grad(loss, W)
        norm = torch.linalg.norm(G)
        if norm > 0:  # a zero gradient has no direction: the iterate stays (spec §4: stop cleanly)
            W = W - eta * G / norm
    return W.detach(), np.array(losses), np.array(norms)


def twostage_train(inp: common.TwoStageInput, n1: int, n2: int, float32: bool) -> dict:
    """Algorithm 1 from the given initial W_ov, W_kq: n1 stage-1 steps, then n2 stage-2 steps."""
    dtype = torch.float32 if float32 else torch.float64
    data = TwoStage(inp, dtype)
    W_ov, l1, n1s = _ngd(data.loss0, _t(inp.W_ov, dtype), inp.eta0, n1)
    W_kq, l2, n2s = _ngd(lambda W: data.loss(W_ov, W), _t(inp.W_kq, dtype), inp.eta, n2)
    # L*: attention fully on x* with W_ov frozen, i.e. the collocation loss of x*.
    opt = torch.as_tensor(inp.optimal)
    floor = cross_entropy((data.E.T @ W_ov @ data.E[:, opt]).T, data.y).mean()
    return {"stage1_loss": l1, "stage1_norm": n1s, "W_ov": _np(W_ov), "loss_floor": _np(floor),
            "stage2_loss": l2, "stage2_norm": n2s, "W_kq": _np(W_kq)}


# ---------------------------------------------------------------------------------------------
# shallow transformer and IndRNN (spec/shallow.md §1, §3, §6)
# ---------------------------------------------------------------------------------------------

def sigma(s, activation: str):
    """tanh, or erf(x/√2) (spec/shallow.md §1)."""
    if activation == "tanh":
        return torch.tanh(s)
    if activation == "erf":
        return torch.erf(s / math.sqrt(2.0))
    raise ValueError(f"unknown activation {activation!r}")


def transformer_f(inp: common.ShallowInput, X, c, U, W):
    """f(X) = m^{-1/2} Σ_i c_i σ(U_i^T Σ_t α_{i,t} x_t), α_i = softmax_t(x_t^T W_i q / τ_att)."""
    z = torch.einsum("ntd,mde,ne->nmt", X, W, X[:, -1, :]) / inp.tau_att
    if inp.mask_last_key:
        z = z.clone()
        z[:, :, -1] = -math.inf
    alpha = torch.softmax(z, dim=2)
    a = torch.einsum("nmt,ntd->nmd", alpha, X)
    s = torch.einsum("nmd,md->nm", a, U)
    return sigma(s, inp.activation) @ c / math.sqrt(len(c))


def indrnn_f(inp: common.ShallowInput, X, c, u, W_in):
    """h_0 = 0, h_t = σ(W_in x_t + u ⊙ h_{t-1}), f = m^{-1/2} Σ_i c_i h_{T,i}."""
    h = torch.zeros(X.shape[0], len(c), dtype=X.dtype)
    for t in range(X.shape[1]):
        h = sigma(X[:, t, :] @ W_in.T + u * h, inp.activation)
    return h @ c / math.sqrt(len(c))


MODEL_F = {"shallow": transformer_f, "indrnn": indrnn_f}


def mse(inp, X, y, params):
    """(f, loss) with loss = (kappa/2) mean_j (f(X_j) - y_j)^2."""
    f = MODEL_F[inp.model](inp, X, *params)
    return f, 0.5 * inp.kappa * torch.mean((f - y) ** 2)


def shallow_eval(inp: common.ShallowInput, float32: bool) -> dict:
    dtype = torch.float32 if float32 else torch.float64
    names = common.PARAMS[inp.model]
    params = [_t(inp.params[k], dtype).requires_grad_(True) for k in names]
    f, loss = mse(inp, _t(inp.X, dtype), _t(inp.y, dtype), params)
    grads = torch.autograd.grad(loss, params)
    out = {"f": _np(f), "loss": _np(loss)}
    out.update({f"grad_{k}": _np(g) for k, g in zip(names, grads)})
    return out


def project(B, B0, radius):
    """Per-head (per-unit) ball projection B0 + Δ·min(1, r/‖Δ‖), Δ = B - B0, norm over all axes but the first."""
    if not math.isfinite(radius):
        return B
    delta = B - B0
    norm = torch.linalg.norm(delta.reshape(delta.shape[0], -1), dim=1)
    scale = torch.where(norm > radius, radius / torch.where(norm > 0, norm, 1.0), 1.0)
    return B0 + delta * scale.reshape((-1,) + (1,) * (delta.dim() - 1))


def shallow_train(inp: common.ShallowInput, n: int, float32: bool) -> dict:
    """n steps of ProjGD (ProjSGD with inp.batches): θ <- Π_Ω(θ - η ∇L(θ)), logs before/after each step."""
    dtype = torch.float32 if float32 else torch.float64
    names = common.PARAMS[inp.model]
    X, y = _t(inp.X, dtype), _t(inp.y, dtype)
    theta0 = [_t(inp.params[k], dtype) for k in names]
    m = theta0[0].shape[0]
    radii = [math.inf] * 3 if inp.rho is None else [float(r) / math.sqrt(m) for r in inp.rho]
    norm_index = names.index(common.GRAD_NORM[inp.model].removeprefix("grad_norm_"))
    theta = list(theta0)
    logs = {"train_loss": [], common.GRAD_NORM[inp.model]: [], "val_loss": []}
    for step in range(n):
        params = [p.detach().requires_grad_(True) for p in theta]
        _, loss = mse(inp, X, y, params)
        logs["train_loss"].append(loss.item())
        if inp.batches is not None:
            idx = torch.as_tensor(inp.batches[step])
            _, loss = mse(inp, X[idx], y[idx], params)
        grads = torch.autograd.grad(loss, params)
        logs[common.GRAD_NORM[inp.model]].append(torch.linalg.norm(grads[norm_index]).item())
        with torch.no_grad():
            theta = [project(p - inp.eta * g, p0, r) for p, g, p0, r in zip(params, grads, theta0, radii)]
            if inp.X_val is not None:
                logs["val_loss"].append(mse(inp, _t(inp.X_val, dtype), _t(inp.y_val, dtype), theta)[1].item())
    out = {k: np.array(v) for k, v in logs.items() if k != "val_loss" or inp.X_val is not None}
    out.update({k: _np(p) for k, p in zip(names, theta)})
    return out


def ntk(inp: common.ShallowInput, float32: bool) -> dict:
    """Finite-width NTK Gram matrix J J^T, J [n, P] the per-sample Jacobian of f (torch.func.jacrev)."""
    dtype = torch.float32 if float32 else torch.float64
    X = _t(inp.X, dtype)
    params = tuple(_t(inp.params[k], dtype) for k in common.PARAMS["shallow"])
    jac = torch.func.jacrev(lambda *p: transformer_f(inp, X, *p), argnums=(0, 1, 2))(*params)
    J = torch.cat([j.reshape(len(X), -1) for j in jac], dim=1)
    return {"gram": _np(J @ J.T)}


FRAMEWORK = common.Framework(name="torch", version=torch.__version__, twostage_eval=twostage_eval,
                             twostage_train=twostage_train, shallow_eval=shallow_eval,
                             shallow_train=shallow_train, ntk=ntk)

if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(common.main(FRAMEWORK))
