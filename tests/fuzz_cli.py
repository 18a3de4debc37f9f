"""Fuzz the ``ntpref`` command line: malformed inputs, awkward outputs, misbehaving adapters, damaged JSON
and reference directories, closed pipes and killed workers.

The default run (``--mode main``) calls ``ntpref.cli.main`` in-process and mixes these surfaces (the share
of each, in fortieths, is in SURFACES):

npz (25)  ``ntpref eval`` / ``ntpref train`` of a valid input of one of the three models (twostage,
          shallow, indrnn; eval and train) after one to three mutations: array-level (dtype changes, shape
          and rank changes, NaN / inf injection, out-of-range values, removed, renamed or unknown arrays, a
          wrong model name or option, object arrays) and file-level (byte flips, truncation, appended or
          prepended garbage, random bytes, a lying zip directory, a zip bomb, raw non-.npy members, a plain
          .npy file, a member stored twice, too many members, zero-byte dtypes, truncated or lying .npy
          headers, bytes after an array's data).
output (4)  a valid input with an awkward ``-o`` (a FIFO, a directory, a character device, a dangling or
          looping symbolic link, a path under a regular file, a name ending in '/', an empty name; or, to
          be accepted, a symbolic link to a file, missing parent directories, an existing file whose mode
          must be kept, stale temporaries of a killed writer). Refused outputs must leave the folder exactly
          as it was (special files untouched, no directory or temporary left); accepted ones must hold the
          result.
environment (2)  a valid input in an odd environment (ENVIRONMENTS: Numba thread counts and threading
          layers, the npz memory budget).
adapter (3)  ``ntpref conformance ADAPTER.py --model M --kind K --no-stored --random N`` (one random case)
          with an adapter file that computes the oracle's outputs and then misbehaves (ADAPTER_FAULTS): at
          import or in its function it calls sys.exit, raises KeyboardInterrupt, SystemExit, GeneratorExit
          or any exception; it returns a non-dict, a mapping that cannot be read, values that are not
          arrays or whose conversion raises, the wrong dtype or shape, NaN, only some outputs, unknown
          names, huge arrays; or it prints, warns, changes directory or modifies its inputs and is correct.
command (1)  the same with ``--command CMD`` (COMMANDS): a command that exits non-zero, is killed, writes
          nothing, garbage, a FIFO, the input or a .npy header of an absurd shape, floods stderr, outlasts
          ``--timeout 1``, is not found or names an unknown placeholder; that starts processes which escape
          its process group or session (a fork, setsid, a daemon's double fork writing into the case's
          folder, shell job control, GNU timeout); that clears the case's folder, puts a FIFO or a link to
          /dev/zero where the stderr log used to be, or locks a folder; or runs ``ntpref`` itself and is
          correct. Besides the verdict, a process the command started that still runs after the case
          (marked by the environment variable MARK) or a temporary folder left is a crash.
tolerances (2)  ``ntpref compare A.npz B.npz --tolerances T.json`` with a mutated tolerance file (an exported
          case.json or a plain one): bad types, unknown, renamed, removed or duplicate keys, NaN, inf,
          negative, huge or 31-digit numbers, deep nesting, long strings; then maybe byte damage (flips,
          truncation, garbage, non-UTF-8, UTF-16, a BOM, NUL, empty, more than 16 MiB); the file may also
          be a FIFO, a directory, a device, a dangling or looping link, or missing.
reference (2)  ``ntpref verify --root DIR CASE`` (also ``-v`` and ``--list``) and ``ntpref export --root DIR
          CASE -o OUT`` on a copy of reference_runs/ with one or two kinds of damage (REFERENCE_MUTATIONS):
          manifest.json mutated like a tolerance file, a field of a case's entry removed or of another
          type, a case directory or file removed, a file, a case
          directory, the manifest or the root replaced by a FIFO, a directory, a symbolic link (to its own
          moved copy, to another case's file, to an awkward path) or a regular file, a changed hash, a
          flipped byte.
cells (1)  ``ntpref reproduce TARGET --full --summarize-only`` on a copy of a target's committed cells
          (CELL_TARGETS) with one or two cells damaged by the npz surface's array mutations (a negative or
          huge value, NaN, an array removed, renamed, of another dtype or shape, a string).

Each run is classified (:func:`classify`):

  accepted  exit 0 and no message on stderr (only "ntpref: warning:" lines)
  failed    exit 1 and no message, or one message that is not an error (``export`` of a damaged case): a
            comparison or conformance verdict
  rejected  exit 2 and exactly one stderr line "ntpref: error: ..."
  crash     anything else: an "internal error", a traceback / escaped exception, several messages, another
            exit status

and each surface adds its own rules. npz, output, environment: exit 1 is a crash; an accepted run's output
file exists, loads, and every output array is finite; a rejected one writes no output file. adapter and
command: the verdict must be the one the fault calls for: exit 0 with a PASS verdict only for a correct
adapter, exit 1 with a FAIL verdict for wrong values, missing required outputs or a failing command, and
exit 2 for an adapter that raises or returns something other than a dict of arrays, with the error line the
last line of stderr (after the adapter's own traceback and output) and naming the adapter file; anything
else is a crash. tolerances and reference: any of accepted, failed, rejected; ``export`` must write its
three files when it succeeds (case.json a readable tolerance file) and nothing when it does not. cells:
accepted (its summary written, naming every damaged cell that holds NaN or inf as left out) or rejected
with the line naming a damaged cell; exit 1 is a crash.

``--mode commands`` runs the command surface alone (twice as many runs as COMMANDS has commands).

Two slower modes run ``ntpref`` as a subprocess, a handful of runs each:

``--mode pipes``  a command with plenty of output (pipe_commands: ``reproduce --list``, ``--help``, ...)
          whose standard output is a pipe closed after reading 0, 1, 100, 4096 or 65536 bytes (``| head -c
          N``), or read to its end. Accepted: exit 0 (the output fitted, or was read to its end); rejected:
          exit 141 (128 + SIGPIPE); both with nothing on stderr. Read to its end, only exit 0 is accepted.
``--mode workers``  ``ntpref reproduce twostage --quick --workers 2`` with one or both worker processes killed
          (SIGKILL) as they start, after the first finished cell or after a delay. Rejected: exit 2 and one
          error line; accepted: exit 0 (the run finished before the kill). Either way every cell file left
          loads, no worker outlives the run, and a rerun exits 0, keeps the finished cells untouched and
          completes the others.

Usage:  python tests/fuzz_cli.py [-n 10000] [--seed 0] [--show 10] [--mode main|commands|pipes|workers]
(-n defaults to 10000, twice the commands, 50 and 4 for the four modes.) Exit status 0 when there is no
crash, 1 otherwise.
The generators are driven by a ``Chooser`` so the property-based test (tests/test_robust_fuzz.py) reuses
them with Hypothesis choosing instead of a seed.

This module runs the fuzz; the surfaces are the test-support modules beside it: fuzz_npz, fuzz_outputs
(output, environment), fuzz_adapters (adapter, command), fuzz_json (tolerances, and the JSON mutations the
reference surface reuses), fuzz_reference, fuzz_cells and fuzz_subprocess (pipes, workers), on what
fuzz_common gives them all (the choice interface, the valid inputs, the fixtures, :func:`classify`).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from fuzz_adapters import COMMANDS, adapter_run, command_run
from fuzz_cells import cells_run
from fuzz_common import Fixtures, RandomChooser
from fuzz_json import tolerance_run
from fuzz_npz import npz_run
from fuzz_outputs import environment_run, output_run
from fuzz_reference import reference_run
from fuzz_subprocess import pipe_run, worker_run


# ---- the fuzz run ----------------------------------------------------------------------------------------------

#: surface → (its share of the main run, in fortieths; the runner)
SURFACES = {"npz": (25, npz_run), "output": (4, output_run), "environment": (2, environment_run),
            "adapter": (3, adapter_run), "command": (1, command_run), "tolerances": (2, tolerance_run),
            "reference": (2, reference_run), "cells": (1, cells_run)}
#: mode → (surface → runner), and the number of runs by default
MODES = {"main": ({name: run for name, (_, run) in SURFACES.items()}, 10000),
         "commands": ({"command": command_run}, 2 * len(COMMANDS)),
         "pipes": ({"pipes": pipe_run}, 50), "workers": ({"workers": worker_run}, 4)}
OUTCOMES = ("accepted", "failed", "rejected", "crash")


def _surface(ch, mode: str) -> str:
    surfaces = MODES[mode][0]
    if len(surfaces) == 1:
        return next(iter(surfaces))
    k = ch.integer(0, sum(share for share, _ in SURFACES.values()) - 1)
    for name, (share, _) in SURFACES.items():
        if k < share:
            return name
        k -= share
    raise AssertionError("the shares add up")


def fuzz(n: int | None = None, seed: int = 0, show: int = 10, log=print, mode: str = "main") -> Counter:
    """Run ``n`` generated cases of ``mode`` (MODES; ``n`` None: its default); returns the outcome counts and
    logs them per surface and per generator step, with the first ``show`` crashes."""
    runners, default = MODES[mode]
    n = default if n is None else n
    ch = RandomChooser(seed)
    counts, by_surface, by_step, crashes = Counter(), Counter(), Counter(), []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="ntpref-fuzz-") as tmp:
        fx = Fixtures(Path(tmp))
        for i in range(n):
            surface = _surface(ch, mode)
            result = runners[surface](ch, fx)
            counts[result.outcome] += 1
            by_surface[(surface, result.outcome)] += 1
            for step in result.steps:
                by_step[(surface, step, result.outcome)] += 1
            if result.outcome == "crash":
                crashes.append(f"case {i}: {result.what}: exit {result.rc}: {result.text.strip()[:300]}")
    seconds = time.perf_counter() - start
    log(f"ntpref fuzz ({mode}): {n} runs (seed {seed}) in {seconds:.1f} s: "
        + ", ".join(f"{k} {counts[k]}" for k in OUTCOMES))
    for title, table in (("surface", by_surface), ("step", by_step)):
        for key in sorted({k[:-1] for k in table}):
            log(f"  {title} {' '.join(key):<44} " + "  ".join(f"{k} {table[(*key, k)]:>5}" for k in OUTCOMES))
    for line in crashes[:show]:
        log("  CRASH " + line)
    return counts


def main_fuzz(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, help="number of runs (default 10000; commands twice the commands, pipes 50, "
                                             "workers 4)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=10, help="crashes to print")
    parser.add_argument("--mode", choices=sorted(MODES), default="main",
                        help="main: in-process surfaces; commands: the command surface alone; pipes, workers: "
                             "subprocess runs (see the module docstring)")
    args = parser.parse_args(argv)
    return 1 if fuzz(args.n, args.seed, args.show, mode=args.mode)["crash"] else 0


if __name__ == "__main__":
    sys.exit(main_fuzz())
