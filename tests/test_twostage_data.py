"""Partial orders, realizability and generators of the two-stage paper (docs/twostage.md §1, §7, §8)."""
import re

import numpy as np
import pytest

from ntpref.errors import InfeasibleError, InputError
from ntpref.twostage import (Dataset, check_realizable, extended_order, find_cycle, five_token_example,
                             observed_relations, optimal_tokens, random_realizable, unseen_sentences)

# docs/twostage.md §8, by hand: optimal tokens and the relations they reveal
FIVE_OPTIMAL = [1, 3, 4, 0, 1, 3]
FIVE_R = {0: {(1, 2), (1, 0), (3, 1), (3, 0), (4, 2), (4, 0)},
          2: {(0, 4), (0, 2), (1, 0), (1, 2), (3, 2)}}


def reachable(pairs, K):
    """Independent transitive closure: breadth-first search from every token."""
    succs = {u: [v for a, v in pairs if a == u] for u in range(K)}
    G = np.zeros((K, K), dtype=bool)
    for s in range(K):
        frontier = list(succs[s])
        while frontier:
            v = frontier.pop()
            if not G[s, v]:
                G[s, v] = True
                frontier.extend(succs[v])
    return G


def test_five_token_example_matches_spec():
    ds = five_token_example()
    assert (ds.K, ds.d, ds.N) == (5, 5, 6) and ds.onehot
    assert ds.succ.tolist() == [1, 2, 3, 4, 0]
    assert [ds.sentence(i).tolist() for i in range(6)] == [[1, 2, 0], [3, 1, 0], [4, 2, 0], [0, 4, 2], [1, 0, 2],
                                                          [3, 3, 2]]
    assert ds.targets.tolist() == [2, 4, 0, 1, 2, 4]
    assert optimal_tokens(ds).tolist() == FIVE_OPTIMAL
    assert observed_relations(ds) == FIVE_R
    check_realizable(ds)


def test_extended_order_five_token():
    ds = five_token_example()
    G = extended_order(ds)
    assert sorted(G) == [0, 2]
    for q in (0, 2):
        assert G[q].dtype == bool and G[q].shape == (5, 5)
        np.testing.assert_array_equal(G[q], reachable(FIVE_R[q], 5))
        assert not G[q].diagonal().any() and not (G[q] & G[q].T).any()
    # 3 > 2 for query 0 only through 3 > 1 > 2
    assert G[0][3, 2] and (3, 2) not in FIVE_R[0] and (3, 1) in FIVE_R[0] and (1, 2) in FIVE_R[0]
    # [1, 4, 0]: 1 and 4 are non-comparable
    assert not G[0][1, 4] and not G[0][4, 1]


def test_find_cycle():
    assert find_cycle({(1, 2), (2, 3)}) is None
    assert find_cycle({(1, 2), (2, 3), (3, 1), (0, 1)}) == [1, 2, 3, 1]
    assert find_cycle({(4, 4)}) == [4, 4]
    assert find_cycle(set()) is None


def test_cyclic_dataset_names_cycle_and_query():
    # query 0: 1 > 2 (sentence 0), 2 > 3 (sentence 1), 3 > 1 (sentence 2); query 4 is fine
    succ = [1, 2, 3, 4, 0]
    ds = Dataset.from_sentences([[1, 2, 0], [2, 3, 0], [3, 1, 0], [1, 0, 4]], [2, 3, 4, 2], K=5, succ=succ)
    assert optimal_tokens(ds).tolist() == [1, 2, 3, 1]
    with pytest.raises(InfeasibleError, match=r"q=0: 1 > 2 > 3 > 1.*sentences 0, 1, 2"):
        check_realizable(ds)
    with pytest.raises(InfeasibleError, match=r"q=0: 1 > 2 > 3 > 1"):
        extended_order(ds)
    assert observed_relations(ds)[0] >= {(1, 2), (2, 3), (3, 1)}      # R_q itself is still reported


def test_sentence_without_unique_optimum():
    succ = [1, 2, 2, 0]                        # tokens 1 and 2 share the successor 2
    ds = Dataset.from_sentences([[0, 3], [1, 2, 3]], [1, 2], K=4, succ=succ)
    with pytest.raises(InfeasibleError, match=r"sentence 1 \[1, 2, 3\] \(target 2\): tokens 1, 2 .*not unique"):
        optimal_tokens(ds)
    with pytest.raises(InfeasibleError, match=r"sentence 1 "):
        check_realizable(ds)
    ds = Dataset.from_sentences([[0, 3], [1, 3]], [1, 1], K=4, succ=succ)
    with pytest.raises(InfeasibleError, match=r"sentence 1 \[1, 3\] \(target 1\): no token has successor 1"):
        check_realizable(ds)


