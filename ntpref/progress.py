"""Throttled progress lines on stderr for long runs: ``label: 5000/10000 (1.2 s elapsed, ~1.2 s left)``."""
from __future__ import annotations

import sys
import time


class Progress:
    """Callable ``progress(label, done, total)`` that prints at most every ``every`` seconds.

    The first call always prints, whatever the clock reads; so does the last call of a label
    (``done == total``), once. The time left is extrapolated from the work done after the label's first
    finished unit: the first one carries the start-up (compiling the kernels, starting worker processes)
    and made a first estimate several times too long, and a resumed run whose first call already counts
    finished work (``done`` > 0) is not estimated as if that work had taken no time. ``enabled=False`` prints nothing, so library code can take one
    unconditionally. ``clock`` returns seconds (``time.perf_counter`` unless given, e.g. a fake clock in
    tests).
    """

    def __init__(self, enabled: bool = True, every: float = 2.0, stream=None, clock=time.perf_counter):
        self.enabled, self.every, self.clock = enabled, every, clock
        self.stream = stream if stream is not None else sys.stderr
        self._start: dict[str, tuple[float, int]] = {}   # label -> (clock, done) at its first call
        self._first: dict[str, tuple[float, int]] = {}   # label -> (clock, done) when work first got done
        self._printed: dict[str, int] = {}
        self._last: float | None = None  # time of the last printed line; None until the first

    def __call__(self, label: str, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = self.clock()
        start, done0 = self._start.setdefault(label, (now, done))
        if done > done0:
            self._first.setdefault(label, (now, done))
        throttled = self._last is not None and now - self._last < self.every
        if (done < total and throttled) or self._printed.get(label) == done:
            return
        self._printed[label] = done
        self._last = now
        elapsed = now - start
        t1, done1 = self._first.get(label, (now, done))
        left = f", ~{(now - t1) * (total - done) / (done - done1):.1f} s left" if done1 < done < total else ""
        print(f"{label}: {done}/{total} ({elapsed:.1f} s elapsed{left})", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        """Print one line now (unless disabled): an event of the run that is not a count."""
        if self.enabled:
            print(text, file=self.stream, flush=True)


def silent(label: str, done: int, total: int) -> None:
    """A progress callback that prints nothing."""
