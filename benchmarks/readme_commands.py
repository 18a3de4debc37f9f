"""The README's two set-up commands as a new user runs them, timed: ``python -m benchmarks.readme_commands
[--only first|tests] [--python PY] [--markdown FILE]`` from the repository root.

The repository's committed HEAD is cloned into a temporary directory; each command gets a fresh virtual
environment made there by ``PY -m venv`` (default: python3.11, else the running Python) and runs in the
clone, verbatim, as ``.ci/run`` runs it. Each command is a chain of steps joined by ``&&`` (an install, then
the job); every step is timed on its own (wall-clock seconds; pip's download cache is whatever the user's
is, so an install here measures installing, not downloading). For the test command the pytest summary line
(passed, failed, skipped, pytest's own seconds) is reported too. Exit status 1 when a command fails.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ntpref.npzio import atomic_write, check_output

PROG = "python -m benchmarks.readme_commands"
ROOT = Path(__file__).resolve().parent.parent
NAMES = ("first", "tests")


def readme_commands(readme: Path = ROOT / "README.md") -> dict[str, str]:
    """{"first": ..., "tests": ...}: the two lines of the README's opening ```bash block, comments stripped."""
    block = re.search(r"^```bash\n(.*?)^```", readme.read_text(encoding="utf-8"), re.M | re.S)
    lines = [re.sub(r"\s*#.*$", "", line).strip() for line in block.group(1).splitlines()] if block else []
    lines = [line for line in lines if line]
    if len(lines) != 2:
        raise SystemExit(f"{PROG}: README.md does not open with a ```bash block of two commands")
    return dict(zip(NAMES, lines))


def run_command(name: str, command: str, clone: Path, python: str, log) -> list[tuple[str, float, int, str]]:
    """Each ``&&`` step of README command ``name`` (``command``) run in ``clone`` in a fresh venv: (step,
    seconds, exit status, the pytest summary line of a pytest step, else ""), stopping at the first failing
    step (whose last 30 lines of output go to stderr)."""
    venv = clone.parent / f"venv-{name}"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    env.pop("NUMBA_CACHE_DIR", None)
    rows = []
    for step in (s.strip() for s in command.split("&&")):
        log(f"  {step}")
        start = time.perf_counter()
        done = subprocess.run(["bash", "-c", step], cwd=clone, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        lines = (done.stdout + done.stderr).strip().splitlines()
        summary = next((line.strip("= ") for line in reversed(lines) if re.search(r"\d+ passed|failed|error", line)),
                       "") if "pytest" in step else ""
        rows.append((step, seconds, done.returncode, summary))
        log(f"    {seconds:.0f} s, exit {done.returncode}" + (f": {rows[-1][3]}" if rows[-1][3] else ""))
        if done.returncode:
            sys.stderr.write("\n".join(lines[-30:]) + "\n")
            break
    return rows


def markdown(head: str, results: dict[str, list]) -> str:
    """The table of every step."""
    out = [f"`{PROG}` at {head}", "", "| command | step | seconds | exit | pytest |", "|---|---|---|---|---|"]
    for name, rows in results.items():
        for step, seconds, status, summary in rows:
            out.append(f"| {name} | `{step}` | {seconds:.0f} | {status} | {summary} |")
        out.append(f"| {name} | total | {sum(r[1] for r in rows):.0f} | | |")
    return "\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog=PROG, description="The README's set-up commands, each in a fresh venv on a "
                                "fresh clone of HEAD, timed step by step.")
    p.add_argument("--only", choices=NAMES, nargs="+", default=list(NAMES), help="which commands (default both)")
    p.add_argument("--python", default=shutil.which("python3.11") or sys.executable,
                   help="the Python that makes the venvs (default python3.11)")
    p.add_argument("--markdown", metavar="FILE", help="also write the table there")
    args = p.parse_args(argv)
    if args.markdown:
        check_output(args.markdown)
    commands = readme_commands()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()
    results = {}
    with tempfile.TemporaryDirectory(prefix="ntpref-readme-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
        for name in args.only:
            print(f"{name}: {commands[name]}", file=sys.stderr, flush=True)
            results[name] = run_command(name, commands[name], clone, args.python,
                                        lambda text: print(text, file=sys.stderr, flush=True))
    table = markdown(head, results)
    print(table)
    if args.markdown:
        atomic_write(args.markdown, lambda fh: fh.write(table.encode()))
    return int(any(status for rows in results.values() for _, _, status, _ in rows))


if __name__ == "__main__":
    sys.exit(main())
