"""Benchmark harness: time one full-batch loss-and-gradient step of each model (``ntpref bench``).

A *case* is a model at one size; an *implementation* turns a case's inputs into a zero-argument
``step()`` that computes the loss and every gradient once. :func:`run` times every implementation on
every case for each thread count (median and minimum of ``repeats`` runs after ``warmup`` calls,
wall clock, same process, implementations interleaved) and returns :class:`Timing` rows; :func:`table`, :func:`slopes` and :func:`figure`
report them. This module times the ntpref backends ("ntpref numba", "ntpref numpy"); ``python -m
scripts.bench`` adds PyTorch and JAX implementations of the same models (ntpref never imports them).

Cases (the papers' settings, :func:`paper_cases`):
  twostage  K = 20 tokens, N = 200 sentences, lengths uniform on 2..6, one-hot E (d = K)
  shallow   n = 4000, d = 8, T = 16, m ∈ {64, 256}; and m = 64, T = 64
  indrnn    n = 4000, d = 17, T = 97 (lag 96), m = 64
Scaling series (:func:`scaling_cases`): one size doubled three times (an 8x range) from a base case:
  shallow n, m, T; indrnn n, T; twostage K, N. :func:`slopes` fits log time = a + b log size.

Flop counts per step (:func:`flops`; a multiply, an add, an exp or a tanh each count 1):
  shallow   n m (4d² + 8Td + 8T + 3d)        (W_i q, scores, U-projections, softmax, a, M U, gradients)
  indrnn    n m T (4d + 10)                  (W_in x_t, recurrence, tanh, σ', BPTT, gradients)
  twostage  Σ_sentences (6 L K + 5 K + 11 L) (scores, softmaxes, logits, a, g_s, scattered gradients)
GFLOP/s = flops / median time.

Steps timed: ``loss_and_grad`` on prepared data for shallow and indrnn (``shallow.prepare`` /
``shallow.indrnn.prepare`` once, then the step with its parameter validation, negligible there); for
twostage ``loss_and_grad`` on a prepared sentence set
(``twostage.loss_and_grad(twostage.prepare(ds), ...)``, as a training loop calls it every step), since on a
Dataset it re-validates and re-prepares the dataset on every call.
"""
from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from .checks import count_argument
from .errors import InputError
from .npzio import atomic_write, check_output
from .reproduce.plots import pyplot, save_figure

MODELS = ("twostage", "shallow", "indrnn")
BASELINE = "ntpref numba"
SHORT_STEP = 0.02   # seconds; see :func:`run`


@dataclass(frozen=True)
class Case:
    """A model at one size. ``size`` holds n, d, T, m (shallow, indrnn) or K, N, min_len, max_len
    (twostage); ``series`` names the size varied by a scaling series (None for a paper case)."""

    model: str
    size: dict = field(hash=False)
    series: str | None = None

    @property
    def label(self) -> str:
        keys = ("K", "N") if self.model == "twostage" else ("n", "d", "T", "m")
        return f"{self.model} " + " ".join(f"{k}={self.size[k]}" for k in keys)


@dataclass
class Implementation:
    """``setup(case, inputs) -> step`` (or None when the implementation does not cover the case);
    ``set_threads(k)`` sets its thread count (None: it cannot, the row says so)."""

    name: str
    setup: Callable
    set_threads: Callable | None = None


@dataclass
class Timing:
    case: str
    model: str
    series: str | None
    size: dict
    implementation: str
    threads: int
    seconds: float        # median wall-clock time of one step
    best: float           # fastest of the timed steps
    flops: float


# ---- cases ------------------------------------------------------------------------------------------

def _shallow(n=4000, d=8, T=16, m=64, series=None):
    return Case("shallow", dict(n=n, d=d, T=T, m=m), series)


def _indrnn(n=4000, d=17, T=97, m=64, series=None):
    return Case("indrnn", dict(n=n, d=d, T=T, m=m), series)


