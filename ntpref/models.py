"""The registry of model specifications (:class:`ntpref.spec.ModelSpec`): the one place that lists the models.

The oracle, the command line and the tools loop over :data:`SPECS` and name no model. Its order is the
order of every listing and of the random conformance cases' seeds (model index i of
``np.random.default_rng([seed, i, j])``), so a new model goes at the end.
"""
from __future__ import annotations

from collections.abc import Iterable

from .checks import did_you_mean
from .errors import InputError
from .shallow.spec import INDRNN, SHALLOW
from .spec import ModelSpec
from .twostage.spec import SPEC as TWOSTAGE

#: name → specification, in registry order.
SPECS: dict[str, ModelSpec] = {spec.name: spec for spec in (TWOSTAGE, SHALLOW, INDRNN)}
#: The model names in registry order.
NAMES: tuple[str, ...] = tuple(SPECS)


def spec_named(name: str) -> ModelSpec:
    """The specification of model ``name``; InputError (with the closest name) for an unknown one."""
    if name not in SPECS:
        raise InputError(f"unknown model {name!r}{did_you_mean(name, NAMES)}; models: {', '.join(NAMES)}")
    return SPECS[name]


def check_models(models: Iterable[str] | str | None) -> tuple[str, ...]:
    """The selected model names in registry order (all when None); InputError for an unknown one."""
    if models is None:
        return NAMES
    models = [models] if isinstance(models, str) else list(models)
    for name in models:
        spec_named(name)
    return tuple(m for m in NAMES if m in models)
