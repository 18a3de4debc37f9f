"""Unseen sentences of a training set, split by what its extended order decides (docs/twostage.md §6, §7).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..checks import as_int, as_scalar
from ..errors import InputError
from .dataset import Dataset
from .generators import check_length_range, top_ranked
from .orders import extended_order, optimal_tokens


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
    top = top_ranked(ds.tokens, ds.queries, orders)
    wrong = np.flatnonzero(top != xstar)
    if wrong.size:
        i = int(wrong[0])
        raise InputError(f"array 'orders': disagrees with the training data, {ds.describe(i)} has optimal token "
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
    min_len, max_len = check_length_range(min_len, max_len)
    succ = ds.require_succ("unseen_sentences")
    G = extended_order(ds)
    if orders is not None:
        orders = _check_orders(ds, orders, optimal_tokens(ds))
    queries = np.array(sorted(G), dtype=np.int64)
    taken = {(int(q), tuple(sorted(ds.sentence(i).tolist()))) for i, q in enumerate(ds.queries)}
    possible = len(queries) * sum(math.comb(ds.K + L - 2, L - 1) for L in range(min_len, max_len + 1)) - sum(
        1 for q, tokens in taken if min_len <= len(tokens) <= max_len)       # query fixed, the rest a multiset
    if n > possible:
        raise InputError(f"unseen_sentences: n = {n} but there are at most {possible} distinct unseen "
                         f"sentences ({len(queries)} queries, K = {ds.K}, lengths {min_len}..{max_len}, as multisets); "
                         "lower n or widen min_len..max_len")
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
