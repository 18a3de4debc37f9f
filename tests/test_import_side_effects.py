"""``import ntpref`` (and using its models) changes nothing in the user's process: no environment variable,
no signal handler; only the ``ntpref`` command sets up its process (ntpref.numba_target.configure_process)."""
import json
import os
import subprocess
import sys

PROBE = r"""
import json, os, signal, sys
names = [n for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGALRM", "SIGPIPE") if hasattr(signal, n)]
def state():
    return {"env": dict(os.environ), "signals": {n: repr(signal.getsignal(getattr(signal, n))) for n in names},
            "unraisablehook": repr(sys.unraisablehook),
            "excepthook": repr(sys.excepthook)}
before = state()
import ntpref, ntpref.twostage, ntpref.shallow, ntpref.shallow.indrnn, ntpref.oracle.contract, ntpref.reproduce
after_import = state()
from ntpref import shallow, twostage
ds = twostage.random_realizable(K=4, N=8, seed=0).dataset
twostage.train(ds, T0=3, T=3)
ts = shallow.teacher_student(n=40, d=3, T=4, K=8, n_train=30, seed=1)
data = shallow.prepare(ts.X_train, ts.y_train)
shallow.ntk.min_eigenvalue(shallow.ntk.limit_kernel(data.X[:5], draws=64, seed=0))   # the BLAS-pinned LAPACK call
after_use = state()
print(json.dumps([before, after_import, after_use]))
"""


def test_import_and_use_leave_environment_and_signals_alone(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NUMBA_", "KMP_"))}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    before, after_import, after_use = json.loads(proc.stdout.splitlines()[-1])
    assert after_import == before
    assert after_use == before
