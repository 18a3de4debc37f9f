#!/usr/bin/env python
"""Generate the stored reference cases in ``reference_runs/`` (docs/contract.md, "Stored reference cases").

    python tests/make_reference_runs.py                 # (re)generate every case
    python tests/make_reference_runs.py CASE ...        # only these
    python tests/make_reference_runs.py --check         # rebuild inputs, assert they equal the stored ones
    python tests/make_reference_runs.py --list

Each case of :data:`CASES` names its model, kind (eval / train / ntk), what it exercises, its
generating configuration and seed, and ``build(config, seed) -> input arrays``. The expected
outputs (and intermediates, see ``reference.intermediates``) come from the numba backend; before
anything is written the numpy backend is run on the same input and must agree within every array's
tolerance (so the tolerances are known to hold
across backends; the measured worst error/tolerance ratio is printed). ``ntpref verify`` then
recomputes the stored inputs, ``ntpref regen`` rewrites one case from its stored input.
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ntpref.oracle import reference, tolerance
from ntpref.oracle.compare import compare_arrays, tolerance_text
from ntpref.npzio import load_npz

# --- case definitions ----------------------------------------------------------------------------
@dataclass
class Case:
    """One reference case: ``build(config, seed)`` returns its input arrays (with ``model``)."""

    name: str
    model: str
    kind: str
    description: str
    config: dict
    seed: int
    build: Callable[[dict, int], dict]


def _twostage_arrays(ds, onehot: bool) -> dict:
    arrays = {"model": np.array("twostage"), "tokens": ds.tokens, "lengths": ds.lengths, "targets": ds.targets}
    arrays.update({"K": np.array(ds.K, dtype=np.int64)} if onehot else {"E": ds.E})
    if ds.succ is not None:
        arrays["succ"] = ds.succ
    return arrays


def _random_weights(rng, d: int, scale: float) -> dict:
    return {"W_ov": rng.normal(0.0, scale, (d, d)), "W_kq": rng.normal(0.0, scale, (d, d))}


def build_twostage_random_eval(cfg: dict, seed: int) -> dict:
    """random_realizable(K, N, lengths, embedding, d, seed) with W_ov, W_kq ~ N(0, scale²) (rng seed + 1)."""
    from ntpref.twostage import random_realizable

    ds = random_realizable(K=cfg["K"], N=cfg["N"], min_len=cfg["min_len"], max_len=cfg["max_len"], seed=seed,
                           embedding=cfg["embedding"], d=cfg.get("d")).dataset
    return {**_twostage_arrays(ds, cfg["embedding"] == "onehot"),
            **_random_weights(np.random.default_rng(seed + 1), ds.d, cfg["scale"])}


def build_twostage_sentences_eval(cfg: dict, seed: int) -> dict:
    """Dataset.from_sentences(cfg sentences, targets, K) with W_ov, W_kq ~ N(0, scale²) (rng seed)."""
    from ntpref.twostage import Dataset

    ds = Dataset.from_sentences(cfg["sentences"], cfg["targets"], K=cfg["K"])
    return {**_twostage_arrays(ds, True), **_random_weights(np.random.default_rng(seed), ds.d, cfg["scale"])}


def _schedule(cfg: dict, d: int) -> dict:
    return {"eta0": np.array(cfg["eta0_sqrt_d"] / np.sqrt(d)), "eta": np.array(cfg["eta_sqrt_d"] / np.sqrt(d)),
            "T0": np.array(cfg["T0"], dtype=np.int64), "T": np.array(cfg["T"], dtype=np.int64),
            "W_ov": np.zeros((d, d)), "W_kq": np.zeros((d, d))}


def build_twostage_five_token_train(cfg: dict, seed: int) -> dict:
    """five_token_example(), zero init, eta0 = eta0_sqrt_d/sqrt(5), eta = eta_sqrt_d/sqrt(5)."""
    from ntpref.twostage import five_token_example

    ds = five_token_example()
    return {**_twostage_arrays(ds, True), **_schedule(cfg, ds.d)}


def build_twostage_random_train(cfg: dict, seed: int) -> dict:
    """random_realizable(K, N, lengths, onehot, seed), zero init, the paper's step sizes over sqrt(d)."""
    from ntpref.twostage import random_realizable

    ds = random_realizable(K=cfg["K"], N=cfg["N"], min_len=cfg["min_len"], max_len=cfg["max_len"], seed=seed).dataset
    return {**_twostage_arrays(ds, True), **_schedule(cfg, ds.d)}


