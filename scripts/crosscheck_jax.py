#!/usr/bin/env python
"""Cross-check ntpref against JAX autograd (float64, jax_enable_x64, jax.jit) on every reference case.

The models are restated here from the specs, not from ntpref's code:
  twostage  spec/twostage.md §2 (Eq. 1 with softmax attention, last token = query; collocation
            loss L0) and §4 (Algorithm 1: normalized GD, stage 1 on W_ov, stage 2 on W_kq);
  shallow   spec/shallow.md §1 (m-head transformer, MSE with kappa) and §3 (ProjGD / ProjSGD);
  indrnn    spec/shallow.md §6 (diagonal RNN) with the same training.
Gradients come from jax.grad; training loops are jitted lax.scan loops. The driver (case discovery,
comparison, table) is scripts/crosscheck_common.py.

    python scripts/crosscheck_jax.py [--cases CASE ...] [--root DIR] [--float32]
"""
from __future__ import annotations

import math
import sys
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402  (after enabling x64)
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.scipy.special import erf  # noqa: E402

import crosscheck_common as common  # noqa: E402


def _dtype(float32: bool):
    return jnp.float32 if float32 else jnp.float64


def _np(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).copy()


def cross_entropy(z, y):
    """Per-row -log softmax(z)_y [B] for logits z [B, K], targets y [B].

    Written as log(1 + sum_{v != y} exp(z_v - z_y)) so that autograd gives p_y - 1 as
    -sum_{v != y} p_v (spec/twostage.md §3) and small losses keep their relative accuracy (log1p).
    """
    onehot = jax.nn.one_hot(y, z.shape[1], dtype=bool)
    zy = jnp.take_along_axis(z, y[:, None], axis=1)
    r = jnp.where(onehot, -jnp.inf, z - zy)
    mx = lax.stop_gradient(jnp.maximum(jnp.max(r, axis=1), 0.0))
    return mx + jnp.log1p(jnp.expm1(-mx) + jnp.sum(jnp.exp(r - mx[:, None]), axis=1))


# ---------------------------------------------------------------------------------------------
# twostage (spec/twostage.md §2, §4)
# ---------------------------------------------------------------------------------------------

def twostage_data(inp: common.TwoStageInput, dtype) -> dict:
    """X [N, Lmax, d] (rows e_τ), queries x_L [N, d], mask, targets; E_C, n(C) for L0; E e_{x*}."""
    E = jnp.asarray(inp.E, dtype=dtype)
    data = {"E": E, "X": E.T[inp.tokens], "xq": E.T[inp.query], "mask": jnp.asarray(inp.mask),
            "y": jnp.asarray(inp.targets)}
    if inp.succ is not None:
        data["EC"], data["nC"] = E[:, inp.colloc], jnp.asarray(inp.succ[inp.colloc])
    if inp.optimal is not None:
        data["Eopt"] = E[:, inp.optimal]
    return data


def twostage_forward(data, W_ov, W_kq):
    """s = X^T W_kq x_L, φ = softmax(s) over the sentence, z = E^T W_ov X φ; returns (losses, z, φ)."""
    s = jnp.einsum("nld,de,ne->nl", data["X"], W_kq, data["xq"])
    phi = jax.nn.softmax(jnp.where(data["mask"], s, -jnp.inf), axis=1)
    z = jnp.einsum("dk,de,nle,nl->nk", data["E"], W_ov, data["X"], phi)
    return cross_entropy(z, data["y"]), z, phi


def twostage_loss(W_ov, W_kq, data):
    """Eq. 1: mean over sentences of -log p_y."""
    return jnp.mean(twostage_forward(data, W_ov, W_kq)[0])


def collocation_loss(W_ov, data):
    """L0 = mean over x in C of -log softmax(E^T W_ov e_x)_{n(x)}."""
    return jnp.mean(cross_entropy((data["E"].T @ W_ov @ data["EC"]).T, data["nC"]))


def _loss_with_outputs(W_ov, W_kq, data):
    """(Eq. 1 loss, (logits, attention)) for jax.value_and_grad(..., has_aux=True)."""
    losses, z, phi = twostage_forward(data, W_ov, W_kq)
    return jnp.mean(losses), (z, phi)


@jax.jit
def _twostage_eval(data, W_ov, W_kq):
    (loss, (z, phi)), (g_ov, g_kq) = jax.value_and_grad(_loss_with_outputs, argnums=(0, 1), has_aux=True)(
        W_ov, W_kq, data)
    out = {"loss": loss, "logits": z, "attn": phi, "grad_W_ov": g_ov, "grad_W_kq": g_kq}
    if "EC" in data:
        out["loss0"], out["grad0_W_ov"] = jax.value_and_grad(collocation_loss)(W_ov, data)
    return out


