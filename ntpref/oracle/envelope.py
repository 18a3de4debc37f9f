"""The float32 envelope of ``ntpref conformance --precision float32`` (docs/conformance.md#float32-mode).

A float32 implementation cannot agree with the float64 oracle to float64 accuracy; it should agree
as well as float32 arithmetic allows *on that input*. The envelope of an output q measures that with
the float64 oracle, u = 2^-24 being the unit roundoff of float32:

    env(q) = u (|q| + M_q)                                  one rounding of q and of the terms it is
                                                            computed from (M_q: the magnitudes of the
                                                            float64 policy, docs/tolerance.md)
           + |q(fl32(inputs)) − q|                          the inputs rounded to float32
           + n_q · max over DRAWS draws |q(moved) − q|      one rounding of every input: data moved by
                                                            u relative, each trained block by the
                                                            rounding of one update (below), ξ = ±1

n_q counts the roundings behind q: 1 for an evaluation; for training the updates before it (t + 1
at step t of a per-step log, plus the T0 + 1 of stage 1 behind stage 2), each bounded by the
largest response seen so far. One update of a block θ rounds by u max|θ| + η u max M(∇θ) (×n/B
for a minibatch of B; a unit NGD direction: η u). A measured term becomes a bound of the policy's
form: its largest entry, or along a per-step log the straight line ``atol + atol_per_step · t`` above
it. The tolerance of an array is :data:`MULTIPLE` times its envelope, so err/env = MULTIPLE · err/tol.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .cases import TRAJECTORIES
from .tolerance import TINY

#: Unit roundoff of float32.
U32 = 2.0 ** -24
#: Random draws of the moved inputs.
DRAWS = 3
#: Tolerance = MULTIPLE × envelope.
MULTIPLE = 8.0
#: Float inputs never moved: kappa takes the values 1 or 2 only.
EXACT_INPUTS = ("kappa",)
#: Inputs of training only; the rest of a train input is an eval input.
TRAIN_ONLY = ("eta0", "eta", "T0", "T", "direction", "steps", "rho", "X_val", "y_val", "batch", "seed")
#: Trained blocks of each model (the step size of each).
BLOCKS = {"twostage": {"W_ov": "eta0", "W_kq": "eta"}, "shallow": dict.fromkeys(("c", "U", "W"), "eta"),
          "indrnn": dict.fromkeys(("c", "u", "W_in"), "eta")}
_SEED = 20240924


def _magnitudes(model: str, inputs: Mapping[str, np.ndarray], **changes) -> dict[str, np.ndarray]:
    """The float64 policy's magnitudes M of every eval output of ``inputs`` with ``changes`` (a train
    input read as the eval input of the same data)."""
    from .tolerance import eval_scales

    base = {k: v for k, v in inputs.items() if k not in TRAIN_ONLY}
    return {k: M for k, (M, _) in eval_scales(model, {**base, **changes}).items()}


def _ends(model: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray], **data) -> list[dict]:
    """Magnitudes at the first and the last parameters of a training run (two-stage: of stage 2,
    W_ov at its stage-1 result; ``data`` replaces X, y)."""
    if model == "twostage":
        return [_magnitudes(model, inputs, W_ov=expected["W_ov"], W_kq=W) for W in (inputs["W_kq"], expected["W_kq"])]
    return [_magnitudes(model, inputs, **data), _magnitudes(model, inputs, **data, **{b: expected[b] for b in BLOCKS[model]})]


def _largest(ends: list[dict], name: str, reduce=np.max) -> float:
    return max(float(reduce(M[name])) for M in ends)


def evaluation_scales(model: str, kind: str, inputs: Mapping[str, np.ndarray],
                      expected: Mapping[str, np.ndarray]) -> dict[str, float]:
    """name → M_q, the magnitude of the terms q is computed from (at the first and last parameters of a
    training run); absent where |q| itself is the scale (norms, parameters)."""
    if kind == "eval":
        return {k: float(np.max(M)) for k, M in _magnitudes(model, inputs).items()}
    ends = _ends(model, inputs, expected)
    if model == "twostage":
        first = _magnitudes(model, inputs, W_ov=inputs["W_ov"], W_kq=inputs["W_kq"])
        return {"stage1_loss": max(float(first["loss0"]), _largest(ends, "loss0")),
                "stage2_loss": _largest(ends, "loss"), "loss_floor": _largest(ends, "loss")}
    from ..shallow.projgd import model_named

    logged = model_named(model).logged
    out = {"train_loss": _largest(ends, "loss"),
           f"grad_norm_{logged}": _per_batch(inputs) * _largest(ends, f"grad_{logged}", np.linalg.norm)}
    if "X_val" in inputs:
        out["val_loss"] = _largest(_ends(model, inputs, expected, X=inputs["X_val"], y=inputs["y_val"]), "loss")
    return out


def _per_batch(inputs: Mapping[str, np.ndarray]) -> float:
    return np.shape(inputs["X"])[0] / int(inputs["batch"]) if "batch" in inputs else 1.0


def update_rounding(model: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> dict[str, float]:
    """block → u max|θ| + η u max M(∇θ) (×n/B for ProjSGD; η u for a unit NGD direction): the rounding
    of one float32 update of each trained block."""
    ends = None if model == "twostage" else _ends(model, inputs, expected)
    out = {}
    for block, step in BLOCKS[model].items():
        size = max(float(np.max(np.abs(inputs[block]), initial=0.0)), float(np.max(np.abs(expected[block]), initial=0.0)))
        direction = 1.0 if ends is None else _per_batch(inputs) * _largest(ends, f"grad_{block}")
        out[block] = U32 * (size + float(inputs[step]) * direction)
    return out


def _float_inputs(inputs: Mapping[str, np.ndarray]):
    return [k for k, a in inputs.items() if np.asarray(a).dtype.kind == "f" and k not in EXACT_INPUTS]


def measured(model: str, kind: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]):
    """(|q(fl32(inputs)) − q|, max over the draws |q(moved) − q|) per output, elementwise (module docstring)."""
    from . import contract

    run = contract.evaluate if kind == "eval" else contract.train
    rng = np.random.default_rng(_SEED)
    blocks = update_rounding(model, inputs, expected) if kind == "train" else {}

    def diff(changes):
        out = run({**inputs, **changes})
        return {k: np.abs(out[k] - expected[k]) for k in expected}

    rounded = diff({k: np.asarray(inputs[k]).astype(np.float32).astype(np.float64) for k in _float_inputs(inputs)})
    worst = {k: np.zeros(np.shape(v)) for k, v in expected.items()}
    for _ in range(DRAWS):
        changes = {}
        for k in _float_inputs(inputs):
            a = np.asarray(inputs[k], dtype=np.float64)
            xi = rng.choice((-1.0, 1.0), size=a.shape)
            changes[k] = a + blocks[k] * xi if k in blocks else a * (1.0 + U32 * xi)
        worst = {k: np.maximum(worst[k], v) for k, v in diff(changes).items()}
    return rounded, worst


def roundings_behind(name: str, kind: str, inputs: Mapping[str, np.ndarray], shape: tuple) -> np.ndarray | int:
    """n_q: 1 for an evaluation; for training the updates before q (per-step logs: an array over t)."""
    if kind != "train" or name in ("W_ov_star", "W_kq_star"):
        return 1
    stage1 = int(inputs["T0"]) + 1 if "T0" in inputs else 0
    before = stage1 if name.startswith("stage2_") or name == "W_kq" else 0
    if name in TRAJECTORIES:
        return before + np.arange(shape[0]) + 1 + (name == "val_loss")
    if name in ("W_ov", "loss_floor"):
        return stage1
    return before + int(inputs["T"] if name == "W_kq" else inputs["steps"]) + 1


def _bound(err: np.ndarray, count) -> tuple[float, float]:
    """(atol, atol_per_step) above count · err: its largest entry, or along a per-step log (count an
    array over t) the straight line through its first entry above count(t) · max_{s <= t} err(s)."""
    if np.ndim(count) == 0 or err.size < 2:
        return float(np.max(count * err, initial=0.0)), 0.0
    line = count * np.maximum.accumulate(err)
    return float(line[0]), max(float(np.max((line[1:] - line[0]) / np.arange(1, err.size))), 0.0)


@np.errstate(all="ignore")   # the user's np.seterr must not change (or break) a bound
def float32_tolerances(kind: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray]) -> dict[str, dict]:
    """name → tolerance (:mod:`ntpref.oracle.compare` form) = :data:`MULTIPLE` × the float32 envelope of
    every array of ``expected``, the float64 oracle's outputs for ``inputs`` (module docstring)."""
    from ..checks import as_scalar

    model = as_scalar("model", inputs["model"], kind="str")
    rounded, moved = measured(model, kind, inputs, expected)
    scales = evaluation_scales(model, kind, inputs, expected)
    out = {}
    for name in expected:
        first, per_step = _bound(moved[name], roundings_behind(name, kind, inputs, moved[name].shape))
        atol = U32 * scales.get(name, 0.0) + float(np.max(rounded[name], initial=0.0)) + first
        out[name] = {"rtol": MULTIPLE * U32, "atol": max(MULTIPLE * atol, TINY), "atol_per_step": MULTIPLE * per_step,
                     "reason": f"float32: {MULTIPLE:g} x envelope u|q| + {atol:.2g}"
                               + (f" + {per_step:.2g}·t" if per_step else "")}
    return out
