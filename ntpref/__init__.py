"""ntpref: a float64 CPU oracle for two papers on training shallow transformers.

Subpackages
-----------
twostage  two-stage normalized GD for next-token prediction (one-layer transformer, W_ov / W_kq)
shallow   projected GD for a shallow multi-head transformer (kernel regime) and the IndRNN baseline
oracle    interchange files, reference runs, comparison and gradient checking
"""
from .interrupt import install_if_command

install_if_command()  # the ntpref command: a signal while it imports ends it with one line (ntpref.interrupt)

from .numba_target import ensure_cache_dir, use_full_vector_width

use_full_vector_width()  # before any ntpref module imports Numba (see ntpref.numba_target)
ensure_cache_dir()

from .errors import InfeasibleError, InputError, NtprefError

__version__ = "0.1.0"

__all__ = ["NtprefError", "InputError", "InfeasibleError", "__version__"]
