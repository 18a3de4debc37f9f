"""Shared driver of the cross-framework checks (scripts/crosscheck_torch.py, scripts/crosscheck_jax.py).

Each framework script restates the three models of the specs (spec/twostage.md §2, §4;
spec/shallow.md §1-§3, §6) with its own autograd and hands this module a :class:`Framework`. This
module does everything that does not depend on the framework:

* case discovery: ``reference_runs/manifest.json`` (format in notes/api.md), ``--cases`` selection;
* reading a case's ``input.npz`` into plain NumPy structures (:class:`TwoStageInput`,
  :class:`ShallowInput`), including the reproduction of ProjSGD's minibatch draws;
* deciding what is compared: every eval output; for train cases the first :data:`STEPS` steps of the
  per-step logs (``expected[:STEPS + 1]`` for the two-stage logs, which hold t = 0..T0 / 0..T;
  ``expected[:STEPS]`` for the shallow logs, which hold one entry per step), and final parameters
  only when the whole run is within the steps the framework executed;
* comparing through :func:`ntpref.oracle.compare.compare_arrays` and printing one table
  (case, array, max abs err, max rel err, ok).

Choices where the specs are silent:

* Tolerances: eval and NTK outputs rtol 1e-10 with atol 1e-12*max|expected| (spec/interchange.md,
  another float64 framework); per-step logs of the first 50 steps rtol 1e-9 (spec, trajectories),
  also used for the final stage-1 W_ov and L* (they depend on all T0 stage-1 steps; measured
  agreement ~1e-14). The network output f gets its absolute floor from max(|f|, |y|)
  (:func:`output_tolerance`), because a reference f that is exactly 0 (paired initialisation) has
  no scale of its own. ``--float32``: one looser table, rtol 1e-4 and atol 1e-4*max|expected|.
* Two-stage training: stage 2 starts from the stage-1 result, so stage 1 runs all T0 steps; stage 2
  runs min(T, 50). The frameworks compute the direction from autograd of the cross-entropy written
  as log(1 + sum_{v != y} exp(z_v - z_y)), whose gradient forms p_y - 1 as -sum_{v != y} p_v without
  cancellation: this is the accurate direction that the "stable" method reproduces (and that
  "naive" equals wherever it is accurate, e.g. in the compared first steps). The correlations
  ``stage*_corr`` and ``W_*_star`` need the max-margin QP, which is not part of the restated models:
  they are not compared.
* ProjSGD: the minibatch indices are reproduced from the documented draws (:func:`sgd_batches`).
* A stage whose gradient is exactly zero keeps its iterate (ntpref pads its logs the same way).

Exit status: 0 all compared arrays pass, 1 something failed, 2 usage error (bad option, unknown
case, missing manifest or root).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tabulate import tabulate

from ntpref.oracle.compare import FRAMEWORK_FLOAT64, compare_arrays
from ntpref.oracle.npzio import load_npz
from ntpref.oracle.reference import default_root

#: Number of training steps restated by the frameworks (spec/interchange.md, "Tolerances").
STEPS = 50
#: Default location of the stored reference cases (as for ``ntpref verify``: $NTPREF_REFERENCE_RUNS, else
#: the repository's reference_runs/).
DEFAULT_ROOT = default_root()

#: Tolerances (spec/interchange.md, "Tolerances (defaults, float64)").
TOL_EVAL64 = FRAMEWORK_FLOAT64
TOL_TRAJ64 = dict(rtol=1e-9, atol=0.0, atol_max_scale=1e-12,
                  reason="another framework in float64, first 50 steps of a trajectory")
TOL_32 = dict(rtol=1e-4, atol=0.0, atol_max_scale=1e-4,
              reason="float32 framework (separate, looser table)")

#: Name of the logged gradient norm of a shallow model (spec/interchange.md).
GRAD_NORM = {"shallow": "grad_norm_W", "indrnn": "grad_norm_u"}
#: Trained parameters of each shallow model, in the order of the interchange format.
PARAMS = {"shallow": ("c", "U", "W"), "indrnn": ("c", "u", "W_in")}


class Skip(Exception):
    """A case (or part of one) the framework check does not reproduce; the message says why."""


class UsageError(Exception):
    """Bad command line, unknown case, missing manifest: exit status 2."""


# ----------------------------------------------------------------------------------------------
# Inputs as plain NumPy structures
# ----------------------------------------------------------------------------------------------

def _scalar(arrays, name, default=None, kind=float):
    if name not in arrays:
        if default is None:
            raise KeyError(f"input array '{name}' is missing")
        return default
    value = np.asarray(arrays[name])
    if value.ndim != 0:
        raise ValueError(f"input array '{name}' must be 0-d, has shape {value.shape}")
    return kind(value.item()) if kind is not str else str(value[()])


@dataclass
class TwoStageInput:
    """spec/twostage.md §1-§2 inputs: sentences as token ids, embeddings, parameters.

    tokens [N, Lmax] int64 with padding replaced by token 0 (``mask`` marks real positions),
    query [N] (last token of each sentence), targets [N], E [d, K], succ [K] or None,
    W_ov, W_kq [d, d]; train fields eta0, eta, T0, T, direction; optimal [N] the optimal token
    x*(X) (the sentence's token whose successor is the target) or -1 when not unique.
    """
    tokens: np.ndarray
    mask: np.ndarray
    query: np.ndarray
    targets: np.ndarray
    E: np.ndarray
    succ: np.ndarray | None
    W_ov: np.ndarray
    W_kq: np.ndarray
    eta0: float = 0.0
    eta: float = 0.0
    T0: int = 0
    T: int = 0
    direction: str = "stable"
    optimal: np.ndarray | None = None

    @property
    def colloc(self) -> np.ndarray:
        """C = tokens with a collocation successor (succ >= 0), the set L0 averages over."""
        return np.flatnonzero(self.succ >= 0)


def twostage_input(arrays: dict, kind: str) -> TwoStageInput:
    """Read a "twostage" input dict (spec/interchange.md) into a :class:`TwoStageInput`."""
    tokens = np.asarray(arrays["tokens"], dtype=np.int64)
    lengths = np.asarray(arrays["lengths"], dtype=np.int64)
    mask = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    if "E" in arrays:
        E = np.asarray(arrays["E"], dtype=np.float64)
    else:
        E = np.eye(_scalar(arrays, "K", kind=int))
    succ = np.asarray(arrays["succ"], dtype=np.int64) if "succ" in arrays else None
    out = TwoStageInput(tokens=np.where(mask, tokens, 0), mask=mask,
                        query=tokens[np.arange(len(lengths)), lengths - 1],
                        targets=np.asarray(arrays["targets"], dtype=np.int64), E=E, succ=succ,
                        W_ov=np.asarray(arrays["W_ov"], dtype=np.float64),
                        W_kq=np.asarray(arrays["W_kq"], dtype=np.float64))
    if kind == "train":
        out.eta0 = _scalar(arrays, "eta0")
        out.eta = _scalar(arrays, "eta")
        out.T0 = _scalar(arrays, "T0", kind=int)
        out.T = _scalar(arrays, "T", kind=int)
        out.direction = _scalar(arrays, "direction", "stable", kind=str)
        # x*(X): the token of the sentence whose successor is the target (spec §1: y = n(x*)).
        hit = mask & (succ[out.tokens] == out.targets[:, None])
        cand = np.where(hit, out.tokens, -1)
        first = cand.max(axis=1)
        unique = np.all((cand == first[:, None]) | (cand == -1), axis=1)
        out.optimal = np.where(unique, first, -1)
    return out


@dataclass
class ShallowInput:
    """spec/shallow.md §1/§6 inputs: X [n, T, d], y [n], params (c, U, W) or (c, u, W_in), options;
    train fields eta, steps, rho [3] or None, X_val / y_val or None, batches [steps, B] or None."""
    model: str
    X: np.ndarray
    y: np.ndarray
    params: dict
    kappa: float = 2.0
    tau_att: float = 1.0
    mask_last_key: bool = False
    activation: str = "tanh"
    eta: float = 0.0
    steps: int = 0
    rho: np.ndarray | None = None
    X_val: np.ndarray | None = None
    y_val: np.ndarray | None = None
    batches: np.ndarray | None = None


def shallow_input(model: str, arrays: dict, kind: str, steps: int) -> ShallowInput:
    """Read a "shallow" / "indrnn" input dict into a :class:`ShallowInput`.

    For ProjSGD (input ``batch``) the minibatch indices of the first ``steps`` steps are
    reproduced by :func:`sgd_batches`.
    """
    out = ShallowInput(model=model, X=np.asarray(arrays["X"], dtype=np.float64),
                       y=np.asarray(arrays["y"], dtype=np.float64),
                       params={k: np.asarray(arrays[k], dtype=np.float64) for k in PARAMS[model]},
                       kappa=_scalar(arrays, "kappa", 2.0),
                       tau_att=_scalar(arrays, "tau_att", 1.0),
                       mask_last_key=_scalar(arrays, "mask_last_key", False, kind=bool),
                       activation=_scalar(arrays, "activation", "tanh", kind=str))
    if kind == "train":
        out.eta = _scalar(arrays, "eta")
        out.steps = _scalar(arrays, "steps", kind=int)
        if "rho" in arrays:
            out.rho = np.asarray(arrays["rho"], dtype=np.float64)
        if "X_val" in arrays:
            out.X_val = np.asarray(arrays["X_val"], dtype=np.float64)
            out.y_val = np.asarray(arrays["y_val"], dtype=np.float64)
        if "batch" in arrays:
            out.batches = sgd_batches(len(out.y), _scalar(arrays, "batch", kind=int),
                                      _scalar(arrays, "seed", kind=int), min(steps, out.steps))
    return out


def sgd_batches(n: int, batch: int, seed: int, steps: int) -> np.ndarray:
    """ProjSGD minibatch indices [steps, batch] (spec/shallow.md §3: sampled with replacement).

    The draws are the documented ones of ntpref.shallow.train (its module docstring, the public
    description of ProjSGD): ``rng = np.random.default_rng(seed)``, then at every step
    ``rng.integers(0, n, size=batch)``, nothing else drawn from ``rng``. Reproduced here from that
    description, not by calling ntpref.
    """
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, n, size=batch) for _ in range(steps)]) if steps else np.zeros((0, batch), np.int64)


# ----------------------------------------------------------------------------------------------
# Framework interface and per-case driver
# ----------------------------------------------------------------------------------------------

@dataclass
class Framework:
    """The model restatement of one framework. Every function takes the input structure and
    ``float32`` (bool) and returns a dict of NumPy arrays named as in spec/interchange.md.

    twostage_eval(inp) -> loss, logits, attn, grad_W_ov, grad_W_kq [, loss0, grad0_W_ov]
    twostage_train(inp, n1, n2) -> stage1_loss [n1+1], stage1_norm [n1+1], W_ov (after n1 steps),
        loss_floor, stage2_loss [n2+1], stage2_norm [n2+1], W_kq (after n2 steps)
    shallow_eval(inp) -> f, loss, grad_<param> for every parameter
    shallow_train(inp, n) -> train_loss [n], grad_norm_W|grad_norm_u [n], val_loss [n] (with
        validation data), the parameters after n steps
    ntk(inp) -> gram [n, n]: K_m(X_j, X_l) = Σ over all parameters of ∂f(X_j)/∂θ · ∂f(X_l)/∂θ
        (spec/shallow.md §4), from the framework's per-sample Jacobian of f
    """
    name: str
    version: str
    twostage_eval: Callable
    twostage_train: Callable
    shallow_eval: Callable
    shallow_train: Callable
    ntk: Callable


def run_case(fw: Framework, meta: dict, arrays: dict, expected: dict, float32: bool):
    """Framework outputs of one case, the matching slices of ``expected``, the default tolerance and
    the per-array tolerances that differ from it (name -> tolerance)."""
    model, kind = meta.get("model"), meta.get("kind")
    tol = TOL_32 if float32 else (TOL_TRAJ64 if kind == "train" else TOL_EVAL64)
    if kind == "ntk":
        # Input: X, c, U, W and the transformer's options (no y; the Gram matrix does not use it).
        inp = shallow_input("shallow", {"y": np.zeros(len(arrays["X"])), **arrays}, "eval", 0)
        return fw.ntk(inp, float32), expected, tol, {}
    if model == "twostage" and kind == "eval":
        return fw.twostage_eval(twostage_input(arrays, kind), float32), expected, tol, {}
    if model in PARAMS and kind == "eval":
        inp = shallow_input(model, arrays, kind, 0)
        return fw.shallow_eval(inp, float32), expected, tol, {"f": output_tolerance(tol, inp.y)}
    if model == "twostage" and kind == "train":
        inp = twostage_input(arrays, kind)
        if inp.direction not in ("stable", "naive"):
            raise ValueError(f"unknown direction {inp.direction!r}")
        # Stage 2 starts from the final W_ov, so stage 1 always runs all T0 steps.
        n2 = min(inp.T, STEPS)
        actual = fw.twostage_train(inp, inp.T0, n2, float32)
        keep = {"stage1_loss": STEPS + 1, "stage1_norm": STEPS + 1, "stage2_loss": n2 + 1,
                "stage2_norm": n2 + 1}
        out = {k: actual[k][:keep[k]] for k in keep}
        out["W_ov"], out["loss_floor"] = actual["W_ov"], actual["loss_floor"]
        if n2 == inp.T:
            out["W_kq"] = actual["W_kq"]
        return out, _matching(expected, out), tol, {}
    if model in PARAMS and kind == "train":
        inp = shallow_input(model, arrays, kind, STEPS)
        n = min(inp.steps, STEPS)
        out = fw.shallow_train(inp, n, float32)
        if n < inp.steps:
            out = {k: v for k, v in out.items() if k not in PARAMS[model]}
        return out, _matching(expected, out), tol, {}
    raise Skip(f"no restatement for model {model!r}, kind {kind!r}")


def output_tolerance(tol: dict, y: np.ndarray) -> dict:
    """Tolerance of the network output f: the absolute floor scales with max(|f|, |y|), not |f| alone.

    f enters the loss and every gradient only through the residual f - y, so an error that is small
    against the targets is invisible to the model. The plain rule (atol_max_scale * max|f|) breaks
    down when the reference f is zero up to rounding, e.g. exactly 0 at the paired initialisation
    (spec/shallow.md §1), where a framework's sum over heads leaves ~1e-17 of rounding.
    """
    floor = tol["atol_max_scale"] * float(np.max(np.abs(y), initial=0.0))
    return {**tol, "atol": tol["atol"] + floor,
            "reason": tol["reason"] + f"; f: atol {tol['atol_max_scale']:g}*max|y|"}


def _matching(expected: dict, actual: dict) -> dict:
    """``expected`` restricted to the names of ``actual``, logs cut to the same number of steps."""
    out = {}
    for name, value in actual.items():
        if name in expected:
            exp = np.asarray(expected[name])
            out[name] = exp[:len(value)] if exp.ndim == 1 and np.ndim(value) == 1 else exp
    return out


def _fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.3e}"


def check_cases(fw: Framework, root: Path, cases: list[str], manifest: dict, float32: bool):
    """Run and compare every case; returns (table rows, all ok)."""
    rows, all_ok = [], True
    for case in cases:
        meta = manifest["cases"][case]
        try:
            arrays = load_npz(root / case / "input.npz")
            expected = load_npz(root / case / "expected.npz")
            arrays.pop("model", None)
            actual, exp, tol, tols = run_case(fw, meta, arrays, expected, float32)
        except Skip as exc:
            rows.append((case, "(all)", "-", "-", f"skipped: {exc}"))
            continue
        except Exception as exc:  # a bug or an input the restatement does not handle: a failure
            rows.append((case, "(all)", "-", "-", f"FAIL: {type(exc).__name__}: {exc}"))
            all_ok = False
            continue
        report = compare_arrays(exp, actual, tols, default=tol, names=sorted(actual))
        for r in report.rows:
            status = "ok" if r.ok else "FAIL" + (f" ({r.note})" if r.note else "")
            rows.append((case, r.name, _fmt(r.max_abs_err), _fmt(r.max_rel_err), status))
        for m in report.missing:
            rows.append((case, m.name, "-", "-", f"FAIL: only in {m.side}"))
        all_ok &= bool(report.ok)
    return rows, all_ok


def parse_args(name: str, argv):
    parser = argparse.ArgumentParser(
        prog=f"crosscheck_{name}",
        description=f"Restate the ntpref models in {name} (autograd, float64) and compare with the "
                    "stored reference cases. Exit 0 all pass, 1 a comparison failed, 2 usage error.")
    parser.add_argument("--cases", nargs="+", metavar="CASE", help="only these cases (default: all)")
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT, metavar="DIR",
                        help=f"reference_runs directory (default: {DEFAULT_ROOT})")
    parser.add_argument("--float32", action="store_true",
                        help="compute in float32 and compare with the separate, looser table "
                             f"(rtol {TOL_32['rtol']:g})")
    return parser.parse_args(argv)


def select_cases(root: Path, wanted: list[str] | None):
    """(manifest, case names) from ``root/manifest.json``; UsageError when missing or unknown."""
    path = root / "manifest.json"
    if not path.is_file():
        raise UsageError(f"{path}: no such file (is --root a reference_runs directory?)")
    try:
        manifest = json.loads(path.read_text())
        known = list(manifest["cases"])
    except (ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{path}: not a manifest ({exc})") from None
    if not wanted:
        return manifest, known
    unknown = [c for c in wanted if c not in manifest["cases"]]
    if unknown:
        raise UsageError(f"unknown case(s): {', '.join(unknown)}; known: {', '.join(known)}")
    return manifest, list(dict.fromkeys(wanted))


def main(fw: Framework, argv=None) -> int:
    """Command-line entry point shared by the framework scripts; returns the exit status."""
    args = parse_args(fw.name, argv)
    try:
        manifest, cases = select_cases(args.root, args.cases)
    except UsageError as exc:
        print(f"crosscheck_{fw.name}: error: {exc}", file=sys.stderr)
        return 2
    tol = TOL_32 if args.float32 else TOL_EVAL64
    start = time.perf_counter()
    rows, ok = check_cases(fw, args.root, cases, manifest, args.float32)
    if args.float32:
        title = (f"{fw.name} {fw.version} FLOAT32 table (separate, looser tolerance: rtol {tol['rtol']:g}, "
                 f"atol {tol['atol_max_scale']:g}*max|ref|; not the float64 contract)")
    else:
        title = (f"{fw.name} {fw.version} float64: eval rtol {TOL_EVAL64['rtol']:g}, trajectories "
                 f"(first {STEPS} steps) rtol {TOL_TRAJ64['rtol']:g}; atol "
                 f"{TOL_EVAL64['atol_max_scale']:g}*max|ref| (output f: max(|f|, |y|))")
    print(title)
    print(tabulate(rows, headers=("case", "array", "max abs err", "max rel err", "ok"),
                   tablefmt="simple", disable_numparse=True))
    n_fail = sum(1 for r in rows if r[4].startswith("FAIL"))
    print(f"{len(cases)} case(s), {len(rows)} row(s), {n_fail} failure(s), "
          f"{time.perf_counter() - start:.1f} s: {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1
