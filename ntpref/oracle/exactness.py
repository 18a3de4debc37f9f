"""The exact backend (:mod:`ntpref.exact`) loaded when it is needed, and float64 arrays measured against its
values: what ``ntpref certify`` (:mod:`ntpref.oracle.certify`) and the calibrated tolerance
(:mod:`ntpref.oracle.policies.calibrated`) share."""
from __future__ import annotations

import numpy as np

from ..errors import InputError


def exact_backend():
    """The exact backend (:mod:`ntpref.exact`), imported when first needed: it loads mpmath."""
    from .. import exact

    return exact


def differences(actual: np.ndarray, exact_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(|Q̂ − Q| elementwise, formed from the unrounded mpf values Q and rounded to float64 once; Q rounded to
    float64), both shaped like ``exact_values``, for a float64 array Q̂ of that shape (InputError otherwise)."""
    exact = exact_backend()
    if np.shape(actual) != exact_values.shape:
        raise InputError(f"shape {list(np.shape(actual))} against the exact {list(exact_values.shape)}")
    values = exact_values.ravel().tolist()
    with exact.arith.precision():
        diff = np.array([float(abs(q - a)) for a, q in zip(np.asarray(actual, dtype=np.float64).ravel().tolist(),
                                                           values)], dtype=np.float64).reshape(exact_values.shape)
    return diff, np.array([float(q) for q in values], dtype=np.float64).reshape(exact_values.shape)
