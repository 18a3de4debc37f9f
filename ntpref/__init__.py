"""ntpref: a float64 CPU oracle for two papers on training shallow transformers.

Subpackages
-----------
twostage  two-stage normalized GD for next-token prediction (one-layer transformer, W_ov / W_kq)
shallow   projected GD for a shallow multi-head transformer (kernel regime) and the IndRNN baseline
oracle    interchange files, reference runs, comparison and gradient checking
"""
from .numba_target import use_full_vector_width

use_full_vector_width()  # before any ntpref module imports Numba (see ntpref.numba_target)

from .errors import InfeasibleError, InputError, NtprefError

__version__ = "0.1.0"

__all__ = ["NtprefError", "InputError", "InfeasibleError", "__version__"]
