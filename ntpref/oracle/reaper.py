"""Every process a command started, killed when it ends (docs/conformance.md, "Any language: --command").

Killing the command's session is not enough: a process it started can leave the session (``setsid``, a
daemon's double fork) or its process group (a shell's job control, GNU ``timeout``), and once its parent
has exited it is the child of the system's init, out of ntpref's reach. On Linux, :class:`Reaper` makes
ntpref a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``) while the command runs, so that such
orphans become ntpref's children instead; at the end every new descendant of ntpref (read from
``/proc``: what was not already its descendant when the command started) is killed with SIGKILL and
reaped, until none is left. The flag is process state: it is set only inside :class:`Reaper`, one
command at a time (a lock), and restored when the command's processes are gone, so ``import ntpref`` and
the rest of the library never change it. Elsewhere (another system, or a Linux without ``/proc`` or that
refuses the flag) only the command's session is killed, and a process that left it is not found.
"""
from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from contextlib import suppress

#: prctl(2) options (linux/prctl.h).
PR_SET_CHILD_SUBREAPER, PR_GET_CHILD_SUBREAPER = 36, 37
#: Seconds spent killing a command's processes before the ones still alive are reported.
GRACE = 5.0
_PROC = "/proc"
_one_command = threading.Lock()


def _prctl():
    """libc's prctl, or None where there is none (not Linux, no /proc to find the descendants in)."""
    if not sys.platform.startswith("linux") or not os.path.isdir(os.path.join(_PROC, "self")):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def _processes() -> dict[int, tuple[int, str, str]]:
    """pid → (parent pid, start time in clock ticks, name) of every process ``/proc`` shows."""
    out = {}
    for entry in os.listdir(_PROC):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(_PROC, entry, "stat"), "rb") as fh:
                text = fh.read().decode("utf-8", "replace")
        except OSError:         # gone meanwhile
            continue
        name, rest = text[text.find("(") + 1: text.rfind(")")], text[text.rfind(")") + 2:].split()
        if len(rest) > 19:      # rest: state, ppid, pgrp, session, ..., starttime (the 20th)
            out[int(entry)] = (int(rest[1]), rest[19], name)
    return out


def _descendants(table: dict[int, tuple[int, str, str]], skip: frozenset = frozenset()) -> set[tuple[int, str]]:
    """(pid, start time) of every descendant of this process in ``table`` (:func:`_processes`), not
    entering the ones in ``skip`` (nor their descendants)."""
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [os.getpid()]
    while todo:
        for pid in children.get(todo.pop(), ()):
            key = (pid, table[pid][1])
            if key not in skip and key not in found:
                found.add(key)
                todo.append(pid)
    return found


class Reaper:
    """While the block runs a command, the processes it starts stay findable, and :meth:`kill_all` ends
    them: ``with Reaper() as reaper: (run the command, kill its session) ... reaper.kill_all()``."""

    def __init__(self):
        self._prctl = None
        self._before: frozenset = frozenset()
        self._was_set = False

    def __enter__(self) -> Reaper:
        _one_command.acquire()
        try:
            prctl = _prctl()
            if prctl is not None:
                flag = ctypes.c_int(0)
                if prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0:
                    self._was_set = bool(flag.value)
                    if self._was_set or prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
                        self._prctl = prctl
                        self._before = frozenset(_descendants(_processes()))
        except BaseException:
            _one_command.release()
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self._prctl is not None and not self._was_set:
                self._prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
        finally:
            _one_command.release()

    def kill_all(self) -> list[str]:
        """Kill every process the command started, where they can be found (module docstring; the
        command's session is the caller's to kill first), reaping those that became ntpref's children;
        returns "PID (NAME)" of each one still alive after :data:`GRACE` seconds (one that ignores SIGKILL
        while the kernel waits on a device, or of another user)."""
        if self._prctl is None:
            return []
        end = time.monotonic() + GRACE
        while True:
            table = _processes()
            alive = _descendants(table, self._before)
            if not alive:
                return []
            for pid, _ in alive:
                with suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            for pid, _ in alive:
                if table[pid][0] == os.getpid():
                    with suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
            if time.monotonic() > end:
                return [f"{pid} ({table[pid][2]})" for pid, _ in sorted(alive)]
            time.sleep(0.01)
