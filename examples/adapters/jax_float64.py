"""Conformance adapter: a JAX restatement (float64, jax_enable_x64, jax.jit) of the three ntpref models.

    ntpref conformance examples/adapters/jax_float64.py

It computes in the dtype of its input arrays (NumPy float64 from ntpref; jax_float32.py passes them as
float32) and returns its outputs in that dtype.

Written from docs/twostage.md (§2 Eq. 1 and L0, §4 Algorithm 1 in both directions) and docs/shallow.md
(§1 the m-head transformer, §3 ProjGD / ProjSGD, §6 the IndRNN), not from ntpref's code; gradients
from jax.grad / jax.vjp, training loops as jitted lax.scan loops. The same two choices as
torch_restatement.py: the cross-entropy as log(1 + Σ_{v≠y} e^{z_v − z_y}), and the "stable" NGD
direction with its log-scale factors taken out (the pairwise form of the softmax Jacobian). The
max-margin outputs (W_ov_star, W_kq_star, stage*_corr) are not returned.
"""
from __future__ import annotations

import math
from functools import partial

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402  (after enabling x64)
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.scipy.special import erf  # noqa: E402

PARAMS = {"shallow": ("c", "U", "W"), "indrnn": ("c", "u", "W_in")}
LOGGED = {"shallow": "W", "indrnn": "u"}


def _get(inputs, name, default):
    return np.asarray(inputs[name]).item() if name in inputs else default


def _margins(z, y):
    """r_v = z_v − z_y, −inf at v = y."""
    r = z - jnp.take_along_axis(z, y[:, None], axis=1)
    return jnp.where(jax.nn.one_hot(y, z.shape[1], dtype=bool), -jnp.inf, r)


def cross_entropy(z, y):
    """Per row −log softmax(z)_y = log(1 + Σ_{v≠y} e^{r_v}) [B]: autograd forms p_y − 1 as −Σ_{v≠y} p_v."""
    return jnp.logaddexp(0.0, jax.nn.logsumexp(_margins(z, y), axis=1))


def scaled_output_gradient(z, y):
    """(m [B], g̃ [B, K]) with ∂ℓ/∂z = e^m g̃, m = max_{v≠y} log p_v, g̃_v = p_v e^{−m} (v ≠ y), g̃_y = −Σ g̃_v."""
    r = _margins(z, y)
    logp = r - jnp.logaddexp(0.0, jax.nn.logsumexp(r, axis=1))[:, None]
    m = jnp.max(logp, axis=1)
    g = jnp.exp(logp - m[:, None])
    return m, g - jax.nn.one_hot(y, z.shape[1], dtype=g.dtype) * jnp.sum(g, axis=1, keepdims=True)


# --- twostage (docs/twostage.md §2, §4) ------------------------------------------------------------
def sentences(inputs) -> dict:
    """X [N, Lmax, d] (row l = e_{τ_l}, padding as token 0), queries q [N, d], mask, targets y; E; E_C, n(C)."""
    E = jnp.asarray(inputs["E"]) if "E" in inputs else jnp.eye(int(inputs["K"]), dtype=np.asarray(inputs["W_ov"]).dtype)
    tokens, lengths = np.asarray(inputs["tokens"]), np.asarray(inputs["lengths"])
    mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    data = {"E": E, "X": E.T[np.where(mask, tokens, 0)], "q": E.T[tokens[np.arange(len(lengths)), lengths - 1]],
            "mask": jnp.asarray(mask), "y": jnp.asarray(inputs["targets"])}
    if "succ" in inputs:
        succ = np.asarray(inputs["succ"])
        C = np.flatnonzero(succ >= 0)
        data["EC"], data["nC"] = E[:, C], jnp.asarray(succ[C])
    return data


def scores(data, W_kq):
    """s_l = x_l^T W_kq q, −inf on padding."""
    return jnp.where(data["mask"], jnp.einsum("nld,de,ne->nl", data["X"], W_kq, data["q"]), -jnp.inf)


