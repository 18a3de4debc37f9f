"""The float64 running error bound, policy "bound" in float64 (docs/tolerance.md): per output array of a
model run, a :class:`ntpref.tolerance.Tolerance` every correct float64 implementation meets.

Every tolerance comes from the *problem*, not from the array's own values, so outputs that are
exactly zero in exact arithmetic (f at the paired initialisation) get an honest, non-zero bound.

**Evaluation** (kind "eval", and the NTK Gram matrix and head states of kind "ntk"). A first-order
running error bound: any float64 implementation, whatever its summation order, blocking, fused
multiply-adds or libm, returns each output Q with

    |Q_computed − Q| ≤ γ_K · M(Q),    γ_K = K u / (1 − K u),  u = 2⁻⁵³,

where M(Q) is Q evaluated with the absolute value of every term, each intermediate's own
magnitude carried through its derivative (M(σ(s)) = |σ(s)| + |σ'(s)| M(s), M(Σ a_k b_k) =
Σ M(a_k)|b_k| + |a_k| M(b_k), a softmax weight α_t gets α_t (1 + 4 max_t M(z_t))), and K is the total
length of the nested sums plus :data:`TRANSCENDENTAL_ULPS` per exp / log / tanh / erf level. The
oracle's own forward quantities (s, a, M U, attention, logits, hidden states) supply the values.
The tolerance of an array is ``atol = SAFETY · γ_K · max M`` (``rtol = 0``).

**Training** (kind "train"). A difference in the last bits is carried along the trajectory. One
step can differ by at most the rounding of the update plus η times the evaluation bound of the
step direction: the *injection* ε per parameter block. For normalized GD that bound is 2 γ_K ρ,
ρ = ‖M(G)‖/‖G‖ for the computation that forms the direction: the plain float64 gradient for
direction "naive", the log-scale computation for "stable" (:func:`stable_accuracy`). The training
is run again from θ(0) + ε·ξ (ξ = ±1, fixed seed), which measures the response D_q(t) of every
logged quantity q to one such injection. A quantity logged after t updates has t injections
behind it; bounding the response to each by the largest one measured so far (from t = 1 on),

    |q_computed(t) − q(t)| ≤ SAFETY · [γ_K (|q(t)| + M_q) + t · max_{1 ≤ s ≤ t} D_q(s)]

(M_q: the evaluation magnitude of q at the first and the last parameters, whichever is larger;
stage 2 of the two-stage algorithm adds T0 · max_s D1_q(s) for the T0 updates of stage 1). It is
stored as ``rtol = SAFETY γ_K`` and the straight line ``atol + atol_per_step · t`` lying above the
rest. Final iterates get SAFETY · steps · max(D, ε); max-margin solutions the solver certificate's
:data:`QP_REL`. A 1e-6 relative error in any array (unless float64 itself cannot resolve the value
to 1e-6, see docs/tolerance.md), or a 1e-3 relative error in one gradient of a training run, is far
outside these bounds.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...checks import as_float
from ...errors import InputError
from ...models import SPECS, spec_named
from ...rounding import eval_tolerance
from ...spec import ModelSpec
from ...tolerance import Tolerance
from .. import contract

KINDS = ("eval", "train")
_SEED = 20240917


def eval_scales(model: str, inputs: Mapping[str, np.ndarray], kind: str = "eval") -> dict[str, tuple[np.ndarray, int]]:
    """name → (M, K) for every output (and intermediate) of an eval input of ``model`` (kind "eval"),
    or of a shallow NTK input (kind "ntk"): M is the evaluation magnitude of the output, an array
    shaped like it (0-d for a loss), K the operation count, so that any float64 implementation
    computes the output to within γ_K · M elementwise (module docstring, docs/tolerance.md). The
    magnitude forms live beside each model (its specification's ``magnitudes``)."""
    spec = spec_named(model)
    _check(spec, kind, spec.magnitude_kinds)
    return spec.magnitudes(inputs, kind)


def _check(spec: ModelSpec, kind: str, allowed) -> None:
    if kind not in allowed:
        raise InputError(f"kind must be one of {', '.join(allowed)}, got {kind!r}")


def _known(model: str, kind: str, names, known) -> None:
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"array '{unknown[0]}': not an output of a {model} {kind} run "
                         f"(outputs: {', '.join(known)}); no tolerance policy for it")


