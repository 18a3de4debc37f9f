"""ntpref.precompile: a command's kernels compiled side by side, the helper's loaded from Numba's cache."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from ntpref import precompile
from ntpref.sweep import run_sweep

PROBE = r"""
import json
import numpy as np
from ntpref import precompile
from ntpref.twostage import least_norm
before = precompile.cached("twostage.solver")
cached = precompile.cached                      # a main group of no kernels, so the solver goes to the helper
precompile.cached = lambda name: name != "probe.main" and cached(name)
precompile.GROUPS["probe.main"] = precompile.Group(lambda: None, ())
precompile.warm(("probe.main",), ("twostage.solver",))
precompile.cached = cached
after = precompile.cached("twostage.solver")
compiled_here = len(least_norm.nnls_kernel.signatures)
w, _ = least_norm.least_norm(np.array([[1.0, 0.0], [0.0, 2.0]]))
print(json.dumps({"before": before, "after": after, "compiled_here": compiled_here, "w": w.tolist(),
                  "hits": sum(least_norm.nnls_kernel.stats.cache_hits.values()),
                  "cores": precompile._cores()}))
"""


def test_the_helper_compiles_into_the_cache_and_this_process_loads_from_it(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["before"] is False and out["after"] is True
    np.testing.assert_allclose(out["w"], [1.0, 0.5], rtol=4e-16, atol=0)   # min ‖w‖ s.t. w_0 >= 1, 2 w_1 >= 1
    if out["cores"] > 1:                              # compiled by the helper, loaded here from the cache
        assert out["compiled_here"] == 0 and out["hits"] == 1
    else:                                             # one core: compiled here
        assert out["compiled_here"] == 1


def _recording_groups(monkeypatch, calls):
    groups = {name: precompile.Group(lambda name=name: calls.append(name), ()) for name in ("a", "b", "c")}
    monkeypatch.setattr(precompile, "GROUPS", groups)


def test_nothing_is_compiled_or_started_when_every_group_is_cached(monkeypatch):
    calls = []
    _recording_groups(monkeypatch, calls)
    monkeypatch.setattr(precompile, "cached", lambda name: True)
    monkeypatch.setattr(precompile, "_start_helper", lambda groups: pytest.fail("helper started"))
    notes = []
    precompile.warm(("a",), ("b", "c"), note=notes.append)
    assert calls == [] and notes == []


def test_missing_side_groups_go_to_the_helper_and_the_rest_compile_here(monkeypatch):
    calls, started = [], []
    _recording_groups(monkeypatch, calls)
    monkeypatch.setattr(precompile, "cached", lambda name: name == "c")
    monkeypatch.setattr(precompile, "_cores", lambda: 2)
    monkeypatch.setattr(precompile, "_start_helper",
                        lambda groups: started.append(groups) or subprocess.Popen([sys.executable, "-c", "pass"]))
    notes = []
    precompile.warm(("a",), ("b", "c"), note=notes.append)
    assert calls == ["a"] and started == [["b"]]
    assert len(notes) == 1 and "compiling" in notes[0]


def test_with_one_core_everything_missing_compiles_here(monkeypatch):
    calls = []
    _recording_groups(monkeypatch, calls)
    monkeypatch.setattr(precompile, "cached", lambda name: False)
    monkeypatch.setattr(precompile, "_cores", lambda: 1)
    monkeypatch.setattr(precompile, "_start_helper", lambda groups: pytest.fail("helper started"))
    precompile.warm(("a",), ("b", "c"))
    assert calls == ["a", "b", "c"]


def test_with_only_side_groups_missing_they_compile_here(monkeypatch):
    calls = []
    _recording_groups(monkeypatch, calls)
    monkeypatch.setattr(precompile, "cached", lambda name: name == "a")
    monkeypatch.setattr(precompile, "_cores", lambda: 2)
    monkeypatch.setattr(precompile, "_start_helper", lambda groups: pytest.fail("helper started"))
    precompile.warm(("a",), ("b", "c"))
    assert calls == ["b", "c"]


def test_a_helper_that_cannot_start_leaves_its_groups_to_this_process(monkeypatch):
    calls = []
    _recording_groups(monkeypatch, calls)
    monkeypatch.setattr(precompile, "cached", lambda name: False)
    monkeypatch.setattr(precompile, "_cores", lambda: 2)
    monkeypatch.setattr(precompile.sys, "executable", "/nonexistent/python")
    precompile.warm(("a",), ("b", "c"))
    assert calls == ["a", "b", "c"]


def _sleeping_helper(started):
    def start(groups):
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]))
        return started[-1]
    return start


def test_a_helper_still_running_after_the_timeout_is_stopped_and_reaped(monkeypatch):
    calls, started = [], []
    _recording_groups(monkeypatch, calls)
    monkeypatch.setattr(precompile, "cached", lambda name: False)
    monkeypatch.setattr(precompile, "_cores", lambda: 2)
    monkeypatch.setattr(precompile, "HELPER_TIMEOUT", 0.2)
    monkeypatch.setattr(precompile, "_start_helper", _sleeping_helper(started))
    precompile.warm(("a",), ("b",))
    assert calls == ["a"] and started[0].returncode is not None


def test_a_failure_here_stops_the_helper(monkeypatch):
    started = []

    def fail():
        raise KeyboardInterrupt

    groups = {"a": precompile.Group(fail, ()), "b": precompile.Group(lambda: None, ())}
    monkeypatch.setattr(precompile, "GROUPS", groups)
    monkeypatch.setattr(precompile, "cached", lambda name: False)
    monkeypatch.setattr(precompile, "_cores", lambda: 2)
    monkeypatch.setattr(precompile, "_start_helper", _sleeping_helper(started))
    with pytest.raises(KeyboardInterrupt):
        precompile.warm(("a",), ("b",))
    assert started[0].returncode is not None


def test_each_group_compiles_what_a_real_training_run_calls():
    """After the groups, a small run of Algorithm 1 (training, solver, loss floor) and a forward pass add no
    signature to their kernels: the groups compile (or load) the specialisations a real run uses. (The
    training group compiles the phases too, before their own group does; that the phases group alone
    compiles the loop's types is the cache test below.)"""
    from ntpref.twostage import forward, random_realizable, train

    for name in precompile.GROUPS:
        precompile.GROUPS[name].compile()
    kernels = [k for name in precompile.GROUPS for k in precompile.dispatchers(name)]
    before = [list(k.signatures) for k in kernels]
    assert all(before)
    ds = random_realizable(K=5, N=12, seed=3).dataset
    res = train(ds, T0=4, T=4)
    forward(ds, res.W_ov, res.W_kq)
    assert [list(k.signatures) for k in kernels] == before


LOOP_LOADS_PHASES = r"""
import json
from ntpref.twostage import kernels, random_realizable, train
train(random_realizable(K=5, N=12, seed=3).dataset, T0=4, T=4)
phases = (kernels.reduce_into, kernels.kq_stable_rows)
print(json.dumps({"hits": [sum(k.stats.cache_hits.values()) for k in phases],
                  "misses": [sum(k.stats.cache_misses.values()) for k in phases],
                  "pass_serial": len(kernels.pass_serial.signatures)}))
"""


def test_the_training_loop_loads_the_phases_another_process_compiled_and_needs_no_other_pass(tmp_path):
    """The helper's share of a training run's compilation: after ``python -m ntpref.precompile
    twostage.phases`` filled an empty cache, a run of Algorithm 1 loads both kernels from it instead of
    compiling them, and its loss floor compiles no second pass (``pass_serial``)."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    helper = subprocess.run([sys.executable, "-m", "ntpref.precompile", "twostage.phases"], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=300)
    assert helper.returncode == 0, helper.stderr
    proc = subprocess.run([sys.executable, "-c", LOOP_LOADS_PHASES], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out == {"hits": [1, 1], "misses": [0, 0], "pass_serial": 0}


def test_a_failing_helper_costs_only_time(monkeypatch):
    calls = []
    _recording_groups(monkeypatch, calls)
    monkeypatch.setattr(precompile, "cached", lambda name: False)
    monkeypatch.setattr(precompile, "_cores", lambda: 2)
    monkeypatch.setattr(precompile, "_start_helper",
                        lambda groups: subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]))
    precompile.warm(("a",), ("b",))
    assert calls == ["a"]


def test_the_helper_command_refuses_an_unknown_group():
    proc = subprocess.run([sys.executable, "-m", "ntpref.precompile", "twostage.nope"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "unknown group(s) twostage.nope" in proc.stderr and "twostage.train" in proc.stderr


def _cell(x):
    return {"y": np.float64(2 * x)}


def test_a_sweep_prepares_once_before_its_first_cell_and_not_when_nothing_is_left(tmp_path):
    prepared = []
    cells = [{"x": 1}, {"x": 2}]
    run_sweep(_cell, cells, tmp_path, prepare=lambda: prepared.append(sorted(tmp_path.iterdir())))
    assert prepared == [[]] and len(list(tmp_path.glob("*.npz"))) == 2
    run_sweep(_cell, cells, tmp_path, prepare=lambda: prepared.append("again"))
    assert prepared == [[]]


def test_a_sweep_on_an_executor_does_not_prepare(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as ex:
        run_sweep(_cell, [{"x": 1}], tmp_path, executor=ex, prepare=lambda: pytest.fail("prepared"))
    assert len(list(tmp_path.glob("*.npz"))) == 1


def test_the_two_stage_targets_compile_their_training_kernels_side_by_side(monkeypatch):
    from ntpref import reproduce
    from ntpref.reproduce import figure2, generalization, width

    calls = []
    monkeypatch.setattr(precompile, "warm", lambda main, side, note=None: calls.append((main, side)))
    for mod in (figure2, generalization):
        reproduce._precompiler(mod, None)()
    assert calls == [(("twostage.train",), ("twostage.phases", "twostage.solver")),
                     (("twostage.train",), ("twostage.phases", "twostage.solver", "twostage.pass"))]
    assert reproduce._precompiler(width, None) is None
