"""One exception hierarchy for the whole library.

The command line turns every ``NtprefError`` into a one-line message and exit status 2
(``ComparisonError`` excepted: a failed comparison is exit status 1).
"""


class NtprefError(Exception):
    """Base class of every error ntpref raises on purpose."""


class InputError(NtprefError, ValueError):
    """An input (array, option, file) is malformed: wrong name, shape, dtype, range or value."""


class NonFiniteError(InputError):
    """Finite inputs whose result overflows float64 (e.g. entries around 1e300, or a diverging run)."""


class InfeasibleError(NtprefError):
    """The problem has no solution, e.g. an unrealizable dataset (a cycle in a partial order)."""


class ComparisonError(NtprefError):
    """Two sets of arrays disagree beyond tolerance (``compare`` / ``verify``)."""
