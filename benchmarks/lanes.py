"""What eight sentences per vector instruction buy the two-stage forward: ``python -m benchmarks.lanes
[--rounds R]`` from the repository root (docs/performance.md, "The two-stage step against one core").

:func:`forward_lanes` restates phases 1–3 of the kernels' pass (ntpref/twostage/kernels.py: the scores and
their arg max, the attention, the logits, the margins, r_max, the sums S and the losses; MODE_FORWARD)
with the sentences in groups of eight, one sentence per lane of an LLVM vector of eight float64 (the
intrinsics below emit the vector operations themselves; Numba's loop vectorizer leaves loops of eight
iterations over arrays that may alias scalar). Every value keeps its operations and their order, so for
finite B_ov, B_kq (what the kernels receive) the results are those of ``kernels.pass_serial`` bit for bit,
which :func:`main` checks before it times the two. The logits stay a loop over the K logits of one sentence
(a vector loop already); eight sentences in lanes would need a gather of eight rows of B_ov per position
and logit. Only the
forward is restated: it measures what the lane layout buys where the serial pass is made of short scalar
loops (the maxima and sums over positions and logits), not a second implementation of the model.

The set is the benchmark's two-stage case (K = 20, N = 200, one-hot E); N must be a multiple of 8.
"""
from __future__ import annotations

import argparse
import math
import sys

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from ntpref import bench
from ntpref.twostage import kernels, prepare

from .limit import best_seconds, measure

LANES = 8
V8 = types.UniTuple(types.float64, LANES)      # a vector of eight lanes, as Numba passes it
_D = ir.DoubleType()
_VEC = ir.VectorType(_D, LANES)
_I32 = ir.IntType(32)


def _vector(builder, lanes):
    """The LLVM vector of an [8 x double] value (the pairs of conversions fold away once inlined)."""
    vec = ir.Constant(_VEC, ir.Undefined)
    for k in range(LANES):
        vec = builder.insert_element(vec, builder.extract_value(lanes, k), _I32(k))
    return vec


def _lanes(builder, vec):
    """The [8 x double] value of an LLVM vector."""
    out = ir.Constant(ir.ArrayType(_D, LANES), ir.Undefined)
    for k in range(LANES):
        out = builder.insert_value(out, builder.extract_element(vec, _I32(k)), k)
    return out


def _pointer(context, builder, array_type, array, offset):
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [offset]), _VEC.as_pointer())


@intrinsic
def vload(typingctx, array, offset):
    """array[offset:offset + 8] of a contiguous 1-D float64 array, as a vector."""
    def codegen(context, builder, signature, args):
        return _lanes(builder, builder.load(_pointer(context, builder, signature.args[0], *args), align=8))
    return V8(array, offset), codegen


@intrinsic
def vstore(typingctx, array, offset, x):
    """array[offset:offset + 8] = x."""
    def codegen(context, builder, signature, args):
        builder.store(_vector(builder, args[2]), _pointer(context, builder, signature.args[0], *args[:2]), align=8)
        return context.get_dummy_value()
    return types.void(array, offset, x), codegen


def _arithmetic(instruction: str):
    @intrinsic
    def op(typingctx, a, b):
        def codegen(context, builder, signature, args):
            return _lanes(builder, getattr(builder, instruction)(_vector(builder, args[0]), _vector(builder, args[1])))
        return V8(a, b), codegen
    op.__doc__ = f"The lanewise IEEE {instruction[1:]} of two vectors."
    return op


vadd, vsub, vdiv = (_arithmetic(name) for name in ("fadd", "fsub", "fdiv"))


@intrinsic
def vsel_gt(typingctx, a, b, x, y):
    """Lanewise ``x if a > b else y`` (an ordered comparison, as Python's)."""
    def codegen(context, builder, signature, args):
        a, b, x, y = (_vector(builder, v) for v in args)
        return _lanes(builder, builder.select(builder.fcmp_ordered(">", a, b), x, y))
    return V8(a, b, x, y), codegen


