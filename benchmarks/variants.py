"""How far the compiler and a second core take the two-stage step: ``python -m benchmarks.variants
[--rounds R] [--no-parallel]`` from the repository root (docs/performance.md, "The two-stage step against
one core").

:func:`build` compiles variants of ntpref/twostage/kernels.py from its source text (the text an edit
replaces must occur as often as the edit states, else the command stops: a variant never runs the shipped
code unnoticed), and :func:`main` times each variant's serial pass (MODE_GRAD, the benchmark's set: K = 20,
N = 200, one-hot E) as a training loop runs it: a compiled loop of ``pass_serial`` calls with no Python
between them, one thread; every timed call runs in ``R`` interleaved rounds of one batch each
(``ntpref.bench.time_steps``), and the least and the median time per call over the batches are printed.
The variants:

    as shipped    the module's source unchanged, compiled as the variants are (no cache): the control
    K constant    the number of logits a module constant instead of an array's shape, so that LLVM knows
                  the trip count of every loop over the K logits; the same operations in the same order,
                  so the same bits
    fastmath      every kernel of the module compiled with the fast-math flags reassoc, contract and arcp
                  (``ntpref.vmath.exp``, imported, keeps strict arithmetic): LLVM may reassociate the sums,
                  contract a multiply and an add into an FMA and multiply by a reciprocal; other bits. What
                  the compiler alone could give if the bits were free
    fastmath with nsz  the same flags and nsz (no signed zeros), the flags of ``fastmath=True`` but for nnan,
                  ninf and afn: it shows whether those flags still compute the model (the printed normwise
                  difference to the shipped values)

Beside them, the shipped (cached) kernels in the same compiled loop, and two calls of them from Python:
``kernels.pass_serial`` (its dispatch and the boxing of its results added to the loop's time) and the
public ``twostage.loss_and_grad`` (the validation of W_ov and W_kq added too), the call the benchmark
times. The process builds the kernels as the ``ntpref`` command and ``benchmarks.run`` do
(``ntpref.numba_target.configure_process``: full vector width).

Unless ``--no-parallel``, the parallel driver (``kernels.sentences_parallel``, then ``kernels.reduce``: the
Numba backend's path for large sets, bitwise the serial pass) on the same set at 2 threads, as shipped
(blocks of BLOCK = 64 sentences: 128 and 72 sentences per thread at N = 200) and with two even blocks,
beside the serial pass, in a child process.
"""
from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from numba import njit

from ntpref import bench, twostage
from ntpref.numba_target import configure_process
from ntpref.twostage import kernels

from .lanes import paper_set

SOURCE = Path(kernels.__file__)
CALLS = 200                # calls per timed batch
CHILD_SECONDS = 900        # the 2-thread child process is stopped after this
#: Edits (old, new, count): old must occur exactly count times in the source (None: every occurrence of a
#: text that occurs at least once, as the decorators' options); "{K}" in new stands for the number of
#: logits. Every variant gets COMMON first: the relative import made absolute and Numba's cache off (the
#: variant is a copy in a temporary directory).
COMMON = (("from .. import vmath", "from ntpref import vmath", 1), ("cache=True", "cache=False", None))
_FAST = 'error_model="numpy", fastmath={}'
VARIANTS = {
    "as shipped": (),
    "K constant": (("import math\n", "import math\nK_LOGITS = {K}\n", 1), ("logits.shape[1]", "K_LOGITS", 1),
                   ("gz.shape[1]", "K_LOGITS", 3), ("g.shape[1]", "K_LOGITS", 1), ("Bov.shape[0]", "K_LOGITS", 2)),
    "fastmath": (('error_model="numpy"', _FAST.format('{"reassoc", "contract", "arcp"}'), None),),
    "fastmath with nsz": (('error_model="numpy"', _FAST.format('{"reassoc", "contract", "arcp", "nsz"}'), None),),
}


def even_blocks(N: int, threads: int = 2) -> tuple:
    """The edit that splits a set of N sentences into ``threads`` even blocks of the parallel driver."""
    return ((f"BLOCK = {kernels.BLOCK} ", f"BLOCK = {-(-N // threads)} ", 1),)


