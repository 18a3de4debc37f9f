"""The conformance cases of the shallow transformer and the IndRNN: the random regimes and the stored
cases' definitions.

:data:`REGIMES`: per model, name → ``make(rng) -> (kind, inputs, description)``, small inputs (a few
samples, at most 40 steps) that together cover the options and the edge cases:

shallow   eval_paired_mask    paired initialisation (f = 0), saturated attention, mask_last_key, tau_att = √d
          eval_T1_erf         T = 1, activation "erf", kappa = 1, independent heads
          train_projgd        ProjGD, rho = (inf, 0, 0.05): c unprojected, U frozen, W's ball active; X_val
          train_projsgd       ProjSGD (batch, seed), rho = (1, 1, 1), X_val
          eval_overflow       tau_att = 0.05, independent heads rescaled so that head i's largest |score|
                              x_t^T W_i q / tau_att is 1500^{i/(m-1)}: from unsaturated to beyond exp's
                              overflow in float32 (88.72) and float64 (709.78)
indrnn    eval_paired         paired initialisation (f = 0)
          eval_T1_erf         T = 1, activation "erf", kappa = 1
          train_projgd        ProjGD, rho = (0.05, 0.05, 0.05), X_val
          train_projsgd       ProjSGD (batch, seed), rho = (1, 1, 1), X_val

:data:`STORED`: the stored reference cases of both models (:class:`ntpref.spec.StoredCase`; the NTK Gram
matrix case of kind "ntk" among them), written to ``reference_runs/`` by tests/make_reference_runs.py and
checked by ``ntpref verify``.
"""
from __future__ import annotations

import math
from functools import partial

import numpy as np

from ..spec import Bench, StoredCase
from ..spec import normal as _normal
from . import indrnn
from . import model as transformer
from .data import scale_tokens
from .model import iid_init, paired_init

#: The two models' names (from their records).
SHALLOW, INDRNN = transformer.MODEL.name, indrnn.MODEL.name


def _samples(rng, n: int, T: int, d: int) -> dict:
    return dict(X=_normal(rng, n, T, d, scale=d ** -0.5), y=_normal(rng, n))


def _heads(rng, model: str, m: int, d: int, paired: bool) -> dict:
    seed = int(rng.integers(2 ** 31))
    if model == INDRNN:
        c, u, W_in = indrnn.paired_init(m, d, seed)
        if not paired:
            c, u, W_in = (p + _normal(rng, *p.shape, scale=0.3) for p in (c, u, W_in))
        return dict(c=c, u=u, W_in=W_in)
    c, U, W = (paired_init if paired else iid_init)(m, d, seed)
    return dict(c=c, U=U, W=W)


def _training(rng, n: int, T: int, d: int, eta: float, rho, **more) -> dict:
    val = _samples(rng, int(rng.integers(4, 8)), T, d)
    return dict(eta=np.array(eta), steps=np.array(int(rng.integers(25, 40))), rho=np.array(rho, dtype=np.float64),
                X_val=val["X"], y_val=val["y"], **more)


def _dims(rng, T=None):
    n, d, m = int(rng.integers(6, 10)), int(rng.integers(2, 5)), 2 * int(rng.integers(2, 5))
    return n, (int(rng.integers(2, 6)) if T is None else T), d, m


def _shallow_eval_paired_mask(rng):
    n, T, d, m = _dims(rng)
    T = max(T, 2)
    heads = _heads(rng, SHALLOW, m, d, paired=True)
    heads["W"] = 30.0 * heads["W"]
    inputs = dict(**_samples(rng, n, T, d), **heads, mask_last_key=np.array(True), tau_att=np.array(math.sqrt(d)))
    return "eval", inputs, f"paired init (f = 0), W of scale 30 (saturated attention), mask_last_key, tau_att = sqrt({d}), m = {m}"


def _eval_T1_erf(rng, model: str):
    n, T, d, m = _dims(rng, T=1)
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, model, m, d, paired=False),
                  activation=np.array("erf"), kappa=np.array(1.0))
    heads = "independent heads" if model == SHALLOW else "perturbed paired init"
    return "eval", inputs, f"T = 1, activation erf, kappa = 1, {heads}, m = {m}"


