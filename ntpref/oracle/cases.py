"""The cases of ``ntpref conformance`` (docs/conformance.md): stored reference cases and fresh random ones.

A :class:`Case` is one ``ntpref eval`` or ``ntpref train`` input of one model. Its expected outputs
are the stored ``expected.npz`` (stored cases, checked against the manifest's hashes) or the
oracle's outputs computed on the spot (random cases); its tolerances are those of the float64
policy (:func:`ntpref.oracle.tolerance.default_tolerances`) or of the float32 envelope
(:func:`ntpref.oracle.envelope.float32_tolerances`). Everything is computed on first use and kept.

The float64 tolerances of a stored case are those recorded in its manifest (the same policy).
Random cases are small (a few sentences or samples, at most 40 steps) and drawn from
``np.random.default_rng([seed, model index, j])``, so case ``j`` of a model is the same whatever ``n``
and whichever models are selected. Case ``j`` of a model uses the regime ``j mod r`` of
:data:`REGIMES` (r regimes of the model: 5 for twostage, 4 for the others); together they cover the options
and the edge cases:

twostage  eval_general_E      general E [d, K] (d < K or d > K), lengths 1..5, repeated tokens, succ with −1
          eval_saturated      one-hot E, W_ov and W_kq of scale 25: attention and output softmax saturate
          train_naive         Algorithm 1 on a small realizable task, Gaussian E, direction "naive"
          train_late_stage    Algorithm 1 late in stage 2 (docs/twostage.md §4.1): the float64 attention
                              gradient cancels, the naive direction fails and the stable one does not
          train_attention_cancel  stage 2 with attention margins >= 40 on x* (docs/twostage.md §4.1):
                              a_l − φ·a cancels, the float64 gradient loses its direction, the stable one
                              does not
shallow   eval_paired_mask    paired initialisation (f = 0), saturated attention, mask_last_key, tau_att = √d
          eval_T1_erf         T = 1, activation "erf", kappa = 1, independent heads
          train_projgd        ProjGD, rho = (inf, 0, 0.05): c unprojected, U frozen, W's ball active; X_val
          train_projsgd       ProjSGD (batch, seed), rho = (1, 1, 1), X_val
indrnn    eval_paired         paired initialisation (f = 0)
          eval_T1_erf         T = 1, activation "erf", kappa = 1
          train_projgd        ProjGD, rho = (0.05, 0.05, 0.05), X_val
          train_projsgd       ProjSGD (batch, seed), rho = (1, 1, 1), X_val
"""
from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Sequence
from functools import cached_property, partial
from pathlib import Path

import numpy as np

from ..checks import as_scalar
from ..errors import InputError

MODELS = ("twostage", "shallow", "indrnn")
KINDS = ("eval", "train")
PRECISIONS = ("float64", "float32")
#: Random cases per model when not given: enough for every regime of :data:`REGIMES` (set below).
DEFAULT_RANDOM = 5
#: Per-step logs among the train outputs (axis 0 = step).
TRAJECTORIES = ("stage1_loss", "stage1_norm", "stage1_corr", "stage2_loss", "stage2_norm", "stage2_corr",
                "train_loss", "val_loss", "grad_norm_W", "grad_norm_u")


class Case:
    """One conformance case: ``id``, ``model``, ``kind`` ("eval" | "train"), ``source`` ("stored" |
    "random"), ``description``; ``inputs`` (the input dict, with ``model``), ``expected`` (the oracle's
    outputs) and :meth:`tolerances` are computed on first use. ``load()`` returns (inputs, the stored
    expected outputs or None); ``recorded``: the float64 tolerances stored with the case, if any."""

    def __init__(self, id: str, model: str, kind: str, source: str, description: str,
                 load: Callable[[], tuple[dict, dict | None]], recorded: dict[str, dict] | None = None):
        self.id, self.model, self.kind, self.source, self.description = id, model, kind, source, description
        self._load = load
        self._tolerances: dict[str, dict] = {} if recorded is None else {"float64": recorded}

    def __repr__(self) -> str:
        return f"Case({self.id!r})"

    @cached_property
    def _data(self) -> tuple[dict, dict | None]:
        return self._load()

    @property
    def inputs(self) -> dict[str, np.ndarray]:
        """The ``ntpref eval`` / ``ntpref train`` input arrays, including the 0-d string ``model``."""
        return self._data[0]

    @cached_property
    def expected(self) -> dict[str, np.ndarray]:
        """The oracle's outputs: the stored expected.npz, or computed now (random cases)."""
        stored = self._data[1]
        if stored is not None:
            return stored
        from . import contract

        return contract.evaluate(self.inputs) if self.kind == "eval" else contract.train(self.inputs)

    def tolerances(self, precision: str = "float64") -> dict[str, dict]:
        """name → tolerance of every expected array: the float64 policy, or the float32 envelope."""
        if precision not in PRECISIONS:
            raise InputError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if precision not in self._tolerances:
            if precision == "float64":
                from .tolerance import default_tolerances

                tols = default_tolerances(self.model, self.kind, self.inputs, self.expected)
            else:
                from .envelope import float32_tolerances

                tols = float32_tolerances(self.kind, self.inputs, self.expected)
            self._tolerances[precision] = tols
        return self._tolerances[precision]


