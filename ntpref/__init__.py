"""ntpref: a float64 CPU oracle for two papers on training shallow transformers.

Subpackages
-----------
twostage  two-stage normalized GD for next-token prediction (one-layer transformer, W_ov / W_kq)
shallow   projected GD for a shallow multi-head transformer (kernel regime) and the IndRNN baseline
oracle    interchange files, reference runs, comparison and gradient checking

Importing ntpref changes nothing in the process: no environment variable, no signal handler. The ``ntpref``
command sets up its own process (:func:`ntpref.numba_target.configure_process`: the vector width of the
kernels and a writable Numba cache; signal handling, :mod:`ntpref.interrupt`); a program can make the same
call before it first uses a model (docs/api.md).
"""
from .errors import InfeasibleError, InputError, NtprefError

__version__ = "0.1.0"

__all__ = ["NtprefError", "InputError", "InfeasibleError", "__version__"]