def _tokens(rng, n: int, T: int, d: int) -> np.ndarray:
    """Tokens i.i.d. N(0, I_d), each scaled by min(1, 1/||x_t||) (docs/shallow.md §5)."""
    X = rng.standard_normal((n, T, d))
    return X * np.minimum(1.0, 1.0 / np.linalg.norm(X, axis=2, keepdims=True))


def _targets(X: np.ndarray) -> np.ndarray:
    """y = sin(2 x_T[0]) + mean_t x_t[1]: a smooth target that uses the query and the context."""
    return np.sin(2.0 * X[:, -1, 0]) + X[:, :, 1].mean(axis=1)


def _shallow_params(cfg: dict, seed: int, rng) -> dict:
    from ntpref import shallow

    model = shallow.indrnn if cfg.get("rnn") else shallow
    params = model.paired_init(cfg["m"], cfg["d"], seed)._asdict()
    if cfg.get("perturb"):
        params = {k: v + cfg["perturb"] * rng.standard_normal(v.shape) for k, v in params.items()}
    return params


def build_shallow(cfg: dict, seed: int) -> dict:
    """Tokens (:func:`_tokens`, rng seed + 1000), y (:func:`_targets`), paired init (seed) plus
    ``perturb``·N(0, 1) noise (same rng), optional validation set and train/option fields from cfg."""
    rng = np.random.default_rng(seed + 1000)
    X = _tokens(rng, cfg["n"], cfg["T"], cfg["d"])
    arrays = {"model": np.array("indrnn" if cfg.get("rnn") else "shallow"), "X": X, "y": _targets(X),
              **_shallow_params(cfg, seed, rng)}
    if cfg.get("n_val"):
        X_val = _tokens(rng, cfg["n_val"], cfg["T"], cfg["d"])
        arrays.update(X_val=X_val, y_val=_targets(X_val))
    for key in ("kappa", "tau_att", "eta"):
        if key in cfg:
            arrays[key] = np.array(float(cfg[key]))
    if cfg.get("tau_att_sqrt_d"):
        arrays["tau_att"] = np.array(np.sqrt(cfg["d"]))
    for key in ("steps", "batch", "seed"):
        if key in cfg:
            arrays[key] = np.array(cfg[key], dtype=np.int64)
    if "mask_last_key" in cfg:
        arrays["mask_last_key"] = np.array(bool(cfg["mask_last_key"]))
    if "activation" in cfg:
        arrays["activation"] = np.array(cfg["activation"])
    if "rho" in cfg:
        arrays["rho"] = np.array(cfg["rho"], dtype=np.float64)
    return arrays


def build_ntk(cfg: dict, seed: int) -> dict:
    """Like :func:`build_shallow` without y: ``model``, X, c, U, W (kind "ntk")."""
    arrays = build_shallow(cfg, seed)
    return {k: arrays[k] for k in ("model", "X", "c", "U", "W", "tau_att", "mask_last_key", "activation")
            if k in arrays}