def check_models(models: Iterable[str] | None) -> tuple[str, ...]:
    """The selected models in the order of :data:`MODELS` (all when None); InputError for an unknown one."""
    if models is None:
        return MODELS
    models = [models] if isinstance(models, str) else list(models)
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        raise InputError(f"unknown model {unknown[0]!r}; models: {', '.join(MODELS)}")
    return tuple(m for m in MODELS if m in models)


# --- stored cases -----------------------------------------------------------------------------------
def stored_cases(models: Iterable[str] | None = None, root: str | os.PathLike | None = None) -> list[Case]:
    """The stored reference cases of kind eval and train of ``models`` (ntk cases take no adapter).

    root: a reference directory (default :func:`ntpref.oracle.reference.default_root`); one without cases
    is an InputError, as for ``ntpref verify``. A file that does not match the manifest is an InputError
    naming the case, the file and the array."""
    from .reference import default_root, load_manifest, require_cases, tolerances_of

    models = check_models(models)
    root = Path(root if root is not None else default_root())
    manifest = load_manifest(root)
    require_cases(root, manifest)
    out = []
    for name, entry in manifest["cases"].items():
        if entry["model"] in models and entry["kind"] in KINDS:
            out.append(Case(name, entry["model"], entry["kind"], "stored", entry.get("description", ""),
                            _stored_loader(root, name, entry), tolerances_of(entry)))
    return out


def _stored_loader(root: Path, name: str, entry: dict) -> Callable[[], tuple[dict, dict]]:
    def load():
        from .reference import check_file

        files = {}
        for filename in ("input.npz", "expected.npz"):
            arrays, problems = check_file(root, name, entry, filename)
            if problems:
                raise InputError(f"reference case {problems[0]} ({root})")
            files[filename] = arrays
        return files["input.npz"], files["expected.npz"]
    return load


# --- random cases -----------------------------------------------------------------------------------
def random_cases(models: Iterable[str] | None = None, n: int = DEFAULT_RANDOM, seed: int = 0) -> list[Case]:
    """``n`` random cases per model from ``seed`` (module docstring); the oracle's outputs are the expected."""
    models = check_models(models)
    n = as_scalar("random", n, kind="int", low=0)
    seed = as_scalar("seed", seed, kind="int", low=0)
    out = []
    for model in models:
        regimes = list(REGIMES[model].items())
        for j in range(n):
            name, make = regimes[j % len(regimes)]
            rng = np.random.default_rng([seed, MODELS.index(model), j])
            kind, inputs, description = make(rng)
            out.append(Case(f"r{seed}_{model}_{j}_{name}", model, kind, "random", description,
                            lambda inputs=inputs, model=model: ({"model": np.array(model), **inputs}, None)))
    return out


def _normal(rng: np.random.Generator, *shape, scale: float = 1.0) -> np.ndarray:
    return scale * rng.standard_normal(shape)


def _tokens(rng: np.random.Generator, lengths: np.ndarray, vocab: Sequence[int]) -> np.ndarray:
    """[N, Lmax] ids drawn from ``vocab`` inside each length, −1 past it."""
    tokens = rng.choice(np.asarray(vocab, dtype=np.int64), size=(len(lengths), int(lengths.max())))
    tokens[np.arange(tokens.shape[1])[None, :] >= lengths[:, None]] = -1
    return tokens


# twostage -------------------------------------------------------------------------------------------
def _twostage_eval_general_E(rng):
    K = int(rng.integers(4, 8))
    d = int(rng.choice([2, 3, K + 2]))
    N, Lmax = int(rng.integers(6, 10)), 5
    lengths = rng.integers(1, Lmax + 1, size=N)
    lengths[:3] = (1, Lmax, Lmax)
    tokens = _tokens(rng, lengths, rng.choice(K, size=3, replace=False))   # three tokens: many repeats
    tokens[2, :] = tokens[2, 0]                                              # one sentence of one token
    succ = rng.integers(-1, K, size=K)
    succ[:2] = int(rng.integers(0, K)), -1                                   # L0 has a term; a token has no successor
    inputs = dict(tokens=tokens, lengths=lengths, targets=rng.integers(0, K, size=N), E=_normal(rng, d, K, scale=d ** -0.5),
                  succ=succ, W_ov=_normal(rng, d, d), W_kq=_normal(rng, d, d))
    return "eval", inputs, f"general E [{d}, {K}], lengths 1..{Lmax}, repeated tokens, succ with -1 entries"