def twostage_eval(inp: common.TwoStageInput, float32: bool) -> dict:
    dtype = _dtype(float32)
    out = _twostage_eval(twostage_data(inp, dtype), jnp.asarray(inp.W_ov, dtype), jnp.asarray(inp.W_kq, dtype))
    return {k: _np(v) for k, v in out.items()}


def _ngd(fn, W, eta, steps: int):
    """Normalized GD W <- W - eta G/||G||_F; returns (W, losses, norms) with logs at t = 0..steps.

    At G = 0 the iterate stays where it is, so the logs of a stopped stage repeat its last value.
    """
    def step(W, _):
        loss, G = jax.value_and_grad(fn)(W)
        norm = jnp.linalg.norm(G)
        # A zero gradient has no direction: the iterate stays (spec §4: stop cleanly).
        step = jnp.where(norm > 0, G / jnp.where(norm > 0, norm, 1.0), 0.0)
        return W - eta * step, (loss, jnp.linalg.norm(W))

    W_end, (losses, norms) = lax.scan(step, W, None, length=steps)
    return (W_end, jnp.append(losses, fn(W_end)), jnp.append(norms, jnp.linalg.norm(W_end)))


@partial(jax.jit, static_argnames=("n1", "n2"))
def _twostage_train(data, W_ov0, W_kq0, eta0, eta, n1, n2):
    W_ov, l1, n1s = _ngd(lambda W: collocation_loss(W, data), W_ov0, eta0, n1)
    W_kq, l2, n2s = _ngd(lambda W: twostage_loss(W_ov, W, data), W_kq0, eta, n2)
    # L*: attention fully on x* with W_ov frozen, i.e. the collocation loss of x*.
    floor = jnp.mean(cross_entropy((data["E"].T @ W_ov @ data["Eopt"]).T, data["y"]))
    return {"stage1_loss": l1, "stage1_norm": n1s, "W_ov": W_ov, "loss_floor": floor,
            "stage2_loss": l2, "stage2_norm": n2s, "W_kq": W_kq}


