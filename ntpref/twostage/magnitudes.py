"""The float64 policy's magnitude forms of the two-stage model (docs/tolerance.md), beside the model.

:func:`magnitudes` gives, for an eval input, name → (M, K) of every output: M the evaluation magnitude (the
output computed with the absolute value of every term, shaped like it), K the operation count, so that any
float64 implementation computes the output to within γ_K · M (:func:`twostage_scales`); for the stable NGD
direction the relative accuracy ρ (:func:`stable_accuracy`). :func:`train_tolerances` is the policy of a
training run (Algorithm 1, two stages), and :func:`float32_scales`, :func:`update_directions`,
:func:`roundings_behind` what the float32 envelope needs (``ntpref.oracle.policies.envelope``).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np

from ..checks import as_float, as_scalar
from ..rounding import (QP_REL, SAFETY, TRANSCENDENTAL_ULPS, U, Scales, eval_tolerance, final_tolerance, gamma,
                        max_abs, qp_tolerance, trajectory_tolerance)
from ..tolerance import Tolerance
from ..spec import ABSENT, names_of
from .contract import BLOCKS, INPUTS, TRAJECTORIES, input_dataset
from .model import direction as ngd_direction
from .model import forward, loss_and_grad, prepare, prepare_collocations
from .orders import optimal_token_sentences
from .two_stage import train as two_stage_train

TRAIN_ONLY = names_of(INPUTS, "eval", ABSENT)
#: A naive NGD direction known to less than this relative accuracy ends the steps the policy follows step by
#: step (:class:`_NoiseWalk`): 100x below the 1e-6 relative error the policy must catch.
DIRECTION_ACCURACY = 1e-8

class _Sentences(NamedTuple):
    """Per sentence j and position l of a prepared set (docs/twostage.md §2): the forward values and
    the magnitudes of the evaluation bound (:func:`twostage_scales`)."""

    inside: np.ndarray  # [N, Lmax] bool, positions within the sentence
    tok: np.ndarray     # [N, Lmax] token ids (0 on padding)
    query: np.ndarray   # [N] the query token
    absE: np.ndarray    # |E| [d, K]
    Xabs: np.ndarray    # |x_l| [N, Lmax, d] (0 on padding)
    Ms: np.ndarray      # M(s_l) [N, Lmax]
    phi: np.ndarray     # φ [N, Lmax] (0 on padding)
    Mphi: np.ndarray    # M(φ) [N, Lmax]
    Bt: np.ndarray      # B[k, τ_l] [K, N, Lmax], B = |E|^T |W_ov| |E|
    Mz: np.ndarray      # M(z_k) [N, K]
    fw: object          # the oracle's twostage.Forward (loss, losses, logits, attn)


def _sentences(prep, W_ov: np.ndarray, W_kq: np.ndarray, backend: str = "numba") -> _Sentences:
    """The oracle's forward pass (by ``backend``) on ``prep`` and the magnitudes of s, φ, z (W_ov, W_kq [d, d])."""
    fw = forward(prep, W_ov, W_kq, backend=backend)
    E, tokens = prep.E, prep.tokens
    N, Lmax = tokens.shape
    inside = np.arange(Lmax)[None, :] < prep.lengths[:, None]
    tok = np.where(inside, tokens, 0)
    query = tokens[np.arange(N), prep.lengths - 1]
    absE = np.abs(E)
    B = absE.T @ np.abs(W_ov) @ absE                                        # [K, K]
    S = absE.T @ np.abs(W_kq) @ absE
    Ms = np.where(inside, S[tok, query[:, None]], 0.0)                      # [N, Lmax]
    phi = np.where(inside, fw.attn, 0.0)
    Mphi = phi * (1.0 + 4.0 * Ms.max(axis=1))[:, None]
    Bt = B[:, tok]                                                          # [K, N, Lmax]
    Mz = np.einsum("jl,kjl->jk", Mphi, Bt)
    Xabs = absE.T[tok] * inside[:, :, None]
    return _Sentences(inside, tok, query, absE, Xabs, Ms, phi, Mphi, Bt, Mz, fw)


