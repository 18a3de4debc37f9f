"""The cases the tests of the exact backend (ntpref.exact, docs/exact.md) run, and the error they measure.

Eval cases: every stored eval case, the random eval cases of two seeds and a few inputs made here for the
option combinations those do not meet. Train cases: the random train cases (every model and algorithm,
the two-stage naive, late-stage and attention-cancellation regimes), every stored train case, and ProjGD
with the projection active in every block.
"""
import math

import mpmath
import numpy as np

from ntpref.oracle.cases import Case, random_cases, stored_cases


def made(name: str, model: str, kind: str, **arrays) -> Case:
    """A case of ``model`` and ``kind`` whose inputs are the arrays given."""
    inputs = {"model": np.array(model), **arrays}
    return Case(name, model, kind, "random", name, lambda: (inputs, None))


def _made_eval_cases() -> list[Case]:
    """Option combinations the conformance cases do not meet."""
    rng = np.random.default_rng(20260101)
    X = rng.standard_normal((5, 3, 3)) / math.sqrt(3)
    lengths = np.array([1, 4, 3, 2, 4, 4])
    tokens = rng.integers(0, 4, size=(6, 4))
    tokens[np.arange(4)[None, :] >= lengths[:, None]] = -1
    return [
        made("made_shallow_tanh_kappa1_tau", "shallow", "eval", X=X, y=rng.standard_normal(5), c=rng.standard_normal(6),
             U=rng.standard_normal((6, 3)), W=rng.standard_normal((6, 3, 3)), kappa=np.array(1.0),
             tau_att=np.array(0.5), mask_last_key=np.array(0), activation=np.array(b"tanh")),
        made("made_shallow_erf_mask", "shallow", "eval", X=X, y=rng.standard_normal(5), c=rng.standard_normal(3),
             U=rng.standard_normal((3, 3)), W=rng.standard_normal((3, 3, 3)), mask_last_key=np.array(True),
             activation=np.array("erf")),
        made("made_twostage_wide_E_no_succ", "twostage", "eval", tokens=tokens, lengths=lengths,
             targets=rng.integers(0, 4, size=6), E=rng.standard_normal((6, 4)), W_ov=rng.standard_normal((6, 6)),
             W_kq=rng.standard_normal((6, 6))),
        made("made_indrnn_tanh_kappa1_long", "indrnn", "eval", X=rng.standard_normal((4, 7, 2)),
             y=rng.standard_normal(4), c=rng.standard_normal(3), u=1.5 * rng.standard_normal(3),
             W_in=rng.standard_normal((3, 2)), kappa=np.array(1.0)),
    ]


EVAL_CASES = ([c for c in stored_cases() if c.kind == "eval"]
              + [c for seed in (0, 1) for c in random_cases(None, 6, seed) if c.kind == "eval"]
              + _made_eval_cases())
BY_ID = {c.id: c for c in EVAL_CASES}


def _made_train_cases() -> list[Case]:
    """ProjGD with every block's projection active, for both models."""
    rng = np.random.default_rng(99)
    X, y, X_val, y_val = rng.standard_normal((6, 3, 2)) / 2, rng.standard_normal(6), rng.standard_normal((3, 3, 2)), \
        rng.standard_normal(3)
    common = dict(X=X, y=y, X_val=X_val, y_val=y_val, eta=np.array(2.0), rho=np.array([0.01, 0.02, 0.03]))
    return [made("made_shallow_projgd_active", "shallow", "train", **common, c=rng.standard_normal(4),
                 U=rng.standard_normal((4, 2)), W=rng.standard_normal((4, 2, 2)), steps=np.array(2),
                 tau_att=np.array(0.7), activation=np.array("erf")),
            made("made_indrnn_projgd_active", "indrnn", "train", **common, c=rng.standard_normal(4),
                 u=rng.standard_normal(4), W_in=rng.standard_normal((4, 2)), steps=np.array(2), kappa=np.array(1.0))]


STORED_TRAIN = [c for c in stored_cases() if c.kind == "train"]
#: Every model and algorithm: two-stage naive, late-stage and attention-cancel regimes, ProjGD and ProjSGD of
#: both shallow models, every stored train case, and ProjGD with the projection active in every block.
TRAIN_CASES = [c for c in random_cases(None, 5, 0) if c.kind == "train"] + STORED_TRAIN + _made_train_cases()


def error(actual: np.ndarray, values: np.ndarray) -> float:
    """max |actual − exact|, from the unrounded mpf values."""
    assert np.shape(actual) == values.shape
    return max(float(abs(mpmath.mpf(float(a)) - q)) for a, q in zip(np.ravel(actual), values.ravel()))