def logits(data, W_ov, phi):
    """z = E^T W_ov X φ [N, K]."""
    return jnp.einsum("dk,de,ne->nk", data["E"], W_ov, jnp.einsum("nl,nle->ne", phi, data["X"]))


def twostage_loss(W_ov, W_kq, data):
    """(Eq. 1, (logits, attention))."""
    phi = jax.nn.softmax(scores(data, W_kq), axis=1)
    z = logits(data, W_ov, phi)
    return jnp.mean(cross_entropy(z, data["y"])), (z, phi)


def collocation_loss(W_ov, data):
    """L0 = mean over x ∈ C of −log softmax(E^T W_ov e_x)_{n(x)}."""
    return jnp.mean(cross_entropy((data["E"].T @ W_ov @ data["EC"]).T, data["nC"]))


@jax.jit
def _twostage_eval(data, W_ov, W_kq):
    (loss, (z, phi)), (g_ov, g_kq) = jax.value_and_grad(twostage_loss, argnums=(0, 1), has_aux=True)(W_ov, W_kq, data)
    out = {"loss": loss, "logits": z, "attn": phi, "grad_W_ov": g_ov, "grad_W_kq": g_kq}
    if "EC" in data:
        out["loss0"], out["grad0_W_ov"] = jax.value_and_grad(collocation_loss)(W_ov, data)
    return out


def stable_ov(W_ov, data):
    """(L0, G ∝ ∇L0): ∂ℓ/∂z = e^m g̃ per token, weights e^{m − max m}; G by a vector-Jacobian product."""
    z, pullback = jax.vjp(lambda W: (data["E"].T @ W @ data["EC"]).T, W_ov)
    m, g = scaled_output_gradient(z, data["nC"])
    return jnp.mean(cross_entropy(z, data["nC"])), pullback(jnp.exp(m - jnp.max(m))[:, None] * g)[0]


def stable_kq(W_kq, W_ov, data):
    """(L, G ∝ ∇_{W_kq} L): ∂ℓ/∂s_l = Σ_k φ_l φ_k (a_l − a_k), a = e^m ã, every weight φ_l φ_k e^m formed as
    exp(log φ_l + log φ_k + m − Λ), Λ the largest; ã and G by vector-Jacobian products."""
    s, pull_s = jax.vjp(lambda W: scores(data, W), W_kq)
    logphi = jax.nn.log_softmax(s, axis=1)
    z, pull_z = jax.vjp(lambda phi: logits(data, W_ov, phi), jnp.exp(logphi))
    m, g = scaled_output_gradient(z, data["y"])
    a = pull_z(g)[0]
    D = a[:, :, None] - a[:, None, :]
    pair = data["mask"][:, :, None] & data["mask"][:, None, :] & (D != 0)
    logw = jnp.where(pair, logphi[:, :, None] + logphi[:, None, :] + m[:, None, None], -jnp.inf)
    top = jnp.max(logw)
    top = jnp.where(jnp.isfinite(top), top, 0.0)                  # no pair: G = 0 exactly
    gs = jnp.sum(jnp.where(pair, jnp.exp(logw - top) * D, 0.0), axis=2)
    return jnp.mean(cross_entropy(z, data["y"])), pull_s(gs)[0]


def naive(loss):
    """(loss, its float64 gradient)."""
    return jax.value_and_grad(loss)


def _ngd(step, W, eta, steps: int):
    """Normalized GD W ← W − η G/‖G‖_F with ``step(W) -> (loss, G)``; (W, losses, norms) at t = 0..steps.
    At G = 0 the iterate stays, so the logs of a stopped stage repeat its last value."""
    def update(W, _):
        loss, G = step(W)
        norm = jnp.linalg.norm(G)
        move = jnp.where(norm > 0, G / jnp.where(norm > 0, norm, 1.0), 0.0)
        return W - eta * move, (loss, jnp.linalg.norm(W))

    W_end, (losses, norms) = lax.scan(update, W, None, length=steps)
    return W_end, jnp.append(losses, step(W_end)[0]), jnp.append(norms, jnp.linalg.norm(W_end))