def twostage_scales(prep, W_ov: np.ndarray, W_kq: np.ndarray | None, backend: str = "numba") -> tuple[Scales, float]:
    """Magnitudes of loss, logits, attn, grad_W_ov, grad_W_kq (docs/twostage.md §2–§3) on a prepared,
    weighted sentence set (:func:`ntpref.twostage.prepare` or ``prepare_collocations``), and the
    largest exponent magnitude max M(z) + max M(s) (a floor of ρ for the naive NGD direction).

    With B = |E|^T |W_ov| |E| and S = |E|^T |W_kq| |E| (token space): M(s_l) = S[τ_l, q], M(φ_l) =
    φ_l (1 + 4 max_l M(s_l)), M(z_k) = Σ_l M(φ_l) B[k, τ_l], M(p_k) = p_k (1 + 4 max_k M(z_k)),
    M(ℓ) = ℓ + 1 + 2 max M(z); g_z = p − e_y with M(g_z,y) = Σ_k M(p_k); a_l = Σ_k (E^T W_ov E)[k, τ_l] g_z,k,
    M(g_s,l) = M(φ_l)(|a_l| + |φ·a|) + φ_l (M(a_l) + M(φ·a)).
    """
    W_kq = np.zeros_like(W_ov) if W_kq is None else W_kq
    st = _sentences(prep, W_ov, W_kq, backend)
    E, w, phi, Mphi, Bt, Xabs = prep.E, prep.weights, st.phi, st.Mphi, st.Bt, st.Xabs
    N, Lmax = prep.tokens.shape
    K, d = E.shape[1], E.shape[0]
    Mzmax = st.Mz.max(axis=1)
    z = st.fw.logits
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    Mp = p * (1.0 + 4.0 * Mzmax)[:, None]
    rows = np.arange(N)
    gz = p.copy()
    gz[rows, prep.targets] -= 1.0
    Mgz = Mp.copy()
    Mgz[rows, prep.targets] = Mp.sum(axis=1)
    Mloss = w @ (np.abs(st.fw.losses) + 1.0 + 2.0 * Mzmax)
    MXphi = np.einsum("jl,jlb->jb", Mphi, Xabs)
    Xphi = np.einsum("jl,jlb->jb", phi, Xabs)
    absE = st.absE
    Mgov = np.einsum("ak,jk,jb,j->ab", absE, Mgz, Xphi, w) + np.einsum("ak,jk,jb,j->ab", absE, np.abs(gz), MXphi, w)
    a = np.einsum("kjl,jk->jl", (E.T @ W_ov @ E)[:, st.tok], gz)
    Ma = np.einsum("kjl,jk->jl", Bt, Mgz)
    ca = np.abs((phi * a).sum(axis=1))
    Mca = (Mphi * np.abs(a) + phi * Ma).sum(axis=1)
    Mgs = np.where(st.inside, Mphi * (np.abs(a) + ca[:, None]) + phi * (Ma + Mca[:, None]), 0.0)
    Mgkq = np.einsum("j,jla,jl,jb->ab", w, Xabs, Mgs, absE.T[st.query])
    count = N + 2 * Lmax + 2 * K + 2 * d * d + 2 * d + 3 * TRANSCENDENTAL_ULPS
    M = {"loss": np.array(Mloss), "logits": st.Mz, "attn": Mphi, "grad_W_ov": Mgov, "grad_W_kq": Mgkq}
    return Scales(M, count), float(Mzmax.max(initial=0.0) + st.Ms.max(initial=0.0))


def _log_sum(log_c: np.ndarray, parts: np.ndarray) -> tuple[float, np.ndarray]:
    """(Λ, Σ_j e^{log_c_j − Λ} parts_j) with Λ = max_j log_c_j: a sum of terms of very different scales
    (parts [N, ...]); Λ = −inf and zeros when every log_c_j is −inf."""
    top = float(np.max(log_c, initial=-np.inf))
    if top == -np.inf:
        return top, np.zeros(parts.shape[1:])
    return top, np.einsum("j,j...->...", np.exp(log_c - top), parts)


