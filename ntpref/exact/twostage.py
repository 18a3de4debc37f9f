"""Paper 1 (docs/twostage.md) in multiprecision: Eq. 1, the collocation loss L0, their closed-form
gradients, Algorithm 1's normalized GD steps and the max-margin solutions of §5 with the correlations ρ of
the iterates with them, written from the equations as plain Python loops.

Input arrays as in docs/contract.md: tokens [N, Lmax] (−1 past each length), lengths [N], targets [N],
E [d, K] or K (then E = I_K, d = K), optional succ [K] (−1 = no successor), W_ov, W_kq [d, d]. Values are
nested lists of mpf (:mod:`ntpref.exact.arith`); the functions below other than :func:`evaluate` and
:func:`train` expect to run inside ``arith.precision()``.

Per sentence τ_1..τ_L (query q = τ_L, x_l = e_{τ_l}, target y), §2–§3:

    s_l = x_lᵀ W_kq x_L,   φ = softmax(s),   z = Eᵀ W_ov X φ,   ℓ = log(1 + Σ_{v≠y} e^{z_v − z_y})
    g_z = p − e_y  (p = softmax(z), p_y − 1 = −Σ_{v≠y} p_v),   ∂ℓ/∂W_ov = E g_z (Xφ)ᵀ
    a_l = x_lᵀ W_ovᵀ E g_z,   g_s,l = φ_l (a_l − φ·a) = φ_l Σ_k φ_k (a_l − a_k),
    ∂ℓ/∂W_kq = X g_s x_Lᵀ

and L = Σ_i w_i ℓ_i (w_i = 1/N for Eq. 1, 1/|C| for L0). The two rewritten forms (p_y − 1 as a sum,
g_s from the differences a_l − a_k = (x_l − x_k)ᵀ W_ovᵀ E g_z) are the same numbers in exact arithmetic
and keep the relative accuracy of a saturated softmax, whose p_y − 1 and a_l − φ·a cancel.

§5: W_ov* and W_kq* are the least-norm solutions (:mod:`ntpref.exact.maxmargin`) of the constraints
(e_u − e_v)ᵀ W e_q ≥ 1 of :func:`collocation_constraints` ((n(x), v, x), x ∈ C, v ≠ n(x)) and of
:func:`relation_constraints` ((u, v, q), (u, v) ∈ R_q), and ρ(W, W*) = ⟨W, W*⟩ / (‖W‖_F ‖W*‖_F).
"""
from __future__ import annotations

from typing import NamedTuple

import mpmath
import numpy as np

from ..checks import as_scalar
from ..errors import InputError
from .arith import add_outer, combine, fdot, flatten, fsum, matvec, norm, precision, rmatvec, softmax, to_mp, \
    to_numpy, zeros
from .maxmargin import least_norm


class Sentences(NamedTuple):
    """Weighted sentences over one embedding: ``tokens[i]`` the ids τ_1..τ_L of sentence i (query last, no
    padding), ``targets[i]`` its y, ``weights[i]`` its w_i in L = Σ_i w_i ℓ_i, ``columns[v]`` the
    embedding e_v [d] (column v of E [d, K])."""

    tokens: list
    targets: list
    weights: list
    columns: list


class Evaluation(NamedTuple):
    """L, ∇_{W_ov} L [d][d], ∇_{W_kq} L [d][d] (None for one-token sentences without W_kq), the logits z
    [N][K] and the attention φ [N][L_i] of every sentence."""

    loss: mpmath.mpf
    grad_W_ov: list
    grad_W_kq: list | None
    logits: list
    attn: list


def embedding_columns(arrays) -> list:
    """The columns e_v [d] of E [d, K] (input ``E``), or of I_K (input ``K``): K lists of d mpf."""
    if "E" in arrays:
        E = to_mp(arrays["E"])
        return [[row[v] for row in E] for v in range(len(E[0]))]
    K = int(arrays["K"])
    return [[mpmath.mpf(int(i == v)) for i in range(K)] for v in range(K)]


