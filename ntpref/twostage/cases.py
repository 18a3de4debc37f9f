"""The conformance cases of the two-stage model: the random regimes and the stored cases' definitions.

:data:`REGIMES`: name → ``make(rng) -> (kind, inputs, description)``, small inputs (a few sentences, at most
40 steps) that together cover the options and the edge cases:

twostage  eval_general_E      general E [d, K] (d < K or d > K), lengths 1..5, repeated tokens, succ with −1
          eval_saturated      one-hot E, W_ov and W_kq of scale 25: attention and output softmax saturate
          train_naive         Algorithm 1 on a small realizable task, Gaussian E, direction "naive"
          train_late_stage    Algorithm 1 late in stage 2 (docs/twostage.md §4.1): the float64 attention
                              gradient cancels, the naive direction fails and the stable one does not
          train_attention_cancel  stage 2 with attention margins >= 40 on x* (docs/twostage.md §4.1):
                              a_l − φ·a cancels, the float64 gradient loses its direction, the stable one
                              does not
          eval_overflow       one-hot E, W_ov and W_kq = 1000 + N(0, 30²): attention scores and output
                              logits about 1000, beyond exp's overflow (709.78 in float64, 88.72 in float32), margins and
                              score gaps of tens: exp(z)/Σexp(z) and −log of it give NaN, the stabilised
                              softmax and log-sum-exp do not

:data:`STORED`: the stored reference cases (:class:`ntpref.spec.StoredCase`: name, kind, description, the
generating configuration and seed, ``build(config, seed) -> input arrays``), written to ``reference_runs/``
by tests/make_reference_runs.py and checked by ``ntpref verify``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..spec import Bench, StoredCase
from ..spec import normal as _normal
from .dataset import Dataset
from .contract import NAME
from .generators import five_token_example, random_realizable
from .model import loss_and_grad, prepare

def _tokens(rng: np.random.Generator, lengths: np.ndarray, vocab: Sequence[int]) -> np.ndarray:
    """[N, Lmax] ids drawn from ``vocab`` inside each length, −1 past it."""
    tokens = rng.choice(np.asarray(vocab, dtype=np.int64), size=(len(lengths), int(lengths.max())))
    tokens[np.arange(tokens.shape[1])[None, :] >= lengths[:, None]] = -1
    return tokens


def _eval_general_E(rng):
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


def _eval_saturated(rng):
    K, N = int(rng.integers(4, 7)), int(rng.integers(6, 10))
    lengths = rng.integers(2, 6, size=N)
    inputs = dict(tokens=_tokens(rng, lengths, range(K)), lengths=lengths, targets=rng.integers(0, K, size=N),
                  K=np.array(K), succ=rng.permutation(K), W_ov=_normal(rng, K, K, scale=25.0),
                  W_kq=_normal(rng, K, K, scale=25.0))
    return "eval", inputs, f"one-hot E (K = {K}), W_ov and W_kq of scale 25: attention and output softmax saturated"


def _realizable(rng, K: int, N: int, min_len: int, max_len: int, **embedding):
    task = random_realizable(K=K, N=N, min_len=min_len, max_len=max_len, seed=int(rng.integers(2 ** 31)), **embedding)
    ds = task.dataset
    tokens = np.where(np.arange(ds.Lmax)[None, :] < ds.lengths[:, None], ds.tokens, -1)
    return task, dict(tokens=tokens, lengths=ds.lengths, targets=ds.targets, succ=ds.succ)


def _train_naive(rng):
    K = int(rng.integers(4, 7))
    d = K + 1
    task, inputs = _realizable(rng, K, int(rng.integers(6, 10)), 1, 4, embedding="gaussian", d=d)
    inputs.update(E=task.dataset.E, W_ov=_normal(rng, d, d, scale=0.1), W_kq=_normal(rng, d, d, scale=0.1),
                  eta0=np.array(0.2 / math.sqrt(d)), eta=np.array(0.05 / math.sqrt(d)),
                  T0=np.array(int(rng.integers(20, 40))), T=np.array(int(rng.integers(20, 40))),
                  direction=np.array("naive"))
    return "train", inputs, (f"Algorithm 1, realizable task K = {K}, Gaussian E [{d}, {K}], lengths 1..4, "
                             "small random initial W_ov, W_kq, direction 'naive'")


def _train_late_stage(rng):
    K = 5
    task, inputs = _realizable(rng, K, int(rng.integers(6, 10)), 2, 4)
    W_ov = 3000.0 * (np.eye(K)[task.dataset.succ].T - 1.0 / K)          # W_ov[v, x] = 3000 (1[v = n(x)] − 1/K)
    W_kq = 2.0 * task.orders.T.astype(np.float64)                          # s_l = 2·rank of τ_l under the query
    inputs.update(K=np.array(K), W_ov=W_ov, W_kq=W_kq, eta0=np.array(0.2 / math.sqrt(K)),
                  eta=np.array(0.05 / math.sqrt(K)), T0=np.array(3), T=np.array(25))
    return "train", inputs, ("late stage of Algorithm 1 (W_ov = 3000 (n - 1/K), attention leaning on x*): every "
                             "p_v, v != y, underflows, the naive direction is 0 and stops; direction 'stable'")


def _train_attention_cancel(rng):
    K = 5
    task, inputs = _realizable(rng, K, int(rng.integers(6, 10)), 2, 4)
    W_ov = 5.0 * (np.eye(K)[task.dataset.succ].T - 1.0 / K)             # W_ov[v, x] = 5 (1[v = n(x)] − 1/K)
    W_kq = 40.0 * task.orders.T.astype(np.float64)                         # attention margins ≥ 40 on x*
    inputs.update(K=np.array(K), W_ov=W_ov, W_kq=W_kq, eta0=np.array(0.2 / math.sqrt(K)),
                  eta=np.array(0.05 / math.sqrt(K)), T0=np.array(3), T=np.array(20))
    return "train", inputs, ("stage 2 with W_kq trained to attention margins >= 40 on x* (W_kq = 40 rank): "
                             "a_l - phi.a cancels, the float64 gradient points elsewhere; direction 'stable'")


def overflow_weights(rng, d: int, level: float, scale: float) -> dict:
    """W_ov, W_kq [d, d] = ``level`` + N(0, ``scale``²) entries (W_ov drawn first). With one-hot E every score
    s_l = W_kq[τ_l, q] and every logit z_v = Σ_l φ_l W_ov[v, τ_l] is ``level`` plus a convex combination of
    the noise: beyond exp's overflow for a level of 1000, with margins and gaps of a few ``scale``."""
    return {name: level + _normal(rng, d, d, scale=scale) for name in ("W_ov", "W_kq")}