PAPER = {"eta0_sqrt_d": 0.2, "eta_sqrt_d": 0.05}
CASES = [
    Case("twostage_eval_onehot_succ", "twostage", "eval",
         "one-hot E (input K), random realizable sentences of lengths 2..6 with collocations succ: loss, "
         "logits, attention, both gradients, collocation loss L0 and its gradient at random W_ov, W_kq",
         {"K": 8, "N": 24, "min_len": 2, "max_len": 6, "embedding": "onehot", "scale": 1.0}, 1,
         build_twostage_random_eval),
    Case("twostage_eval_gaussian_E", "twostage", "eval",
         "general embeddings E [d=5, K=7] with N(0, 1/d) entries (not orthogonal, d < K), with succ: all eval "
         "outputs through the general (non one-hot) path",
         {"K": 7, "N": 20, "min_len": 2, "max_len": 5, "embedding": "gaussian", "d": 5, "scale": 1.0}, 2,
         build_twostage_random_eval),
    Case("twostage_eval_lengths_repeats", "twostage", "eval",
         "sentence lengths 1..6 (length 1 = the query alone) with repeated tokens, including a sentence of "
         "one token repeated; padding (-1) handling and scatter-add of the W_kq gradient over repeats; no succ",
         {"K": 5, "scale": 1.5, "sentences": [[2], [1, 1], [3, 0, 3], [4, 4, 4, 4], [0, 1, 0, 1, 2],
                                               [3, 3, 2, 2, 1, 1], [1, 2, 3, 4, 0, 0]],
          "targets": [3, 2, 4, 0, 3, 2, 1]}, 3, build_twostage_sentences_eval),
    Case("twostage_train_five_token", "twostage", "train",
         "Algorithm 1 on the 5-token example (docs/twostage.md §8): zero init, eta0 = 0.2/sqrt 5, eta = 0.05/sqrt 5, "
         "T0 = 500, T = 2000, stable direction; full stage-1 and stage-2 loss / norm / correlation trajectories, "
         "max-margin solutions, L*; rho(W_kq, W_kq*) at t = 100, 1000 are the values of docs/twostage.md §8, 0.98865, 0.99701",
         {**PAPER, "T0": 500, "T": 2000}, 0, build_twostage_five_token_train),
    Case("twostage_train_K20", "twostage", "train",
         "the paper's Figure 2 configuration (K = d = 20, N = 200, lengths 2..6, one-hot, eta0 = 0.2/sqrt d, "
         "eta = 0.05/sqrt d, zero init) on a shortened schedule T0 = 200, T = 500",
         {"K": 20, "N": 200, "min_len": 2, "max_len": 6, **PAPER, "T0": 200, "T": 500}, 0,
         build_twostage_random_train),
    Case("shallow_eval_paired_init", "shallow", "eval",
         "shallow transformer at the paired initialisation: f = 0 exactly, loss = mean y^2; paired heads have "
         "equal grad_c and opposite grad_U, grad_W",
         {"n": 12, "T": 5, "d": 4, "m": 8}, 4, build_shallow),
    Case("shallow_eval_perturbed", "shallow", "eval",
         "shallow transformer at paired init + 0.3 N(0, 1) noise on c, U, W (f != 0): f, loss and all gradients",
         {"n": 12, "T": 5, "d": 4, "m": 8, "perturb": 0.3}, 5, build_shallow),
    Case("shallow_eval_mask_tau", "shallow", "eval",
         "options: mask_last_key (the query does not attend to itself), tau_att = sqrt(d), activation erf, "
         "kappa = 1, perturbed parameters",
         {"n": 10, "T": 6, "d": 5, "m": 6, "perturb": 0.3, "mask_last_key": True, "tau_att_sqrt_d": True,
          "activation": "erf", "kappa": 1.0}, 6, build_shallow),
    Case("shallow_train_projgd", "shallow", "train",
         "ProjGD (full batch) from paired init with small radii rho = (0.5, 0.5, 0.5) so the projection is "
         "active, with a validation set: final c, U, W, train_loss, val_loss, grad_norm_W per step",
         {"n": 32, "T": 5, "d": 4, "m": 8, "n_val": 16, "eta": 0.5, "steps": 150, "rho": [0.5, 0.5, 0.5]}, 7,
         build_shallow),
    Case("shallow_train_projsgd", "shallow", "train",
         "ProjSGD: minibatches of 8 drawn with replacement (seed 11), rho = (3, 3, 3), validation set",
         {"n": 32, "T": 5, "d": 4, "m": 8, "n_val": 16, "eta": 0.3, "steps": 150, "rho": [3.0, 3.0, 3.0],
          "batch": 8, "seed": 11}, 8, build_shallow),
    Case("indrnn_eval", "indrnn", "eval",
         "IndRNN baseline at paired init + 0.3 N(0, 1) noise: f, loss, grad_c, grad_u, grad_W_in (BPTT)",
         {"n": 12, "T": 6, "d": 4, "m": 8, "perturb": 0.3, "rnn": True}, 9, build_shallow),
    Case("indrnn_train", "indrnn", "train",
         "IndRNN trained by ProjGD from paired init, rho = (1, 1, 1), validation set: final c, u, W_in, "
         "train_loss, val_loss, grad_norm_u per step",
         {"n": 32, "T": 6, "d": 4, "m": 8, "n_val": 16, "eta": 0.3, "steps": 150, "rho": [1.0, 1.0, 1.0],
          "rnn": True}, 10, build_shallow),
    Case("shallow_ntk_gram", "shallow", "ntk",
         "finite-width NTK Gram matrix (kind ntk, not an interchange model): input X [n=10, T=5, d=4], c, U, W "
         "(paired init, m = 16); output gram [10, 10] = ntpref.shallow.ntk.ntk_gram(X, c, U, W)",
         {"n": 10, "T": 5, "d": 4, "m": 16}, 12, build_ntk),
]