def sentences(arrays) -> Sentences:
    """The N sentences of Eq. 1 (weights 1/N) of an input dict."""
    lengths = np.asarray(arrays["lengths"]).tolist()
    tokens = [row[:L] for row, L in zip(np.asarray(arrays["tokens"]).tolist(), lengths, strict=True)]
    N = len(tokens)
    return Sentences(tokens, np.asarray(arrays["targets"]).tolist(), [mpmath.mpf(1) / N] * N,
                     embedding_columns(arrays))


def collocations(columns: list, succ) -> Sentences:
    """D0 of §2: the one-token sentences ([x], n(x)) for every x of C = {x : succ[x] ≥ 0}, weights 1/|C|
    (the L0 of ``ntpref eval`` and of stage 1 of ``ntpref train``)."""
    C = [x for x, n in enumerate(np.asarray(succ).tolist()) if n >= 0]
    return Sentences([[x] for x in C], [int(succ[x]) for x in C], [mpmath.mpf(1) / len(C)] * len(C), columns)


def optimal_tokens(S: Sentences, succ) -> list[int]:
    """x* of every sentence of S: its token whose successor is the target (§1; copies allowed, the input is
    expected realizable, so the first such token is the one)."""
    succ = np.asarray(succ).tolist()
    out = []
    for i, (tokens, y) in enumerate(zip(S.tokens, S.targets)):
        optimal = [t for t in tokens if succ[t] == y]
        if not optimal:
            raise InputError(f"sentence {i}: no token whose successor is the target {y}")
        out.append(optimal[0])
    return out


def floor_sentences(S: Sentences, succ) -> Sentences:
    """Every sentence of S reduced to [x*] (:func:`optimal_tokens`), same weights: the loss of these is the
    floor L* of §6.2."""
    return S._replace(tokens=[[x] for x in optimal_tokens(S, succ)])


def collocation_constraints(succ) -> list[tuple[int, int, int]]:
    """The constraints (u, v, q) of W_ov* (§5), (e_{n(x)} − e_v)ᵀ W e_x ≥ 1: (n(x), v, x) for every x of
    C = {x : succ[x] ≥ 0} and v ≠ n(x)."""
    succ = np.asarray(succ).tolist()
    return [(n, v, x) for x, n in enumerate(succ) if n >= 0 for v in range(len(succ)) if v != n]


def relation_constraints(S: Sentences, succ) -> list[tuple[int, int, int]]:
    """The constraints (u, v, q) of W_kq* (§5), (e_u − e_v)ᵀ W e_q ≥ 1 for (u, v) in R_q: the observed
    relations R_q = {(x*, τ) : a sentence with query q holds τ ≠ x*} (§1; the query itself is a token of
    its sentence), each pair once, sorted by (q, u, v)."""
    pairs = {(tokens[-1], x, t) for tokens, x in zip(S.tokens, optimal_tokens(S, succ)) for t in tokens if t != x}
    return [(u, v, q) for q, u, v in sorted(pairs)]


def correlation(W: list, W_star: list) -> mpmath.mpf:
    """ρ(W, W*) = ⟨W, W*⟩ / (‖W‖_F ‖W*‖_F) of §5, 0 when either is zero."""
    size = norm(W) * norm(W_star)
    return fdot(flatten(W), flatten(W_star)) / size if size else mpmath.mpf(0)