def test_missing_succ_is_input_error():
    ds = Dataset.from_sentences([[0, 1]], [1], K=2)
    for f in (optimal_tokens, observed_relations, check_realizable, extended_order, unseen_sentences):
        with pytest.raises(InputError, match="succ"):
            f(ds)


def test_random_realizable_reproducible_and_realizable():
    a, b = random_realizable(K=12, N=80, seed=7), random_realizable(K=12, N=80, seed=7)
    for x, y in ((a.dataset.tokens, b.dataset.tokens), (a.dataset.targets, b.dataset.targets),
                 (a.dataset.succ, b.dataset.succ), (a.orders, b.orders)):
        np.testing.assert_array_equal(x, y)
    c = random_realizable(K=12, N=80, seed=8)
    assert not np.array_equal(a.dataset.tokens, c.dataset.tokens)
    ds, orders = a.dataset, a.orders
    check_realizable(ds)
    assert sorted(ds.succ.tolist()) == list(range(12))
    assert (np.sort(orders, axis=1) == np.arange(12)).all()
    assert ds.lengths.min() >= 2 and ds.lengths.max() <= 6 and ds.onehot
    for i in range(ds.N):                      # x* = the maximum under the query's hidden order, y = succ[x*]
        s = ds.sentence(i)
        top = s[np.argmax(orders[s[-1], s])]
        assert ds.targets[i] == ds.succ[top] and optimal_tokens(ds)[i] == top


def test_random_realizable_embeddings():
    one = random_realizable(K=6, N=30, seed=3)
    orth = random_realizable(K=6, N=30, seed=3, embedding="orthonormal", d=9)
    gauss = random_realizable(K=6, N=30, seed=3, embedding="gaussian")
    for t in (orth, gauss):                    # same sentences under every embedding
        np.testing.assert_array_equal(t.dataset.tokens, one.dataset.tokens)
        np.testing.assert_array_equal(t.orders, one.orders)
    assert orth.dataset.E.shape == (9, 6)
    np.testing.assert_allclose(orth.dataset.E.T @ orth.dataset.E, np.eye(6), atol=1e-14)
    assert gauss.dataset.E.shape == (6, 6) and not np.allclose(gauss.dataset.E.T @ gauss.dataset.E, np.eye(6))
    np.testing.assert_array_equal(one.dataset.E, np.eye(6))


@pytest.mark.parametrize("kw,message", [
    (dict(embedding="onehot", d=7), "embedding 'onehot' needs d = K = 6, got d = 7"),
    (dict(embedding="orthonormal", d=5), "embedding 'orthonormal' needs d >= K = 6, got d = 5"),
    (dict(embedding="sparse"), "embedding must be one of onehot, orthonormal, gaussian, got 'sparse'"),
    (dict(min_len=4, max_len=3), "array 'max_len': must be >= 4, got 3"),
], ids=["onehot-d", "orthonormal-d", "unknown-embedding", "lengths"])
def test_random_realizable_refuses_bad_arguments(kw, message):
    with pytest.raises(InputError, match="^" + re.escape(message) + "$"):
        random_realizable(K=6, **kw)


def test_unseen_split_five_token_all_length_three():
    ds = five_token_example()
    G = {q: reachable(FIVE_R[q], 5) for q in FIVE_R}
    seen = {(int(s[-1]), tuple(sorted(s.tolist()))) for s in (ds.sentence(i) for i in range(ds.N))}
    # every unseen (query, multiset) of length 3 with query 0 or 2: 2 * C(5 + 1, 2) - 6 = 24
    split = unseen_sentences(ds, n=24, seed=1, min_len=3, max_len=3)
    sents = {}
    for part, determined in ((split.determined, True), (split.noncomparable, False)):
        for i in range(part.N):
            s = part.sentence(i).tolist()
            key = (s[-1], tuple(sorted(s)))
            assert key not in seen and key not in sents and s[-1] in (0, 2)
            sents[key] = (s, determined, int(part.targets[i]))
    assert len(sents) == 24
    for (q, _), (s, determined, y) in sents.items():
        S = sorted(set(s))
        tops = [u for u in S if all(G[q][u, v] for v in S if v != u)]
        assert determined == (len(tops) == 1)
        if determined:
            assert y == (tops[0] + 1) % 5
        else:                                  # documented rule: successor of the leftmost closure-maximal token
            maximal = [u for u in s if not any(G[q][v, u] for v in S)]
            assert y == (maximal[0] + 1) % 5
    assert sents[(0, (0, 2, 3))][1:] == (True, 4)          # [3, 2, 0]: attention -> 3, prediction 4
    assert sents[(0, (0, 1, 4))][1] is False               # [1, 4, 0]: non-comparable


