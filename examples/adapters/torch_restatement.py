"""A PyTorch restatement of the three ntpref models, in a dtype of your choice, as a conformance adapter.

torch_float64.py and torch_float32.py are this restatement in float64 and float32. It is written
from the math in docs/twostage.md and docs/shallow.md, not from ntpref's code, and takes every
gradient from torch.autograd:

  twostage  §2 Eq. 1 (softmax attention, last token = query) and the collocation loss L0;
            §4 Algorithm 1 (normalized GD, stage 1 on W_ov, stage 2 on W_kq) in both directions
  shallow   §1 the m-head transformer with MSE (kappa), §3 ProjGD / ProjSGD
  indrnn    §6 the diagonal RNN, same training

Two places need more than plain autograd, both documented choices of ntpref:

* The cross-entropy is written as log(1 + Σ_{v≠y} e^{z_v − z_y}), so that autograd forms p_y − 1 as
  −Σ_{v≠y} p_v (no cancellation) and small losses keep their relative accuracy.
* The "stable" NGD direction (docs/twostage.md §4.1). Late in training every p_v (v ≠ y) can
  underflow and the softmax Jacobian φ_l (a_l − φ·a) cancel, so the float64 gradient is 0 or wrong
  while its direction is well defined. Here it is computed with the log-scale factors taken out:
  ∂ℓ/∂z = e^m g̃ with m = max_{v≠y} log p_v, and ∂ℓ/∂s_l = Σ_k φ_l φ_k (a_l − a_k) with every weight
  φ_l φ_k e^m formed as exp(log φ_l + log φ_k + m − Λ), Λ the largest over the data. The linear
  maps (ã from g̃, the gradient from ∂ℓ/∂s) are autograd vector-Jacobian products.

Interface (docs/conformance.md): ``evaluate(model, inputs)`` and ``train(model, inputs)`` take the
arrays of an ``ntpref eval`` / ``ntpref train`` input (without ``model``) and return the outputs
under the same names, as NumPy arrays of the chosen dtype. The max-margin outputs (W_ov_star,
W_kq_star, stage*_corr) need a QP solver and are not returned.
"""
from __future__ import annotations

import math

import numpy as np
import torch

# The conformance cases are tiny: one thread is faster than many (thread start-up dominates).
torch.set_num_threads(1)

PARAMS = {"shallow": ("c", "U", "W"), "indrnn": ("c", "u", "W_in")}
#: The parameter block whose gradient norm is logged (grad_norm_W, grad_norm_u).
LOGGED = {"shallow": "W", "indrnn": "u"}


def _get(inputs, name, default):
    return np.asarray(inputs[name]).item() if name in inputs else default


def cross_entropy(z, y):
    """Per row −log softmax(z)_y = log(1 + Σ_{v≠y} e^{r_v}), r = z − z_y [B, K] → [B]."""
    return torch.logaddexp(torch.zeros_like(z[:, 0]), torch.logsumexp(_margins(z, y), dim=1))


def _margins(z, y):
    """r_v = z_v − z_y, −inf at v = y."""
    r = z - z.gather(1, y[:, None])
    return r.masked_fill(torch.nn.functional.one_hot(y, z.shape[1]).bool(), -math.inf)


def scaled_output_gradient(z, y):
    """(m [B], g̃ [B, K]) with ∂ℓ/∂z = p − e_y = e^m g̃: m = max_{v≠y} log p_v, g̃_v = p_v e^{−m} (v ≠ y),
    g̃_y = −Σ_{v≠y} g̃_v. Nothing underflows however small the p_v are."""
    r = _margins(z, y)
    logp = r - torch.logaddexp(torch.zeros_like(z[:, 0]), torch.logsumexp(r, dim=1))[:, None]
    m = logp.max(dim=1).values
    g = torch.exp(logp - m[:, None])
    return m, g - torch.nn.functional.one_hot(y, z.shape[1]).to(g.dtype) * g.sum(dim=1, keepdim=True)


