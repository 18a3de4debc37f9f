"""The ``eval`` / ``train`` contract for model = "twostage" (docs/contract.md).

inputs   tokens [N, Lmax] int (−1 past a sentence's length), lengths [N] int, targets [N] int,
         W_ov [d, d], W_kq [d, d], exactly one of E [d, K] or K (0-d int; E = I_K), optional succ [K] int
eval     loss (0-d), logits [N, K], attn [N, Lmax] (0 past the length), grad_W_ov [d, d], grad_W_kq [d, d];
         with succ also loss0 (0-d, L0 over C = every token with succ ≥ 0) and grad0_W_ov [d, d]
train    inputs additionally succ (required), eta0, eta (0-d > 0), T0, T (0-d int ≥ 0), optional direction
         ("stable" | "naive"); W_ov / W_kq are the initial values. Outputs W_ov, W_kq (final), W_ov_star,
         W_kq_star, stage1_loss / stage1_norm / stage1_corr [T0 + 1], stage2_loss / stage2_norm /
         stage2_corr [T + 1] (index t = after t updates; a stage stopped by a zero gradient is padded with
         its last value), loss_floor (0-d L*).
Unknown array names are errors. Outputs are float64, scalars 0-d.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from ..checks import MAX_STEPS, as_float, as_scalar, check_names
from ..errors import InputError
from ..progress import silent
from ..spec import ABSENT, OPTIONAL, REQUIRED, Input, names_of
from .dataset import Dataset
from .model import forward, loss_and_grad, prepare, prepare_collocations
from .two_stage import train as two_stage_train

NAME = "twostage"
#: The input arrays (their order: the required ones in the order a missing-array error lists them).
INPUTS = (
    Input("tokens", "[N, Lmax]", "int", REQUIRED, REQUIRED, "-1 past a sentence's length"),
    Input("lengths", "[N]", "int", REQUIRED, REQUIRED),
    Input("targets", "[N]", "int", REQUIRED, REQUIRED),
    Input("W_ov", "[d, d]", "float", REQUIRED, REQUIRED),
    Input("W_kq", "[d, d]", "float", REQUIRED, REQUIRED),
    Input("E", "[d, K]", "float", OPTIONAL, OPTIONAL, "exactly one of E and K"),
    Input("K", "0-d", "int", OPTIONAL, OPTIONAL, "E = I_K"),
    Input("succ", "[K]", "int", OPTIONAL, REQUIRED, "no loss0 / grad0_W_ov"),
    Input("eta0", "0-d", "float", ABSENT, REQUIRED),
    Input("eta", "0-d", "float", ABSENT, REQUIRED),
    Input("T0", "0-d", "int", ABSENT, REQUIRED),
    Input("T", "0-d", "int", ABSENT, REQUIRED),
    Input("direction", "0-d", "str", ABSENT, OPTIONAL, '"stable"'),
)
#: Outputs of eval (loss0 and grad0_W_ov with succ) and of train; the per-step logs among the train outputs.
EVAL_OUTPUTS = ("loss", "logits", "attn", "grad_W_ov", "grad_W_kq", "loss0", "grad0_W_ov")
TRAJECTORIES = tuple(f"{stage}_{key}" for stage in ("stage1", "stage2") for key in ("loss", "norm", "corr"))
TRAIN_OUTPUTS = ("W_ov", "W_kq", "W_ov_star", "W_kq_star", "loss_floor") + TRAJECTORIES
#: Train outputs an implementation need not return: the max-margin solutions and the correlations with them.
DIAGNOSTICS = ("W_ov_star", "W_kq_star", "stage1_corr", "stage2_corr")
#: The outputs not promised bit-identical across x86-64 CPUs, with what makes their rounding depend on the CPU
#: (docs/contract.md, "Stored reference cases"); every other output comes from the Numba kernels and NumPy
#: operations whose results IEEE 754 and NumPy's fixed summation order determine.
NOT_BITWISE = {
    "W_ov_star": "max-margin solution: E M E^T by BLAS (the closed form of orthonormal E, else the QP)",
    "W_kq_star": "least-norm QP solver: np.linalg.norm in its rescaling, E M E^T by BLAS",
    "stage1_norm": "np.linalg.norm (BLAS dot)",
    "stage2_norm": "np.linalg.norm (BLAS dot)",
    "stage1_corr": "np.vdot and np.linalg.norm (BLAS dot)",
    "stage2_corr": "np.vdot and np.linalg.norm (BLAS dot)",
}
#: The trained blocks and the input holding each one's step size (stage 1: W_ov, stage 2: W_kq).
BLOCKS = {"W_ov": "eta0", "W_kq": "eta"}


def input_dataset(arrays: Mapping) -> Dataset:
    """The Dataset of the arrays of an input file (tokens, lengths, targets, exactly one of E [d, K] / K, optional
    succ), validated; W_ov is checked to be [K, K] before a one-hot E = I_K is built."""
    if ("E" in arrays) == ("K" in arrays):
        raise InputError("give exactly one of array 'E' [d, K] (embeddings) or 'K' (0-d int, one-hot E = I_K)"
                         + (", not both" if "E" in arrays else ""))
    if "E" in arrays:
        E = as_float("E", arrays["E"], (None, None))
    else:
        K = as_scalar("K", arrays["K"], kind="int", low=1)
        as_float("W_ov", arrays["W_ov"], (K, K))  # before I_K is built: a huge K must not allocate
        E = np.eye(K)
    return Dataset(arrays["tokens"], arrays["lengths"], arrays["targets"], E, arrays.get("succ"))


def _matrices(arrays: Mapping, d: int):
    return as_float("W_ov", arrays["W_ov"], (d, d)), as_float("W_kq", arrays["W_kq"], (d, d))


def _f64(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float64, order="C")


def evaluate(model: str, arrays: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, np.ndarray]:
    """Outputs of ``ntpref eval`` for model "twostage"."""
    check_names(arrays, names_of(INPUTS, "eval", REQUIRED), names_of(INPUTS, "eval", OPTIONAL), f"{model} eval input",
                train_names=names_of(INPUTS, "eval", ABSENT))
    ds = input_dataset(arrays)
    W_ov, W_kq = _matrices(arrays, ds.d)
    prep = prepare(ds)
    fw = forward(prep, W_ov, W_kq, backend=backend)
    result = loss_and_grad(prep, W_ov, W_kq, backend=backend)
    inside = np.arange(ds.Lmax)[None, :] < ds.lengths[:, None]
    out = {"loss": _f64(result.loss), "logits": _f64(fw.logits), "attn": _f64(np.where(inside, fw.attn, 0.0)),
           "grad_W_ov": _f64(result.grad_W_ov), "grad_W_kq": _f64(result.grad_W_kq)}
    if ds.succ is not None:
        stage1 = loss_and_grad(prepare_collocations(ds.E, ds.succ), W_ov, None, backend=backend)
        out.update(loss0=_f64(stage1.loss), grad0_W_ov=_f64(stage1.grad_W_ov))
    return out


def train(model: str, arrays: Mapping[str, np.ndarray], backend: str = "numba",
          progress: Callable[[str, int, int], None] = silent) -> dict[str, np.ndarray]:
    """Outputs of ``ntpref train`` for model "twostage": Algorithm 1 from the given W_ov / W_kq."""
    check_names(arrays, names_of(INPUTS, "train", REQUIRED), names_of(INPUTS, "train", OPTIONAL), f"{model} train input")
    ds = input_dataset(arrays)
    W_ov, W_kq = _matrices(arrays, ds.d)
    direction = as_scalar("direction", arrays["direction"], kind="str") if "direction" in arrays else "stable"
    res = two_stage_train(ds, eta0=as_scalar("eta0", arrays["eta0"], low=0, low_open=True),
                          eta=as_scalar("eta", arrays["eta"], low=0, low_open=True),
                          T0=as_scalar("T0", arrays["T0"], kind="int", low=0, high=MAX_STEPS),
                          T=as_scalar("T", arrays["T"], kind="int", low=0, high=MAX_STEPS),
                          direction=direction, W_ov0=W_ov, W_kq0=W_kq, backend=backend, progress=progress)
    out = {"W_ov": res.W_ov, "W_kq": res.W_kq, "W_ov_star": res.W_ov_star, "W_kq_star": res.W_kq_star,
           "loss_floor": res.loss_floor}
    for stage, metrics in (("stage1", res.stage1), ("stage2", res.stage2)):
        for key in ("loss", "norm", "corr"):
            out[f"{stage}_{key}"] = metrics[key]
    return {k: _f64(v) for k, v in out.items()}


#: Seconds of the NumPy backend per sentence position, token and embedding dimension of one pass over the
#: sentences (N · Lmax · K · d), an estimate rounded up from timed runs at K = 20..300, N = 200..2000.
NUMPY_UNIT = 1e-8


def numpy_cost(kind: str, arrays: Mapping[str, np.ndarray]) -> tuple[int, float]:
    """(passes, seconds per pass) of the NumPy backend on an eval / train input, from its sizes alone
    (:mod:`ntpref.backend`): one pass for an evaluation, T0 + T for training; N · Lmax · K · d · NUMPY_UNIT a pass
    (tokens [N, Lmax], W_ov [d, d], K or E [d, K])."""
    N, Lmax = np.shape(arrays["tokens"])
    d = np.shape(arrays["W_ov"])[0]
    K = np.shape(arrays["E"])[1] if "E" in arrays else int(arrays["K"])
    passes = 1 if kind == "eval" else int(arrays["T0"]) + int(arrays["T"])
    return passes, NUMPY_UNIT * N * Lmax * K * d


#: The order of the eval outputs' computation: forward (attention, logits, loss), backward, then L0.
_EVAL_ORDER = ("attn", "logits", "loss", "grad_W_ov", "grad_W_kq", "loss0", "grad0_W_ov")
#: Within one index t of a stage's logs (all at the parameters after t updates): the loss, the norm, the correlation.
_WITHIN = {"loss": 0, "norm": 1, "corr": 2}


def timeline(name: str, expected: Mapping[str, np.ndarray]) -> np.ndarray:
    """When ``name`` is computed, for ordering failures (``expected``: the oracle's outputs of the run, for the
    stages' lengths): eval outputs in :data:`_EVAL_ORDER`; in training the max-margin solutions first (they
    come from the data alone), then stage 1's logs index by index [T0 + 1], the stage-1 result W_ov and L*
    (from W_ov), stage 2's logs [T + 1], and the stage-2 result W_kq. A per-step log gets one time per entry."""
    if name in _EVAL_ORDER:
        return np.array(float(_EVAL_ORDER.index(name)))
    if name in ("W_ov_star", "W_kq_star"):
        return np.array(-1.0)
    end1 = 3.0 * len(expected["stage1_loss"])
    start2 = end1 + 2.0
    end2 = start2 + 3.0 * len(expected["stage2_loss"])
    if name in ("W_ov", "loss_floor", "W_kq"):
        return np.array({"W_ov": end1, "loss_floor": end1 + 1.0, "W_kq": end2}[name])
    stage, key = name.split("_", 1)
    return (0.0 if stage == "stage1" else start2) + 3.0 * np.arange(len(expected[name])) + _WITHIN[key]