def twostage_train(inp: common.TwoStageInput, n1: int, n2: int, float32: bool) -> dict:
    """Algorithm 1 from the given initial W_ov, W_kq: n1 stage-1 steps, then n2 stage-2 steps."""
    dtype = _dtype(float32)
    out = _twostage_train(twostage_data(inp, dtype), jnp.asarray(inp.W_ov, dtype), jnp.asarray(inp.W_kq, dtype),
                          inp.eta0, inp.eta, n1=n1, n2=n2)
    return {k: _np(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# shallow transformer and IndRNN (spec/shallow.md §1, §3, §6)
# ---------------------------------------------------------------------------------------------

def sigma(s, activation: str):
    """tanh, or erf(x/√2) (spec/shallow.md §1)."""
    if activation == "tanh":
        return jnp.tanh(s)
    if activation == "erf":
        return erf(s / math.sqrt(2.0))
    raise ValueError(f"unknown activation {activation!r}")


def transformer_f(opts, X, c, U, W):
    """f(X) = m^{-1/2} Σ_i c_i σ(U_i^T Σ_t α_{i,t} x_t), α_i = softmax_t(x_t^T W_i q / τ_att)."""
    z = jnp.einsum("ntd,mde,ne->nmt", X, W, X[:, -1, :]) / opts["tau_att"]
    if opts["mask_last_key"]:
        z = z.at[:, :, -1].set(-jnp.inf)
    alpha = jax.nn.softmax(z, axis=2)
    a = jnp.einsum("nmt,ntd->nmd", alpha, X)
    s = jnp.einsum("nmd,md->nm", a, U)
    return sigma(s, opts["activation"]) @ c / math.sqrt(c.shape[0])


def indrnn_f(opts, X, c, u, W_in):
    """h_0 = 0, h_t = σ(W_in x_t + u ⊙ h_{t-1}), f = m^{-1/2} Σ_i c_i h_{T,i}."""
    def step(h, x_t):
        return sigma(x_t @ W_in.T + u * h, opts["activation"]), None

    h, _ = lax.scan(step, jnp.zeros((X.shape[0], c.shape[0]), X.dtype), jnp.swapaxes(X, 0, 1))
    return h @ c / math.sqrt(c.shape[0])


MODEL_F = {"shallow": transformer_f, "indrnn": indrnn_f}


def mse(opts, X, y, params):
    """loss = (kappa/2) mean_j (f(X_j) - y_j)^2 (opts["kappa"])."""
    f = MODEL_F[opts["model"]](opts, X, *params)
    return 0.5 * opts["kappa"] * jnp.mean((f - y) ** 2), f


def _opts(inp: common.ShallowInput) -> tuple:
    """The static (hashable) options of a shallow case; kappa and tau_att are plain floats."""
    return (("model", inp.model), ("kappa", inp.kappa), ("tau_att", inp.tau_att),
            ("mask_last_key", inp.mask_last_key), ("activation", inp.activation))


@partial(jax.jit, static_argnames=("opts",))
def _shallow_eval(X, y, params, opts):
    (loss, f), grads = jax.value_and_grad(partial(mse, dict(opts), X, y), has_aux=True)(params)
    return f, loss, grads


def shallow_eval(inp: common.ShallowInput, float32: bool) -> dict:
    dtype = _dtype(float32)
    names = common.PARAMS[inp.model]
    params = tuple(jnp.asarray(inp.params[k], dtype) for k in names)
    f, loss, grads = _shallow_eval(jnp.asarray(inp.X, dtype), jnp.asarray(inp.y, dtype), params, _opts(inp))
    out = {"f": _np(f), "loss": _np(loss)}
    out.update({f"grad_{k}": _np(g) for k, g in zip(names, grads)})
    return out


def project(B, B0, radius):
    """Per-head (per-unit) ball projection B0 + Δ·min(1, r/‖Δ‖), Δ = B - B0, norm over all axes but the first."""
    delta = B - B0
    norm = jnp.linalg.norm(delta.reshape(delta.shape[0], -1), axis=1)
    scale = jnp.where(norm > radius, radius / jnp.where(norm > 0, norm, 1.0), 1.0)
    return B0 + delta * scale.reshape((-1,) + (1,) * (delta.ndim - 1))


@partial(jax.jit, static_argnames=("opts", "n", "norm_index", "sgd", "val"))
def _shallow_train(X, y, X_val, y_val, theta0, radii, eta, batches, opts, n, norm_index, sgd, val):
    opts = dict(opts)

    def step(theta, idx):
        loss, grads = jax.value_and_grad(lambda p: mse(opts, X, y, p)[0])(theta)
        if sgd:  # ProjSGD steps along the minibatch gradient; the log keeps the full training loss
            grads = jax.grad(lambda p: mse(opts, X[idx], y[idx], p)[0])(theta)
        new = tuple(project(p - eta * g, p0, r) for p, g, p0, r in zip(theta, grads, theta0, radii))
        val_loss = mse(opts, X_val, y_val, new)[0] if val else jnp.zeros((), X.dtype)
        return new, (loss, jnp.linalg.norm(grads[norm_index]), val_loss)

    xs = batches if sgd else None
    return lax.scan(step, theta0, xs, length=n)


def shallow_train(inp: common.ShallowInput, n: int, float32: bool) -> dict:
    """n steps of ProjGD (ProjSGD with inp.batches): θ <- Π_Ω(θ - η ∇L(θ)), logs before/after each step."""
    dtype = _dtype(float32)
    names = common.PARAMS[inp.model]
    theta0 = tuple(jnp.asarray(inp.params[k], dtype) for k in names)
    m = theta0[0].shape[0]
    radii = (math.inf,) * len(names) if inp.rho is None else tuple(float(r) / math.sqrt(m) for r in inp.rho)
    grad_norm = common.GRAD_NORM[inp.model]
    val = inp.X_val is not None
    X, y = jnp.asarray(inp.X, dtype), jnp.asarray(inp.y, dtype)
    theta, (loss, gnorm, val_loss) = _shallow_train(
        X, y, jnp.asarray(inp.X_val, dtype) if val else X, jnp.asarray(inp.y_val, dtype) if val else y,
        theta0, radii, inp.eta, None if inp.batches is None else jnp.asarray(inp.batches[:n]),
        opts=_opts(inp), n=n, norm_index=names.index(grad_norm.removeprefix("grad_norm_")),
        sgd=inp.batches is not None, val=val)
    out = {"train_loss": _np(loss), grad_norm: _np(gnorm)}
    if val:
        out["val_loss"] = _np(val_loss)
    out.update({k: _np(p) for k, p in zip(names, theta)})
    return out


@partial(jax.jit, static_argnames=("opts",))
def _ntk_gram(X, params, opts):
    jac = jax.jacrev(lambda p: transformer_f(dict(opts), X, *p))(params)
    J = jnp.concatenate([j.reshape(X.shape[0], -1) for j in jac], axis=1)
    return J @ J.T


def ntk(inp: common.ShallowInput, float32: bool) -> dict:
    """Finite-width NTK Gram matrix J J^T, J [n, P] the per-sample Jacobian of f (jax.jacrev)."""
    dtype = _dtype(float32)
    params = tuple(jnp.asarray(inp.params[k], dtype) for k in common.PARAMS["shallow"])
    return {"gram": _np(_ntk_gram(jnp.asarray(inp.X, dtype), params, _opts(inp)))}


FRAMEWORK = common.Framework(name="jax", version=jax.__version__, twostage_eval=twostage_eval,
                             twostage_train=twostage_train, shallow_eval=shallow_eval,
                             shallow_train=shallow_train, ntk=ntk)

if __name__ == "__main__":
    sys.exit(common.main(FRAMEWORK))