def loss_and_grad(S: Sentences, W_ov: list, W_kq: list | None) -> Evaluation:
    """L = Σ_i w_i ℓ_i and its gradients by the closed forms of §3 (module docstring); W_kq may be None
    when every sentence has one token (φ = 1: L0 and L* do not depend on W_kq)."""
    d = len(S.columns[0])
    G_ov, G_kq = zeros(d, d), (None if W_kq is None else zeros(d, d))
    losses, logits, attn = [], [], []
    for tokens, y, w in zip(S.tokens, S.targets, S.weights, strict=True):
        X = [S.columns[t] for t in tokens]                                   # x_1..x_L
        x_L = X[-1]
        if W_kq is None:
            if len(X) != 1:
                raise ValueError("W_kq is needed for sentences longer than one token")
            phi = [mpmath.mpf(1)]
        else:
            k = matvec(W_kq, x_L)
            phi = softmax([fdot(x, k) for x in X])                      # φ = softmax(Xᵀ W_kq x_L)
        h = [fdot([x[i] for x in X], phi) for i in range(d)]            # X φ
        o = matvec(W_ov, h)
        z = [fdot(e, o) for e in S.columns]                             # z = Eᵀ W_ov X φ
        e_r = [mpmath.exp(z_v - z[y]) if v != y else mpmath.mpf(0) for v, z_v in enumerate(z)]
        rest = fsum(e_r)                                                # Σ_{v≠y} e^{r_v}
        losses.append(mpmath.log1p(rest))                                      # ℓ = log(1 + Σ_{v≠y} e^{r_v})
        g_z = [e / (1 + rest) for e in e_r]                                    # p_v, v ≠ y
        g_z[y] = -fsum(g_z)                                             # p_y − 1 = −Σ_{v≠y} p_v
        Eg = [fdot([e[i] for e in S.columns], g_z) for i in range(d)]   # E g_z
        add_outer(G_ov, w, Eg, h)                                              # E g_z (Xφ)ᵀ
        if W_kq is not None:
            b = rmatvec(W_ov, Eg)                                              # a_l = x_lᵀ b
            g_s = [phi[l] * fsum(phi[j] * fdot([xl - xj for xl, xj in zip(X[l], X[j])], b)
                                        for j in range(len(X)))
                   for l in range(len(X))]
            add_outer(G_kq, w, [fdot([x[i] for x in X], g_s) for i in range(d)], x_L)   # X g_s x_Lᵀ
        logits.append(z)
        attn.append(phi)
    return Evaluation(fdot(S.weights, losses), G_ov, G_kq, logits, attn)


def ngd_step(W: list, G: list, eta) -> list:
    """One normalized GD update of Algorithm 1 (§4), ``W − η G/‖G‖_F`` [d][d], with G the exact gradient
    of the trained matrix (what direction "stable" computes in float64); ``‖G‖_F = 0`` leaves W as it is
    (the stage stops with reason "zero_gradient")."""
    size = norm(G)
    return W if size == 0 else combine(W, G, -eta / size)