def _eval_overflow(rng):
    K = int(rng.integers(4, 7))
    task, inputs = _realizable(rng, K, int(rng.integers(6, 10)), 2, 5)
    inputs.update(K=np.array(K), **overflow_weights(rng, K, 1000.0, 30.0))
    return "eval", inputs, (f"one-hot E (K = {K}), W_ov and W_kq = 1000 + N(0, 30^2): attention scores and output "
                            "logits about 1000, beyond exp's overflow in float64 (709.8) and float32 (88.7)")


#: name → make(rng), in the order random case j cycles through them.
REGIMES = {"eval_general_E": _eval_general_E, "eval_saturated": _eval_saturated,
           "train_naive": _train_naive, "train_late_stage": _train_late_stage,
           "train_attention_cancel": _train_attention_cancel, "eval_overflow": _eval_overflow}


# --- stored cases ----------------------------------------------------------------------------------
def _twostage_arrays(ds, onehot: bool) -> dict:
    arrays = {"model": np.array(NAME), "tokens": ds.tokens, "lengths": ds.lengths, "targets": ds.targets}
    arrays.update({"K": np.array(ds.K, dtype=np.int64)} if onehot else {"E": ds.E})
    if ds.succ is not None:
        arrays["succ"] = ds.succ
    return arrays