def stable_accuracy(prep, W_ov: np.ndarray, W_kq: np.ndarray | None, wrt: str, backend: str = "numba") -> float:
    """ρ = ‖M(G)‖_F / ‖G‖_F for the log-scale ("stable") direction of ∇_{W_wrt} (wrt "ov" | "kq",
    docs/twostage.md §4.1): the computed G/‖G‖ is then accurate to 2 γ_K ρ. M(G) is the magnitude of
    that computation, which scales each sentence j by e^{λ_j} and never forms p_y − 1 or a_l − φ·a:

        g̃ = (p̃_v)_{v≠y}, g̃_y = −S:   M(p̃_v) = p̃_v (1 + 4 M(z)_j), M(g̃_y) = Σ_v M(p̃_v)
        ã_l = Σ_v (EᵀW_ovE)[v, τ_l] g̃_v:   M(ã_l) = Σ_v B[v, τ_l] M(g̃_v)
        ov:  G = Σ_j e^{m_j} w_j E g̃_j (Xφ)_jᵀ,
             M = Σ_j e^{m_j} w_j |E| [M(g̃) |Xφ|ᵀ + |g̃| (M(Xφ) + R_j |Xφ|)ᵀ]
        kq:  G = Σ_j e^{m_j} w_j Σ_{l,k} φ_l φ_k (ã_l − ã_k) x_l x_Lᵀ over pairs of different tokens,
             M = Σ_j e^{m_j} w_j Σ_{l,k} φ_l φ_k [M(ã_l) + M(ã_k) + R_j |ã_l − ã_k|] |x_l| |x_L|ᵀ

    with m_j = max_{v≠y} log p_v and R_j = 2 (1 + |log w_j|) + 4 max M(z)_j + 8 max M(s)_j the
    magnitude of the exponents that form the log-scale weights (e^{λ_j − Λ}, e^{log φ_l + log φ_k − σ}).
    The exact values φ, m come from the oracle's logits and scores; ‖G‖ from its stable direction.
    Returns 1 when G = 0 (no step is taken)."""
    W_kq = np.zeros_like(W_ov) if W_kq is None else W_kq
    direction = ngd_direction(prep, W_ov, W_kq, wrt=wrt, method="stable", backend=backend)
    if direction.log_norm == -np.inf:
        return 1.0
    st = _sentences(prep, W_ov, W_kq, backend)
    E, w = prep.E, prep.weights
    N = w.shape[0]
    rows = np.arange(N)
    y = prep.targets
    z = st.fw.logits
    other = np.arange(z.shape[1])[None, :] != y[:, None]
    r = np.where(other, z - z[rows, y][:, None], -np.inf)                   # margins r_v = z_v − z_y
    rmax = r.max(axis=1)
    pt = np.exp(r - rmax[:, None])                                          # p̃, 0 at v = y
    Mzmax = st.Mz.max(axis=1)
    Mpt = pt * (1.0 + 4.0 * Mzmax)[:, None]
    g = pt.copy()
    g[rows, y] = -pt.sum(axis=1)
    Mg = Mpt.copy()
    Mg[rows, y] = Mpt.sum(axis=1)
    zmax = z.max(axis=1)
    lse = zmax + np.log(np.exp(z - zmax[:, None]).sum(axis=1))
    log_w = np.log(np.where(w > 0, w, 1.0))
    m = np.where(w > 0, rmax + z[rows, y] - lse + log_w, -np.inf)           # log (w_j max_{v≠y} p_v)
    R = 2.0 * (1.0 + np.abs(log_w)) + 4.0 * Mzmax + 8.0 * st.Ms.max(axis=1)
    if wrt == "ov":
        Xphi = np.einsum("jl,jlb->jb", st.phi, st.Xabs)
        MXphi = np.einsum("jl,jlb->jb", st.Mphi, st.Xabs)
        parts = (np.einsum("jk,jb->jkb", Mg, Xphi)
                 + np.einsum("jk,jb->jkb", np.abs(g), MXphi + R[:, None] * Xphi))
        top, Mt = _log_sum(m, parts)
        Mt = st.absE @ Mt
    else:
        s = (E.T @ W_kq @ E)[st.tok, st.query[:, None]]
        s = np.where(st.inside, s, -np.inf)
        smax = s.max(axis=1)
        lphi = s - (smax + np.log(np.exp(s - smax[:, None]).sum(axis=1)))[:, None]
        a = np.einsum("kjl,jk->jl", (E.T @ W_ov @ E)[:, st.tok], g)
        Ma = np.einsum("kjl,jk->jl", st.Bt, Mg)
        pairs = [(st.inside & st.inside[:, k:k + 1] & (st.tok != st.tok[:, k:k + 1]), k) for k in range(s.shape[1])]
        sigma = np.max([np.where(valid, lphi + lphi[:, k:k + 1], -np.inf).max(axis=1) for valid, k in pairs], axis=0)
        shift = np.where(sigma > -np.inf, sigma, 0.0)[:, None]
        inner = np.zeros_like(a)
        for valid, k in pairs:
            weight = np.exp(np.where(valid, lphi + lphi[:, k:k + 1] - shift, -np.inf))
            inner += weight * (Ma + Ma[:, k:k + 1] + R[:, None] * np.abs(a - a[:, k:k + 1]))
        parts = np.einsum("jla,jl,jb->jab", st.Xabs, inner, st.absE.T[st.query])
        top, Mt = _log_sum(m + sigma, parts)
    if top == -np.inf:
        return 1.0
    return float(np.exp(top + np.log(np.linalg.norm(Mt)) - direction.log_norm)) if np.any(Mt) else 1.0


