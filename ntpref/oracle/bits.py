"""Recomputed arrays against their stored bits, in ulp of the stored value (:func:`ulp_distance`): besides
the tolerance check, ``ntpref verify`` and ``regen`` measure how far every recomputed array lies from its
stored bits, so that "bit-identical" tells an unchanged oracle from one whose rounding moved within the
tolerances."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import numpy as np

from .manifest import array_records


def ulp_distance(stored, new) -> float | None:
    """The largest distance between an entry of ``new`` and the same entry of ``stored``, in units in the last
    place of the stored value: |new − stored| / spacing(|stored|), spacing(x) being the gap from x to the next
    float of larger magnitude. 0 exactly when every entry has the same bits.

    Zeros and subnormals: their spacing is the smallest subnormal, 2^-1074, so a stored zero that became
    nonzero counts as a huge number (inf from 2^-50 on): a change of an exact zero is never "a few ulp".
    Entries that differ only in the sign of a zero count 1 (the two zeros are neighbours); NaN or inf in
    ``new`` where ``stored`` has other bits counts inf. Arrays that are not floating point count 0 when
    equal. None when the two cannot be compared entry by entry: other shapes, dtypes of another kind, or
    unequal non-float arrays.
    """
    s, a = np.asarray(stored), np.asarray(new)
    if s.shape != a.shape or s.dtype.kind != a.dtype.kind:
        return None
    if s.dtype.kind != "f":
        return 0.0 if np.array_equal(s, a) else None
    s, a = s.astype(np.float64), a.astype(np.float64)
    same = (s == a) & (np.signbit(s) == np.signbit(a))
    if same.all():
        return 0.0
    with np.errstate(over="ignore", invalid="ignore"):
        units = np.abs(a - s) / np.spacing(np.abs(s))     # a power of two: the division is exact
    units = np.where(np.isnan(units), np.inf, units)
    units = np.where(same, 0.0, np.where(units == 0.0, 1.0, units))   # 0 where only the sign of a zero differs
    return float(units.max())


def ulp_text(ulp: float | None) -> str:
    """"identical", "64 ulp", "0.5 ulp", "1.2e+17 ulp", or "differs" (None: not comparable entry by entry)."""
    if ulp is None:
        return "differs"
    return "identical" if ulp == 0.0 else f"{ulp:.4g} ulp"


class ArrayBits(NamedTuple):
    """One recomputed array against its stored bits: ``ulp`` (:func:`ulp_distance`; None when the stored
    arrays lack it or it is not comparable) and ``promised``, the manifest's ``bitwise`` flag."""

    name: str
    ulp: float | None
    promised: bool

    @property
    def identical(self) -> bool:
        """Whether every entry kept its bits."""
        return self.ulp == 0.0


def bit_distances(stored: Mapping[str, np.ndarray], new: Mapping[str, np.ndarray],
                  entry: Mapping) -> list[ArrayBits]:
    """:class:`ArrayBits` of every array of ``new`` (a case's recomputed outputs and intermediates) against
    the ``stored`` ones, with the promises of the case's manifest ``entry``."""
    records = array_records(entry)
    return [ArrayBits(name, ulp_distance(stored[name], a) if name in stored else None,
                      records.get(name, {}).get("bitwise") is True) for name, a in new.items()]


def changes_text(bits: Iterable[ArrayBits]) -> str:
    """"unchanged, all N arrays bit-identical to the stored ones", or "K of N arrays changed (max M ulp):
    NAME 3 ulp, NAME 0.5 ulp, ..." for new arrays against their stored bits."""
    bits = list(bits)
    changed = [b for b in bits if not b.identical]
    if not changed:
        return f"unchanged, all {len(bits)} arrays bit-identical to the stored ones"
    return (f"{len(changed)} of {len(bits)} arrays changed ({bits_summary(changed)}): "
            + ", ".join(f"{b.name} {ulp_text(b.ulp)}" for b in changed))


def bits_summary(bits: Iterable[ArrayBits]) -> str:
    """"bit-identical" when every array kept its bits, else "max N ulp" over the arrays with a distance
    ("differs" when none has one)."""
    bits = list(bits)
    if all(b.identical for b in bits):
        return "bit-identical"
    worst = [b.ulp for b in bits if b.ulp is not None]
    return f"max {ulp_text(max(worst))}" if worst else "differs"