def _twostage(K=20, N=200, series=None):
    return Case("twostage", dict(K=K, N=N, min_len=2, max_len=6), series)


def paper_cases() -> list[Case]:
    """The papers' settings (module docstring)."""
    return [_twostage(), _shallow(), _shallow(m=256), _shallow(T=64), _indrnn()]


def scaling_cases(points: int = 4) -> list[Case]:
    """Scaling series: each listed size doubled ``points`` − 1 times from a base case."""
    doubling = [2 ** k for k in range(points)]
    cases = []
    cases += [_shallow(n=500 * f, series="n") for f in doubling]
    cases += [_shallow(n=1000, m=32 * f, series="m") for f in doubling]
    cases += [_shallow(n=1000, T=8 * f, series="T") for f in doubling]
    cases += [_indrnn(n=500 * f, T=24, series="n") for f in doubling]
    cases += [_indrnn(n=1000, T=12 * f, series="T") for f in doubling]
    cases += [_twostage(K=10 * f, series="K") for f in doubling]
    cases += [_twostage(N=200 * f, series="N") for f in doubling]
    return cases


# ---- inputs and flop counts -------------------------------------------------------------------------

def make_inputs(case: Case, seed: int = 0) -> dict:
    """Random inputs of a case (NumPy arrays; twostage also the ntpref Dataset as ``ds``).

    shallow / indrnn: X [n, T, d] i.i.d. N(0, 1) tokens scaled to norm ≤ 1, y [n] N(0, 1); parameters
    from iid_init (shallow: c, U, W) or shallow.indrnn.paired_init with its second half's W_in redrawn (indrnn:
    c, u, W_in), so f ≠ 0. twostage: random_realizable(K, N, 2, 6) with one-hot E, W_ov and W_kq
    [K, K] with N(0, 1) entries; also tokens (padding 0), mask, query, targets for other frameworks.
    """
    rng = np.random.default_rng(seed)
    s = case.size
    if case.model == "twostage":
        from .twostage import random_realizable
        ds = random_realizable(K=s["K"], N=s["N"], min_len=s["min_len"], max_len=s["max_len"], seed=seed).dataset
        mask = ds.tokens >= 0
        return dict(ds=ds, tokens=np.where(mask, ds.tokens, 0), mask=mask,
                    query=ds.tokens[np.arange(ds.N), ds.lengths - 1], targets=ds.targets.copy(), E=ds.E.copy(),
                    W_ov=rng.standard_normal((ds.d, ds.d)), W_kq=rng.standard_normal((ds.d, ds.d)))
    from . import shallow
    X = shallow.scale_tokens(rng.standard_normal((s["n"], s["T"], s["d"])))
    y = rng.standard_normal(s["n"])
    if case.model == "shallow":
        c, U, W = shallow.iid_init(s["m"], s["d"], seed)
        return dict(X=X, y=y, params=(c, U, W))
    c, u, W_in = shallow.indrnn.paired_init(s["m"], s["d"], seed)
    W_in[s["m"] // 2:] = rng.standard_normal((s["m"] - s["m"] // 2, s["d"]))
    return dict(X=X, y=y, params=(c, u, W_in))


def flops(case: Case, inputs: dict) -> float:
    """Stated flop count of one loss-and-gradient step (module docstring)."""
    s = case.size
    if case.model == "shallow":
        n, d, T, m = s["n"], s["d"], s["T"], s["m"]
        return float(n * m * (4 * d * d + 8 * T * d + 8 * T + 3 * d))
    if case.model == "indrnn":
        n, d, T, m = s["n"], s["d"], s["T"], s["m"]
        return float(n * m * T * (4 * d + 10))
    L = inputs["ds"].lengths.astype(np.float64)
    K = s["K"]
    return float(np.sum(6 * L * K + 5 * K + 11 * L))


# ---- ntpref implementations -------------------------------------------------------------------------

def max_threads() -> int:
    """Most threads Numba runs here: NUMBA_NUM_THREADS, which is the number of cores unless set."""
    import numba
    return numba.config.NUMBA_NUM_THREADS


def _numba_threads(k: int) -> None:
    import numba
    numba.set_num_threads(k)


def _ntpref_setup(backend: str):
    def setup(case: Case, inputs: dict):
        if case.model == "twostage":
            from . import twostage
            prep = twostage.prepare(inputs["ds"])
            W_ov, W_kq = inputs["W_ov"].copy(), inputs["W_kq"].copy()
            return lambda: twostage.loss_and_grad(prep, W_ov, W_kq, backend=backend)
        from . import shallow
        model = shallow if case.model == "shallow" else shallow.indrnn
        data, params = model.prepare(inputs["X"], inputs["y"]), inputs["params"]
        return lambda: model.loss_and_grad(data, *params, backend=backend)
    return setup


def ntpref_implementations(numpy: bool = True) -> list[Implementation]:
    """"ntpref numba" (threads via numba.set_num_threads) and, unless ``numpy=False``, "ntpref numpy"
    (NumPy's own threading, usually single-threaded elementwise work)."""
    impls = [Implementation(BASELINE, _ntpref_setup("numba"), _numba_threads)]
    if numpy:
        impls.append(Implementation("ntpref numpy", _ntpref_setup("numpy"), None))
    return impls


# ---- timing -----------------------------------------------------------------------------------------

def _timed(step: Callable) -> float:
    t0 = time.perf_counter()
    step()
    return time.perf_counter() - t0


def run(implementations: Sequence[Implementation], cases: Sequence[Case], threads: Sequence[int] = (1, 2),
        repeats: int = 7, warmup: int = 2, seed: int = 0, max_seconds: float = 60.0,
        progress: Callable[[str], None] | None = None) -> list[Timing]:
    """Time every implementation on every case for every thread count.

    The implementations of one case and thread count are timed *interleaved* (repeat r times each of
    them once, in turn), so that a changing machine load affects all of them alike and the ratios stay
    meaningful. An implementation that cannot set its thread count is timed with the first thread
    count only and reported with threads = 0 ("default"). A step shorter than SHORT_STEP runs once
    untimed before each timed call (as in a training loop, where it follows itself). The timed rounds
    stop early (after at least 3) once they have taken max_seconds."""
    rows = []
    for case in cases:
        inputs = make_inputs(case, seed)
        fl = flops(case, inputs)
        steps = [(impl, impl.setup(case, inputs)) for impl in implementations]
        steps = [(impl, step) for impl, step in steps if step is not None]
        for ki, k in enumerate(threads):
            active = [(impl, step) for impl, step in steps if impl.set_threads is not None or ki == 0]
            for impl, _ in active:
                if impl.set_threads is not None:
                    impl.set_threads(k)
            if progress:
                progress(f"{case.label}, {k} thread(s): " + ", ".join(impl.name for impl, _ in active))
            times: dict = {impl.name: [] for impl, _ in active}
            for _ in range(warmup):
                for impl, step in active:
                    step()
            t_start = time.perf_counter()
            for r in range(repeats):
                for impl, step in active:
                    if not times[impl.name] or times[impl.name][-1] < SHORT_STEP:
                        step()          # a short step re-warms caches and predictors after the others
                    times[impl.name].append(_timed(step))
                if r >= 2 and time.perf_counter() - t_start > max_seconds:
                    break
            for impl, _ in active:
                t = times[impl.name]
                rows.append(Timing(case.label, case.model, case.series, dict(case.size), impl.name,
                                   k if impl.set_threads is not None else 0, float(np.median(t)),
                                   float(np.min(t)), fl))
    return rows


# ---- reports ----------------------------------------------------------------------------------------

def _fmt_time(s: float) -> str:
    return f"{s * 1e3:.3f} ms" if s < 1.0 else f"{s:.3f} s"


def table(rows: Sequence[Timing], baseline: str = BASELINE) -> str:
    """Times, GFLOP/s and the ratio time / time(baseline, same case and thread count; for rows
    without a thread count, the baseline's best time) as a tabulate grid."""
    from tabulate import tabulate

    base = {}
    for r in rows:
        if r.implementation == baseline:
            base[(r.case, r.threads)] = r.seconds
            base[(r.case, 0)] = min(base.get((r.case, 0), math.inf), r.seconds)
    out = []
    for r in rows:
        b = base.get((r.case, r.threads))
        out.append([r.case, r.implementation, r.threads or "default", _fmt_time(r.seconds), _fmt_time(r.best),
                    f"{r.flops / r.seconds / 1e9:.2f}", "" if b is None else f"{r.seconds / b:.1f}x"])
    return tabulate(out, headers=["case", "implementation", "threads", "median step", "min step",
                                  "GFLOP/s (median)", f"median / {baseline}"], tablefmt="github")


def slopes(rows: Sequence[Timing]) -> list[tuple[str, str, str, int, float, float, float]]:
    """Fitted log–log slopes of time vs the varied size, from the median and from the minimum times,
    and the slope of the stated flop count (what a constant GFLOP/s would give: below 1 where a term
    does not grow with the size, e.g. the d² terms of the shallow model in T):
    (model, series, implementation, threads, b_median, b_min, b_flops)."""
    groups: dict = {}
    for r in rows:
        if r.series is not None:
            groups.setdefault((r.model, r.series, r.implementation, r.threads), []).append(r)
    out = []
    for (model, series, impl, k), rs in groups.items():
        if len(rs) >= 2:
            x = np.log([r.size[series] for r in rs])
            b_med = np.polyfit(x, np.log([r.seconds for r in rs]), 1)[0]
            b_min = np.polyfit(x, np.log([r.best for r in rs]), 1)[0]
            b_flops = np.polyfit(x, np.log([r.flops for r in rs]), 1)[0]
            out.append((model, series, impl, k, float(b_med), float(b_min), float(b_flops)))
    return out


def slope_table(rows: Sequence[Timing]) -> str:
    from tabulate import tabulate
    rows_out = []
    for m, s, i, k, b, c, f in slopes(rows):
        sizes = sorted({r.size[s] for r in rows if (r.model, r.series) == (m, s)})
        rows_out.append([m, f"{s} = {sizes[0]}..{sizes[-1]}", i, k or "default", f"{b:.2f}", f"{c:.2f}", f"{f:.2f}"])
    return tabulate(rows_out, headers=["model", "size doubled", "implementation", "threads", "slope (median)",
                                       "slope (min)", "flop-count slope"], tablefmt="github")


def figure(rows: Sequence[Timing], path: str) -> None:
    """Log–log plot of time vs size, one panel per (model, series), one line per implementation and
    thread count, written as PNG atomically (needs matplotlib, the ``plot`` extra)."""
    plt = pyplot()
    panels = sorted({(r.model, r.series) for r in rows if r.series is not None})
    if not panels:
        raise InputError("no scaling series in the results: nothing to plot")
    cols = min(3, len(panels))
    fig, axes = plt.subplots((len(panels) + cols - 1) // cols, cols, figsize=(4.2 * cols, 3.4 * ((len(panels) + cols - 1) // cols)),
                             squeeze=False)
    for ax, (model, series) in zip(axes.ravel(), panels):
        lines: dict = {}
        for r in rows:
            if (r.model, r.series) == (model, series):
                lines.setdefault((r.implementation, r.threads), []).append((r.size[series], r.seconds))
        for (impl, k), pts in sorted(lines.items()):
            pts.sort()
            ax.loglog([p[0] for p in pts], [p[1] for p in pts], "o-", base=2,
                      label=f"{impl} ({k} thr)" if k else impl)
        ax.set_title(f"{model}: time vs {series}")
        ax.set_xlabel(series)
        ax.set_ylabel("seconds per step")
        ax.legend(fontsize=6)
    for ax in axes.ravel()[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    save_figure(fig, path)


def machine() -> dict:
    """Machine and software description for the report."""
    import numba
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = dict(cpu=cpu, cores=os.cpu_count(), python=platform.python_version(), numpy=np.__version__,
                numba=numba.__version__, platform=platform.platform())
    try:
        info["load_average"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        pass
    return info


# ---- whole runs ------------------------------------------------------------------------------------

def figure2_seconds(threads: int = 1, seed: int = 0) -> float:
    """Wall-clock seconds of the whole Figure-2 run (twostage.train with T0 = 1000, T = 10000, stable
    direction, K = 20, N = 200) after a short compiling run."""
    from .twostage import random_realizable, train
    _numba_threads(threads)
    ds = random_realizable(K=20, N=200, seed=seed).dataset
    train(ds, T0=3, T=3)
    t0 = time.perf_counter()
    train(ds, T0=1000, T=10000)
    return time.perf_counter() - t0


def startup_seconds() -> float:
    """Seconds for `import ntpref` plus a first shallow, indrnn and twostage step in a fresh Python
    process (warm Numba cache; run once before to fill it)."""
    code = ("import time; t = time.perf_counter(); import numpy as np\n"
            "from ntpref import shallow, twostage\n"
            "X = np.full((4, 3, 2), 0.1); y = np.zeros(4)\n"
            "shallow.loss_and_grad(shallow.prepare(X, y), *shallow.iid_init(2, 2, 0))\n"
            "shallow.indrnn.loss_and_grad(shallow.indrnn.prepare(X, y), *shallow.indrnn.paired_init(2, 2, 0))\n"
            "ds = twostage.random_realizable(K=5, N=10, seed=0).dataset\n"
            "twostage.loss_and_grad(ds, np.eye(5), np.eye(5))\n"
            "print(time.perf_counter() - t)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)   # fill the cache
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.strip().splitlines()[-1])


def _bits(result) -> bytes:
    """All floats of a step's result (nested tuples of arrays / floats) as bytes."""
    if isinstance(result, (tuple, list)):
        return b"".join(_bits(r) for r in result)
    return np.ascontiguousarray(result, dtype=np.float64).tobytes()


def thread_determinism(cases: Sequence[Case], threads: Sequence[int] = (1, 2), seed: int = 0) -> dict:
    """{case label: True when the ntpref numba step gives bitwise the same loss and gradients for every
    thread count in ``threads``}."""
    setup = _ntpref_setup("numba")
    out = {}
    for case in cases:
        step = setup(case, make_inputs(case, seed))
        results = []
        for k in threads:
            _numba_threads(k)
            results.append(_bits(step()))
        out[case.label] = all(r == results[0] for r in results)
    return out


def report(rows: Sequence[Timing], extras: dict | None = None) -> str:
    """Machine description, the paper-size table, the scaling slopes and any extra measurements."""
    paper = [r for r in rows if r.series is None]
    scaling = [r for r in rows if r.series is not None]
    parts = ["machine: " + ", ".join(f"{k} {v}" for k, v in machine().items())]
    if paper:
        parts += ["", "one loss-and-gradient step, paper sizes (median wall clock):", table(paper)]
    if scaling:
        parts += ["", "scaling (fitted slope of log time vs log size):", slope_table(scaling)]
    for k, v in (extras or {}).items():
        parts.append(f"{k}: {v}")
    return "\n".join(parts)


def main(implementations: Sequence[Implementation], *, quick: bool = False, threads: Sequence[int] | None = None,
         repeats: int = 7, scaling: bool = True, models: Sequence[str] = MODELS, figure_path: str | None = None,
         json_path: str | None = None, whole_runs: bool = True, quiet: bool = False) -> str:
    """Run the benchmark and return the report text (also used by ``python -m scripts.bench``). Models,
    thread counts and output paths are checked before anything is timed; ``threads`` None: 1 and 2 threads
    (1 alone on one core)."""
    for m in models:
        if m not in MODELS:
            raise InputError(f"unknown model {m!r}; known: {', '.join(MODELS)}")
    threads = [k for k in (1, 2) if k <= max_threads()] if threads is None else threads
    _check_threads(threads)
    for path in (json_path, figure_path):
        if path:
            check_output(path)
    if figure_path and scaling:
        pyplot()  # without matplotlib, fail now rather than after the run
    cases = [c for c in paper_cases() if c.model in models]
    if scaling:
        cases += [c for c in scaling_cases(3 if quick else 4) if c.model in models]
    if quick:
        repeats = min(repeats, 3)
    log = None if quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))
    rows = run(implementations, cases, threads, repeats=repeats, progress=log)
    extras = {}
    if whole_runs and "twostage" in models:
        for k in threads:
            extras[f"Figure-2 run (T0 = 1000, T = 10000, stable), ntpref numba, {k} thread(s)"] = \
                f"{figure2_seconds(k):.3f} s"
    if whole_runs:
        extras["import + first call of each model, warm cache"] = f"{startup_seconds():.2f} s"
    if len(threads) > 1:
        same = thread_determinism([c for c in paper_cases() if c.model in models], threads)
        extras[f"ntpref numba bitwise identical for threads {tuple(threads)}"] = \
            "yes, every paper case" if all(same.values()) else \
            "NO: " + ", ".join(k for k, v in same.items() if not v)
    text = report(rows, extras)
    if json_path:
        data = json.dumps(dict(machine=machine(), rows=[asdict(r) for r in rows], extras=extras), indent=1)
        atomic_write(json_path, lambda fh: fh.write(data.encode()))
    if figure_path and scaling:
        figure(rows, figure_path)
    return text


def _check_threads(threads: Sequence[int]) -> None:
    """InputError for a thread count below 1 or above :func:`max_threads` (Numba would run fewer threads
    than the report claims)."""
    limit = max_threads()
    for k in threads:
        if not 1 <= k <= limit:
            raise InputError(f"--threads {k}: expected 1 to {limit}, the threads Numba runs on this machine "
                             f"({os.cpu_count()} cores; NUMBA_NUM_THREADS sets another limit)")


# ---- command line -----------------------------------------------------------------------------------

def add_arguments(p) -> None:
    """The options shared by ``ntpref bench`` and ``python -m scripts.bench``."""
    p.add_argument("--quick", action="store_true", help="3 repeats, shorter scaling series")
    p.add_argument("--threads", type=count_argument, nargs="+",
                   help="thread counts, at most the number of cores (default 1 2; 1 on one core)")
    p.add_argument("--repeats", type=count_argument, default=7, help="timed runs per measurement (median; default 7)")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--no-scaling", action="store_true", help="paper sizes only")
    p.add_argument("--no-numpy", action="store_true", help="skip the NumPy backend")
    p.add_argument("--no-whole-runs", action="store_true", help="skip the Figure-2 run and start-up timings")
    p.add_argument("--figure", metavar="PATH.png", help="log-log figure of the scaling series")
    p.add_argument("--json", metavar="PATH.json", help="all timings as JSON")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")


def run_from_args(args, extra: Sequence[Implementation] = ()) -> int:
    """Run the benchmark as the parsed ``args`` say and print its report; the exit status."""
    impls = ntpref_implementations(numpy=not args.no_numpy) + list(extra)
    print(main(impls, quick=args.quick, threads=args.threads, repeats=args.repeats, scaling=not args.no_scaling,
               models=args.models, figure_path=args.figure, json_path=args.json,
               whole_runs=not args.no_whole_runs, quiet=args.quiet))
    return 0


def register(subparsers) -> None:
    """Add ``ntpref bench`` (ntpref backends only; ``python -m scripts.bench`` adds PyTorch and JAX)."""
    text = "time one loss-and-gradient step of each model (paper sizes and scaling series)"
    p = subparsers.add_parser("bench", help=text, description=text + "; python -m scripts.bench (run from the "
                              "repository root) adds PyTorch and JAX.")
    add_arguments(p)
    p.set_defaults(func=run_from_args)
