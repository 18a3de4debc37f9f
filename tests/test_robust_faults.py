"""Faults: result files are written atomically, interrupted sweeps resume.

Real subprocesses are killed with SIGKILL (no cleanup code runs) at random moments, including while the
temporary file of the result is being written; the result file must then be absent / the old complete
file, or the new complete file, never half of one.
"""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ntpref.oracle import contract
from ntpref.npzio import load_npz, save_npz
from ntpref.shallow import iid_init
from ntpref.sweep import load_results, run_sweep

pytestmark = pytest.mark.skipif(os.name != "posix", reason="SIGKILL")

RNG = np.random.default_rng(2024)


def _spawn(args, cwd):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1]) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.Popen([sys.executable, *args], cwd=cwd, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _kill_when(proc, folder: Path, pattern: str, delay: float, timeout: float = 120.0) -> str:
    """SIGKILL ``proc`` ``delay`` seconds after a file matching ``pattern`` appears in ``folder`` (polled
    every millisecond); returns "killed" or "finished" (the process ended first)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            return "finished"
        if any(folder.glob(pattern)):
            time.sleep(delay)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return "killed" if proc.returncode == -signal.SIGKILL else "finished"
        time.sleep(0.001)
    proc.kill()
    proc.wait()
    raise AssertionError("the subprocess neither wrote nor finished in time")


@pytest.fixture(scope="module")
def big_train(tmp_path_factory):
    """A shallow train input whose result (W [384, 40, 40], about 5 MB) takes a while to write."""
    folder = tmp_path_factory.mktemp("train")
    rng = np.random.default_rng(0)
    c, U, W = iid_init(384, 40, seed=1)
    arrays = {"model": np.array("shallow"), "X": rng.standard_normal((6, 4, 40)) / 6, "y": rng.standard_normal(6),
              "c": c, "U": U, "W": W, "eta": np.array(0.1), "steps": np.array(3)}
    save_npz(folder / "in.npz", arrays)
    return folder / "in.npz", contract.train(arrays)


def test_killed_train_leaves_old_or_new_file(big_train, tmp_path):
    inp, expected = big_train
    out = tmp_path / "out.npz"
    old = {"W": np.arange(6.0), "note": np.array("previous run")}
    outcomes = []
    # kill while the temporary result file is being written (random delay after it appears), and at
    # a random moment of the whole run
    for delay in (0.0, float(RNG.uniform(0, 0.01)), float(RNG.uniform(0.0, 0.03))):
        save_npz(out, old)
        proc = _spawn(["-m", "ntpref.cli", "train", str(inp), "-o", str(out), "-q"], tmp_path)
        outcomes.append(_kill_when(proc, tmp_path, ".out.npz.*.tmp", delay))
        got = load_npz(out)                      # always a complete npz
        if set(got) == set(old):
            for k in old:
                np.testing.assert_array_equal(got[k], old[k])
        else:
            assert set(got) == set(expected)
            for k in expected:
                np.testing.assert_array_equal(got[k], expected[k])
    out.unlink()
    proc = _spawn(["-m", "ntpref.cli", "train", str(inp), "-o", str(out), "-q"], tmp_path)
    time.sleep(float(RNG.uniform(0.0, 0.5)))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if out.exists():                                   # finished before the kill: complete
        assert set(load_npz(out)) == set(expected)
    assert "killed" in outcomes, outcomes                # at least one kill hit the write window


CELL_SOURCE = '''
import time
import numpy as np

def cell(seed, x):
    time.sleep(0.02)
    return {"v": np.random.default_rng(seed).standard_normal(200_000) * x, "seed": np.int64(seed)}
'''
CELLS = [{"seed": s, "x": 1.5} for s in range(10)]


def _cell_fn():
    space = {}
    exec(CELL_SOURCE, space)
    return space["cell"]


def _check_cells(outdir, cells):
    cell = _cell_fn()
    results = load_results(outdir)
    assert len(results) == len(cells)
    for params, arrays in results:
        assert params in cells
        ref = cell(**params)
        for k in ref:
            np.testing.assert_array_equal(arrays[k], ref[k])


@pytest.mark.parametrize("delay", [0.0, 0.005])
def test_killed_sweep_resumes_without_recomputing(delay, tmp_path):
    outdir = tmp_path / "sweep"
    outdir.mkdir()
    script = tmp_path / "child.py"
    script.write_text(CELL_SOURCE + f"""
import sys
from ntpref.sweep import run_sweep
run_sweep(cell, {CELLS!r}, sys.argv[1])
""")
    proc = _spawn([str(script), str(outdir)], tmp_path)
    # wait until a few cells are done, then kill while (probably) writing the next one
    pattern = "seed=3_*.tmp" if delay == 0.0 else "seed=2_x=1.5.npz"
    assert _kill_when(proc, outdir, f"*{pattern}", delay) == "killed", proc.stderr.read().decode()
    finished = sorted(outdir.glob("*.npz"))
    assert 0 < len(finished) < len(CELLS)
    stamps = {p.name: (p.stat().st_mtime_ns, p.read_bytes()) for p in finished}
    done = [c for c in CELLS if any(p.name.startswith(f"seed={c['seed']}_") for p in finished)]
    _check_cells(outdir, done)                       # every file present is complete and right
    calls = []
    cell = _cell_fn()

    def counting(**params):
        calls.append(params)
        return cell(**params)

    summary = run_sweep(counting, CELLS, outdir)
    assert (summary.skipped, summary.computed) == (len(finished), len(CELLS) - len(finished))
    assert sorted(c["seed"] for c in calls) == sorted(c["seed"] for c in CELLS if c not in done)
    for name, (mtime, data) in stamps.items():       # finished cells untouched
        p = outdir / name
        assert p.stat().st_mtime_ns == mtime and p.read_bytes() == data
    _check_cells(outdir, CELLS)
    assert run_sweep(counting, CELLS, outdir).computed == 0


def test_failed_write_keeps_old_file(tmp_path, monkeypatch):
    """An exception in the middle of writing (here: a disk-full OSError) leaves the old file and no temporary."""
    out = tmp_path / "r.npz"
    save_npz(out, {"a": np.arange(3.0)})

    def failing_savez(fh, **arrays):
        fh.write(b"PK\x03\x04 half a file")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", failing_savez)
    from ntpref.errors import InputError
    with pytest.raises(InputError, match="r.npz: cannot write.*No space"):
        save_npz(out, {"a": np.zeros(5)})
    monkeypatch.undo()
    assert load_npz(out)["a"].tolist() == [0.0, 1.0, 2.0]
    assert [p.name for p in tmp_path.iterdir()] == ["r.npz"]


def dying_or_slow_cell(x, seed):
    """A sweep cell: x = 0 kills its own worker process after 2 s, x = 2 waits a minute, others return at once."""
    if x == 0:
        time.sleep(2)
        os.kill(os.getpid(), signal.SIGKILL)
    if x == 2:
        time.sleep(60)
    return {"y": np.float64(x + seed)}


def test_a_killed_worker_is_named_and_the_finished_cells_kept(tmp_path):
    from ntpref.errors import InputError
    from ntpref.sweep import grid

    cells = grid(seed=[0], x=[1.0, 1.5]) + [{"seed": 0, "x": 0}]
    with pytest.raises(InputError, match=r"sweep: a worker process died \(BrokenProcessPool: killed, or out of "
                                         r"memory\?\); the 2 finished cells of 3 are kept in .*, and running the "
                                         r"same command again resumes"):
        run_sweep(dying_or_slow_cell, cells, tmp_path, workers=2, label="sweep")
    assert sorted(p["x"] for p, _ in load_results(tmp_path)) == [1.0, 1.5]


class BreaksOnSecondSubmit:
    """An executor that runs the first cell at once and then breaks, as a pool does when a worker is killed
    while the cells are still being handed out: ``submit`` raises BrokenProcessPool."""

    used = False

    def submit(self, fn, *args):
        from concurrent.futures import Future
        from concurrent.futures.process import BrokenProcessPool

        if self.used:
            raise BrokenProcessPool("A child process terminated abruptly, the process pool is not usable anymore")
        self.used, fut = True, Future()
        fut.set_result(fn(*args))
        return fut


def test_a_pool_broken_while_cells_are_handed_out_is_named_and_the_finished_cells_kept(tmp_path):
    from ntpref.errors import InputError
    from ntpref.sweep import grid

    cells = grid(seed=[0], x=[1.0, 1.5, 3.0])
    with pytest.raises(InputError, match=r"sweep: a worker process died \(BrokenProcessPool: killed, or out of "
                                         r"memory\?\); the 1 finished cells of 3 are kept in "):
        run_sweep(dying_or_slow_cell, cells, tmp_path, executor=BreaksOnSecondSubmit(), label="sweep")
    assert [p["x"] for p, _ in load_results(tmp_path)] == [1.0]


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads /proc")
def test_workers_exit_when_the_coordinating_process_is_killed(tmp_path):
    script = tmp_path / "coordinator.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(Path(__file__).parent)!r})
from test_robust_faults import dying_or_slow_cell
from ntpref.sweep import run_sweep
run_sweep(dying_or_slow_cell, [{{"seed": 0, "x": 2}}, {{"seed": 1, "x": 2}}], sys.argv[1], workers=2)
""")
    proc = _spawn([str(script), str(tmp_path / "cells")], tmp_path)
    deadline, workers = time.monotonic() + 60, []
    while time.monotonic() < deadline and len(workers) < 2:   # the two spawned workers (and a resource tracker)
        time.sleep(0.2)
        workers = [p for p in _children(proc.pid) if "spawn_main" in Path(f"/proc/{p}/cmdline").read_text()]
    assert len(workers) == 2, proc.stderr.read().decode() if proc.poll() is not None else workers
    time.sleep(3)                                             # both are in their long cells now
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(_alive(p) for p in workers):
        time.sleep(0.2)
    assert not any(_alive(p) for p in workers)
