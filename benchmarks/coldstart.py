"""The first commands on an empty Numba cache ("cold") against the same commands once it is filled ("warm"):
``python -m benchmarks.coldstart [--repeats N] [--only NAME ...] [--markdown FILE]`` from the repository root.

Each target is one ``ntpref`` command in a fresh process. A cold run gets a new, empty temporary
NUMBA_CACHE_DIR; the warm run after it reuses that directory, so it loads what the cold run compiled. Every
run writes into a fresh temporary directory (``reproduce`` never resumes). Measured per run: the process's
wall-clock seconds and its CPU seconds (user + system of the child and of the processes it started and
waited for, such as the helper of :mod:`ntpref.precompile`, from ``resource.getrusage``); the table
gives the median over ``--repeats`` pairs and the cold / warm ratio of each. The inputs are the small ones a
first user tries: a 2-sentence two-stage input, a shallow transformer (n = 6, T = 5, m = 4, d = 4) and an
IndRNN (n = 5, T = 4, m = 4, d = 3); ``--backend`` is left at its default (``auto``) unless a target names it.
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from ntpref.npzio import atomic_write, check_output, save_npz
from ntpref.oracle.contract import evaluate
from ntpref.shallow import iid_init, indrnn
from ntpref.twostage import five_token_example

ADAPTER = "tests/conformance_adapters/oracle_numpy.py"


def inputs() -> dict[str, dict]:
    """name → the input arrays of the eval targets."""
    five = five_token_example()
    twostage = {"model": np.array("twostage"), "tokens": five.tokens[:2], "lengths": five.lengths[:2],
                "targets": five.targets[:2], "W_ov": np.full((5, 5), 0.1), "W_kq": np.eye(5), "K": np.array(5),
                "succ": five.succ}
    rng = np.random.default_rng(0)
    c, U, W = iid_init(4, 4, seed=1)
    shallow = {"model": np.array("shallow"), "X": rng.standard_normal((6, 5, 4)), "y": rng.standard_normal(6),
               "c": c, "U": U, "W": W}
    c, u, W_in = indrnn.paired_init(4, 3, seed=1)
    rnn = {"model": np.array("indrnn"), "X": rng.standard_normal((5, 4, 3)), "y": rng.standard_normal(5),
           "c": c, "u": u, "W_in": W_in}
    return {"twostage": twostage, "shallow": shallow, "indrnn": rnn}


def targets() -> dict[str, list[str]]:
    """name → the command's arguments after ``ntpref``; {in:NAME} is the eval input NAME, {res:NAME} its
    outputs (the NumPy backend's), {out} a fresh output path (a file for eval, a directory for reproduce)."""
    out = {f"eval {m}": ["eval", "-q", f"{{in:{m}}}", "-o", "{out}/out.npz"] for m in inputs()}
    out["eval twostage --backend numba"] = ["eval", "-q", "--backend", "numba", "{in:twostage}", "-o", "{out}/out.npz"]
    out["compare --input twostage"] = ["compare", "{res:twostage}", "{res:twostage}", "--input", "{in:twostage}"]
    out["compare --input twostage --backend numba"] = [*out["compare --input twostage"], "--backend", "numba"]
    out["conformance oracle_numpy"] = ["conformance", ADAPTER]
    out["reproduce twostage"] = ["reproduce", "twostage", "-q", "--out", "{out}/results"]
    return out


def _command(args: list[str], input_dir: Path, out_dir: Path) -> list[str]:
    words = []
    for a in args:
        for name in inputs():
            a = a.replace(f"{{in:{name}}}", str(input_dir / f"{name}.npz"))
            a = a.replace(f"{{res:{name}}}", str(input_dir / f"{name}.outputs.npz"))
        words.append(a.replace("{out}", str(out_dir)))
    return [sys.executable, "-m", "ntpref.cli", *words]


def run_once(command: list[str], cache: Path) -> tuple[float, float]:
    """(wall, cpu) seconds of ``command`` in a fresh process with NUMBA_CACHE_DIR = ``cache``; RuntimeError
    when it fails."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {done.returncode}: {done.stderr.strip()[-300:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def measure(names: list[str], repeats: int, progress=print) -> list[tuple]:
    """Rows (target, cold wall, cold cpu, warm wall, warm cpu, cpu ratio), medians over ``repeats`` pairs."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="ntpref-coldstart-") as tmp:
        tmp = Path(tmp)
        for name, arrays in inputs().items():
            save_npz(tmp / f"{name}.npz", arrays)
            save_npz(tmp / f"{name}.outputs.npz", evaluate(arrays, "numpy"))
        for name in names:
            runs = {"cold": [], "warm": []}
            for r in range(repeats):
                cache = Path(tempfile.mkdtemp(prefix="numba-", dir=tmp))
                for kind in ("cold", "warm"):
                    out = Path(tempfile.mkdtemp(prefix="out-", dir=tmp))
                    runs[kind].append(run_once(_command(targets()[name], tmp, out), cache))
                    progress(f"{name} [{r + 1}/{repeats}] {kind}: {runs[kind][-1][0]:.2f} s wall, "
                             f"{runs[kind][-1][1]:.2f} s CPU")
            med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
            rows.append((name, *med["cold"], *med["warm"], med["cold"][1] / med["warm"][1]))
    return rows


def table(rows: list[tuple], repeats: int) -> str:
    """The rows as a markdown table with the machine's load average before and after."""
    lines = [f"| target (`ntpref ...`) | cold wall | cold CPU | warm wall | warm CPU | cold / warm CPU |",
             "|---|---|---|---|---|---|"]
    for name, cw, cc, ww, wc, ratio in rows:
        lines.append(f"| {name} | {cw:.1f} s | {cc:.1f} s | {ww:.1f} s | {wc:.1f} s | {ratio:.1f}x |")
    lines.append(f"\nmedians of {repeats} cold/warm pair(s); {os.cpu_count()} cores; load average after the run: "
                 + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    names = list(targets())
    parser = argparse.ArgumentParser(prog="python -m benchmarks.coldstart", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="cold/warm pairs per target (default 3)")
    parser.add_argument("--only", nargs="+", choices=names, metavar="NAME", help=f"only these ({', '.join(names)})")
    parser.add_argument("--markdown", metavar="FILE", help="also write the table there")
    args = parser.parse_args(argv)
    if args.markdown:
        check_output(args.markdown)
    text = table(measure(args.only or names, max(args.repeats, 1), lambda s: print(s, file=sys.stderr)), args.repeats)
    print(text)
    if args.markdown:
        atomic_write(args.markdown, lambda fh: fh.write((text + "\n").encode()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