class Sentences:
    """A two-stage dataset as tensors: X [N, Lmax, d] (row l = e_{τ_l}, padding as token 0 and masked),
    queries q [N, d] (the last token), mask [N, Lmax], targets y [N]; E [d, K]."""

    def __init__(self, E, tokens, lengths, targets):
        tokens, lengths = np.asarray(tokens), np.asarray(lengths)
        mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
        self.E = E
        self.X = E.T[torch.as_tensor(np.where(mask, tokens, 0))]
        self.q = E.T[torch.as_tensor(tokens[np.arange(len(lengths)), lengths - 1])]
        self.mask = torch.as_tensor(mask)
        self.y = torch.tensor(np.asarray(targets))

    def scores(self, W_kq):
        """s_l = x_l^T W_kq q, −inf on padding [N, Lmax]."""
        return torch.einsum("nld,de,ne->nl", self.X, W_kq, self.q).masked_fill(~self.mask, -math.inf)

    def logits(self, W_ov, phi):
        """z = E^T W_ov X φ [N, K]."""
        return torch.einsum("dk,de,ne->nk", self.E, W_ov, torch.einsum("nl,nle->ne", phi, self.X))

    def forward(self, W_ov, W_kq):
        """(per-sentence losses [N], logits z [N, K], attention φ [N, Lmax])."""
        phi = torch.softmax(self.scores(W_kq), dim=1)
        z = self.logits(W_ov, phi)
        return cross_entropy(z, self.y), z, phi


