"""Running ``ntpref`` in this process for the command-line tests: its exit status and standard error, the check
that a command fails with one ``ntpref: error:`` line, an npz writer that lets any dtype in; the installed
package's folder, a path component too long for any file system, and a ``reproduce width`` size that runs
in about a second."""
from pathlib import Path

import numpy as np

import ntpref
from ntpref.cli import main

PACKAGE = Path(ntpref.__file__).resolve().parent
LONG = "a" * 300 + ".npz"          # one path component longer than any file system allows (255)
TINY_WIDTH = dict(seeds=(1, 2), widths=(4, 8), n=40, K=16, steps=5, T=4, teachers=("diagonal",))


def run(capsys, *argv) -> tuple[int, str]:
    """``ntpref ARGV`` in this process: (exit status, stderr)."""
    capsys.readouterr()
    status = main([str(a) for a in argv])
    return status, capsys.readouterr().err


def one_error(capsys, *argv) -> str:
    """Run ``ntpref ARGV``, check it fails with exit status 2 and one ``ntpref: error:`` line; the line."""
    status, err = run(capsys, *argv)
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("ntpref: error: "), err
    assert "internal error" not in err and "Traceback" not in err, err
    return err.rstrip("\n")


def write(path: Path, arrays: dict) -> Path:
    np.savez(path, **arrays)   # np.savez, not save_npz: any dtype (longdouble, bytes) gets in
    return path