@partial(jax.jit, static_argnames=("T0", "T", "stable"))
def _twostage_train(data, W_ov0, W_kq0, eta0, eta, xstar, T0, T, stable):
    stage1 = (lambda W: stable_ov(W, data)) if stable else naive(lambda W: collocation_loss(W, data))
    W_ov, l1, n1 = _ngd(stage1, W_ov0, eta0, T0)
    stage2 = (lambda W: stable_kq(W, W_ov, data)) if stable else naive(lambda W: twostage_loss(W_ov, W, data)[0])
    W_kq, l2, n2 = _ngd(stage2, W_kq0, eta, T)
    floor = jnp.mean(cross_entropy((data["E"].T @ W_ov @ data["E"][:, xstar]).T, data["y"]))
    return {"W_ov": W_ov, "W_kq": W_kq, "loss_floor": floor, "stage1_loss": l1, "stage1_norm": n1,
            "stage2_loss": l2, "stage2_norm": n2}


def _optimal(inputs) -> np.ndarray:
    """x* of each sentence: its token whose successor is the target."""
    tokens, lengths, succ = (np.asarray(inputs[k]) for k in ("tokens", "lengths", "succ"))
    inside = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    hit = inside & (succ[np.where(inside, tokens, 0)] == np.asarray(inputs["targets"])[:, None])
    return np.where(hit, tokens, -1).max(axis=1)


# --- shallow transformer and IndRNN (docs/shallow.md §1, §3, §6) ----------------------------------
#: σ of each activation of docs/shallow.md; any other name is an error.
ACTIVATIONS = {"tanh": jnp.tanh, "erf": lambda s: erf(s / math.sqrt(2.0))}