def _twostage_eval_saturated(rng):
    K, N = int(rng.integers(4, 7)), int(rng.integers(6, 10))
    lengths = rng.integers(2, 6, size=N)
    inputs = dict(tokens=_tokens(rng, lengths, range(K)), lengths=lengths, targets=rng.integers(0, K, size=N),
                  K=np.array(K), succ=rng.permutation(K), W_ov=_normal(rng, K, K, scale=25.0),
                  W_kq=_normal(rng, K, K, scale=25.0))
    return "eval", inputs, f"one-hot E (K = {K}), W_ov and W_kq of scale 25: attention and output softmax saturated"


def _realizable(rng, K: int, N: int, min_len: int, max_len: int, **embedding):
    from ..twostage import random_realizable

    task = random_realizable(K=K, N=N, min_len=min_len, max_len=max_len, seed=int(rng.integers(2 ** 31)), **embedding)
    ds = task.dataset
    tokens = np.where(np.arange(ds.Lmax)[None, :] < ds.lengths[:, None], ds.tokens, -1)
    return task, dict(tokens=tokens, lengths=ds.lengths, targets=ds.targets, succ=ds.succ)


def _twostage_train_naive(rng):
    K = int(rng.integers(4, 7))
    d = K + 1
    task, inputs = _realizable(rng, K, int(rng.integers(6, 10)), 1, 4, embedding="gaussian", d=d)
    inputs.update(E=task.dataset.E, W_ov=_normal(rng, d, d, scale=0.1), W_kq=_normal(rng, d, d, scale=0.1),
                  eta0=np.array(0.2 / math.sqrt(d)), eta=np.array(0.05 / math.sqrt(d)),
                  T0=np.array(int(rng.integers(20, 40))), T=np.array(int(rng.integers(20, 40))),
                  direction=np.array("naive"))
    return "train", inputs, (f"Algorithm 1, realizable task K = {K}, Gaussian E [{d}, {K}], lengths 1..4, "
                             "small random initial W_ov, W_kq, direction 'naive'")


def _twostage_train_late_stage(rng):
    K = 5
    task, inputs = _realizable(rng, K, int(rng.integers(6, 10)), 2, 4)
    W_ov = 3000.0 * (np.eye(K)[task.dataset.succ].T - 1.0 / K)          # W_ov[v, x] = 3000 (1[v = n(x)] − 1/K)
    W_kq = 2.0 * task.orders.T.astype(np.float64)                          # s_l = 2·rank of τ_l under the query
    inputs.update(K=np.array(K), W_ov=W_ov, W_kq=W_kq, eta0=np.array(0.2 / math.sqrt(K)),
                  eta=np.array(0.05 / math.sqrt(K)), T0=np.array(3), T=np.array(25))
    return "train", inputs, ("late stage of Algorithm 1 (W_ov = 3000 (n - 1/K), attention leaning on x*): every "
                             "p_v, v != y, underflows, the naive direction is 0 and stops; direction 'stable'")


def _twostage_train_attention_cancel(rng):
    K = 5
    task, inputs = _realizable(rng, K, int(rng.integers(6, 10)), 2, 4)
    W_ov = 5.0 * (np.eye(K)[task.dataset.succ].T - 1.0 / K)             # W_ov[v, x] = 5 (1[v = n(x)] − 1/K)
    W_kq = 40.0 * task.orders.T.astype(np.float64)                         # attention margins ≥ 40 on x*
    inputs.update(K=np.array(K), W_ov=W_ov, W_kq=W_kq, eta0=np.array(0.2 / math.sqrt(K)),
                  eta=np.array(0.05 / math.sqrt(K)), T0=np.array(3), T=np.array(20))
    return "train", inputs, ("stage 2 with W_kq trained to attention margins >= 40 on x* (W_kq = 40 rank): "
                             "a_l - phi.a cancels, the float64 gradient points elsewhere; direction 'stable'")


# shallow and indrnn ---------------------------------------------------------------------------------
def _samples(rng, n: int, T: int, d: int) -> dict:
    return dict(X=_normal(rng, n, T, d, scale=d ** -0.5), y=_normal(rng, n))