def _twostage_data(inputs: Mapping[str, np.ndarray]):
    """(Dataset, W_ov, W_kq) of a two-stage input (validated by the model's contract)."""
    ds = input_dataset(inputs)
    return ds, as_float("W_ov", inputs["W_ov"], (ds.d, ds.d)), as_float("W_kq", inputs["W_kq"], (ds.d, ds.d))


def magnitudes(inputs: Mapping[str, np.ndarray], kind: str = "eval", backend: str = "numba") -> dict[str, tuple[np.ndarray, int]]:
    """name → (M, K) of every output of an eval input (module docstring); loss0 and grad0_W_ov with succ. The
    oracle's values the magnitudes start from are ``backend``'s."""
    ds, W_ov, W_kq = _twostage_data(inputs)
    sc, _ = twostage_scales(prepare(ds), W_ov, W_kq, backend)
    out = {k: (v, sc.count) for k, v in sc.M.items()}
    if ds.succ is not None:
        sc0, _ = twostage_scales(prepare_collocations(ds.E, ds.succ), W_ov, None, backend)
        out.update(loss0=(sc0.M["loss"], sc0.count), grad0_W_ov=(sc0.M["grad_W_ov"], sc0.count))
    return out


def train_tolerances(inputs: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray], names,
                     response: Callable[[dict], dict], backend: str = "numba") -> dict[str, dict]:
    """The float64 tolerances of the outputs ``names`` of a training run with the oracle's outputs ``out``
    (by ``backend``, which also runs the passes the magnitudes start from).

    Stage 1 trains W_ov for T0 steps, stage 2 W_kq for T steps with W_ov frozen at the stage-1
    result. Two reruns (``response``) measure the responses D1 (W_ov(0) moved) and D2 (W_kq(0) moved). After t
    steps of a stage, q has t injections of its own stage behind it (responses max_{1≤s≤t} D(s)), and
    a stage-2 quantity also the T0 of stage 1 (responses max_{s≤t} D1(s)). The injection of a step of
    size η along G/‖G‖ is U·max|W| + η (U + 2 γ_K ρ), ρ the relative accuracy of the direction at
    both ends of the stage: for direction "stable" :func:`stable_accuracy`; for "naive" (the plain
    float64 gradient) the larger of ‖M(G)‖/‖G‖ at the start and 1 + 2·(max M(z) + max M(s))."""
    ds, W_ov0, W_kq0 = _twostage_data(inputs)
    T0 = as_scalar("T0", inputs["T0"], kind="int")
    naive = "direction" in inputs and as_scalar("direction", inputs["direction"], kind="str") == "naive"
    prep, prep0 = prepare(ds), prepare_collocations(ds.E, ds.succ)
    W_ov = out["W_ov"]
    stages = {"W_ov": (prep0, [(W_ov, None) for W_ov in (W_ov0, W_ov)], "ov", 1),
              "W_kq": (prep, [(W_ov, W) for W in (W_kq0, out["W_kq"])], "kq", 2)}
    walk, path_rel = _noise_walk(ds, inputs, out, prep, backend) if naive else (None, np.zeros(0))
    scales, eps, D, rels = {}, {}, {}, {}
    for block, (pset, ends, wrt, g_index) in stages.items():
        sc = [twostage_scales(pset, *e, backend) for e in ends]
        scales[block] = sc
        if naive:
            G = loss_and_grad(pset, *ends[0], backend=backend)[g_index]
            rel = 1.0 + 2.0 * max(x[1] for x in sc)
            if np.any(G):
                rel = max(rel, float(np.linalg.norm(sc[0][0].M[f"grad_{block}"]) / np.linalg.norm(G)))
        else:
            rel = max(stable_accuracy(pset, *e, wrt, backend) for e in ends)
        largest = max(max_abs(inputs[block]), max_abs(out[block]))
        step = as_scalar(BLOCKS[block], inputs[BLOCKS[block]])
        eps[block] = U * largest + step * (U + 2.0 * gamma(sc[0][0].count) * rel)
        rels[block] = rel
        D[block] = response({block: eps[block]})
    sf, _ = twostage_scales(prepare(optimal_token_sentences(ds)), W_ov, None, backend)
    T = as_scalar("T", inputs["T"], kind="int")
    # stage 2's injections behind t steps, in units of the one the rerun measured: t, or for the naive
    # direction the steps' own accuracies along the path (ρ(s) = ‖M(G)‖/‖G‖ at W_kq(s), at least ρ)
    injected = np.arange(T + 1, dtype=np.float64)
    if path_rel.size:
        count = scales["W_kq"][0][0].count
        largest = max(max_abs(inputs["W_kq"]), max_abs(out["W_kq"]))
        rho = np.maximum(np.concatenate([path_rel, np.zeros(max(T - path_rel.size, 0))])[:T], rels["W_kq"])
        per_step = U * largest + as_scalar("eta", inputs["eta"]) * (U + 2.0 * gamma(count) * rho)
        injected = np.concatenate([[0.0], np.cumsum(per_step / eps["W_kq"])])
    tols = {}
    for name in names:
        q, D1, D2 = out[name], D["W_ov"][name], D["W_kq"][name]
        if name in ("W_ov_star", "W_kq_star"):
            tols[name] = qp_tolerance(q)
        elif name == "W_ov":
            tols[name] = final_tolerance(T0 * max(max_abs(D1), eps["W_ov"]), "stage-1 result")
        elif name == "W_kq":
            propagated = T0 * max_abs(D1) + injected[T] * max(max_abs(D2), eps["W_kq"])
            if walk is None:
                tols[name] = final_tolerance(propagated, "stage-2 result")
            else:
                spread = walk.spread(T0 * max_abs(D1) + injected[walk.t_star] * max(max_abs(D2), eps["W_kq"]), T)
                tols[name] = final_tolerance(propagated + spread / SAFETY, f"stage-2 result; {walk.why}")
        elif name == "loss_floor":
            tol = eval_tolerance(sf.M["loss"], sf.count)
            tols[name] = Tolerance.saturated(atol=tol.atol + SAFETY * T0 * max_abs(D1), reason=tol.reason
                                             + f" + {SAFETY:g}·{T0}·response {max_abs(D1):.3g} of the stage-1 result")
        else:
            stage, key = name.split("_", 1)
            sc = scales["W_ov" if stage == "stage1" else "W_kq"]
            count = sc[0][0].count
            floor = {"loss": gamma(count) * max(float(x[0].M["loss"]) for x in sc), "norm": 0.0,
                     "corr": gamma(count) + 2.0 * ds.d * QP_REL}[key]                 # ρ against a certified W*
            t = np.arange(q.shape[0])
            if stage == "stage1":
                propagated = t * Tolerance.running_max(D1, 1)
            else:
                propagated = T0 * Tolerance.running_max(D1, 0) + injected[:t.size] * Tolerance.running_max(D2, 1)
            tols[name] = trajectory_tolerance(q, floor, count, propagated, name)
            if stage == "stage2" and walk is not None:
                tols[name] = walk.split(tols[name], key, T0 * max_abs(D1) + injected[walk.t_star] * max(
                    max_abs(D2), eps["W_kq"]))
    return tols