def sigma(s, activation: str):
    """σ(s) of the named activation (tanh, or erf(x/√2)); ValueError for a name the table lacks."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not implemented here (known: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[activation](s)


def transformer_f(opts, X, c, U, W):
    """f(X) = m^{-1/2} Σ_i c_i σ(U_i^T Σ_t α_{i,t} x_t), α_i = softmax_t(x_t^T W_i q / τ_att), q = x_T."""
    z = jnp.einsum("ntd,mde,ne->nmt", X, W, X[:, -1, :]) / opts["tau_att"]
    if opts["mask_last_key"]:
        z = z.at[:, :, -1].set(-jnp.inf)
    a = jnp.einsum("nmt,ntd->nmd", jax.nn.softmax(z, axis=2), X)
    return sigma(jnp.einsum("nmd,md->nm", a, U), opts["activation"]) @ c / math.sqrt(c.shape[0])


def indrnn_f(opts, X, c, u, W_in):
    """h_0 = 0, h_t = σ(W_in x_t + u ⊙ h_{t−1}), f = m^{-1/2} Σ_i c_i h_{T,i}."""
    def step(h, x_t):
        return sigma(x_t @ W_in.T + u * h, opts["activation"]), None

    h, _ = lax.scan(step, jnp.zeros((X.shape[0], c.shape[0]), X.dtype), jnp.swapaxes(X, 0, 1))
    return h @ c / math.sqrt(c.shape[0])


def mse(opts, X, y, params):
    """(loss, f): loss = (κ/2) mean_j (f(X_j) − y_j)²."""
    f = {"shallow": transformer_f, "indrnn": indrnn_f}[opts["model"]](opts, X, *params)
    return 0.5 * opts["kappa"] * jnp.mean((f - y) ** 2), f


def _options(model, inputs) -> tuple:
    """The static (hashable) options of a shallow / indrnn input."""
    return (("model", model), ("kappa", float(_get(inputs, "kappa", 2.0))), ("tau_att", float(_get(inputs, "tau_att", 1.0))),
            ("mask_last_key", bool(_get(inputs, "mask_last_key", False))),
            ("activation", str(_get(inputs, "activation", "tanh"))))


@partial(jax.jit, static_argnames=("opts",))
def _shallow_eval(X, y, params, opts):
    (loss, f), grads = jax.value_and_grad(partial(mse, dict(opts), X, y), has_aux=True)(params)
    return f, loss, grads


def project(B, B0, radius):
    """Per head (unit) onto the ball of ``radius`` around B0 (inf: no projection, 0: B0)."""
    delta = B - B0
    norm = jnp.linalg.norm(delta.reshape(delta.shape[0], -1), axis=1)
    scale = jnp.where(norm > radius, radius / jnp.where(norm > 0, norm, 1.0), 1.0)
    return B0 + delta * scale.reshape((-1,) + (1,) * (delta.ndim - 1))


@partial(jax.jit, static_argnames=("opts", "steps", "logged", "sgd", "val"))
def _shallow_train(X, y, X_val, y_val, theta0, radii, eta, batches, opts, steps, logged, sgd, val):
    opts = dict(opts)

    def step(theta, idx):
        loss, grads = jax.value_and_grad(lambda p: mse(opts, X, y, p)[0])(theta)
        if sgd:  # ProjSGD steps along the minibatch gradient; the log keeps the full training loss
            grads = jax.grad(lambda p: mse(opts, X[idx], y[idx], p)[0])(theta)
        new = tuple(project(p - eta * g, p0, r) for p, g, p0, r in zip(theta, grads, theta0, radii))
        val_loss = mse(opts, X_val, y_val, new)[0] if val else jnp.zeros(())
        return new, (loss, jnp.linalg.norm(grads[logged]), val_loss)

    return lax.scan(step, theta0, batches if sgd else None, length=steps)


def _np(x) -> np.ndarray:
    """A NumPy copy of ``x`` in the dtype it was computed in (the inputs' dtype, float64 or float32)."""
    return np.array(x)


def evaluate(model: str, inputs: dict) -> dict:
    if model == "twostage":
        out = _twostage_eval(sentences(inputs), jnp.asarray(inputs["W_ov"]), jnp.asarray(inputs["W_kq"]))
        return {k: _np(v) for k, v in out.items()}
    names = PARAMS[model]
    f, loss, grads = _shallow_eval(jnp.asarray(inputs["X"]), jnp.asarray(inputs["y"]),
                                   tuple(jnp.asarray(inputs[k]) for k in names), _options(model, inputs))
    return {"f": _np(f), "loss": _np(loss), **{f"grad_{k}": _np(g) for k, g in zip(names, grads)}}


def train(model: str, inputs: dict) -> dict:
    if model == "twostage":
        out = _twostage_train(sentences(inputs), jnp.asarray(inputs["W_ov"]), jnp.asarray(inputs["W_kq"]),
                              float(inputs["eta0"]), float(inputs["eta"]), jnp.asarray(_optimal(inputs)),
                              T0=int(inputs["T0"]), T=int(inputs["T"]),
                              stable=_get(inputs, "direction", "stable") == "stable")
        return {k: _np(v) for k, v in out.items()}
    names = PARAMS[model]
    theta0 = tuple(jnp.asarray(inputs[k]) for k in names)
    m = theta0[0].shape[0]
    radii = tuple(float(r) / math.sqrt(m) for r in inputs["rho"]) if "rho" in inputs else (math.inf,) * len(names)
    steps = int(inputs["steps"])
    batches = None
    if "batch" in inputs:   # ProjSGD draws (docs/contract.md): one generator, `batch` indices per step
        rng = np.random.default_rng(int(inputs["seed"]))
        batches = jnp.asarray(np.stack([rng.integers(0, len(inputs["y"]), size=int(inputs["batch"])) for _ in range(steps)]))
    val = "X_val" in inputs
    X, y = jnp.asarray(inputs["X"]), jnp.asarray(inputs["y"])
    theta, (loss, gnorm, val_loss) = _shallow_train(
        X, y, jnp.asarray(inputs["X_val"]) if val else X, jnp.asarray(inputs["y_val"]) if val else y, theta0, radii,
        float(inputs["eta"]), batches, opts=_options(model, inputs), steps=steps, logged=names.index(LOGGED[model]),
        sgd=batches is not None, val=val)
    out = {"train_loss": _np(loss), f"grad_norm_{LOGGED[model]}": _np(gnorm), **{k: _np(p) for k, p in zip(names, theta)}}
    if val:
        out["val_loss"] = _np(val_loss)
    return out