def _heads(rng, model: str, m: int, d: int, paired: bool) -> dict:
    from .. import shallow
    from ..shallow import indrnn

    seed = int(rng.integers(2 ** 31))
    if model == "indrnn":
        c, u, W_in = indrnn.paired_init(m, d, seed)
        if not paired:
            c, u, W_in = (p + _normal(rng, *p.shape, scale=0.3) for p in (c, u, W_in))
        return dict(c=c, u=u, W_in=W_in)
    c, U, W = (shallow.paired_init if paired else shallow.iid_init)(m, d, seed)
    return dict(c=c, U=U, W=W)


def _training(rng, n: int, T: int, d: int, eta: float, rho, **more) -> dict:
    val = _samples(rng, int(rng.integers(4, 8)), T, d)
    return dict(eta=np.array(eta), steps=np.array(int(rng.integers(25, 40))), rho=np.array(rho, dtype=np.float64),
                X_val=val["X"], y_val=val["y"], **more)


def _dims(rng, T=None):
    n, d, m = int(rng.integers(6, 10)), int(rng.integers(2, 5)), 2 * int(rng.integers(2, 5))
    return n, (int(rng.integers(2, 6)) if T is None else T), d, m


def _shallow_eval_paired_mask(rng):
    n, T, d, m = _dims(rng)
    T = max(T, 2)
    heads = _heads(rng, "shallow", m, d, paired=True)
    heads["W"] = 30.0 * heads["W"]
    inputs = dict(**_samples(rng, n, T, d), **heads, mask_last_key=np.array(True), tau_att=np.array(math.sqrt(d)))
    return "eval", inputs, f"paired init (f = 0), W of scale 30 (saturated attention), mask_last_key, tau_att = sqrt({d}), m = {m}"


def _eval_T1_erf(rng, model: str):
    n, T, d, m = _dims(rng, T=1)
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, model, m, d, paired=False),
                  activation=np.array("erf"), kappa=np.array(1.0))
    heads = "independent heads" if model == "shallow" else "perturbed paired init"
    return "eval", inputs, f"T = 1, activation erf, kappa = 1, {heads}, m = {m}"


def _shallow_train_projgd(rng):
    n, T, d, m = _dims(rng)
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, "shallow", m, d, paired=True),
                  **_training(rng, n, T, d, 0.5, (math.inf, 0.0, 0.05)))
    return "train", inputs, "ProjGD, rho = (inf, 0, 0.05): c unprojected, U frozen, W's ball active; validation set"


def _train_projsgd(rng, model: str):
    n, T, d, m = _dims(rng)
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, model, m, d, paired=True),
                  **_training(rng, n, T, d, 0.3, (1.0, 1.0, 1.0), batch=np.array(int(rng.integers(2, 5))),
                              seed=np.array(int(rng.integers(1000)))))
    return "train", inputs, "ProjSGD (batch, seed), rho = (1, 1, 1), validation set"


def _indrnn_eval_paired(rng):
    n, T, d, m = _dims(rng)
    return "eval", dict(**_samples(rng, n, T, d), **_heads(rng, "indrnn", m, d, paired=True)), f"paired init (f = 0), T = {T}, m = {m}"


def _indrnn_train_projgd(rng):
    n, T, d, m = _dims(rng)
    inputs = dict(**_samples(rng, n, T, d), **_heads(rng, "indrnn", m, d, paired=True),
                  **_training(rng, n, T, d, 0.3, (0.05, 0.05, 0.05)))
    return "train", inputs, "ProjGD, rho = (0.05, 0.05, 0.05) (projection active), validation set"


#: The random-case generators of each model, {regime name: make(rng)}, in the order case j cycles through them.
REGIMES = {
    "twostage": {"eval_general_E": _twostage_eval_general_E, "eval_saturated": _twostage_eval_saturated,
                 "train_naive": _twostage_train_naive, "train_late_stage": _twostage_train_late_stage,
                 "train_attention_cancel": _twostage_train_attention_cancel},
    "shallow": {"eval_paired_mask": _shallow_eval_paired_mask, "eval_T1_erf": partial(_eval_T1_erf, model="shallow"),
                "train_projgd": _shallow_train_projgd, "train_projsgd": partial(_train_projsgd, model="shallow")},
    "indrnn": {"eval_paired": _indrnn_eval_paired, "eval_T1_erf": partial(_eval_T1_erf, model="indrnn"),
               "train_projgd": _indrnn_train_projgd, "train_projsgd": partial(_train_projsgd, model="indrnn")},
}


def cases(models: Iterable[str] | None = None, random: int = DEFAULT_RANDOM, seed: int = 0, stored: bool = True,
          root: str | os.PathLike | None = None) -> list[Case]:
    """The stored eval/train cases of ``models`` (unless ``stored`` is False), then ``random`` random cases per
    model from ``seed``. Cheap: inputs, expected outputs and tolerances are computed when first used."""
    return (stored_cases(models, root) if stored else []) + random_cases(models, random, seed)
