"""The float32 envelope, policy "bound" in float32 (``ntpref conformance --precision float32 --policy bound``,
docs/conformance.md#float32-mode).

A float32 implementation cannot agree with the float64 oracle to float64 accuracy; it should agree
as well as float32 arithmetic allows *on that input*. The envelope of an output q measures that with
the float64 oracle, u = 2^-24 being the unit roundoff of float32:

    env(q) = u (|q| + M_q)                                  one rounding of q and of the terms it is
                                                            computed from (M_q: the magnitudes of the
                                                            float64 policy, docs/tolerance.md; of a
                                                            training output the model's float32_scales)
           + |q(fl32(inputs)) − q|                          the inputs rounded to float32
           + n_q · max over DRAWS draws |q(moved) − q|      one rounding of every input: data moved by
                                                            u relative, each trained block by the
                                                            rounding of one update (below), ξ = ±1

n_q counts the roundings behind q: 1 for an evaluation; for training the updates before it (t + 1
at step t of a per-step log, plus the T0 + 1 of stage 1 behind stage 2), each bounded by the
largest response seen so far. One update of a block θ rounds by u max|θ| + η u max M(∇θ) (×n/B
for a minibatch of B; a unit NGD direction: η u). A measured term becomes a bound of the policy's
form: its largest entry, or along a per-step log the straight line ``atol + atol_per_step · t`` above
it. The tolerance of an array is :data:`ENVELOPE_MULTIPLE` times its envelope, so err/env = ENVELOPE_MULTIPLE · err/tol.

The model's diagnostics (the two-stage max-margin solutions and the correlations with them) come from a
solver whose certificate, not rounding, sets the oracle's accuracy (1e-9 of max|W*|): the rounding of
the inputs barely moves them, and the oracle's own value may miss the exact one by more than float32's
rounding of it (an entry of W* that is 0 exactly and −8e-17 in the oracle's). Their tolerance adds the
float64 tolerance of the same array, so it never claims more than the oracle is certified to.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ...spec import ModelSpec
from ...tolerance import TINY, Tolerance
from ..contract import model_of, oracle_outputs

#: Unit roundoff of float32.
U32 = 2.0 ** -24
#: Random draws of the moved inputs.
DRAWS = 3
#: Tolerance = ENVELOPE_MULTIPLE × envelope.
ENVELOPE_MULTIPLE = 8.0
#: Float inputs never moved: kappa takes the values 1 or 2 only.
EXACT_INPUTS = ("kappa",)
_SEED = 20240924


def evaluation_scales(spec: ModelSpec, kind: str, inputs: Mapping[str, np.ndarray],
                      expected: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, float]:
    """name → M_q, the magnitude of the terms q is computed from (at the first and last parameters of a
    training run: the model's ``float32_scales``); absent where |q| itself is the scale (norms, parameters)."""
    if kind == "eval":
        return {k: float(np.max(M)) for k, (M, _) in spec.magnitudes(inputs, "eval", backend).items()}
    return spec.float32_scales(inputs, expected, backend)


def update_rounding(spec: ModelSpec, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                    backend: str = "numba") -> dict[str, float]:
    """block → u max|θ| + η u D_θ, D_θ the magnitude of one update's direction (the model's
    ``update_directions``: n/B max M(∇θ) for ProjGD / ProjSGD, 1 for a unit NGD direction): the rounding
    of one float32 update of each trained block."""
    directions = spec.update_directions(inputs, expected, backend)
    out = {}
    for block, step in spec.blocks.items():
        size = max(float(np.max(np.abs(inputs[block]), initial=0.0)), float(np.max(np.abs(expected[block]), initial=0.0)))
        out[block] = U32 * (size + float(inputs[step]) * directions[block])
    return out


def _float_inputs(inputs: Mapping[str, np.ndarray]):
    return [k for k, a in inputs.items() if np.asarray(a).dtype.kind == "f" and k not in EXACT_INPUTS]


def measured(spec: ModelSpec, kind: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
             backend: str = "numba"):
    """(|q(fl32(inputs)) − q|, max over the draws |q(moved) − q|) per output, elementwise (module docstring);
    the moved runs by ``backend``, the one that computed ``expected``."""
    rng = np.random.default_rng(_SEED)
    blocks = update_rounding(spec, inputs, expected, backend) if kind == "train" else {}

    def diff(changes):
        out = oracle_outputs(kind, {**inputs, **changes}, backend)
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


def roundings_behind(spec: ModelSpec, name: str, kind: str, inputs: Mapping[str, np.ndarray],
                     shape: tuple) -> np.ndarray | int:
    """n_q: 1 for an evaluation; for training the updates before q (the model's ``roundings_behind``;
    per-step logs: an array over t)."""
    return spec.roundings_behind(name, inputs, shape) if kind == "train" else 1


def _bound(err: np.ndarray, count) -> tuple[float, float]:
    """(atol, atol_per_step) above count · err: its largest entry, or along a per-step log (count an
    array over t) the straight line through its first entry above count(t) · max_{s <= t} err(s)."""
    if np.ndim(count) == 0 or err.size < 2:
        return float(np.max(count * err, initial=0.0)), 0.0
    return Tolerance.line_above(count * Tolerance.running_max(err))


@np.errstate(all="ignore")   # the user's np.seterr must not change (or break) a bound
def envelope_tolerances(kind: str, inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                        certified: Mapping[str, Tolerance], terms: tuple | None = None,
                        backend: str = "numba") -> dict[str, Tolerance]:
    """name → tolerance = :data:`ENVELOPE_MULTIPLE` × the float32 envelope of every array of ``expected``, the
    float64 oracle's outputs for ``inputs`` (module docstring); ``certified``: name → the float64 tolerance (the
    running error bound) of every one of the model's diagnostics among them (nothing else is read), added to
    their envelope (module docstring); ``terms``: what :func:`measured` returns for them, if already computed;
    ``backend``: the oracle's backend that computed ``expected``, which the runs of the envelope use too."""
    spec = model_of(inputs)
    rounded, moved = terms if terms is not None else measured(spec, kind, inputs, expected, backend)
    scales = evaluation_scales(spec, kind, inputs, expected, backend)
    out = {}
    for name in expected:
        first, per_step = _bound(moved[name], roundings_behind(spec, name, kind, inputs, moved[name].shape))
        atol = U32 * scales.get(name, 0.0) + float(np.max(rounded[name], initial=0.0)) + first
        out[name] = Tolerance(rtol=ENVELOPE_MULTIPLE * U32, atol=max(ENVELOPE_MULTIPLE * atol, TINY),
                              atol_per_step=ENVELOPE_MULTIPLE * per_step,
                              reason=f"float32: {ENVELOPE_MULTIPLE:g} x envelope u|q| + {atol:.2g}"
                                     + (f" + {per_step:.2g}·t" if per_step else ""))
        if name in spec.diagnostics:
            out[name] = out[name].plus(certified[name], f"{out[name].reason}; + the oracle's own float64 "
                                       f"tolerance ({certified[name].reason})")
    return out


def for_case(case) -> dict[str, Tolerance]:
    """The float32 envelope's tolerances of a conformance case (:class:`ntpref.oracle.cases.Case`); the running
    error bound's are read only for the model's diagnostics among its outputs."""
    diagnostics = set(case.spec.diagnostics) & set(case.expected)       # their float64 bound is added
    certified = case.tolerances("float64", "bound") if diagnostics else {}
    return envelope_tolerances(case.kind, case.inputs, case.expected, certified, case.float32_terms, case.backend)