def overflow_heads(X: np.ndarray, W: np.ndarray, tau_att: float, top: float) -> np.ndarray:
    """W [m, d, d] (m >= 2) with head i rescaled so that its largest |score| |x_t^T W_i x_T| / tau_att over the
    samples and keys of X [n, T, d] is top^{i/(m-1)}: 1 for head 0, ``top`` for head m - 1. Every head
    needs a nonzero score."""
    z = np.einsum("ntd,mde,ne->mnt", X, W, X[:, -1, :]) / tau_att
    largest = np.abs(z).reshape(len(W), -1).max(axis=1)
    return W * (top ** (np.arange(len(W)) / (len(W) - 1)) / largest)[:, None, None]


def _shallow_eval_overflow(rng):
    n, T, d, m = _dims(rng)
    T, tau_att = max(T, 2), 0.05
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, SHALLOW, m, d, paired=False), tau_att=np.array(tau_att))
    inputs["W"] = overflow_heads(inputs["X"], inputs["W"], tau_att, 1500.0)
    return "eval", inputs, (f"tau_att = 0.05, independent heads (m = {m}) whose largest |score| runs from 1 to 1500: "
                            "attention beyond exp's overflow in float32 (88.7) and float64 (709.8)")


def _shallow_train_projgd(rng):
    n, T, d, m = _dims(rng)
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, SHALLOW, m, d, paired=True),
                  **_training(rng, n, T, d, 0.5, (math.inf, 0.0, 0.05)))
    return "train", inputs, "ProjGD, rho = (inf, 0, 0.05): c unprojected, U frozen, W's ball active; validation set"


def _train_projsgd(rng, model: str):
    n, T, d, m = _dims(rng)
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, model, m, d, paired=True),
                  **_training(rng, n, T, d, 0.3, (1.0, 1.0, 1.0), batch=np.array(int(rng.integers(2, 5))),
                              seed=np.array(int(rng.integers(1000)))))
    return "train", inputs, "ProjSGD (batch, seed), rho = (1, 1, 1), validation set"


def _indrnn_eval_paired(rng):
    n, T, d, m = _dims(rng)
    return "eval", dict(**_samples(rng, n, T, d), **_heads(rng, INDRNN, m, d, paired=True)), f"paired init (f = 0), T = {T}, m = {m}"


def _indrnn_train_projgd(rng):
    n, T, d, m = _dims(rng)
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, INDRNN, m, d, paired=True),
                  **_training(rng, n, T, d, 0.3, (0.05, 0.05, 0.05)))
    return "train", inputs, "ProjGD, rho = (0.05, 0.05, 0.05) (projection active), validation set"


#: name → make(rng) of each model, in the order random case j cycles through them.
REGIMES = {
    SHALLOW: {"eval_paired_mask": _shallow_eval_paired_mask, "eval_T1_erf": partial(_eval_T1_erf, model=SHALLOW),
              "train_projgd": _shallow_train_projgd, "train_projsgd": partial(_train_projsgd, model=SHALLOW),
              "eval_overflow": _shallow_eval_overflow},
    INDRNN: {"eval_paired": _indrnn_eval_paired, "eval_T1_erf": partial(_eval_T1_erf, model=INDRNN),
             "train_projgd": _indrnn_train_projgd, "train_projsgd": partial(_train_projsgd, model=INDRNN)},
}


# --- stored cases ----------------------------------------------------------------------------------
def _tokens(rng, n: int, T: int, d: int) -> np.ndarray:
    """Tokens i.i.d. N(0, I_d), each scaled by min(1, 1/||x_t||) (docs/shallow.md §5)."""
    X = rng.standard_normal((n, T, d))
    return X * np.minimum(1.0, 1.0 / np.linalg.norm(X, axis=2, keepdims=True))


def _targets(X: np.ndarray) -> np.ndarray:
    """y = sin(2 x_T[0]) + mean_t x_t[1]: a smooth target that uses the query and the context."""
    return np.sin(2.0 * X[:, -1, 0]) + X[:, :, 1].mean(axis=1)