def evaluate(arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """The outputs of ``ntpref eval`` for a two-stage input (docs/contract.md): loss, logits [N, K], attn
    [N, Lmax] (0 past each length), grad_W_ov, grad_W_kq [d, d], and with succ loss0, grad0_W_ov [d, d];
    float64 (``as_float``) or object arrays of mpf."""
    with precision():
        S = sentences(arrays)
        W_ov, W_kq = to_mp(arrays["W_ov"]), to_mp(arrays["W_kq"])
        ev = loss_and_grad(S, W_ov, W_kq)
        Lmax = np.shape(arrays["tokens"])[1]
        attn = [phi + [mpmath.mpf(0)] * (Lmax - len(phi)) for phi in ev.attn]
        out = {"loss": ev.loss, "logits": ev.logits, "attn": attn, "grad_W_ov": ev.grad_W_ov,
               "grad_W_kq": ev.grad_W_kq}
        if "succ" in arrays:
            ev0 = loss_and_grad(collocations(S.columns, arrays["succ"]), W_ov, None)
            out.update(loss0=ev0.loss, grad0_W_ov=ev0.grad_W_ov)
        return {k: to_numpy(v, as_float) for k, v in out.items()}


def train(arrays, as_float: bool = True) -> dict[str, np.ndarray]:
    """Algorithm 1 (§4) for a two-stage train input (docs/contract.md: succ, eta0, eta, T0, T; W_ov, W_kq
    the initial values; the direction is the exact normalized gradient whatever ``direction`` says):

        stage 1, T0 times:  W_ov ← W_ov − η0 G/‖G‖_F,  G = ∇L0(W_ov)    (D0 of :func:`collocations`)
        stage 2, T times:   W_kq ← W_kq − η G/‖G‖_F,   G = ∇_{W_kq} L    (Eq. 1, W_ov frozen)

    Returns W_ov, W_kq (final), the max-margin solutions W_ov_star, W_kq_star [d, d] of §5
    (:func:`ntpref.exact.maxmargin.least_norm` on :func:`collocation_constraints` and
    :func:`relation_constraints`), stage1_loss / stage1_norm / stage1_corr [T0 + 1] (L0, ‖W_ov‖_F, ρ(W_ov, W_ov*)
    after t updates), stage2_loss / stage2_norm / stage2_corr [T + 1] (L, ‖W_kq‖_F, ρ(W_kq, W_kq*)) and
    loss_floor (L* at the final W_ov)."""
    with precision():
        S = sentences(arrays)
        S0 = collocations(S.columns, arrays["succ"])
        W_ov_star = least_norm(S.columns, collocation_constraints(arrays["succ"])).W
        W_kq_star = least_norm(S.columns, relation_constraints(S, arrays["succ"])).W
        W_ov, W_kq = to_mp(arrays["W_ov"]), to_mp(arrays["W_kq"])
        eta0, eta = (mpmath.mpf(as_scalar(k, arrays[k])) for k in ("eta0", "eta"))
        T0, T = (as_scalar(k, arrays[k], kind="int") for k in ("T0", "T"))
        W_ov, stage1 = _stage(W_ov, T0, eta0, lambda W: loss_and_grad(S0, W, None), "grad_W_ov", W_ov_star)
        W_kq, stage2 = _stage(W_kq, T, eta, lambda W: loss_and_grad(S, W_ov, W), "grad_W_kq", W_kq_star)
        floor = loss_and_grad(floor_sentences(S, arrays["succ"]), W_ov, None).loss
        out = {"W_ov": W_ov, "W_kq": W_kq, "W_ov_star": W_ov_star, "W_kq_star": W_kq_star, "loss_floor": floor,
               **{f"stage1_{k}": v for k, v in stage1.items()}, **{f"stage2_{k}": v for k, v in stage2.items()}}
        return {k: to_numpy(v, as_float) for k, v in out.items()}


def _stage(W: list, steps: int, eta, evaluate_at, grad: str, W_star: list) -> tuple[list, dict[str, list]]:
    """One stage of Algorithm 1: ``steps`` updates W ← ngd_step(W, G, η) with G the field ``grad`` of
    ``evaluate_at(W)``; returns the final W and {"loss", "norm", "corr"}: the loss, ‖W‖_F and ρ(W, W*) after
    t = 0..steps updates."""
    log = {"loss": [], "norm": [], "corr": []}
    for t in range(steps + 1):
        ev = evaluate_at(W)
        log["loss"].append(ev.loss)
        log["norm"].append(norm(W))
        log["corr"].append(correlation(W, W_star))
        if t < steps:
            W = ngd_step(W, getattr(ev, grad), eta)
    return W, log


#: kind of case → its outputs (arrays, as_float) → dict.
KINDS = {"eval": evaluate, "train": train}
#: kind of case → the intermediates stored beside its outputs (none for the two-stage model).
INTERMEDIATES: dict = {}
#: The inputs counting a train run's updates: stage 1, stage 2.
STEPS = ("T0", "T")
#: Outputs of the oracle the exact backend does not compute (name → why): none.
NOT_COMPUTED: dict[str, str] = {}
#: Inputs the exact backend does not read (name → what it does instead).
IGNORED = {"direction": "the exact run steps along the exact normalized gradient G/‖G‖_F; the oracle's float64 "
                        "direction ('stable' in log scale, or 'naive') approximates it, and the case's tolerance "
                        "bounds that approximation (docs/tolerance.md, accuracy of the NGD direction)"}