def test_unseen_split_with_hidden_orders():
    task = random_realizable(K=8, N=60, seed=2)
    ds = task.dataset
    split = unseen_sentences(ds, n=150, seed=3, orders=task.orders)
    assert split.determined.N + split.noncomparable.N == 150
    queries = set(ds.queries.tolist())
    for part in (split.determined, split.noncomparable):
        check_realizable(part)                 # targets are successors of a token of each sentence
        for i in range(part.N):                # targets follow the hidden order (the closure agrees with it)
            s = part.sentence(i)
            assert s[-1] in queries
            assert part.targets[i] == ds.succ[s[np.argmax(task.orders[s[-1], s])]]
    again = unseen_sentences(ds, n=150, seed=3, orders=task.orders)
    np.testing.assert_array_equal(again.determined.tokens, split.determined.tokens)


def test_unseen_validation():
    task = random_realizable(K=6, N=40, seed=4)
    bad = task.orders.copy()
    i = next(i for i in range(task.dataset.N) if np.unique(task.dataset.sentence(i)).size > 1)
    q = int(task.dataset.queries[i])
    bad[q] = bad[q].max() - bad[q]             # reverse the hidden order of that sentence's query
    with pytest.raises(InputError, match="'orders': disagrees with the training data, sentence"):
        unseen_sentences(task.dataset, n=5, orders=bad)
    with pytest.raises(InputError, match="permutation"):
        unseen_sentences(task.dataset, n=5, orders=np.zeros((6, 6), dtype=np.int64))
    with pytest.raises(InputError, match="n = 100 but there are at most 10 distinct unseen sentences"):
        unseen_sentences(five_token_example(), n=100, min_len=2, max_len=2)
    with pytest.raises(InputError, match="'n'"):
        unseen_sentences(five_token_example(), n=0)


def test_dataset_and_evaluate_leave_the_callers_arrays_writable():
    import small_inputs
    from ntpref.oracle import contract

    five = five_token_example()
    tokens, targets = five.tokens.copy(), five.targets.copy()
    E = np.eye(5)
    ds = Dataset(tokens, five.lengths.copy(), targets, E, succ=five.succ.copy())
    assert tokens.flags.writeable and targets.flags.writeable and E.flags.writeable
    assert not ds.tokens.flags.writeable                     # the data set's own copy is frozen
    tokens[0, 0] = 4                                         # an edit by the caller leaves the data set alone
    assert ds.tokens[0, 0] == five.tokens[0, 0]
    for make, run in ((small_inputs.twostage_eval, contract.evaluate), (small_inputs.twostage_train, contract.train)):
        arrays = {k: np.array(v) for k, v in make().items()}
        before = {k: v.copy() for k, v in arrays.items()}
        run(arrays)
        assert [k for k, v in arrays.items() if not v.flags.writeable] == []
        assert all(np.array_equal(arrays[k], before[k]) for k in arrays)


def test_unseen_sentences_refuses_an_unreachable_n_at_once():
    """More sentences than distinct unseen ones exist (queries × multisets of the other tokens, less the
    training set's) is an InputError before any draw, not after 1000 + 100 n of them."""
    from ntpref.twostage import unseen_sentences

    ds = five_token_example()
    with pytest.raises(InputError, match=r"n = 1000000000 but there are at most 496 distinct unseen sentences"):
        unseen_sentences(ds, n=10 ** 9)
    with pytest.raises(InputError, match="at most 34 distinct"):
        unseen_sentences(ds, n=35, max_len=3)
    split = unseen_sentences(ds, n=34, max_len=3)                       # exactly the bound: every one found
    assert sum(len(p.lengths) for p in (split.determined, split.noncomparable) if p is not None) == 34