def _shallow_params(cfg: dict, seed: int, rng) -> dict:
    model = indrnn if cfg.get("rnn") else transformer
    params = model.paired_init(cfg["m"], cfg["d"], seed)._asdict()
    if cfg.get("perturb"):
        params = {k: v + cfg["perturb"] * rng.standard_normal(v.shape) for k, v in params.items()}
    return params


def _shallow(cfg: dict, seed: int) -> dict:
    """Tokens (:func:`_tokens`, rng seed + 1000), y (:func:`_targets`), paired init (seed) plus
    ``perturb``·N(0, 1) noise (same rng), optional validation set and train/option fields from cfg."""
    rng = np.random.default_rng(seed + 1000)
    X = _tokens(rng, cfg["n"], cfg["T"], cfg["d"])
    arrays = {"model": np.array(INDRNN if cfg.get("rnn") else SHALLOW), "X": X, "y": _targets(X),
              **_shallow_params(cfg, seed, rng)}
    if cfg.get("n_val"):
        X_val = _tokens(rng, cfg["n_val"], cfg["T"], cfg["d"])
        arrays.update(X_val=X_val, y_val=_targets(X_val))
    for key in ("kappa", "tau_att", "eta"):
        if key in cfg:
            arrays[key] = np.array(float(cfg[key]))
    if cfg.get("tau_att_sqrt_d"):
        arrays["tau_att"] = np.array(np.sqrt(cfg["d"]))
    for key in ("steps", "batch", "seed"):
        if key in cfg:
            arrays[key] = np.array(cfg[key], dtype=np.int64)
    if "mask_last_key" in cfg:
        arrays["mask_last_key"] = np.array(bool(cfg["mask_last_key"]))
    if "activation" in cfg:
        arrays["activation"] = np.array(cfg["activation"])
    if "rho" in cfg:
        arrays["rho"] = np.array(cfg["rho"], dtype=np.float64)
    return arrays


def _overflow(cfg: dict, seed: int) -> dict:
    """:func:`_shallow` with W rescaled by :func:`overflow_heads` (cfg ``tau_att``, ``top``)."""
    arrays = _shallow(cfg, seed)
    arrays["W"] = overflow_heads(arrays["X"], arrays["W"], cfg["tau_att"], cfg["top"])
    return arrays


def _ntk(cfg: dict, seed: int) -> dict:
    """Like :func:`_shallow` without y: ``model``, X, c, U, W (kind "ntk")."""
    arrays = _shallow(cfg, seed)
    return {k: arrays[k] for k in ("model", "X", "c", "U", "W", "tau_att", "mask_last_key", "activation")
            if k in arrays}