def _random_weights(rng, d: int, scale: float) -> dict:
    return {"W_ov": rng.normal(0.0, scale, (d, d)), "W_kq": rng.normal(0.0, scale, (d, d))}


def _random_eval(cfg: dict, seed: int) -> dict:
    """random_realizable(K, N, lengths, embedding, d, seed) with W_ov, W_kq ~ N(0, scale²) (rng seed + 1)."""
    ds = random_realizable(K=cfg["K"], N=cfg["N"], min_len=cfg["min_len"], max_len=cfg["max_len"], seed=seed,
                           embedding=cfg["embedding"], d=cfg.get("d")).dataset
    return {**_twostage_arrays(ds, cfg["embedding"] == "onehot"),
            **_random_weights(np.random.default_rng(seed + 1), ds.d, cfg["scale"])}


def _sentences_eval(cfg: dict, seed: int) -> dict:
    """Dataset.from_sentences(cfg sentences, targets, K) with W_ov, W_kq ~ N(0, scale²) (rng seed)."""
    ds = Dataset.from_sentences(cfg["sentences"], cfg["targets"], K=cfg["K"])
    return {**_twostage_arrays(ds, True), **_random_weights(np.random.default_rng(seed), ds.d, cfg["scale"])}


def _overflow_eval(cfg: dict, seed: int) -> dict:
    """random_realizable(K, N, lengths, onehot, seed) with W_ov, W_kq = level + N(0, scale²) entries
    (:func:`overflow_weights`, rng seed + 1)."""
    ds = random_realizable(K=cfg["K"], N=cfg["N"], min_len=cfg["min_len"], max_len=cfg["max_len"], seed=seed).dataset
    return {**_twostage_arrays(ds, True),
            **overflow_weights(np.random.default_rng(seed + 1), ds.d, cfg["level"], cfg["scale"])}


def _schedule(cfg: dict, d: int) -> dict:
    return {"eta0": np.array(cfg["eta0_sqrt_d"] / np.sqrt(d)), "eta": np.array(cfg["eta_sqrt_d"] / np.sqrt(d)),
            "T0": np.array(cfg["T0"], dtype=np.int64), "T": np.array(cfg["T"], dtype=np.int64),
            "W_ov": np.zeros((d, d)), "W_kq": np.zeros((d, d))}


def _five_token_train(cfg: dict, seed: int) -> dict:
    """five_token_example(), zero init, eta0 = eta0_sqrt_d/sqrt(5), eta = eta_sqrt_d/sqrt(5)."""
    ds = five_token_example()
    return {**_twostage_arrays(ds, True), **_schedule(cfg, ds.d)}


def _random_train(cfg: dict, seed: int) -> dict:
    """random_realizable(K, N, lengths, onehot, seed), zero init, the paper's step sizes over sqrt(d)."""
    ds = random_realizable(K=cfg["K"], N=cfg["N"], min_len=cfg["min_len"], max_len=cfg["max_len"], seed=seed).dataset
    return {**_twostage_arrays(ds, True), **_schedule(cfg, ds.d)}


