"""The sentence data of the two-stage paper (docs/twostage.md §1): :class:`Dataset` and the collocation set C.

A :class:`Dataset` holds N sentences of token ids (padded with -1 to Lmax), their lengths, next-token
targets, the embedding matrix E [d, K] (columns e_v) and optionally the collocation map ``succ`` (n: V → V,
-1 = none). The query of sentence i is its last token ``tokens[i, lengths[i] - 1]``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..checks import as_float, as_int, require_sequence
from ..errors import InputError


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
                if np.may_share_memory(value, getattr(self, name)):
                    value = value.copy()    # the caller's array keeps its flags and stays the caller's
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

    def describe(self, i: int) -> str:
        """Sentence i for an error message: "sentence i [τ_1, ..., τ_L] (target y)"."""
        return f"sentence {i} {self.sentence(i).tolist()} (target {int(self.targets[i])})"

    def require_succ(self, what: str) -> np.ndarray:
        """succ [K]; InputError "<what>: the dataset has no collocation map 'succ'" when it is None."""
        if self.succ is None:
            raise InputError(f"{what}: the dataset has no collocation map 'succ'")
        return self.succ

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
        require_sequence("sentences", sentences, "a list of token-id lists")
        if len(sentences) == 0:
            raise InputError("array 'tokens': empty dataset")
        for i, s in enumerate(sentences):
            require_sequence(f"sentences[{i}]", s, "a list of token ids")
        lengths = np.array([len(s) for s in sentences], dtype=np.int64)
        tokens = np.full((len(sentences), max(int(lengths.max()), 1)), -1, dtype=np.int64)
        for i, s in enumerate(sentences):
            if len(s):                          # an empty sentence is the Dataset's to refuse
                tokens[i, : len(s)] = as_int(f"sentences[{i}]", s, (len(s),))
        return cls(tokens, lengths, np.asarray(targets, dtype=np.int64), E, succ)


def check_dataset(ds, name: str = "ds") -> Dataset:
    """``ds`` if it is a :class:`Dataset`, else InputError naming the argument ``name``."""
    if not isinstance(ds, Dataset):
        raise InputError(f"{name}: expected a ntpref.twostage.Dataset, got {type(ds).__name__}")
    return ds
