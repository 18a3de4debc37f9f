"""Generated data sets of the two-stage paper: random realizable tasks (docs/twostage.md §7) and the
5-token example (docs/twostage.md §8).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..blas import one_blas_thread
from ..checks import as_scalar
from ..errors import InputError
from .dataset import Dataset


EMBEDDINGS = ("onehot", "orthonormal", "gaussian")


@dataclass(frozen=True, eq=False)
class RandomTask:
    """A random realizable dataset and its hidden orders.

    orders [K, K] int64: orders[q] is the hidden total order of query q as a rank per token
    (orders[q, u] > orders[q, v] means u >_q v); each row is a permutation of 0..K-1.
    """

    dataset: Dataset
    orders: np.ndarray


def _embedding(rng: np.random.Generator, K: int, embedding: str, d) -> np.ndarray:
    if embedding not in EMBEDDINGS:
        raise InputError(f"embedding must be one of {', '.join(EMBEDDINGS)}, got {embedding!r}")
    d = K if d is None else as_scalar("d", d, "int", low=1)
    if embedding == "onehot":
        if d != K:
            raise InputError(f"embedding 'onehot' needs d = K = {K}, got d = {d}")
        return np.eye(K)
    if embedding == "orthonormal":
        if d < K:
            raise InputError(f"embedding 'orthonormal' needs d >= K = {K}, got d = {d}")
        with one_blas_thread():                            # the same frame for any thread count
            Q, R = np.linalg.qr(rng.standard_normal((d, K)))
        return Q * np.where(np.diag(R) < 0, -1.0, 1.0)     # the Haar-distributed orthonormal frame
    return rng.normal(0.0, 1.0 / np.sqrt(d), size=(d, K))


def check_length_range(min_len, max_len) -> tuple[int, int]:
    """(min_len, max_len) as ints with 1 <= min_len <= max_len: the range of generated sentence lengths."""
    min_len = as_scalar("min_len", min_len, "int", low=1)
    max_len = as_scalar("max_len", max_len, "int", low=min_len)
    return min_len, max_len


def top_ranked(tokens: np.ndarray, queries: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """[N] int64: the token of each sentence that its query's order ranks highest. tokens [N, Lmax] (-1
    padding), queries [N], orders [K, K] (orders[q, v] = rank of token v for query q)."""
    ranks = np.where(tokens >= 0, orders[queries[:, None], np.maximum(tokens, 0)], -1)
    return tokens[np.arange(tokens.shape[0]), ranks.argmax(axis=1)]


def random_realizable(K: int = 20, N: int = 200, min_len: int = 2, max_len: int = 6, seed: int = 0,
                      embedding: str = "onehot", d: int | None = None) -> RandomTask:
    """A random realizable dataset (docs/twostage.md §7), reproducible from ``seed`` (np.random.default_rng).

    succ is a random permutation of V; every query q gets a hidden random total order (orders[q], a rank per
    token); sentence lengths are uniform on min_len..max_len and tokens uniform on V (the query is the last
    token, so it is uniform too); x* is the maximum of the sentence under its query's order and y = succ[x*].
    Any revealed subset of a total order is acyclic, so the dataset satisfies Assumption 1.

    embedding: "onehot" (E = I_K, d = K), "orthonormal" (a random d x K matrix with orthonormal columns,
    d >= K, default d = K) or "gaussian" (entries N(0, 1/d), default d = K). E is drawn after everything
    else, so one seed gives the same sentences and orders under every embedding.
    """
    K = as_scalar("K", K, "int", low=1)
    N = as_scalar("N", N, "int", low=1)
    min_len, max_len = check_length_range(min_len, max_len)
    seed = as_scalar("seed", seed, "int", low=0)
    rng = np.random.default_rng(seed)
    succ = rng.permutation(K).astype(np.int64)
    orders = np.stack([rng.permutation(K) for _ in range(K)]).astype(np.int64)
    lengths = rng.integers(min_len, max_len + 1, size=N, dtype=np.int64)
    Lmax = int(lengths.max())
    tokens = rng.integers(0, K, size=(N, Lmax), dtype=np.int64)
    tokens[np.arange(Lmax)[None, :] >= lengths[:, None]] = -1
    xstar = top_ranked(tokens, tokens[np.arange(N), lengths - 1], orders)
    E = _embedding(rng, K, embedding, d)
    orders.setflags(write=False)
    return RandomTask(Dataset(tokens, lengths, succ[xstar], E, succ), orders)


def five_token_example() -> Dataset:
    """The 5-token example of docs/twostage.md §8: K = 5, E = I, succ x -> x + 1 mod 5, six sentences (last = query).

    [1,2,0]->2  [3,1,0]->4  [4,2,0]->0  [0,4,2]->1  [1,0,2]->2  [3,3,2]->4   (optimal 1, 3, 4, 0, 1, 3)
    """
    sentences = [[1, 2, 0], [3, 1, 0], [4, 2, 0], [0, 4, 2], [1, 0, 2], [3, 3, 2]]
    return Dataset.from_sentences(sentences, [2, 4, 0, 1, 2, 4], K=5, succ=(np.arange(5) + 1) % 5)