#: The stored reference cases of both models, in the order of the manifest.
STORED = (
    StoredCase("shallow_eval_paired_init", SHALLOW, "eval",
         "shallow transformer at the paired initialisation: f = 0 exactly, loss = mean y^2; paired heads have "
         "equal grad_c and opposite grad_U, grad_W",
         {"n": 12, "T": 5, "d": 4, "m": 8}, 4, _shallow),
    StoredCase("shallow_eval_perturbed", SHALLOW, "eval",
         "shallow transformer at paired init + 0.3 N(0, 1) noise on c, U, W (f != 0): f, loss and all gradients",
         {"n": 12, "T": 5, "d": 4, "m": 8, "perturb": 0.3}, 5, _shallow),
    StoredCase("shallow_eval_mask_tau", SHALLOW, "eval",
         "options: mask_last_key (the query does not attend to itself), tau_att = sqrt(d), activation erf, "
         "kappa = 1, perturbed parameters",
         {"n": 10, "T": 6, "d": 5, "m": 6, "perturb": 0.3, "mask_last_key": True, "tau_att_sqrt_d": True,
          "activation": "erf", "kappa": 1.0}, 6, _shallow),
    StoredCase("shallow_train_projgd", SHALLOW, "train",
         "ProjGD (full batch) from paired init with small radii rho = (0.5, 0.5, 0.5) so the projection is "
         "active, with a validation set: final c, U, W, train_loss, val_loss, grad_norm_W per step",
         {"n": 32, "T": 5, "d": 4, "m": 8, "n_val": 16, "eta": 0.5, "steps": 150, "rho": [0.5, 0.5, 0.5]}, 7,
         _shallow),
    StoredCase("shallow_train_projsgd", SHALLOW, "train",
         "ProjSGD: minibatches of 8 drawn with replacement (seed 11), rho = (3, 3, 3), validation set",
         {"n": 32, "T": 5, "d": 4, "m": 8, "n_val": 16, "eta": 0.3, "steps": 150, "rho": [3.0, 3.0, 3.0],
          "batch": 8, "seed": 11}, 8, _shallow),
    StoredCase("indrnn_eval", INDRNN, "eval",
         "IndRNN baseline at paired init + 0.3 N(0, 1) noise: f, loss, grad_c, grad_u, grad_W_in (BPTT)",
         {"n": 12, "T": 6, "d": 4, "m": 8, "perturb": 0.3, "rnn": True}, 9, _shallow),
    StoredCase("indrnn_train", INDRNN, "train",
         "IndRNN trained by ProjGD from paired init, rho = (1, 1, 1), validation set: final c, u, W_in, "
         "train_loss, val_loss, grad_norm_u per step",
         {"n": 32, "T": 6, "d": 4, "m": 8, "n_val": 16, "eta": 0.3, "steps": 150, "rho": [1.0, 1.0, 1.0],
          "rnn": True}, 10, _shallow),
    StoredCase("shallow_ntk_gram", SHALLOW, "ntk",
         "finite-width NTK Gram matrix (kind ntk, not an interchange model): input X [n=10, T=5, d=4], c, U, W "
         "(paired init, m = 16); output gram [10, 10] = ntpref.shallow.ntk.ntk_gram(X, c, U, W)",
         {"n": 10, "T": 5, "d": 4, "m": 16}, 12, _ntk),
    StoredCase("shallow_eval_overflow", SHALLOW, "eval",
         "saturated attention beyond exp's overflow: paired init + 0.3 N(0, 1) noise, tau_att = 0.05, head i's W "
         "rescaled so that its largest |score| x_t^T W_i q / tau_att is 1500^{i/7} (1 to 1500: heads below, "
         "between and beyond the float32 (88.7) and float64 (709.8) thresholds); a softmax without its largest "
         "score subtracted gives NaN",
         {"n": 10, "T": 5, "d": 4, "m": 8, "perturb": 0.3, "tau_att": 0.05, "top": 1500.0}, 14, _overflow),
)


# --- benchmark --------------------------------------------------------------------------------------
def _bench_inputs(model: str, size: dict, seed: int = 0) -> dict:
    """X [n, T, d] N(0, 1) scaled to norm ≤ 1, y [n] N(0, 1) and ``params``: the transformer's iid_init; the
    IndRNN's paired_init with the second half's W_in redrawn (f ≠ 0)."""
    rng = np.random.default_rng(seed)
    X = scale_tokens(rng.standard_normal((size["n"], size["T"], size["d"])))
    y, m, d = rng.standard_normal(size["n"]), size["m"], size["d"]
    if model == SHALLOW:
        return dict(X=X, y=y, params=iid_init(m, d, seed))
    c, u, W_in = indrnn.paired_init(m, d, seed)
    W_in[m // 2:] = rng.standard_normal((m - m // 2, d))
    return dict(X=X, y=y, params=(c, u, W_in))


def _bench_step(model: str, inputs: dict, backend: str = "numba"):
    module = transformer if model == SHALLOW else indrnn
    data, params = module.prepare(inputs["X"], inputs["y"]), inputs["params"]
    return lambda: module.loss_and_grad(data, *params, backend=backend)


_SIZES = ("n", "d", "T", "m")
#: The papers' sizes (the width sweep's n = 4000, d = 8, T = 16, m = 64, also m = 256 and T = 64; the RNN
#: comparison's d = 17, lag 96).
BENCH = {SHALLOW: Bench(dict(n=4000, d=8, T=16, m=64), (dict(m=256), dict(T=64)), _SIZES,
                        partial(_bench_inputs, SHALLOW), partial(_bench_step, SHALLOW)),
         INDRNN: Bench(dict(n=4000, d=17, T=97, m=64), (), _SIZES, partial(_bench_inputs, INDRNN),
                       partial(_bench_step, INDRNN))}
