"""The specifications of paper (2)'s models (:class:`ntpref.spec.ModelSpec`), the shallow multi-head
transformer and the IndRNN baseline: their file contract (:mod:`ntpref.shallow.contract`), the tolerance
policy's magnitude forms (:mod:`ntpref.shallow.magnitudes`) and their conformance cases (random regimes, stored cases)
(:mod:`ntpref.shallow.cases`)."""
from collections.abc import Callable
from functools import partial

from ..spec import ModelSpec, no_intermediates
from . import contract, indrnn, magnitudes
from . import model as transformer
from .cases import BENCH, REGIMES, STORED


def _spec(model: str, description: str, scales: Callable, extra_kinds: dict, intermediates: Callable,
          diagnostics: tuple[str, ...]) -> ModelSpec:
    """The specification of ``model`` whose eval magnitudes are ``scales`` (data, *params, kappa)."""
    return ModelSpec(
        name=model, description=description, inputs=contract.inputs_of(model),
        eval_outputs=contract.eval_outputs(model), train_outputs=contract.train_outputs(model),
        trajectories=contract.trajectories(model), diagnostics=diagnostics, not_bitwise={},
        blocks=dict.fromkeys(contract.model_named(model).blocks, "eta"),
        evaluate=partial(contract.evaluate, model), train=partial(contract.train, model),
        numpy_cost=partial(contract.numpy_cost, model),
        timeline=partial(contract.timeline, model),
        extra_kinds=extra_kinds, intermediates=intermediates, magnitudes=partial(magnitudes.magnitudes, model, scales),
        train_tolerances=partial(magnitudes.train_tolerances, model, scales),
        float32_scales=partial(magnitudes.float32_scales, model, scales),
        update_directions=partial(magnitudes.update_directions, model, scales),
        roundings_behind=magnitudes.roundings_behind, regimes=REGIMES[model],
        stored=tuple(c for c in STORED if c.model == model), bench=BENCH[model])


SHALLOW = _spec(transformer.MODEL.name, "paper (2): shallow multi-head transformer, ProjGD / ProjSGD",
                magnitudes.shallow_scales, {"ntk": contract.ntk_outputs}, contract.head_state_intermediates,
                contract.HEAD_STATES)
INDRNN = _spec(indrnn.MODEL.name, "paper (2): IndRNN baseline, ProjGD / ProjSGD", magnitudes.indrnn_scales, {},
               no_intermediates, ())
