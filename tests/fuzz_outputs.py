"""The output and environment surfaces of the command-line fuzzer (tests/fuzz_cli.py): a valid input run with
an awkward ``-o`` path, or in an odd environment."""
from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from fuzz_common import Fixtures, Result, _call, _one_error_line, _output_problem
from fuzz_npz import BACKENDS, _npz_bytes, run_case


# ---- awkward outputs: each set-up gets an empty folder and returns the -o argument ----------------------------

def _fifo(d):
    os.mkfifo(d / "out.npz")
    return str(d / "out.npz")


def _directory(d):
    (d / "out.npz").mkdir()
    return str(d / "out.npz")


def _chardev(d):
    if os.geteuid() != 0:  # refusing /dev/null writes nothing, so an unprivileged run may name it
        return "/dev/null"
    os.mknod(d / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return str(d / "null")


def _dangling(d):
    os.symlink(d / "nowhere", d / "out.npz")
    return str(d / "out.npz")


def _loop(d):
    os.symlink(d / "b", d / "a")
    os.symlink(d / "a", d / "b")
    return str(d / "a")


def _link_to_dir(d):
    (d / "sub").mkdir()
    os.symlink(d / "sub", d / "out.npz")
    return str(d / "out.npz")


def _under_file(d):
    (d / "afile").write_bytes(b"x")
    return str(d / "afile" / "new" / "out.npz")


def _link(d):
    (d / "target.npz").write_bytes(b"old")
    os.symlink("target.npz", d / "out.npz")
    return str(d / "out.npz")


def _kept_mode(d):
    (d / "out.npz").write_bytes(b"old")
    os.chmod(d / "out.npz", 0o604)
    return str(d / "out.npz")


def _stale(d):
    """Temporaries of a killed writer (to be removed), and look-alikes that are not its to remove (kept)."""
    for name in (".out.npz.abcd1234.tmp", ".out.npz.zzzzzzzz.tmp"):
        (d / name).write_bytes(b"PK\x03\x04 half a file")
    (d / ".out.npz.dirdirdi.tmp").mkdir()
    (d / ".other.npz.abcd1234.tmp").write_bytes(b"another output's")
    (d / "victim").write_bytes(b"keep me")
    os.symlink(d / "victim", d / ".out.npz.linklink.tmp")
    return str(d / "out.npz")


def _stale_ok(d):
    return (sorted(p.name for p in d.iterdir()) == [".other.npz.abcd1234.tmp", ".out.npz.dirdirdi.tmp",
                                                     ".out.npz.linklink.tmp", "out.npz", "victim"]
            and (d / "victim").read_bytes() == b"keep me")


#: kind → (set-up, check after a successful run, or None: the output must be refused)
OUTPUTS = {
    "fifo": (_fifo, None), "directory": (_directory, None), "chardev": (_chardev, None),
    "dangling": (_dangling, None), "loop": (_loop, None), "link_to_dir": (_link_to_dir, None),
    "under_file": (_under_file, None), "slash": (lambda d: str(d / "newdir") + "/", None), "empty": (lambda d: "", None),
    "link": (_link, lambda d: (d / "out.npz").is_symlink() and _output_problem(d / "target.npz") is None),
    "new_dirs": (lambda d: str(d / "a" / "b" / "out.npz"), lambda d: (d / "a" / "b" / "out.npz").is_file()),
    "kept_mode": (_kept_mode, lambda d: stat.S_IMODE(os.stat(d / "out.npz").st_mode) == 0o604),
    "stale": (_stale, _stale_ok),
}


def _listing(d: Path) -> list[tuple[str, int]]:
    return sorted((str(p.relative_to(d)), stat.S_IFMT(p.lstat().st_mode)) for p in d.rglob("*"))


def run_output_case(kind: str, command: str, raw: bytes, workdir: Path, backend: str = "numba") -> tuple[str, int, str]:
    """Run a valid input with the awkward output ``kind`` (see OUTPUTS); (outcome, exit status, stderr)."""
    setup, check = OUTPUTS[kind]
    inp, d = workdir / "input.npz", workdir / "out"
    inp.write_bytes(raw)
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir()
    out = setup(d)
    before = _listing(d)
    rc, _, text = _call([command, inp, "-o", out, "--backend", backend, "-q"])
    if rc is None:
        return "crash", -1, text
    if check is not None:
        problem = (f"exit {rc}, expected 0" if rc != 0 else _output_problem(Path(out))
                   or (None if check(d) else f"the {kind} output is not as it should be: {_listing(d)}"))
        return ("crash", rc, f"{problem}: {text}") if problem else ("accepted", rc, text)
    if _one_error_line(rc, text) and _listing(d) == before:
        return "rejected", rc, text
    return "crash", rc, f"{text.strip()} (folder {before} became {_listing(d)})"


#: odd values of the environment variables the command reads (the variable, then its value)
ENVIRONMENTS = [("NUMBA_NUM_THREADS", v) for v in ("0", "-1", "abc", "1.5", "100000", "", " 2")] + \
               [("NUMBA_THREADING_LAYER", v) for v in ("bogus", "", "TBB", "workqueue")] + \
               [("NTPREF_MAX_NPZ_BYTES", v) for v in ("-1", "abc", "0", "1", "1K", "16G", "")]


@contextlib.contextmanager
def _environment(name: str, value: str):
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name)
        else:
            os.environ[name] = old


def run_env_case(env: tuple[str, str], command: str, raw: bytes, workdir: Path, backend: str = "numba"):
    """Run a valid input with one variable of ENVIRONMENTS set; (outcome, exit status, stderr)."""
    with _environment(*env):
        return run_case(command, raw, workdir, backend)


# ---- awkward outputs and odd environments as runs -----------------------------------------------------------

def output_run(ch, fx: Fixtures) -> Result:
    backend = ch.choice(BACKENDS)
    command, arrays = fx.bases[ch.integer(0, len(fx.bases) - 1)]
    kind = ch.choice(sorted(OUTPUTS))
    outcome, rc, text = run_output_case(kind, command, _npz_bytes(arrays), fx.workdir, backend)
    return Result(f"{arrays['model']} {command} output:{kind}", [f"output:{kind}"], outcome, rc, text)


def environment_run(ch, fx: Fixtures) -> Result:
    backend = ch.choice(BACKENDS)
    command, arrays = fx.bases[ch.integer(0, len(fx.bases) - 1)]
    env = ENVIRONMENTS[ch.integer(0, len(ENVIRONMENTS) - 1)]
    outcome, rc, text = run_env_case(env, command, _npz_bytes(arrays), fx.workdir, backend)
    return Result(f"{arrays['model']} {command} env:{env[0]}={env[1]!r}", [f"env:{env[0]}"], outcome, rc, text)
