"""What every surface of the command-line fuzzer (tests/fuzz_cli.py) shares: the choice interface, the valid
npz inputs and the fixtures made once per run, running ``ntpref`` in-process, and classifying a run."""
from __future__ import annotations

import contextlib
import io
import json
import shutil
import stat
from pathlib import Path
from typing import NamedTuple

import numpy as np

from ntpref.cli import main
from ntpref.npzio import load_npz, save_npz
from ntpref.oracle.manifest import default_root, load_manifest
from ntpref.oracle.reference import export


# ---- choices: a seeded generator here, Hypothesis in the tests --------------------------------------

class RandomChooser:
    """The choice interface of the mutation engine, backed by ``np.random.default_rng(seed)``."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def choice(self, options):
        options = list(options)
        return options[int(self.rng.integers(len(options)))]

    def integer(self, low: int, high: int) -> int:
        """An integer in [low, high] (both inclusive)."""
        return int(self.rng.integers(low, high + 1))


# ---- valid inputs -------------------------------------------------------------------------------------

def valid_inputs() -> list[tuple[str, dict[str, np.ndarray]]]:
    """(command, arrays) for a small valid input of every model and command."""
    from ntpref.shallow import iid_init, indrnn as indrnn_model
    from ntpref.twostage import five_token_example

    rng = np.random.default_rng(7)
    five = five_token_example()
    twostage = {"model": np.array("twostage"), "tokens": five.tokens, "lengths": five.lengths,
                "targets": five.targets, "W_ov": 0.1 * rng.standard_normal((5, 5)),
                "W_kq": 0.1 * rng.standard_normal((5, 5)), "K": np.array(5), "succ": five.succ}
    twostage_E = {**{k: v for k, v in twostage.items() if k != "K"}, "E": rng.standard_normal((5, 5))}
    X, y = rng.standard_normal((6, 4, 3)) / 2, rng.standard_normal(6)
    c, U, W = iid_init(4, 3, seed=1)
    shallow = {"model": np.array("shallow"), "X": X, "y": y, "c": c, "U": U, "W": W, "kappa": np.array(2.0),
               "tau_att": np.array(1.0), "mask_last_key": np.array(False), "activation": np.array("tanh")}
    c, u, W_in = indrnn_model.paired_init(4, 3, seed=1)
    indrnn = {"model": np.array("indrnn"), "X": X, "y": y, "c": c, "u": u, "W_in": W_in,
              "activation": np.array("erf")}
    two_train = {**twostage, "eta0": np.array(0.1), "eta": np.array(0.05), "T0": np.array(3), "T": np.array(3),
                 "direction": np.array("stable")}
    sgd = {"eta": np.array(0.1), "steps": np.array(3), "rho": np.array([1.0, np.inf, 2.0]),
           "X_val": X[:2], "y_val": y[:2], "batch": np.array(3), "seed": np.array(5)}
    return [("eval", twostage), ("eval", twostage_E), ("train", two_train), ("eval", shallow),
            ("train", {**shallow, **sgd}), ("eval", indrnn), ("train", {**indrnn, **sgd})]


# ---- running and classifying ------------------------------------------------------------------------------

def _call(argv) -> tuple[int | None, str, str]:
    """Run ``ntpref ARGV`` in-process: (exit status or None when an exception escaped, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in argv])
    except BaseException as exc:  # noqa: BLE001 - an escaped exception is exactly what we look for
        return None, out.getvalue(), f"escaped {type(exc).__name__}: {exc}"
    return rc, out.getvalue(), err.getvalue()


def _one_error_line(rc, text: str) -> bool:
    lines = text.splitlines()
    return (rc == 2 and len(lines) == 1 and text.endswith("\n") and lines[0].startswith("ntpref: error: ")
            and "internal error" not in text)


def _output_problem(out: Path) -> str | None:
    """Why the result file ``out`` is not a loadable file of finite float arrays, or None."""
    try:
        result = load_npz(out)
    except Exception as exc:  # noqa: BLE001
        return f"exit 0 but the output does not load: {exc}"
    bad = [k for k, v in result.items() if v.dtype.kind != "f" or not np.isfinite(v).all()]
    return f"exit 0 with non-finite / non-float outputs {bad}" if bad else None