class TorchModels:
    """evaluate / train of docs/conformance.md in ``dtype`` (torch.float64 or torch.float32)."""

    def __init__(self, dtype):
        self.dtype = dtype
        self.np_dtype = {torch.float64: np.float64, torch.float32: np.float32}[dtype]

    def tensor(self, x):
        return torch.tensor(np.asarray(x), dtype=self.dtype)

    def array(self, x) -> np.ndarray:
        if isinstance(x, torch.Tensor):
            return x.detach().numpy().copy()
        return np.asarray(x, dtype=self.np_dtype)

    def evaluate(self, model: str, inputs: dict) -> dict:
        out = self._twostage_eval(inputs) if model == "twostage" else self._shallow_eval(model, inputs)
        return {k: self.array(v) for k, v in out.items()}

    def train(self, model: str, inputs: dict) -> dict:
        out = self._twostage_train(inputs) if model == "twostage" else self._shallow_train(model, inputs)
        return {k: self.array(v) for k, v in out.items()}

    # --- twostage -------------------------------------------------------------------------------
    def _embedding(self, inputs):
        return self.tensor(inputs["E"]) if "E" in inputs else torch.eye(int(inputs["K"]), dtype=self.dtype)

    def _sentences(self, inputs):
        return Sentences(self._embedding(inputs), inputs["tokens"], inputs["lengths"], inputs["targets"])

    def _collocation(self, E, succ):
        """(E_C [d, |C|], n(C) [|C|]) over C = the tokens with a successor."""
        C = np.flatnonzero(np.asarray(succ) >= 0)
        return E[:, torch.as_tensor(C)], torch.as_tensor(np.asarray(succ)[C])

    def _twostage_eval(self, inputs):
        data = self._sentences(inputs)
        W_ov, W_kq = (self.tensor(inputs[k]).requires_grad_(True) for k in ("W_ov", "W_kq"))
        losses, z, phi = data.forward(W_ov, W_kq)
        loss = losses.mean()
        g_ov, g_kq = torch.autograd.grad(loss, (W_ov, W_kq))
        out = {"loss": loss, "logits": z, "attn": phi, "grad_W_ov": g_ov, "grad_W_kq": g_kq}
        if "succ" in inputs:
            EC, nC = self._collocation(data.E, inputs["succ"])
            loss0 = cross_entropy((data.E.T @ W_ov @ EC).T, nC).mean()
            out["loss0"], out["grad0_W_ov"] = loss0, torch.autograd.grad(loss0, W_ov)[0]
        return out

    def _twostage_train(self, inputs):
        data = self._sentences(inputs)
        stable = _get(inputs, "direction", "stable") == "stable"
        EC, nC = self._collocation(data.E, inputs["succ"])

        def stage1(W_ov):
            """(L0, G ∝ ∇L0) at W_ov."""
            W_ov = W_ov.detach().requires_grad_(True)
            z = (data.E.T @ W_ov @ EC).T
            loss = cross_entropy(z, nC).mean()
            if not stable:
                return loss, torch.autograd.grad(loss, W_ov)[0]
            m, g = scaled_output_gradient(z.detach(), nC)
            weight = torch.exp(m - m.max())
            return loss, torch.autograd.grad(z, W_ov, weight[:, None] * g)[0]

        W_ov, stage1_loss, stage1_norm = _ngd(stage1, self.tensor(inputs["W_ov"]), float(inputs["eta0"]),
                                              int(inputs["T0"]))

        def stage2(W_kq):
            """(L, G ∝ ∇_{W_kq} L) at W_kq with W_ov frozen."""
            W_kq = W_kq.detach().requires_grad_(True)
            if not stable:
                loss = data.forward(W_ov, W_kq)[0].mean()
                return loss, torch.autograd.grad(loss, W_kq)[0]
            s = data.scores(W_kq)
            logphi = torch.log_softmax(s.detach(), dim=1)
            phi = logphi.exp().requires_grad_(True)
            z = data.logits(W_ov, phi)
            loss = cross_entropy(z, data.y).mean()
            m, g = scaled_output_gradient(z.detach(), data.y)
            a = torch.autograd.grad(z, phi, g)[0]                            # ã_l = x_l^T W_ov^T E g̃
            D = a[:, :, None] - a[:, None, :]                                # ã_l − ã_k
            pair = data.mask[:, :, None] & data.mask[:, None, :] & (D != 0)
            logw = (logphi[:, :, None] + logphi[:, None, :] + m[:, None, None]).masked_fill(~pair, -math.inf)
            top = logw.max()
            if top == -math.inf:                                             # all a_l equal: G = 0 exactly
                return loss, torch.zeros_like(W_kq)
            gs = (torch.exp(logw - top) * D).sum(dim=2)                       # ∝ ∂L/∂s
            return loss, torch.autograd.grad(s, W_kq, gs)[0]

        W_kq, stage2_loss, stage2_norm = _ngd(stage2, self.tensor(inputs["W_kq"]), float(inputs["eta"]),
                                              int(inputs["T"]))
        succ = np.asarray(inputs["succ"])
        tokens, lengths = np.asarray(inputs["tokens"]), np.asarray(inputs["lengths"])
        inside = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
        hit = inside & (succ[np.where(inside, tokens, 0)] == np.asarray(inputs["targets"])[:, None])
        xstar = np.where(hit, tokens, -1).max(axis=1)                         # the token whose successor is y
        floor = cross_entropy((data.E.T @ W_ov @ data.E[:, torch.as_tensor(xstar)]).T, data.y).mean()
        return {"W_ov": W_ov, "W_kq": W_kq, "loss_floor": floor, "stage1_loss": stage1_loss,
                "stage1_norm": stage1_norm, "stage2_loss": stage2_loss, "stage2_norm": stage2_norm}

    # --- shallow transformer and IndRNN -----------------------------------------------------------
    def _options(self, model, inputs):
        return {"model": model, "kappa": _get(inputs, "kappa", 2.0), "tau_att": _get(inputs, "tau_att", 1.0),
                "mask_last_key": bool(_get(inputs, "mask_last_key", False)),
                "activation": _get(inputs, "activation", "tanh")}

    def _shallow_eval(self, model, inputs):
        opts = self._options(model, inputs)
        params = [self.tensor(inputs[k]).requires_grad_(True) for k in PARAMS[model]]
        f, loss = mse(opts, self.tensor(inputs["X"]), self.tensor(inputs["y"]), params)
        grads = torch.autograd.grad(loss, params)
        return {"f": f, "loss": loss, **{f"grad_{k}": g for k, g in zip(PARAMS[model], grads)}}

    def _shallow_train(self, model, inputs):
        """θ(t+1) = Π(θ(t) − η g), g the full or the minibatch gradient; logs before/after each update."""
        opts = self._options(model, inputs)
        names = PARAMS[model]
        X, y = self.tensor(inputs["X"]), self.tensor(inputs["y"])
        val = (self.tensor(inputs["X_val"]), self.tensor(inputs["y_val"])) if "X_val" in inputs else None
        theta0 = [self.tensor(inputs[k]) for k in names]
        m = theta0[0].shape[0]
        radii = [r / math.sqrt(m) for r in np.asarray(inputs["rho"], dtype=float)] if "rho" in inputs else [math.inf] * 3
        eta, steps = float(inputs["eta"]), int(inputs["steps"])
        # ProjSGD draws (docs/contract.md, train conventions): one generator, `batch` indices per step.
        rng = np.random.default_rng(int(inputs["seed"])) if "batch" in inputs else None
        logged = names.index(LOGGED[model])
        theta, logs = theta0, {"train_loss": [], f"grad_norm_{LOGGED[model]}": [], "val_loss": []}
        for _ in range(steps):
            params = [p.detach().requires_grad_(True) for p in theta]
            loss = mse(opts, X, y, params)[1]
            logs["train_loss"].append(loss.item())
            if rng is not None:
                idx = torch.as_tensor(rng.integers(0, len(y), size=int(inputs["batch"])))
                loss = mse(opts, X[idx], y[idx], params)[1]
            grads = torch.autograd.grad(loss, params)
            logs[f"grad_norm_{LOGGED[model]}"].append(torch.linalg.norm(grads[logged]).item())
            with torch.no_grad():
                theta = [project(p - eta * g, p0, r) for p, g, p0, r in zip(params, grads, theta0, radii)]
                if val is not None:
                    logs["val_loss"].append(mse(opts, *val, theta)[1].item())
        out = {k: v for k, v in logs.items() if k != "val_loss" or val is not None}
        return {**out, **dict(zip(names, theta))}


