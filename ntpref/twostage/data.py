"""Datasets of the two-stage paper (docs/twostage.md §1, §7, §8).

A :class:`Dataset` holds N sentences of token ids (padded with -1 to Lmax), their lengths, next-token
targets, the embedding matrix E [d, K] (columns e_v) and optionally the collocation map ``succ`` (n: V → V,
-1 = none). The query of sentence i is its last token ``tokens[i, lengths[i] - 1]``.

Partial orders (Assumption 1). The optimal token x*(X) of a sentence is the unique token whose successor is
the target, y = n(x*). The observed relations R_q = {(x*(X), τ) : query q, τ in X, τ ≠ x*} must be acyclic
for every query q; their transitive closure is the extended order >_q^ext. Tokens it does not order are
non-comparable.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import as_float, as_int, as_scalar
from ..errors import InfeasibleError, InputError


def collocation_set(succ: np.ndarray, C=None) -> np.ndarray:
    """The collocation set C as int64 token ids: ``C`` validated (distinct ids in 0..K-1, each with a
    successor, not empty), or by default every x with succ[x] >= 0. succ [K] int64, already validated."""
    K = succ.shape[0]
    if C is None:
        C = np.flatnonzero(succ >= 0)
        if C.size == 0:
            raise InputError("array 'succ': no token has a successor, the collocation set C is empty")
        return C
    C = as_int("C", C, (None,), low=0, high=K - 1)
    if C.size == 0:
        raise InputError("array 'C': the collocation set is empty")
    if np.unique(C).size != C.size:
        raise InputError("array 'C': tokens must be distinct")
    bad = C[succ[C] < 0]
    if bad.size:
        raise InputError(f"array 'C': token {int(bad[0])} has no successor (succ[{int(bad[0])}] = -1)")
    return C

@dataclass(frozen=True, eq=False)
class Dataset:
    """Validated, immutable sentence data.

    tokens  [N, Lmax] int64, entries past a sentence's length are -1
    lengths [N] int64 in 1..Lmax
    targets [N] int64 in 0..K-1
    E       [d, K] float64, finite (one-hot default: the identity, d = K)
    succ    [K] int64 in -1..K-1, or None
    """

    tokens: np.ndarray
    lengths: np.ndarray
    targets: np.ndarray
    E: np.ndarray
    succ: np.ndarray | None = None

    def __post_init__(self):
        E = as_float("E", self.E, (None, None))
        d, K = E.shape
        if K < 1 or d < 1:
            raise InputError(f"array 'E': needs at least one row and one column, got shape {list(E.shape)}")
        tokens = as_int("tokens", self.tokens, (None, None), low=-1, high=K - 1)
        N, Lmax = tokens.shape
        if N < 1 or Lmax < 1:
            raise InputError(f"array 'tokens': empty dataset (shape {list(tokens.shape)})")
        lengths = as_int("lengths", self.lengths, (N,), low=1, high=Lmax)
        targets = as_int("targets", self.targets, (N,), low=0, high=K - 1)
        pos = np.arange(Lmax)[None, :]
        inside = pos < lengths[:, None]
        bad = np.argwhere(inside & (tokens < 0))
        if bad.size:
            i, l = bad[0]
            raise InputError(f"array 'tokens': sentence {i} has padding -1 at position {l} inside its length {lengths[i]}")
        bad = np.argwhere(~inside & (tokens != -1))
        if bad.size:
            i, l = bad[0]
            raise InputError(f"array 'tokens': sentence {i} has token {tokens[i, l]} at position {l}, past its length {lengths[i]} (must be -1)")
        succ = None if self.succ is None else as_int("succ", self.succ, (K,), low=-1, high=K - 1)
        for name, value in (("tokens", tokens), ("lengths", lengths), ("targets", targets), ("E", E), ("succ", succ)):
            if value is not None:
                value.setflags(write=False)
            object.__setattr__(self, name, value)

    # ---- sizes -------------------------------------------------------------------------------
    @property
    def N(self) -> int:
        """Number of sentences."""
        return self.tokens.shape[0]

    @property
    def Lmax(self) -> int:
        """Padded sentence length."""
        return self.tokens.shape[1]

    @property
    def d(self) -> int:
        """Embedding dimension."""
        return self.E.shape[0]

    @property
    def K(self) -> int:
        """Vocabulary size |V|."""
        return self.E.shape[1]

    @property
    def onehot(self) -> bool:
        """True when E is the identity (d = K), which enables the one-hot fast paths."""
        return self.d == self.K and bool(np.array_equal(self.E, np.eye(self.K)))

    @property
    def queries(self) -> np.ndarray:
        """[N] int64: the query (last token) of every sentence."""
        return self.tokens[np.arange(self.N), self.lengths - 1]

    def sentence(self, i: int) -> np.ndarray:
        """Token ids of sentence i (length lengths[i])."""
        return self.tokens[i, : self.lengths[i]]

    def subset(self, idx) -> "Dataset":
        """The sentences ``idx`` (indices or mask), with the padding trimmed to their longest."""
        idx = np.arange(self.N)[idx]
        if idx.size == 0:
            raise InputError("subset: no sentences selected")
        lengths = self.lengths[idx]
        return Dataset(self.tokens[idx, : lengths.max()], lengths, self.targets[idx], self.E, self.succ)

    @classmethod
    def from_sentences(cls, sentences: Sequence[Sequence[int]], targets: Sequence[int], *, K: int | None = None,
                       E=None, succ=None) -> "Dataset":
        """Build from a list of token-id lists (last = query). Give K (one-hot E = I_K) or E [d, K]."""
        if (K is None) == (E is None):
            raise InputError("give exactly one of K (one-hot embeddings) or E")
        if E is None:
            E = np.eye(int(K))
        if len(sentences) == 0:
            raise InputError("array 'tokens': empty dataset")
        lengths = np.array([len(s) for s in sentences], dtype=np.int64)
        tokens = np.full((len(sentences), max(int(lengths.max()), 1)), -1, dtype=np.int64)
        for i, s in enumerate(sentences):
            tokens[i, : len(s)] = np.asarray(s, dtype=np.int64)
        return cls(tokens, lengths, np.asarray(targets, dtype=np.int64), E, succ)


# ---- optimal tokens and partial orders (Assumption 1) ------------------------------------------

def _require_succ(ds: Dataset, what: str) -> np.ndarray:
    if ds.succ is None:
        raise InputError(f"{what}: the dataset has no collocation map 'succ' (needed to find optimal tokens)")
    return ds.succ


def _describe(ds: Dataset, i: int) -> str:
    return f"sentence {i} {ds.sentence(i).tolist()} (target {int(ds.targets[i])})"


def optimal_tokens(ds: Dataset) -> np.ndarray:
    """[N] int64: x*(X), the token of each sentence whose successor is the target (y = n(x*)).

    Copies of x* are allowed. InfeasibleError names the first sentence in which no token, or more than one
    distinct token, has the target as successor (successors not distinguishable).
    """
    succ = _require_succ(ds, "optimal_tokens")
    inside = ds.tokens >= 0
    match = inside & (succ[np.where(inside, ds.tokens, 0)] == ds.targets[:, None])
    lo = np.where(match, ds.tokens, ds.K).min(axis=1)
    hi = np.where(match, ds.tokens, -1).max(axis=1)
    missing = np.flatnonzero(lo == ds.K)
    if missing.size:
        i = int(missing[0])
        raise InfeasibleError(f"unrealizable dataset: {_describe(ds, i)}: no token has successor "
                              f"{int(ds.targets[i])}, so the sentence has no optimal token")
    ambiguous = np.flatnonzero(lo != hi)
    if ambiguous.size:
        i = int(ambiguous[0])
        both = sorted({int(t) for t in ds.sentence(i) if succ[t] == ds.targets[i]})
        raise InfeasibleError(f"unrealizable dataset: {_describe(ds, i)}: tokens {', '.join(map(str, both))} all have "
                              f"successor {int(ds.targets[i])}, so the optimal token is not unique")
    return lo.astype(np.int64)


def _relation_sources(ds: Dataset) -> dict[int, dict[tuple[int, int], int]]:
    """R_q for every query q of ds, each pair mapped to the first sentence that reveals it."""
    xstar = optimal_tokens(ds)
    queries = ds.queries
    R: dict[int, dict[tuple[int, int], int]] = {}
    for i in range(ds.N):
        pairs = R.setdefault(int(queries[i]), {})
        u = int(xstar[i])
        for v in np.unique(ds.sentence(i)).tolist():
            if v != u:
                pairs.setdefault((u, v), i)
    return R


def observed_relations(ds: Dataset) -> dict[int, set[tuple[int, int]]]:
    """R_q = {(x*(X), τ) : sentence X with query q, τ in X, τ ≠ x*} for every query q in ds.

    Keys are the queries that occur (a query whose sentences hold a single distinct token gets an empty set).
    """
    return {q: set(pairs) for q, pairs in sorted(_relation_sources(ds).items())}


def find_cycle(relations) -> list[int] | None:
    """A directed cycle [a, b, ..., a] of the relation (pairs (u, v) meaning u > v), or None if acyclic.

    Depth-first search over the tokens in increasing order, so the cycle reported is deterministic.
    """
    succs: dict[int, list[int]] = {}
    for u, v in relations:
        succs.setdefault(int(u), []).append(int(v))
    for vs in succs.values():
        vs.sort()
    state: dict[int, int] = {}          # 1 = on the current path, 2 = finished
    for root in sorted(succs):
        if root in state:
            continue
        path, stack = [root], [iter(succs.get(root, ()))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(succs.get(nxt, ())))
    return None


def _acyclic_relations(ds: Dataset) -> dict[int, dict[tuple[int, int], int]]:
    """_relation_sources after checking every R_q for a cycle (InfeasibleError naming it and its query)."""
    R = _relation_sources(ds)
    for q in sorted(R):
        cycle = find_cycle(R[q])
        if cycle is not None:
            chain = " > ".join(map(str, cycle))
            sources = sorted({R[q][(a, b)] for a, b in zip(cycle[:-1], cycle[1:])})
            raise InfeasibleError(f"unrealizable dataset: the observed relations are cyclic, q={q}: {chain} "
                                  f"(revealed by sentences {', '.join(map(str, sources))})")
    return R


def check_realizable(ds: Dataset) -> None:
    """Assumption 1: a unique optimal token per sentence with y = n(x*), distinguishable successors and
    acyclic R_q for every query. Raises InfeasibleError naming the sentence, or the cycle as
    "q=Q: a > b > ... > a"; InputError when ds.succ is None."""
    _acyclic_relations(ds)


def extended_order(ds: Dataset) -> dict[int, np.ndarray]:
    """>_q^ext for every query q of ds: G [K, K] bool with G[u, v] = u >_q^ext v, the transitive closure of R_q.

    The dataset must be realizable (check_realizable), so every G is a strict partial order.
    """
    out = {}
    for q, pairs in sorted(_acyclic_relations(ds).items()):
        G = np.zeros((ds.K, ds.K), dtype=bool)
        if pairs:
            u, v = np.array(list(pairs), dtype=np.int64).T
            G[u, v] = True
        for k in range(ds.K):                      # Warshall: add u > k > v
            G |= G[:, k, None] & G[None, k, :]
        G.setflags(write=False)
        out[q] = G
    return out


# ---- generators -------------------------------------------------------------------------------

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
        Q, R = np.linalg.qr(rng.standard_normal((d, K)))
        return Q * np.where(np.diag(R) < 0, -1.0, 1.0)     # the Haar-distributed orthonormal frame
    return rng.normal(0.0, 1.0 / np.sqrt(d), size=(d, K))


def _check_lengths(min_len, max_len) -> tuple[int, int]:
    min_len = as_scalar("min_len", min_len, "int", low=1)
    max_len = as_scalar("max_len", max_len, "int", low=min_len)
    return min_len, max_len


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
    min_len, max_len = _check_lengths(min_len, max_len)
    seed = as_scalar("seed", seed, "int", low=0)
    rng = np.random.default_rng(seed)
    succ = rng.permutation(K).astype(np.int64)
    orders = np.stack([rng.permutation(K) for _ in range(K)]).astype(np.int64)
    lengths = rng.integers(min_len, max_len + 1, size=N, dtype=np.int64)
    Lmax = int(lengths.max())
    tokens = rng.integers(0, K, size=(N, Lmax), dtype=np.int64)
    tokens[np.arange(Lmax)[None, :] >= lengths[:, None]] = -1
    queries = tokens[np.arange(N), lengths - 1]
    ranks = np.where(tokens >= 0, orders[queries[:, None], np.maximum(tokens, 0)], -1)
    xstar = tokens[np.arange(N), ranks.argmax(axis=1)]
    E = _embedding(rng, K, embedding, d)
    orders.setflags(write=False)
    return RandomTask(Dataset(tokens, lengths, succ[xstar], E, succ), orders)


def five_token_example() -> Dataset:
    """The 5-token example of docs/twostage.md §8: K = 5, E = I, succ x -> x + 1 mod 5, six sentences (last = query).

    [1,2,0]->2  [3,1,0]->4  [4,2,0]->0  [0,4,2]->1  [1,0,2]->2  [3,3,2]->4   (optimal 1, 3, 4, 0, 1, 3)
    """
    sentences = [[1, 2, 0], [3, 1, 0], [4, 2, 0], [0, 4, 2], [1, 0, 2], [3, 3, 2]]
    return Dataset.from_sentences(sentences, [2, 4, 0, 1, 2, 4], K=5, succ=(np.arange(5) + 1) % 5)


# ---- generalization split ---------------------------------------------------------------------

@dataclass(frozen=True, eq=False)
class UnseenSplit:
    """Unseen sentences split by what the extended order says about them (None when a part is empty).

    determined    a unique token of the sentence is >_q^ext every other distinct token; target = its successor
    noncomparable all others (the closure leaves the maximum open; nothing is guaranteed there)
    """

    determined: Dataset | None
    noncomparable: Dataset | None


def _check_orders(ds: Dataset, orders, xstar: np.ndarray) -> np.ndarray:
    orders = as_int("orders", orders, (ds.K, ds.K), low=0, high=ds.K - 1)
    bad = np.flatnonzero((np.sort(orders, axis=1) != np.arange(ds.K)).any(axis=1))
    if bad.size:
        raise InputError(f"array 'orders': row {int(bad[0])} is not a permutation of 0..{ds.K - 1} (rank per token)")
    ranks = np.where(ds.tokens >= 0, orders[ds.queries[:, None], np.maximum(ds.tokens, 0)], -1)
    top = ds.tokens[np.arange(ds.N), ranks.argmax(axis=1)]
    wrong = np.flatnonzero(top != xstar)
    if wrong.size:
        i = int(wrong[0])
        raise InputError(f"array 'orders': disagrees with the training data, {_describe(ds, i)} has optimal token "
                         f"{int(xstar[i])} but orders[{int(ds.queries[i])}] ranks token {int(top[i])} highest")
    return orders


def unseen_sentences(ds: Dataset, n: int = 200, seed: int = 0, orders=None, min_len: int = 2,
                     max_len: int = 6) -> UnseenSplit:
    """n random sentences absent from the training set ds, split into closure-determined and non-comparable.

    Sampling (np.random.default_rng(seed)): length uniform on min_len..max_len, query uniform over the queries
    that occur in ds (nothing is known about the others), the other tokens uniform on V. The model has no
    positional encoding, so a sentence counts as seen when a training sentence has the same query and the
    same multiset of tokens; seen sentences and repeats are redrawn.

    Classification with the extended order G = >_q^ext of ds: the sentence is *determined* when one of its
    distinct tokens x̂ satisfies G[x̂, v] for every other distinct token v (a sentence of one distinct token is
    determined vacuously); its target is succ[x̂]. Otherwise it is *non-comparable*; its target is
    succ[argmax orders[q]] when ``orders`` (the hidden orders, e.g. RandomTask.orders) is given, else the
    successor of the leftmost closure-maximal token (one not below any other token of the sentence): one of
    the tokens the closure cannot rank, chosen deterministically. A sentence whose chosen token has no
    successor (succ = -1) is redrawn. InputError when n distinct unseen sentences cannot be found.
    """
    n = as_scalar("n", n, "int", low=1)
    seed = as_scalar("seed", seed, "int", low=0)
    min_len, max_len = _check_lengths(min_len, max_len)
    succ = _require_succ(ds, "unseen_sentences")
    G = extended_order(ds)
    if orders is not None:
        orders = _check_orders(ds, orders, optimal_tokens(ds))
    queries = np.array(sorted(G), dtype=np.int64)
    taken = {(int(q), tuple(sorted(ds.sentence(i).tolist()))) for i, q in enumerate(ds.queries)}
    rng = np.random.default_rng(seed)
    parts: tuple[list, list] = ([], [])               # (sentences, targets) per part: determined, noncomparable
    found, attempts, max_attempts = 0, 0, 1000 + 100 * n
    while found < n and attempts < max_attempts:
        attempts += 1
        L = int(rng.integers(min_len, max_len + 1))
        q = int(queries[rng.integers(queries.size)])
        s = rng.integers(0, ds.K, size=L - 1).tolist() + [q]
        key = (q, tuple(sorted(s)))
        if key in taken:
            continue
        S = np.unique(s)
        sub = G[q][np.ix_(S, S)]
        top = np.flatnonzero(sub.sum(axis=1) == S.size - 1)
        determined = top.size == 1
        if determined:
            xhat = int(S[top[0]])
        elif orders is not None:
            xhat = int(S[orders[q, S].argmax()])
        else:
            maximal = set(S[~sub.any(axis=0)].tolist())
            xhat = next(t for t in s if t in maximal)
        if succ[xhat] < 0:
            continue
        taken.add(key)
        found += 1
        part = parts[0] if determined else parts[1]
        part.append((s, int(succ[xhat])))
    if found < n:
        raise InputError(f"unseen_sentences: found only {found} of n = {n} distinct unseen sentences in "
                         f"{max_attempts} draws; lower n or widen min_len..max_len")

    def build(part):
        if not part:
            return None
        return Dataset.from_sentences([s for s, _ in part], [y for _, y in part], E=ds.E, succ=succ)

    return UnseenSplit(build(parts[0]), build(parts[1]))