def generate(cases: list[Case], root: Path) -> None:
    manifest = reference.load_manifest(root)
    for case in cases:
        start = time.perf_counter()
        inputs = case.build(case.config, case.seed)
        runs = {}
        for backend in ("numba", "numpy"):
            runs[backend] = (reference.compute(case.kind, inputs, backend),
                             reference.intermediates(case.model, case.kind, inputs, backend))
        (expected, extra), (other, other_extra) = runs["numba"], runs["numpy"]
        tols = tolerance.default_tolerances(case.model, case.kind, inputs, {**expected, **extra})
        report = compare_arrays({**expected, **extra}, {**other, **other_extra}, tols, labels=("numba", "numpy"))
        if not report.ok:
            raise SystemExit(f"{case.name}: numba and numpy backends disagree beyond the tolerances:\n{report}")
        entry = reference.case_entry(case.model, case.kind, case.description, case.config, case.seed,
                                     inputs, expected, tols, extra)
        reference.write_case(root, case.name, entry, inputs, expected, manifest, extra)
        size = sum((root / case.name / f).stat().st_size for f in entry["files"])
        worst = max((r.ratio or 0.0) for r in report.rows)
        print(f"{case.name}: {len(expected)} arrays (+{len(extra)} intermediates), {size / 1024:.0f} KiB, "
              f"numba vs numpy worst error/tolerance {worst:.1e}, {time.perf_counter() - start:.1f} s")
    reference.save_manifest(root, manifest)


def check(cases: list[Case], root: Path) -> bool:
    """Rebuild each case's input from its config and seed; True when all equal the stored inputs bitwise."""
    ok = True
    for case in cases:
        stored = load_npz(root / case.name / "input.npz")
        rep = compare_arrays(stored, case.build(case.config, case.seed), labels=("stored", "rebuilt"))
        print(f"{case.name}: {'ok' if rep.ok else 'DIFFERS'}")
        if not rep.ok:
            print(rep)
        ok &= rep.ok
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("cases", nargs="*", metavar="CASE")
    parser.add_argument("--root", type=Path, default=None, help="reference directory (default reference_runs/)")
    parser.add_argument("--check", action="store_true", help="only check that inputs rebuild bitwise")
    parser.add_argument("--list", action="store_true")
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in CASES}
    unknown = [c for c in args.cases if c not in by_name]
    if unknown:
        parser.error(f"unknown case {unknown[0]}; known: {', '.join(by_name)}")
    cases = [by_name[c] for c in args.cases] if args.cases else CASES
    root = args.root or reference.default_root()
    if args.list:
        for c in cases:
            print(f"{c.name} [{c.model} {c.kind}]: {c.description}")
        return 0
    if args.check:
        return 0 if check(cases, root) else 1
    generate(cases, root)
    for c in cases:
        tols = reference.tolerances_of(reference.load_manifest(root)["cases"][c.name])
        print(f"  {c.name}: " + ", ".join(sorted({tolerance_text(t) for t in tols.values()})))
    return 0


if __name__ == "__main__":
    sys.exit(main())
