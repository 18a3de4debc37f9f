"""The specification of the two-stage model (:class:`ntpref.spec.ModelSpec`): its file contract
(:mod:`ntpref.twostage.contract`), the tolerance policy's magnitude forms (:mod:`ntpref.twostage.magnitudes`)
and its conformance cases (random regimes, stored cases) (:mod:`ntpref.twostage.cases`)."""
from functools import partial

from ..spec import ModelSpec, no_intermediates
from . import contract, magnitudes
from .cases import BENCH, REGIMES, STORED

SPEC = ModelSpec(
    name=contract.NAME,
    description="paper (1): one-layer transformer (attention W_kq, feed-forward W_ov), two-stage normalized GD",
    inputs=contract.INPUTS,
    eval_outputs=contract.EVAL_OUTPUTS,
    train_outputs=contract.TRAIN_OUTPUTS,
    trajectories=contract.TRAJECTORIES,
    diagnostics=contract.DIAGNOSTICS,
    not_bitwise=contract.NOT_BITWISE,
    blocks=contract.BLOCKS,
    evaluate=partial(contract.evaluate, contract.NAME),
    train=partial(contract.train, contract.NAME),
    numpy_cost=contract.numpy_cost,
    timeline=contract.timeline,
    extra_kinds={},
    intermediates=no_intermediates,
    magnitudes=magnitudes.magnitudes,
    train_tolerances=magnitudes.train_tolerances,
    float32_scales=magnitudes.float32_scales,
    update_directions=magnitudes.update_directions,
    roundings_behind=magnitudes.roundings_behind,
    regimes=REGIMES,
    stored=STORED,
    bench=BENCH,
)
