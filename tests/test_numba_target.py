"""ntpref.numba_target: 512-bit vectors change speed only, never a bit of a result."""
import os
import subprocess
import sys

import numpy as np
import pytest

from ntpref import numba_target

# Every model's Numba gradient at a width that fills 512-bit vectors (m = 64) and one with remainder
# loops (m = 13), saved to the npz file given as argv[1].
SCRIPT = r"""
import sys
import numpy as np
from ntpref import shallow, twostage
from ntpref.shallow import indrnn

rng = np.random.default_rng(5)
out = {}
for m in (13, 64):
    X = rng.uniform(-0.5, 0.5, (37, 9, 6))
    y = rng.standard_normal(37)
    data = shallow.prepare(X, y)
    for name, arr in zip("loss c U W f".split(), shallow.loss_and_grad(data, *shallow.iid_init(m, 6, m))):
        out[f"shallow{m}_{name}"] = np.asarray(arr)
    c, u, W_in = indrnn.paired_init(m + m % 2, 6, m)
    for name, arr in zip("loss c u W_in f".split(), indrnn.loss_and_grad(indrnn.prepare(X, y), c + 0.1, u, W_in)):
        out[f"rnn{m}_{name}"] = np.asarray(arr)
ds = twostage.random_realizable(K=20, N=60, seed=3).dataset
W = rng.standard_normal((2, 20, 20))
for name, arr in zip("loss ov kq".split(), twostage.loss_and_grad(ds, W[0], W[1])):
    out[f"twostage_{name}"] = np.asarray(arr)
np.savez(sys.argv[1], **out)
"""


def _run(path, features):
    env = dict(os.environ)
    env.pop("NUMBA_CPU_FEATURES", None)
    if features is not None:
        env["NUMBA_CPU_FEATURES"] = features
    subprocess.run([sys.executable, "-c", SCRIPT, str(path)], check=True, env=env)
    with np.load(path) as f:
        return dict(f)


def test_vector_width_leaves_every_result_bitwise_unchanged(tmp_path):
    wide = numba_target.full_width_features()
    if wide is None:
        pytest.skip("the host has no AVX-512: both settings compile the same code")
    default = wide[: -len("," + numba_target.PREFER_256)]     # the host's own features: 256-bit vectors
    a = _run(tmp_path / "wide.npz", None)                       # what `import ntpref` chooses
    b = _run(tmp_path / "default.npz", default)
    assert a.keys() == b.keys() and len(a) == 23
    for key in a:
        assert a[key].tobytes() == b[key].tobytes(), key


def test_import_sets_the_full_width_features_on_avx512_hosts(monkeypatch):
    wide = numba_target.full_width_features()
    if wide is None:
        pytest.skip("the host has no AVX-512: nothing is set (tested with a fake host below)")
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    monkeypatch.delenv("NUMBA_ENABLE_AVX", raising=False)
    numba_target.use_full_vector_width()
    assert os.environ["NUMBA_CPU_FEATURES"] == wide
    assert wide.endswith("," + numba_target.PREFER_256)


def test_import_leaves_the_users_settings_alone(monkeypatch):
    monkeypatch.setenv("NUMBA_CPU_FEATURES", "+sse2")
    numba_target.use_full_vector_width()
    assert os.environ["NUMBA_CPU_FEATURES"] == "+sse2"
    monkeypatch.delenv("NUMBA_CPU_FEATURES")
    monkeypatch.setenv("NUMBA_ENABLE_AVX", "0")                # the user turned AVX off: leave it off
    numba_target.use_full_vector_width()
    assert "NUMBA_CPU_FEATURES" not in os.environ


def test_no_avx512_or_unreadable_features_mean_no_change(monkeypatch):
    import llvmlite.binding as llvm

    class Features(dict):
        def flatten(self):
            return "+avx2,+fma,-avx512f"

    monkeypatch.setattr(llvm, "get_host_cpu_features", lambda: Features())
    assert numba_target.full_width_features() is None

    def unreadable():
        raise RuntimeError("failed to get host cpu features")

    monkeypatch.setattr(llvm, "get_host_cpu_features", unreadable)
    assert numba_target.full_width_features() is None
    monkeypatch.delenv("NUMBA_CPU_FEATURES", raising=False)
    numba_target.use_full_vector_width()
    assert "NUMBA_CPU_FEATURES" not in os.environ