def _ngd(step, W, eta: float, steps: int):
    """Normalized GD W ← W − η G/‖G‖_F, ``step(W) -> (loss, G)``. Returns (W, losses [steps + 1],
    norms [steps + 1]) at t = 0..steps. At G = 0 the stage stops; its logs repeat the last value."""
    losses, norms = [], []
    for t in range(steps + 1):
        loss, G = step(W)
        losses.append(loss.item())
        norms.append(torch.linalg.norm(W).item())
        norm = torch.linalg.norm(G) if t < steps else None
        if norm is None or norm == 0:
            break
        W = W.detach() - eta * G / norm
    pad = steps + 1 - len(losses)
    return W.detach(), losses + losses[-1:] * pad, norms + norms[-1:] * pad


#: σ of each activation of docs/shallow.md; any other name is an error.
ACTIVATIONS = {"tanh": torch.tanh, "erf": lambda s: torch.erf(s / math.sqrt(2.0))}


def sigma(s, activation: str):
    """σ(s) of the named activation (tanh, or erf(x/√2)); ValueError for a name the table lacks."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation {activation!r} is not implemented here (known: {', '.join(ACTIVATIONS)})")
    return ACTIVATIONS[activation](s)


def transformer_f(opts, X, c, U, W):
    """f(X) = m^{-1/2} Σ_i c_i σ(U_i^T Σ_t α_{i,t} x_t), α_i = softmax_t(x_t^T W_i q / τ_att), q = x_T."""
    z = torch.einsum("ntd,mde,ne->nmt", X, W, X[:, -1, :]) / opts["tau_att"]
    if opts["mask_last_key"]:
        last = torch.zeros(z.shape[-1], dtype=torch.bool)
        last[-1] = True
        z = z.masked_fill(last, -math.inf)
    a = torch.einsum("nmt,ntd->nmd", torch.softmax(z, dim=2), X)
    return sigma(torch.einsum("nmd,md->nm", a, U), opts["activation"]) @ c / math.sqrt(len(c))


def indrnn_f(opts, X, c, u, W_in):
    """h_0 = 0, h_t = σ(W_in x_t + u ⊙ h_{t−1}), f = m^{-1/2} Σ_i c_i h_{T,i}."""
    h = torch.zeros(X.shape[0], len(c), dtype=X.dtype)
    for t in range(X.shape[1]):
        h = sigma(X[:, t, :] @ W_in.T + u * h, opts["activation"])
    return h @ c / math.sqrt(len(c))


MODEL_F = {"shallow": transformer_f, "indrnn": indrnn_f}


def mse(opts, X, y, params):
    """(f, loss) with loss = (κ/2) mean_j (f(X_j) − y_j)²."""
    f = MODEL_F[opts["model"]](opts, X, *params)
    return f, 0.5 * opts["kappa"] * torch.mean((f - y) ** 2)


def project(B, B0, radius: float):
    """Per head (unit) onto the ball of ``radius`` around B0: B0 + Δ min(1, r/‖Δ‖), the norm over all
    axes but the first; radius inf leaves B alone, 0 freezes it at B0."""
    if math.isinf(radius):
        return B
    delta = B - B0
    norm = torch.linalg.norm(delta.reshape(delta.shape[0], -1), dim=1)
    scale = torch.where(norm > radius, radius / torch.where(norm > 0, norm, 1.0), 1.0)
    return B0 + delta * scale.reshape((-1,) + (1,) * (delta.dim() - 1))
