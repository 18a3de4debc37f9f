"""Output that cannot be written: every file a command writes (reproduce's summary, bench's JSON) is
written atomically and refused before the run when it cannot be (a FIFO, a parent that is a file); standard
output into a closed pipe or onto a full device; bench's thread and repeat counts.
"""
import json
import os
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import numba
import pytest

from ntpref import bench

from cli_support import TINY_WIDTH, one_error, run

NTPREF = [sys.executable, "-m", "ntpref.cli"]
FIFO_REFUSED = "cannot write: it is a FIFO, not a regular file (only regular files are replaced)"


@contextmanager
def deadline(seconds: int):
    """Raise TimeoutError in the body after ``seconds`` (a blocking open of a FIFO would hang the test)."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")
    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ---- reproduce: summary.txt --------------------------------------------------------------------------

def test_summary_that_is_a_fifo_is_refused_before_the_run(tmp_path, capsys, tiny_width):
    fifo = tmp_path / "width" / "quick" / "summary.txt"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    with deadline(60):
        err = one_error(capsys, "reproduce", "width", "--out", tmp_path, "-q")
    assert err == f"ntpref: error: {fifo}: {FIFO_REFUSED}"
    assert not (fifo.parent / "cells").exists()


def test_summary_write_that_fails_keeps_the_old_summary(tmp_path, capsys, tiny_width):
    assert run(capsys, "reproduce", "width", "--out", tmp_path, "-q")[0] == 0
    summary = tmp_path / "width" / "quick" / "summary.txt"
    old = summary.read_bytes()
    assert old.endswith(b"\n") and len(old) < 8192
    # a summary larger than the file-size limit: its write fails part way, as on a full disk
    script = (
        "import resource, signal, sys\n"
        "from ntpref.cli import main\n"
        "from ntpref.reproduce import Summary, width\n"
        f"width.SIZES['quick'] = {TINY_WIDTH!r}\n"
        "width.summarize = lambda results, outdir: Summary('x' * 20000)\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (8192, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))\n"
        f"sys.exit(main(['reproduce', 'width', '--summarize-only', '--out', {str(tmp_path)!r}, '-q']))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        2, "", f"ntpref: error: {summary}: cannot write (File too large)\n")
    assert summary.read_bytes() == old
    assert [p.name for p in summary.parent.iterdir() if p.name.startswith(".")] == []


# ---- bench: --json, --threads, --repeats ----------------------------------------------------------------

@pytest.fixture
def no_timing(monkeypatch):
    """bench.time_steps replaced by one that fails the test: whatever is checked must be checked before timing."""
    def timing(*args, **kwargs):
        raise AssertionError("the benchmark ran")
    monkeypatch.setattr(bench, "time_steps", timing)


@pytest.fixture
def fake_timing(monkeypatch):
    """bench.time_steps returning the times 0.5, 0.25, 0.75 s for every step; the thread counts it ran at."""
    threads = []
    monkeypatch.setattr(numba, "set_num_threads", threads.append)
    monkeypatch.setattr(bench, "time_steps", lambda steps, repeats: [[0.5, 0.25, 0.75] for _ in steps])
    return threads


QUICK = ("--models", "twostage")


def test_bench_json_that_is_a_fifo_is_refused_before_the_run(tmp_path, capsys, no_timing):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    with deadline(60):
        assert one_error(capsys, "bench", "--json", fifo, *QUICK) == f"ntpref: error: {fifo}: {FIFO_REFUSED}"


def test_bench_json_below_a_file_is_refused_before_the_run(tmp_path, capsys, no_timing):
    (tmp_path / "file").write_text("a file")
    target = tmp_path / "file" / "bench.json"
    assert one_error(capsys, "bench", "--json", target, *QUICK) == (
        f"ntpref: error: {target}: cannot write: '{tmp_path / 'file'}' is a regular file, not a directory")


def test_bench_json_replaces_the_file_with_every_row(tmp_path, capsys, fake_timing):
    out = tmp_path / "bench.json"
    out.write_text("an older run")
    assert run(capsys, "bench", "--json", out, "--threads", "1", "--repeats", "3", *QUICK) == (0, "")
    assert json.loads(out.read_text()) == dict(backend="numba", repeats=3, rows=[
        dict(case="twostage K=20 N=200", threads=1, seconds=0.5, best=0.25)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json"]


def test_bench_table_has_a_row_per_paper_case_and_thread_count(capsys, fake_timing):
    from ntpref.cli import main

    assert main(["bench", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[2:]] == [
        [c.label, "1", "500.000 ms", "250.000 ms"] for c in bench.paper_cases()]


def test_bench_threads_beyond_numba_are_refused(capsys, no_timing):
    limit = numba.config.NUMBA_NUM_THREADS
    assert one_error(capsys, "bench", "--threads", "1", limit + 1, *QUICK) == (
        f"ntpref: error: --threads {limit + 1}: expected 1 to {limit}, the threads Numba runs on this machine "
        f"({os.cpu_count()} cores; NUMBA_NUM_THREADS sets another limit)")


@pytest.mark.parametrize("option, value", [("--threads", "0"), ("--threads", "-1"), ("--repeats", "0"),
                                           ("--repeats", "1.5")])
def test_bench_counts_below_one_are_usage_errors(option, value, capsys, no_timing):
    status, err = run(capsys, "bench", option, value, *QUICK)
    assert (status, err) == (2, f"ntpref bench: error: argument {option}: expected a whole number >= 1, got "
                                f"'{value}' (see 'ntpref bench --help')\n")


def test_bench_default_threads_fit_the_machine(capsys, monkeypatch, fake_timing):
    monkeypatch.setattr(numba.config, "NUMBA_NUM_THREADS", 1)
    assert run(capsys, "bench", *QUICK) == (0, "")
    assert fake_timing == [1]


# ---- standard output: closed pipe, full device ---------------------------------------------------------

@pytest.mark.parametrize("argv", [["reproduce", "--list"], ["--help"]])
def test_output_into_a_closed_pipe_ends_quietly_with_sigpipe_status(argv):
    read_end, write_end = os.pipe()
    os.close(read_end)      # the reader has gone: the first write fails with EPIPE
    try:
        proc = subprocess.run(NTPREF + argv, stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert (proc.returncode, proc.stderr) == (128 + signal.SIGPIPE, "")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("argv", [["reproduce", "--list"], ["--help"]])
def test_output_onto_a_full_device_is_one_line(argv):
    with open("/dev/full", "w") as full:
        proc = subprocess.run(NTPREF + argv, stdout=full, stderr=subprocess.PIPE, text=True, timeout=120)
    assert (proc.returncode, proc.stderr) == (2, "ntpref: cannot write to standard output: No space left on device\n")


def test_reproduce_without_matplotlib_refuses_before_computing(tmp_path, capsys, monkeypatch):
    from ntpref.cli import main

    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib raises ImportError
    assert main(["reproduce", "twostage", "--out", str(tmp_path), "-q"]) == 2
    assert capsys.readouterr().err == "ntpref: error: figures need matplotlib: pip install 'ntpref[plot]'\n"
    assert list(tmp_path.iterdir()) == []