class _NoiseWalk(NamedTuple):
    """Stage 2 of a naive-direction run from the first step ``t_star`` at which float64 determines the
    gradient's direction to less than :data:`DIRECTION_ACCURACY`, 2·SAFETY·γ_K ‖M(G)‖ ≥ that ‖G‖ (on a loss
    plateau G shrinks to rounding noise): from there on the policy bounds the run as if two correct
    implementations took unit steps of size η in unrelated directions, so ‖ΔW_kq(t)‖_F ≤ δ + 2η (t − t_star), δ the difference
    allowed at t_star (d × its entrywise bound); the loss differs by at most ``lip`` ‖ΔW_kq‖_F (``lip`` ≥
    ‖∇_{W_kq} L‖_F for every W_kq: 4 max|EᵀW_ovE| max_k ‖E_k‖², W_ov being fixed in stage 2), the norm by
    ‖ΔW_kq‖_F, the correlation by anything (|ρ| ≤ 1). Up to t_star the bounds of a determined run hold
    (a tolerance's ``head``)."""

    t_star: int
    eta: float
    lip: float
    d: int

    @property
    def why(self) -> str:
        return (f"naive direction: from stage-2 step {self.t_star} float64 determines the gradient's direction "
                f"to less than {DIRECTION_ACCURACY:g} (a loss plateau; then rounding noise), so the walk is "
                f"bounded only by its steps of η = {self.eta:.3g}")

    def spread(self, propagated: float, t: int) -> float:
        """The bound δ + 2η (t − t_star) on ‖ΔW_kq(t)‖_F, δ from ``propagated`` (the entrywise bound at t_star)."""
        return SAFETY * self.d * propagated + 2.0 * self.eta * (t - self.t_star)

    def split(self, tol: Tolerance, key: str, propagated: float) -> Tolerance:
        """``tol`` on the entries up to t_star (its ``head``), and after them the walk's bound for the log
        ``key`` ("loss" | "norm" | "corr") of stage 2."""
        at_star = tol.atol + tol.atol_per_step * self.t_star
        delta = self.spread(propagated, self.t_star)
        factor = {"loss": self.lip, "norm": 1.0}.get(key)
        rest = (Tolerance(atol=2.0) if factor is None else
                Tolerance.saturated(rtol=tol.rtol, atol=at_star + factor * delta,
                                    atol_per_step=tol.atol_per_step + factor * 2.0 * self.eta))
        return rest.with_head(self.t_star + 1, tol, f"{tol.reason}; after step {self.t_star}: {self.why}")