def variant_source(name: str, edits, K: int) -> str:
    """The source of variant ``name`` with ``edits`` (see COMMON) for sets of K logits; SystemExit (one line)
    when an edit does not occur as often as it states in ntpref/twostage/kernels.py as it is now."""
    text = SOURCE.read_text()
    for old, new, count in COMMON + tuple(edits):
        found = text.count(old)
        if found != count and not (count is None and found):
            raise SystemExit(f"benchmarks.variants: variant {name!r}: {old!r} occurs {found} times in {SOURCE}, "
                             f"not {count or 'at least once'}; the variant needs updating")
        text = text.replace(old, new.replace("{K}", str(K)))
    return text


def build(name: str, edits, K: int, directory: str):
    """Variant ``name`` (``edits`` as :func:`variant_source`) of the kernels module for K logits, written to
    ``directory`` and imported."""
    stem = "kernels_" + name.replace(" ", "_")
    path = Path(directory) / f"{stem}.py"
    path.write_text(variant_source(name, edits, K))
    spec = importlib.util.spec_from_file_location(stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def loop_of(pass_serial):
    """A compiled loop of n calls of ``pass_serial`` (the mode a run-time argument, as the public call
    passes it), returning the sum of their losses."""
    @njit
    def loop(n, tokens, lengths, targets, weights, Bov, Bkq, mode):
        total = 0.0
        for _ in range(n):
            total += pass_serial(tokens, lengths, targets, weights, Bov, Bkq, mode)[0]
        return total
    return loop


def differences(a, b) -> str:
    """'same bits', or the largest normwise difference max|x - y| / max|x| over the values of two pass results
    (loss, log scale, losses, logits, attention, G_ov, G_kq)."""
    pairs = [(np.asarray(x, dtype=float), np.asarray(y, dtype=float)) for x, y in zip(a, b)]
    if all(x.tobytes() == y.tobytes() for x, y in pairs):
        return "same bits"
    worst = max(float(np.max(np.abs(x - y)) / max(float(np.max(np.abs(x))), np.finfo(float).tiny))
                for x, y in pairs)
    return f"other bits (normwise difference up to {worst:.1e})"


def repeat(f, *args) -> None:
    """CALLS calls of f(*args), each result dropped before the next call (kept results would time the
    allocator)."""
    for _ in range(CALLS):
        f(*args)


def per_call(batches: dict, rounds: int) -> dict:
    """{name: seconds per call of each timed batch} (a batch makes CALLS calls): ``ntpref.bench.time_steps``
    times the batches interleaved, once each per round."""
    times = bench.time_steps(list(batches.values()), repeats=rounds)
    return {name: [t / CALLS for t in ts] for name, ts in zip(batches, times)}


def serial_rows(prep, W_ov, W_kq, rounds: int) -> list[tuple[str, float, float, str]]:
    """(what, least and median seconds per step, bits against the shipped pass) of the variants' compiled
    loops, the shipped kernels' compiled loop and the two calls from Python, on the Prepared set ``prep``
    with W_ov, W_kq."""
    data = (prep.tokens, prep.lengths, prep.targets, prep.weights, W_ov, W_kq)
    shipped = kernels.pass_serial(*data, kernels.MODE_GRAD)
    K = prep.E.shape[1]
    calls, bits = {}, {}

    def add(what, batch, bit):
        calls[what], bits[what] = batch, bit

    add("shipped (cached): compiled loop",
        functools.partial(loop_of(kernels.pass_serial), CALLS, *data, kernels.MODE_GRAD), "the shipped pass")
    with tempfile.TemporaryDirectory() as directory:
        for name, edits in VARIANTS.items():
            module = build(name, edits, K, directory)
            add(f"{name}: compiled loop",
                functools.partial(loop_of(module.pass_serial), CALLS, *data, kernels.MODE_GRAD),
                differences(shipped, module.pass_serial(*data, kernels.MODE_GRAD)))
    add("shipped: kernels.pass_serial from Python",
        functools.partial(repeat, kernels.pass_serial, *data, kernels.MODE_GRAD), "the shipped pass")
    add("shipped: twostage.loss_and_grad", functools.partial(repeat, twostage.loss_and_grad, prep, W_ov, W_kq),
        "the shipped pass")
    times = per_call(calls, rounds)
    return [(what, min(t), float(np.median(t)), bits[what]) for what, t in times.items()]


def parallel_pass(module, data) -> tuple:
    """The parallel driver of the kernels ``module`` (``sentences_parallel``, then ``reduce``) in MODE_GRAD on
    data = (tokens, lengths, targets, weights, W_ov, W_kq): (loss, log scale, G_ov, G_kq)."""
    losses, lam, _, gz, attn, gs = module.sentences_parallel(*data, kernels.MODE_GRAD)
    return module.reduce(data[0], data[1], data[3], kernels.MODE_GRAD, losses, lam, gz, attn, gs)


def gradient_bits(loss, G_ov, G_kq) -> bytes:
    """The bits of a pass's loss and gradients, for comparing the parallel driver with the serial pass."""
    return np.float64(loss).tobytes() + G_ov.tobytes() + G_kq.tobytes()


def parallel_child(rounds: int) -> None:
    """In a child process at 2 threads: the parallel driver as shipped (blocks of BLOCK sentences) and with
    two even blocks (:func:`even_blocks`), and the serial pass; one line: the threading layer, then the least
    and the median seconds of each, and whether each parallel driver gave the serial pass's bits."""
    import numba
    numba.set_num_threads(2)
    _, prep, W_ov, W_kq = paper_set()
    data = (prep.tokens, prep.lengths, prep.targets, prep.weights, W_ov, W_kq)

    with tempfile.TemporaryDirectory() as directory:
        even = build("even blocks", even_blocks(prep.tokens.shape[0]), prep.E.shape[1], directory)
    drivers = {"shipped": kernels, "even": even}
    serial = kernels.pass_serial(*data, kernels.MODE_GRAD)
    expected = gradient_bits(serial[0], serial[5], serial[6])
    same = {}
    for name, module in drivers.items():
        loss, _, G_ov, G_kq = parallel_pass(module, data)
        same[name] = "same" if gradient_bits(loss, G_ov, G_kq) == expected else "other"
    times = per_call({name: functools.partial(repeat, parallel_pass, module, data)
                      for name, module in drivers.items()}
                     | {"serial": functools.partial(repeat, kernels.pass_serial, *data, kernels.MODE_GRAD)}, rounds)
    print(numba.threading_layer(), *(f"{min(t):.9f} {np.median(t):.9f}" for t in times.values()),
          same["shipped"], same["even"])


def parallel_rows(rounds: int) -> list[tuple[str, float, float, str]]:
    """The rows of :func:`parallel_child`, run in a child process (module docstring)."""
    if (os.cpu_count() or 1) < 2:
        return []
    out = subprocess.run([sys.executable, "-m", "benchmarks.variants", "--parallel-child", "--rounds", str(rounds)],
                         stdout=subprocess.PIPE, text=True, check=True, timeout=CHILD_SECONDS).stdout.split()
    layer, times, same = out[0], [float(x) for x in out[1:7]], out[7:9]
    rows = []
    for i, what in enumerate((f"parallel driver (blocks of {kernels.BLOCK})", "parallel driver (two even blocks)",
                              "kernels.pass_serial")):
        bits = ("the serial pass" if i == 2 else "same bits as the serial pass" if same[i] == "same"
                else "OTHER BITS than the serial pass")
        rows.append((f"2 threads ({layer}): {what}", times[2 * i], times[2 * i + 1], bits))
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.variants", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=35, help="interleaved rounds of timing (default 35)")
    parser.add_argument("--no-parallel", action="store_true", help="leave out the 2-thread parallel driver")
    parser.add_argument("--parallel-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.parallel_child:
        parallel_child(args.rounds)
        return 0
    configure_process()       # the kernels as the ntpref command and benchmarks.run build them; children inherit it
    import numba
    numba.set_num_threads(1)
    _, prep, W_ov, W_kq = paper_set()
    rows = serial_rows(prep, W_ov, W_kq, args.rounds)
    if not args.no_parallel:
        rows += parallel_rows(args.rounds)
    N, Lmax = prep.tokens.shape
    print(f"two-stage MODE_GRAD pass on the benchmark's set (N = {N}, Lmax = {Lmax}), one thread unless stated: "
          f"least and median time per call over {args.rounds} interleaved rounds of one batch of {CALLS} calls")
    width = max(len(what) for what, *_ in rows)
    for what, best, median, bits in rows:
        print(f"  {what:{width}s} {best * 1e6:6.1f} {median * 1e6:6.1f} us   {bits}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
