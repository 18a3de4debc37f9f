"""Optimal tokens and the partial orders of Assumption 1 (docs/twostage.md §1, §5).

The optimal token x*(X) of a sentence is the unique token whose successor is the target, y = n(x*). The
observed relations R_q = {(x*(X), τ) : query q, τ in X, τ ≠ x*} must be acyclic for every query q; their
transitive closure is the extended order >_q^ext. Tokens it does not order are non-comparable.
"""
from __future__ import annotations

import numpy as np

from ..errors import InfeasibleError
from .dataset import Dataset


def optimal_tokens(ds: Dataset) -> np.ndarray:
    """[N] int64: x*(X), the token of each sentence whose successor is the target (y = n(x*)).

    Copies of x* are allowed. InfeasibleError names the first sentence in which no token, or more than one
    distinct token, has the target as successor (successors not distinguishable).
    """
    succ = ds.require_succ("optimal_tokens")
    inside = ds.tokens >= 0
    match = inside & (succ[np.where(inside, ds.tokens, 0)] == ds.targets[:, None])
    lo = np.where(match, ds.tokens, ds.K).min(axis=1)
    hi = np.where(match, ds.tokens, -1).max(axis=1)
    missing = np.flatnonzero(lo == ds.K)
    if missing.size:
        i = int(missing[0])
        raise InfeasibleError(f"unrealizable dataset: {ds.describe(i)}: no token has successor "
                              f"{int(ds.targets[i])}, so the sentence has no optimal token")
    ambiguous = np.flatnonzero(lo != hi)
    if ambiguous.size:
        i = int(ambiguous[0])
        both = sorted({int(t) for t in ds.sentence(i) if succ[t] == ds.targets[i]})
        raise InfeasibleError(f"unrealizable dataset: {ds.describe(i)}: tokens {', '.join(map(str, both))} all have "
                              f"successor {int(ds.targets[i])}, so the optimal token is not unique")
    return lo.astype(np.int64)


def optimal_token_sentences(ds: Dataset, xstar=None) -> Dataset:
    """The sentences of ``ds`` reduced to their optimal token: the one-token sentences ([x*_i], y_i), whose
    attention is fully on x* (the set of the loss floor L*, docs/twostage.md §6). xstar [N]: the optimal tokens
    when already known (default :func:`optimal_tokens`)."""
    xstar = optimal_tokens(ds) if xstar is None else xstar
    return Dataset(xstar[:, None], np.ones(ds.N, dtype=np.int64), ds.targets, ds.E)


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