def _noise_walk(ds, inputs: Mapping[str, np.ndarray], out: Mapping[str, np.ndarray],
                prep, backend: str = "numba") -> tuple[_NoiseWalk | None, np.ndarray]:
    """(the stage-2 walk of a naive-direction run from its first step of an inaccurate direction, :class:`_NoiseWalk`,
    or None when there is none; ρ(s) = ‖M(G)‖/‖G‖ at W_kq(s) for the steps s before it, the accuracy the
    injection of each step must cover). The oracle's stage-2 iterates come from a run with snapshots."""
    T = as_scalar("T", inputs["T"], kind="int")
    if T == 0:
        return None, np.zeros(0)
    run = two_stage_train(ds, eta0=as_scalar("eta0", inputs["eta0"]), eta=as_scalar("eta", inputs["eta"]),
                          T0=as_scalar("T0", inputs["T0"], kind="int"), T=T, direction="naive",
                          W_ov0=inputs["W_ov"], W_kq0=inputs["W_kq"], snapshots=range(T), backend=backend)
    W_ov, rho = out["W_ov"], []
    for t, W_kq in sorted(run.snapshots.items()):
        G = np.linalg.norm(loss_and_grad(prep, W_ov, W_kq, backend=backend)[2])
        sc, _ = twostage_scales(prep, W_ov, W_kq, backend)
        M = np.linalg.norm(sc.M["grad_W_kq"])
        if 2.0 * SAFETY * gamma(sc.count) * M >= DIRECTION_ACCURACY * G:
            absE = np.abs(ds.E)
            lip = 4.0 * max_abs(ds.E.T @ W_ov @ ds.E) * float(np.max(np.sum(absE * absE, axis=0)))
            return _NoiseWalk(t, as_scalar("eta", inputs["eta"]), lip, ds.d), np.array(rho)
        rho.append(float(M / G))
    return None, np.array(rho)


