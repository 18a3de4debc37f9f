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
precompile.warm((), ("twostage.solver",))
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
    groups = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
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
    run_sweep(_cell, cells, tmp_path, prepare=lambda: prepared.append(1))
    assert prepared == [1]
    run_sweep(_cell, cells, tmp_path, prepare=lambda: prepared.append(2))
    assert prepared == [1]


def test_the_two_stage_targets_compile_their_training_kernels_side_by_side(monkeypatch):
    from ntpref import reproduce
    from ntpref.reproduce import figure2, generalization, width

    calls = []
    monkeypatch.setattr(precompile, "warm", lambda main, side, note=None: calls.append((main, side)))
    for mod in (figure2, generalization):
        reproduce._precompiler(mod, None)()
    assert calls == [(("twostage.train",), ("twostage.solver", "twostage.pass"))] * 2
    assert reproduce._precompiler(width, None) is None