@intrinsic
def vsplat(typingctx, x):
    """The vector of eight copies of a float64."""
    def codegen(context, builder, signature, args):
        out = ir.Constant(ir.ArrayType(_D, LANES), ir.Undefined)
        for k in range(LANES):
            out = builder.insert_value(out, args[0], k)
        return out
    return V8(x), codegen


@njit(cache=True, error_model="numpy")
def _except_target(y, v, x, other):
    """Lanewise ``other`` where the lane's target y is v (y holds integers as float64), else x."""
    return vsel_gt(y, vsplat(v - 0.5), vsel_gt(vsplat(v + 0.5), y, other, x), x)


@njit(cache=True, error_model="numpy")
def forward_lanes(tokens, lengths, targets, weights, Bov, Bkq):
    """Phases 1–3 of ``kernels.pass_serial`` in MODE_FORWARD with eight sentences per vector (module
    docstring): (loss, losses [N], logits [N, K], attn [N, Lmax]), bitwise those of the kernel. tokens
    [N, Lmax] (N a multiple of 8), lengths, targets, weights [N], Bov, Bkq [K, K]."""
    N, Lmax = tokens.shape
    if N % LANES:
        raise ValueError("forward_lanes: the number of sentences must be a multiple of 8")
    K = Bov.shape[0]
    BovT = Bov.T.copy()
    losses, logits, attn = np.empty(N), np.empty((N, K)), np.empty((N, Lmax))
    flat_logits = logits.reshape(N * K)
    s, valid, u = np.empty(Lmax * LANES), np.empty(Lmax * LANES), np.empty(Lmax * LANES)   # [Lmax, 8]
    p, e_rmax, y_lanes = np.empty(K * LANES), np.empty(LANES), np.empty(LANES)           # p [K, 8]
    zero, half, ninf = vsplat(0.0), vsplat(0.5), vsplat(-np.inf)
    for i0 in range(0, N, LANES):
        for j in range(LANES):                       # the scores s_l = B_kq[τ_l, q]; -inf on padding
            i = i0 + j
            L = lengths[i]
            q = tokens[i, L - 1]
            y_lanes[j] = targets[i]
            for l in range(Lmax):
                s[l * LANES + j] = Bkq[tokens[i, l], q] if l < L else -np.inf
                valid[l * LANES + j] = 1.0 if l < L else 0.0
        s1 = vload(s, 0)                             # the score of the first arg max
        for l in range(1, Lmax):
            sl = vload(s, l * LANES)
            s1 = vsel_gt(sl, s1, sl, s1)
        for l in range(Lmax):                        # u ← s_l - s_1 (padding 0), then u ← e^u
            vstore(u, l * LANES, vsel_gt(vload(valid, l * LANES), half, vsub(vload(s, l * LANES), s1), zero))
        kernels._exp_inplace(u)
        U = zero
        for l in range(Lmax):                        # U = Σ_l u_l in position order (padding adds 0)
            ul = vsel_gt(vload(valid, l * LANES), half, vload(u, l * LANES), zero)
            vstore(u, l * LANES, ul)
            U = vadd(U, ul)
        for l in range(Lmax):                        # φ = u / U (padding 0)
            vstore(u, l * LANES, vsel_gt(vload(valid, l * LANES), half, vdiv(vload(u, l * LANES), U), zero))
        for j in range(LANES):                       # z = Σ_l φ_l B_ov[:, τ_l], one sentence at a time
            i = i0 + j
            for l in range(Lmax):
                attn[i, l] = u[l * LANES + j]
            for v in range(K):
                logits[i, v] = 0.0
            for l in range(lengths[i]):
                t = tokens[i, l]
                f = attn[i, l]
                for v in range(K):
                    logits[i, v] += f * BovT[t, v]
        y = vload(y_lanes, 0)
        o = i0 * K
        zy = (logits[i0, targets[i0]], logits[i0 + 1, targets[i0 + 1]], logits[i0 + 2, targets[i0 + 2]],
              logits[i0 + 3, targets[i0 + 3]], logits[i0 + 4, targets[i0 + 4]], logits[i0 + 5, targets[i0 + 5]],
              logits[i0 + 6, targets[i0 + 6]], logits[i0 + 7, targets[i0 + 7]])
        r_max = ninf                                 # max_{v≠y} r_v, r_v = z_v - z_y
        for v in range(K):
            zv = (flat_logits[o + v], flat_logits[o + K + v], flat_logits[o + 2 * K + v],
                  flat_logits[o + 3 * K + v], flat_logits[o + 4 * K + v], flat_logits[o + 5 * K + v],
                  flat_logits[o + 6 * K + v], flat_logits[o + 7 * K + v])
            r = _except_target(y, v, vsub(zv, zy), ninf)
            vstore(p, v * LANES, r)
            r_max = vsel_gt(r, r_max, r, r_max)
        for v in range(K):                           # p̃ ← r_v - r_max (y: 0), then p̃ ← e^p̃
            vstore(p, v * LANES, _except_target(y, v, vsub(vload(p, v * LANES), r_max), zero))
        vstore(e_rmax, 0, vsel_gt(r_max, zero, vsub(zero, r_max), r_max))      # -|r_max|
        kernels._exp_inplace(p)
        kernels._exp_inplace(e_rmax)
        S = zero                                     # S = Σ_{v≠y} p̃_v in v order
        for v in range(K):
            S = vadd(S, _except_target(y, v, vload(p, v * LANES), zero))
        for j in range(LANES):
            if r_max[j] > 0.0:
                losses[i0 + j] = r_max[j] - -math.log(e_rmax[j] + S[j])      # r_max - m
            else:
                losses[i0 + j] = math.log1p(e_rmax[j] * S[j])
    loss = 0.0
    for i in range(N):
        loss += weights[i] * losses[i]
    return loss, losses, logits, attn