# --- the float32 envelope -----------------------------------------------------------------------------
def _eval_magnitudes(inputs: Mapping[str, np.ndarray], backend: str = "numba", **changes) -> dict[str, np.ndarray]:
    """M of every eval output of the eval input with the data of the train input ``inputs``, ``changes`` applied."""
    base = {k: v for k, v in inputs.items() if k not in TRAIN_ONLY}
    return {k: M for k, (M, _) in magnitudes({**base, **changes}, backend=backend).items()}


#: M_q of a correlation ρ = ⟨W, W*⟩ / (‖W‖_F ‖W*‖_F): its three sums with every term divided by what ρ
#: divides it by add up to Σ|W ∘ W*| / (‖W‖ ‖W*‖) + ½ + ½ ≤ 2 (Cauchy–Schwarz; the norms enter as square roots).
CORRELATION_TERMS = 2.0


def float32_scales(inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                   backend: str = "numba") -> dict[str, float]:
    """name → M_q of the training outputs evaluated from terms: the losses, the larger at the first and the
    last parameters of their stage (stage 2: W_ov at its stage-1 result), and the correlations with the
    max-margin solutions, :data:`CORRELATION_TERMS` at every step."""
    ends = [_eval_magnitudes(inputs, backend, W_ov=expected["W_ov"], W_kq=W) for W in (inputs["W_kq"], expected["W_kq"])]
    first = _eval_magnitudes(inputs, backend, W_ov=inputs["W_ov"], W_kq=inputs["W_kq"])
    loss = max(float(np.max(M["loss"])) for M in ends)
    return {"stage1_loss": max(float(first["loss0"]), max(float(np.max(M["loss0"])) for M in ends)),
            "stage2_loss": loss, "loss_floor": loss,
            "stage1_corr": CORRELATION_TERMS, "stage2_corr": CORRELATION_TERMS}


def update_directions(inputs: Mapping[str, np.ndarray], expected: Mapping[str, np.ndarray],
                      backend: str = "numba") -> dict[str, float]:
    """block → the magnitude of one update's direction: 1, a unit NGD direction."""
    return dict.fromkeys(BLOCKS, 1.0)


def roundings_behind(name: str, inputs: Mapping[str, np.ndarray], shape: tuple) -> np.ndarray | int:
    """The updates before the train output ``name`` (a per-step log: an array over t): t + 1 at step t of a
    stage's log, plus the T0 + 1 of stage 1 behind stage 2; 1 for the max-margin solutions."""
    if name in ("W_ov_star", "W_kq_star"):
        return 1
    stage1 = int(inputs["T0"]) + 1
    before = stage1 if name.startswith("stage2_") or name == "W_kq" else 0
    if name in TRAJECTORIES:
        return before + np.arange(shape[0]) + 1
    if name in ("W_ov", "loss_floor"):
        return stage1
    return before + int(inputs["T"]) + 1
