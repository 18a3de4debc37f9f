"""The kinds of stored case and how the oracle computes each: "eval" and "train" through the interchange
contract (:func:`ntpref.oracle.contract.evaluate` / ``train``), any other kind through a model's
``extra_kinds`` (its specification; not part of the interchange contract, no ``ntpref eval`` for it):
"ntk" of model "shallow", whose input holds ``X`` [n, T, d], ``c`` [m], ``U`` [m, d], ``W`` [m, d, d] and
optional ``tau_att``, ``mask_last_key``, ``activation``, and whose output is ``gram`` [n, n], the
finite-width NTK Gram matrix of :func:`ntpref.shallow.ntk.ntk_gram`."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from ..errors import InputError
from ..models import SPECS, spec_named
from . import contract

#: The kinds of stored case: eval, train and every model's extra kinds ("ntk").
KINDS = ("eval", "train") + tuple(dict.fromkeys(k for spec in SPECS.values() for k in spec.extra_kinds))


def intermediates(model: str, kind: str, inputs: Mapping[str, np.ndarray], backend: str = "numba") -> dict:
    """Internal states stored next to a case's outputs to help locate a mismatch: the model's own
    (its specification's ``intermediates``; the shallow transformer's eval / ntk cases: ``head_s``,
    ``head_a``, ``head_MU``). Returns {} when there are none."""
    return spec_named(model).intermediates(kind, inputs, backend)


def compute(kind: str, inputs: Mapping[str, np.ndarray], backend: str = "numba") -> dict[str, np.ndarray]:
    """Outputs of a case of ``kind`` ("eval" | "train" | "ntk") for its input arrays."""
    if kind == "eval":
        return contract.evaluate(inputs, backend)
    if kind == "train":
        return contract.train(inputs, backend)
    spec = contract.model_of(inputs)
    if kind not in spec.extra_kinds:
        raise InputError(f"kind must be one of {', '.join(('eval', 'train', *spec.extra_kinds))} for model "
                         f"{spec.name!r}, got {kind!r}")
    return spec.extra_kinds[kind](inputs, backend)