_PAPER = {"eta0_sqrt_d": 0.2, "eta_sqrt_d": 0.05}
#: The stored reference cases, in the order of the manifest.
STORED = (
    StoredCase("twostage_eval_onehot_succ", NAME, "eval",
         "one-hot E (input K), random realizable sentences of lengths 2..6 with collocations succ: loss, "
         "logits, attention, both gradients, collocation loss L0 and its gradient at random W_ov, W_kq",
         {"K": 8, "N": 24, "min_len": 2, "max_len": 6, "embedding": "onehot", "scale": 1.0}, 1,
         _random_eval),
    StoredCase("twostage_eval_gaussian_E", NAME, "eval",
         "general embeddings E [d=5, K=7] with N(0, 1/d) entries (not orthogonal, d < K), with succ: all eval "
         "outputs through the general (non one-hot) path",
         {"K": 7, "N": 20, "min_len": 2, "max_len": 5, "embedding": "gaussian", "d": 5, "scale": 1.0}, 2,
         _random_eval),
    StoredCase("twostage_eval_lengths_repeats", NAME, "eval",
         "sentence lengths 1..6 (length 1 = the query alone) with repeated tokens, including a sentence of "
         "one token repeated; padding (-1) handling and scatter-add of the W_kq gradient over repeats; no succ",
         {"K": 5, "scale": 1.5, "sentences": [[2], [1, 1], [3, 0, 3], [4, 4, 4, 4], [0, 1, 0, 1, 2],
                                               [3, 3, 2, 2, 1, 1], [1, 2, 3, 4, 0, 0]],
          "targets": [3, 2, 4, 0, 3, 2, 1]}, 3, _sentences_eval),
    StoredCase("twostage_train_five_token", NAME, "train",
         "Algorithm 1 on the 5-token example (docs/twostage.md §8): zero init, eta0 = 0.2/sqrt 5, eta = 0.05/sqrt 5, "
         "T0 = 500, T = 2000, stable direction; full stage-1 and stage-2 loss / norm / correlation trajectories, "
         "max-margin solutions, L*; rho(W_kq, W_kq*) at t = 100, 1000 are the values of docs/twostage.md §8, 0.98865, 0.99701",
         {**_PAPER, "T0": 500, "T": 2000}, 0, _five_token_train),
    StoredCase("twostage_train_K20", NAME, "train",
         "the paper's Figure 2 configuration (K = d = 20, N = 200, lengths 2..6, one-hot, eta0 = 0.2/sqrt d, "
         "eta = 0.05/sqrt d, zero init) on a shortened schedule T0 = 200, T = 500",
         {"K": 20, "N": 200, "min_len": 2, "max_len": 6, **_PAPER, "T0": 200, "T": 500}, 0,
         _random_train),
    StoredCase("twostage_eval_overflow", NAME, "eval",
         "one-hot E (K = 6), random realizable sentences of lengths 2..5 with succ, W_ov and W_kq = 1000 + "
         "N(0, 30^2): every attention score and output logit (also of L0) beyond exp's overflow in float64 "
         "(709.8) and float32 (88.7), with margins and score gaps of tens; a softmax without its largest score "
         "subtracted and a loss as -log of that quotient give NaN",
         {"K": 6, "N": 12, "min_len": 2, "max_len": 5, "level": 1000.0, "scale": 30.0}, 13, _overflow_eval),
)


# --- benchmark --------------------------------------------------------------------------------------
def _bench_inputs(size: dict, seed: int = 0) -> dict:
    """A random realizable task of ``size`` (K, N, min_len, max_len; one-hot E) with W_ov, W_kq [K, K] N(0, 1)."""
    rng = np.random.default_rng(seed)
    ds = random_realizable(**size, seed=seed).dataset
    return dict(ds=ds, W_ov=rng.standard_normal((ds.d, ds.d)), W_kq=rng.standard_normal((ds.d, ds.d)))


def _bench_step(inputs: dict, backend: str = "numba"):
    prep, W_ov, W_kq = prepare(inputs["ds"]), inputs["W_ov"].copy(), inputs["W_kq"].copy()
    return lambda: loss_and_grad(prep, W_ov, W_kq, backend=backend)


#: The papers' size (Figure 2: K = 20 tokens, N = 200 sentences, lengths 2..6).
BENCH = Bench(dict(K=20, N=200, min_len=2, max_len=6), (), ("K", "N"), _bench_inputs, _bench_step)