# ---- commands that report: the classification shared by the surfaces ----------------------------------------

def _messages(err: str) -> list[str]:
    """ntpref's own lines on stderr, warnings left out."""
    return [line for line in err.splitlines()
            if line.startswith("ntpref:") and not line.startswith("ntpref: warning: ")]


def classify(rc: int | None, err: str, strict: bool = True) -> tuple[str, str | None]:
    """(outcome, why it is a crash or None) of a run that exited with ``rc`` after writing ``err``: exit 0 with
    no message accepted, 1 with none (or one that is not an error) failed, 2 with exactly one error line
    rejected (see tests/fuzz_cli.py). ``strict``: stderr holds nothing but ntpref's lines; otherwise
    (a conformance adapter's own traceback and output) the error line must be the last line."""
    if rc is None:
        return "crash", err
    if "internal error" in err:
        return "crash", "an internal error"
    messages, lines = _messages(err), err.splitlines()
    if strict and any(not line.startswith("ntpref:") for line in lines):
        return "crash", f"exit {rc} with other output on stderr"
    if rc == 0 and not messages:
        return "accepted", None
    if rc == 1 and (not messages or (len(messages) == 1 and not messages[0].startswith("ntpref: error"))):
        return "failed", None
    if rc == 2 and len(messages) == 1 and lines[-1] == messages[0] and messages[0].startswith("ntpref: error: "):
        return "rejected", None
    return "crash", f"exit {rc} with {len(messages)} message line(s)"


class Result(NamedTuple):
    """One fuzz run: what was run, the generator's steps (for the per-step counts), the outcome, the exit
    status (-1: an exception escaped) and the reason of a crash (else stderr)."""

    what: str
    steps: list[str]
    outcome: str
    rc: int
    text: str


def _result(what: str, steps: list[str], rc: int | None, err: str, why: str | None, outcome: str) -> Result:
    return Result(what, steps, "crash" if why else outcome, -1 if rc is None else rc,
                  f"{why}: {err.strip()}" if why else err)


class Fixtures:
    """What the runs share, made once in ``workdir``: the valid npz inputs, a copy of the reference directory
    (``pristine``) and the names of its quickly verified cases, its first eval case exported (``expected``,
    the case's expected.npz, and its case.json), ``perturbed`` (those outputs times 1 + 1e-9), the
    tolerance files that the tolerance runs start from, and ``wide``, a result file of 250 arrays with long
    names (comparing it with itself prints more than a pipe holds)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.bases = valid_inputs()
        self.pristine = workdir / "reference_runs"
        shutil.copytree(default_root(), self.pristine)
        cases = load_manifest(self.pristine)["cases"]
        self.cases = [c for c, e in cases.items() if e["kind"] != "train" or e["model"] == "twostage"]
        exported = workdir / "exported_case"
        export(self.pristine, next(c for c, e in cases.items() if e["kind"] == "eval"), exported)
        self.expected = exported / "expected.npz"
        outputs = load_npz(self.expected)
        self.perturbed = workdir / "perturbed.npz"
        save_npz(self.perturbed, {k: v * (1 + 1e-9) if v.dtype.kind == "f" else v for k, v in outputs.items()})
        self.wide = workdir / "wide.npz"
        save_npz(self.wide, {"w" * 200 + str(i): np.arange(3.0) for i in range(250)})
        first = sorted(outputs)[0]
        self.tolerance_files = {
            "case.json": json.loads((exported / "case.json").read_text()),
            "plain": {**{k: {"rtol": 1e-8, "atol": 1e-300, "reason": "fuzz"} for k in outputs},
                      "default": {"rtol": 1e-12, "atol_max_scale": 1e-14}},
            "head": {first: {"rtol": 1e-10, "atol_per_step": 1e-15, "head": {"n": 1, "rtol": 1e-6, "atol": 0.0}}},
        }

    def fresh(self, name: str) -> Path:
        """An empty folder ``name`` of the work directory (whatever was there removed first)."""
        path = self.workdir / name
        _clear(path)
        path.mkdir()
        return path


def _clear(path: Path) -> None:
    """Remove whatever ``path`` is (a folder with its contents, a file, a link, a FIFO), if anything."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(path)
    else:
        path.unlink()
