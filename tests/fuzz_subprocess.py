"""The subprocess modes of the command-line fuzzer (tests/fuzz_cli.py): ``ntpref`` as a subprocess with its
standard output closed early, or with its worker processes killed."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ntpref.npzio import load_npz

from fuzz_common import Fixtures, Result, _clear, classify


# ---- subprocess modes: closed pipes and killed workers ----------------------------------------------------------

#: Seconds a subprocess run may take before it counts as hung (a crash).
PROCESS_TIMEOUT = 300


def _ntpref(argv, cwd: Path, **popen) -> subprocess.Popen:
    """``ntpref ARGV`` as a subprocess (``python -X faulthandler -m ntpref.cli``, this interpreter), stdin empty."""
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-m", "ntpref.cli", *map(str, argv)], cwd=cwd,
                            stdin=subprocess.DEVNULL, **popen)


def _finish(process: subprocess.Popen) -> int | None:
    """The exit status of ``process``, or None when it hangs past PROCESS_TIMEOUT: then it gets SIGABRT (on which
    faulthandler prints the stack of every thread on its stderr), and SIGKILL."""
    try:
        return process.wait(PROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
        process.kill()
        process.wait()
        return None


def _run_logged(argv, workdir: Path, watch=lambda process: None) -> tuple[int | None, str, object]:
    """Run ``ntpref ARGV`` with stderr into a file, ``watch(process)`` while it runs: (exit status, or None when it
    hung (:func:`_finish`), stderr, what ``watch`` returned)."""
    with tempfile.TemporaryFile() as log:
        process = _ntpref(argv, workdir, stdout=subprocess.DEVNULL, stderr=log)
        try:
            watched = watch(process)
            rc = _finish(process)
        finally:
            process.kill()
            process.wait()
        log.seek(0)
        return rc, log.read().decode(errors="replace"), watched


def pipe_commands(fx: Fixtures) -> dict[str, list]:
    """name → argv of the commands run with a closed standard output: each exits 0 when it is read."""
    return {"reproduce --list": ["reproduce", "--list"], "verify --list": ["verify", "--root", fx.pristine, "--list"],
            "--help": ["--help"], "conformance --help": ["conformance", "--help"], "adapters": ["adapters"],
            "docs": ["docs"], "compare": ["compare", fx.expected, fx.expected],
            "compare wide": ["compare", fx.wide, fx.wide]}


#: Bytes read from standard output before it is closed (None: read to its end).
PIPE_READS = (0, 1, 100, 4096, 65536, None)


def pipe_outcome(read: int | None, rc: int, err: str) -> tuple[str, str | None]:
    """(outcome, why it is a crash or None) of a command whose output was closed after ``read`` bytes."""
    if rc is None:
        return "crash", f"no exit within {PROCESS_TIMEOUT} s"
    if err:
        return "crash", "output on stderr"
    if rc == 0:
        return "accepted", None
    if rc == 128 + signal.SIGPIPE and read is not None:
        return "rejected", None
    return "crash", f"exit {rc}"


def run_pipe_case(argv, read: int | None, workdir: Path) -> tuple[str, int, str]:
    """Run ``ntpref ARGV`` with stdout a pipe closed after ``read`` bytes; (outcome, exit status, why or stderr)."""
    process = _ntpref(argv, workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    if read is None:
        process.stdout.read()
    elif read:
        process.stdout.read(read)
    process.stdout.close()
    err = process.stderr.read().decode(errors="replace")
    rc = _finish(process)
    outcome, why = pipe_outcome(read, rc, err)
    return outcome, rc, f"{why}: {err.strip()}" if why else err


def pipe_run(ch, fx: Fixtures) -> Result:
    commands = pipe_commands(fx)
    name, read = ch.choice(sorted(commands)), ch.choice(PIPE_READS)
    outcome, rc, text = run_pipe_case(commands[name], read, fx.workdir)
    return Result(f"{name} | head -c {read}", [f"pipe:{name}", f"read:{read}"], outcome, rc, text)


#: The target of the worker runs (3 cells of a few seconds at --quick).
WORKER_TARGET = "twostage"
#: When the workers are killed: as soon as they run, after the first finished cell, after a few seconds.
KILL_TIMES = ("start", "first_cell", "delay")


def _workers(parent: int) -> set[int]:
    """The worker processes (multiprocessing's spawned children, not its resource tracker) of ``parent``."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if ppid == parent and b"spawn_main" in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.add(int(entry))
    return found


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that are still worker processes (not gone, and not a new process of the same id)."""
    alive = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                alive.add(pid)
    return alive


def _cells(out: Path) -> dict[str, tuple]:
    """Cell file → (inode, mtime, SHA-256) of every cell the reproduce run left in ``out``."""
    return {str(p.relative_to(out)): (p.stat().st_ino, p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(out.rglob("cells/*.npz"))}


def _kill_workers(process: subprocess.Popen, when: str, both: bool, delay: float, out: Path) -> tuple[list, set]:
    """SIGKILL one worker (``both``: every worker) of ``process`` at ``when`` (KILL_TIMES); (killed, seen)."""
    seen, since, deadline = set(), None, time.monotonic() + PROCESS_TIMEOUT
    while process.poll() is None and time.monotonic() < deadline:
        workers = _workers(process.pid)
        seen |= workers
        since = since or (time.monotonic() if workers else None)
        ready = workers and (when == "start" or (when == "first_cell" and _cells(out))
                             or (when == "delay" and time.monotonic() - since > delay))
        if ready:
            killed = sorted(workers) if both else [min(workers)]
            for pid in killed:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return killed, seen
        time.sleep(0.05)
    return [], seen


def run_worker_case(when: str, both: bool, delay: float, workdir: Path, seeds: int | None = None) -> tuple:
    """``ntpref reproduce WORKER_TARGET --quick --workers 2`` with workers killed (see :func:`_kill_workers`), then
    the same command again; (outcome, exit status, why or stderr) by the rules of tests/fuzz_cli.py."""
    from ntpref.reproduce import target_module, with_seeds

    module = target_module(WORKER_TARGET)
    total = len(module.cells(**with_seeds(module.SIZES["quick"], seeds)))
    out = workdir / "reproduce"
    _clear(out)
    argv = ["reproduce", WORKER_TARGET, "--quick", "--workers", "2", "--out", out, "-q"] + \
           ([] if seeds is None else ["--seeds", seeds])
    kill = functools.partial(_kill_workers, when=when, both=both, delay=delay, out=out)
    rc, err, (killed, seen) = _run_logged(argv, workdir, kill)
    outcome, why = classify(rc, f"no exit within {PROCESS_TIMEOUT} s" if rc is None else err)
    deadline = time.monotonic() + 10
    while _alive(seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    kept = _cells(out)
    problems = [why] if why else []
    if outcome not in ("accepted", "rejected", "crash"):
        problems.append(f"exit {rc}")
    if _alive(seen):
        problems.append(f"workers {sorted(_alive(seen))} outlived the run")
    for name in kept:
        try:
            load_npz(out / name)
        except Exception as exc:  # noqa: BLE001
            problems.append(f"the kept cell {name} does not load: {exc}")
    rerun, rerun_err, _ = _run_logged(argv, workdir)
    after = _cells(out)
    if rerun != 0 or rerun_err:
        problems.append(f"the rerun exited {rerun}: {rerun_err.strip()}")
    if len(after) != total:
        problems.append(f"the rerun left {len(after)} of {total} cells")
    changed = [name for name, mark in kept.items() if after.get(name) != mark]
    if changed:
        problems.append(f"the rerun replaced finished cells {changed}")
    text = f"killed {len(killed)} worker(s), {len(kept)} of {total} cells kept; {err.strip()}"
    return ("crash" if problems else outcome), rc, ("; ".join(problems) + ": " + text) if problems else text


def worker_run(ch, fx: Fixtures) -> Result:
    when, both, delay = ch.choice(KILL_TIMES), bool(ch.integer(0, 1)), ch.choice((1.0, 3.0, 6.0))
    outcome, rc, text = run_worker_case(when, both, delay, fx.workdir)
    what = f"reproduce {WORKER_TARGET} --workers 2, {'both workers' if both else 'a worker'} killed at {when}"
    return Result(what + (f" ({delay:g} s)" if when == "delay" else ""), [f"kill:{when}"], outcome, rc, text)