def paper_set():
    """(case, Prepared set, W_ov, W_kq): the benchmark's two-stage case (``ntpref.bench``), its sentence set and
    standard normal W_ov, W_kq [K, K] from seed 0."""
    case = bench.paper_cases(["twostage"])[0]
    prep = prepare(bench.make_inputs(case)["ds"])
    K = prep.E.shape[1]
    W_ov, W_kq = np.random.default_rng(0).standard_normal((2, K, K))
    return case, prep, W_ov, W_kq


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.lanes", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="alternated rounds of timing (default 7)")
    args = parser.parse_args(argv)
    import numba
    numba.set_num_threads(1)
    case, prep, W_ov, W_kq = paper_set()
    data = (prep.tokens, prep.lengths, prep.targets, prep.weights, W_ov, W_kq)
    serial = kernels.pass_serial(*data, kernels.MODE_FORWARD)
    lanes = forward_lanes(*data)
    for name, a, b in zip(("loss", "losses", "logits", "attn"), (serial[0], *serial[2:5]), lanes):
        if np.asarray(a).tobytes() != np.asarray(b).tobytes():
            print(f"{name}: the lanes differ from kernels.pass_serial", file=sys.stderr)
            return 1
    calls = {"kernels.pass_serial (MODE_FORWARD)": lambda: kernels.pass_serial(*data, kernels.MODE_FORWARD),
             "forward_lanes": lambda: forward_lanes(*data)}
    best = dict.fromkeys(calls, math.inf)
    for _ in range(args.rounds):
        for name, call in calls.items():
            best[name] = min(best[name], best_seconds(call, calls=200, rounds=10))
    print(f"{case.label}: loss, losses, logits and attention bit for bit the same")
    for name, seconds in best.items():
        print(f"  {name:36s} {seconds * 1e6:6.1f} us")
    N, Lmax = prep.tokens.shape
    lanes_of_exp = N * (Lmax + prep.E.shape[1] + 1)       # u over the padded row, p̃, e^{-|r_max|}
    rates = measure()
    print(f"  in both: {lanes_of_exp:,} exponential lanes (padding and y included) at the measured "
          f"{rates['exp_seconds'] * 1e9:.2f} ns = {lanes_of_exp * rates['exp_seconds'] * 1e6:.1f} us, "
          f"{N} logarithms at {rates['log_seconds'] * 1e9:.2f} ns = {N * rates['log_seconds'] * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