def _response(inputs: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], eps: Mapping[str, float],
              backend: str) -> dict[str, np.ndarray]:
    """Train again from θ(0) + ε·ξ (ξ = ±1 from a fixed seed, per block of ``eps``) and return
    |rerun − out| per output: the response to one step's worth of rounding."""
    rng = np.random.default_rng(_SEED)
    moved = {b: as_float(b, inputs[b]) + e * rng.choice((-1.0, 1.0), size=np.shape(inputs[b])) for b, e in eps.items()}
    unbounded = {k: np.full(np.shape(out[k]), np.inf) for k in out}
    if not all(np.isfinite(v).all() for v in moved.values()):
        return unbounded        # the step's rounding itself overflows: no bound (Tolerance.saturated)
    try:
        other = contract.train({**inputs, **moved}, backend)
    except InputError:          # the moved run overflows where the given one did not: no bound either
        return unbounded
    return {k: np.abs(other[k] - out[k]) for k in out}


# --- the policy -------------------------------------------------------------------------------------
def run_kind(inputs: Mapping[str, np.ndarray]) -> str:
    """"train" when the input holds training fields (``eta``); for an input without targets ``y`` of a model
    with an extra kind, that kind (a stored NTK case of the shallow transformer: "ntk"); else "eval"."""
    if "eta" in inputs:
        return "train"
    model = inputs.get("model")
    spec = SPECS.get(str(np.asarray(model))) if model is not None else None
    if spec is not None and spec.extra_kinds and "y" not in inputs:
        return next(iter(spec.extra_kinds))
    return "eval"


@np.errstate(all="ignore")   # the user's np.seterr must not change (or break) a bound
def bound_tolerances(model: str, kind: str, inputs: Mapping[str, np.ndarray],
                     expected: Mapping[str, np.ndarray], *, outputs: Mapping[str, np.ndarray] | None = None,
                     backend: str = "numba") -> dict[str, Tolerance]:
    """Per output array of ``expected``, its tolerance under the float64 running error bound (module docstring).

    model: a name of the registry (:mod:`ntpref.models`); kind "eval" or "train" (or one of the model's
    ``extra_kinds``: "ntk" for "shallow", the stored NTK Gram matrix). ``inputs`` is the run's
    input dict; ``expected`` only supplies the names (its values are not used). ``outputs``: the oracle's
    own outputs of ``inputs`` when the caller has them (then a train input is trained only for the
    perturbation runs that measure the growth of rounding); None: the oracle runs here, which also
    validates the input. eval / ntk of a shallow input also cover the intermediates head_s, head_a, head_MU.
    Raises InputError for an unknown model or kind, an invalid input, or a name that is not an output.
    """
    spec = spec_named(model)
    _check(spec, kind, KINDS + tuple(k for k in spec.magnitude_kinds if k not in KINDS))
    names = list(expected)
    if kind == "train":
        _known(model, kind, names, spec.train_outputs)
        out = contract.train(inputs, backend) if outputs is None else outputs
        return spec.train_tolerances(inputs, out, names, lambda eps: _response(inputs, out, eps, backend), backend)
    if kind == "eval" and outputs is None:
        contract.evaluate(inputs, backend)                                   # validates the input
    scales = spec.magnitudes(inputs, kind, backend)
    _known(model, kind, names, list(scales))
    return {name: eval_tolerance(*scales[name]) for name in names}


def for_case(case) -> dict[str, Tolerance]:
    """The running error bound's tolerances of a conformance case (:class:`ntpref.oracle.cases.Case`): a random
    case's expected outputs are the oracle's own, computed there, so the input is not run again; the
    perturbed training runs use the case's backend."""
    outputs = case.expected if case.source == "random" else None
    return bound_tolerances(case.model, case.kind, case.inputs, case.expected, outputs=outputs, backend=case.backend)
