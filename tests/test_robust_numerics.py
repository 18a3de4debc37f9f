"""Numerical extremes: no NaN or inf for finite input, clean stops, linear memory.

Saturated softmax (very large weights) in both models, tiny gradients late in normalized GD (the stable
direction), exactly zero gradients (a clean stop with a reason), long sequences (T = 1024) and wide models
(m = 4096), with peak Python-side memory growing linearly in T and m.
"""
import tracemalloc

import numpy as np
import pytest

from common_checks import check_backends_agree, indrnn_case, twostage_case
from ntpref.oracle import contract
from ntpref import shallow
from ntpref.shallow import indrnn
from ntpref import twostage as tm
from ntpref.twostage import Dataset, W_kq_star, W_ov_star, five_token_example


def finite(*arrays):
    return all(np.isfinite(np.asarray(a, dtype=float)).all() for a in arrays)


def close(a, b, rtol=1e-12):
    a, b = np.asarray(a, float), np.asarray(b, float)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=rtol * max(np.abs(b).max(initial=0.0), 1e-300))


def logsumexp(z):
    zmax = z.max()
    return zmax + np.log(np.exp(z - zmax).sum())


# ---- saturated softmax -----------------------------------------------------------------------------------

@pytest.mark.parametrize("scale", [1e4, 1e8, 1e15])
def test_twostage_saturated_attention_and_output(scale, rng):
    """Huge W_kq: attention is one-hot on the best-scoring token and the loss is the one-token closed form
    log Σ_v exp(z_v) − z_y with z = E^T W_ov e_τ*; huge W_ov: a saturated output softmax. Finite everywhere."""
    five = five_token_example()
    E = rng.standard_normal((4, 5))
    ds = Dataset(five.tokens, five.lengths, five.targets, E, five.succ)
    W_ov, W_kq = rng.standard_normal((4, 4)), scale * rng.standard_normal((4, 4))
    runs = {b: (tm.forward(ds, W_ov, W_kq, backend=b), tm.loss_and_grad(ds, W_ov, W_kq, backend=b))
            for b in ("numba", "numpy")}
    for fw, (loss, g_ov, g_kq) in runs.values():
        assert finite(fw.loss, fw.logits, fw.attn, loss, g_ov, g_kq)
        for i in range(ds.N):
            toks = ds.sentence(i)
            s = E[:, toks].T @ W_kq @ E[:, toks[-1]]
            best = toks[np.argmax(s)]
            assert fw.attn[i, : len(toks)][toks == best].sum() == pytest.approx(1.0, abs=1e-12)
            z = E.T @ W_ov @ E[:, best]
            assert fw.losses[i] == pytest.approx(logsumexp(z) - z[ds.targets[i]], rel=1e-12, abs=1e-14)
    (fa, ga), (fb, gb) = runs["numba"], runs["numpy"]
    close(fa.losses, fb.losses, 1e-11)
    for x, y in zip(ga[1:], gb[1:]):
        close(x, y, 1e-10)


@pytest.mark.parametrize("scale", [1e4, 1e8, 1e15])
def test_twostage_saturated_output_softmax_backends_agree(scale, rng):
    """Huge W_ov and W_kq: both softmaxes saturated; loss, logits, attention and gradients of the two
    backends agree within the float64 policy."""
    five = five_token_example()
    inputs = {"model": np.array("twostage"), "tokens": five.tokens, "lengths": five.lengths,
              "targets": five.targets, "E": rng.standard_normal((4, 5)),
              "W_ov": scale * rng.standard_normal((4, 4)), "W_kq": scale * rng.standard_normal((4, 4))}
    check_backends_agree(twostage_case("twostage", "gaussian"), inputs)


@pytest.mark.parametrize("scale", [1e4, 1e8, 1e15])
def test_shallow_saturated_attention(scale, rng):
    X, y = rng.standard_normal((6, 5, 3)), rng.standard_normal(6)
    c, U, W = shallow.iid_init(4, 3, seed=2)
    W = scale * W
    outs = {b: shallow.loss_and_grad(shallow.prepare(X, y), c, U, W, backend=b) for b in ("numba", "numpy")}
    for out in outs.values():
        assert finite(*out)
    # saturated: f equals the head outputs with attention one-hot on the top-scoring key
    z = np.einsum("ntk,mkl,nl->nmt", X, W, X[:, -1])
    top = X[np.arange(6)[:, None], z.argmax(axis=2)]                  # [n, m, d]
    f_limit = (c * np.tanh(np.einsum("nmk,mk->nm", top, U))).sum(axis=1) / 2.0
    close(outs["numba"].f, f_limit, 1e-12)
    for a, b in zip(outs["numba"], outs["numpy"]):
        close(a, b, 1e-10)


@pytest.mark.parametrize("scale", [1e4, 1e8, 1e15])
def test_indrnn_saturated_units_backends_agree(scale, rng):
    """Huge input weights: tanh saturates; f, loss and gradients of the two backends agree within the
    float64 policy."""
    c, u, W_in = indrnn.paired_init(4, 3, seed=2)
    inputs = {"model": np.array("indrnn"), "X": rng.standard_normal((6, 5, 3)), "y": rng.standard_normal(6),
              "c": c, "u": u, "W_in": scale * W_in}
    check_backends_agree(indrnn_case("indrnn"), inputs)


# ---- tiny and zero gradients ------------------------------------------------------------------------------

def test_stable_direction_where_the_naive_gradient_underflows():
    five = five_token_example()
    W_ov, _ = W_ov_star(five.E, five.succ)
    W_kq, _ = W_kq_star(five)
    # moderate scale: the stable direction equals the naive one
    naive, stable = (tm.direction(five, W_ov, W_kq, wrt="kq", method=m) for m in ("naive", "stable"))
    close(stable.unit, naive.unit, 1e-13)
    assert stable.log_norm == pytest.approx(naive.log_norm, rel=1e-13)
    for a, b in ((1.0, 1e3), (1e3, 10.0), (1e4, 1e3)):        # late in training: ‖W_kq‖, ‖W_ov‖ large
        assert tm.direction(five, a * W_ov, b * W_kq, wrt="kq", method="naive").unit is None   # gradient underflowed
        for backend in ("numba", "numpy"):
            d = tm.direction(five, a * W_ov, b * W_kq, wrt="kq", backend=backend)
            assert d.unit is not None and finite(d.unit, d.log_norm) and d.log_norm < -700
            assert np.linalg.norm(d.unit) == pytest.approx(1.0, abs=1e-14)
        close(tm.direction(five, a * W_ov, b * W_kq, wrt="kq", backend="numpy").unit,
              tm.direction(five, a * W_ov, b * W_kq, wrt="kq", backend="numba").unit, 1e-11)


def test_long_normalized_gd_stays_finite():
    """Big steps push ‖W_kq‖ into the range where p_y − 1 underflows in float64: the stable direction keeps
    a meaningful direction (correlation with W_kq* → 1), everything finite, no spurious stop."""
    five = five_token_example()
    res = tm.train(five, eta0=0.5, eta=200.0, T0=20, T=40, direction="stable")
    assert res.stop2.reason == "max_steps"
    assert finite(*res.stage2.values(), res.W_kq) and res.stage2["norm"][-1] > 2000
    assert res.stage2["corr"][-1] > 0.99
    assert tm.direction(five, res.W_ov, res.W_kq, wrt="kq", method="naive").log_norm < -700     # tiny indeed


def _one_token_task():
    """One-token sentences: attention is 1 whatever W_kq, so ∇_{W_kq} L = 0 exactly at step 0."""
    return Dataset.from_sentences([[0], [1], [2]], [1, 2, 0], K=3, succ=np.array([1, 2, 0]))


def test_zero_gradient_is_a_clean_stop():
    res = tm.train(_one_token_task(), eta0=0.1, eta=0.1, T0=3, T=5)
    assert (res.stop2.reason, res.stop2.step) == ("zero_gradient", 0)
    assert (res.W_kq == 0).all()
    np.testing.assert_array_equal(res.stage2["loss"], np.full(6, res.stage2["loss"][0]))


def test_zero_gradient_stop_pads_the_contract_output():
    """The train contract's stage-2 arrays keep their T + 1 rows after the stop, padded with the last value."""
    ds = _one_token_task()
    out = contract.train({"model": np.array("twostage"), "tokens": ds.tokens, "lengths": ds.lengths,
                          "targets": ds.targets, "W_ov": np.zeros((3, 3)), "W_kq": np.zeros((3, 3)),
                          "K": np.array(3), "succ": ds.succ, "eta0": np.array(0.1), "eta": np.array(0.1),
                          "T0": np.array(3), "T": np.array(5)})
    res = tm.train(ds, eta0=0.1, eta=0.1, T0=3, T=5)
    np.testing.assert_array_equal(out["stage2_loss"], np.full(6, res.stage2["loss"][0]))
    np.testing.assert_array_equal(out["W_kq"], np.zeros((3, 3)))


def test_zero_residual_leaves_shallow_parameters_unchanged():
    """Paired init gives f = 0; with targets 0 every gradient is zero and ProjGD does not move."""
    X = np.random.default_rng(1).standard_normal((5, 3, 2))
    params = shallow.paired_init(4, 2, seed=3)
    res = shallow.train(shallow.prepare(X, np.zeros(5)), params, eta=1.0, steps=3)
    assert (res.train_loss == 0).all() and (res.grad_norms["W"] == 0).all()
    for name, p in zip("cUW", params):
        np.testing.assert_array_equal(res.params[name], p)


# ---- long sequences, wide models, linear memory --------------------------------------------------------

def _backends_close(fn, *args):
    a, b = fn(*args, backend="numba"), fn(*args, backend="numpy")
    assert finite(*a)
    for u, v in zip(a, b):
        close(u, v, 1e-10)


#: model -> (its API module, init(m, d, seed))
MODELS = {"shallow": (shallow, shallow.iid_init), "indrnn": (indrnn, indrnn.paired_init)}


@pytest.mark.parametrize("model", MODELS)
def test_long_sequences_backends_agree(rng, model):
    """T = 1024 tokens."""
    api, init = MODELS[model]
    X, y = rng.standard_normal((3, 1024, 6)), rng.standard_normal(3)
    _backends_close(api.loss_and_grad, api.prepare(X, y), *init(8, 6, seed=0))


@pytest.mark.parametrize("model", MODELS)
def test_wide_models_backends_agree(rng, model):
    """m = 4096 heads / units."""
    api, init = MODELS[model]
    X, y = rng.standard_normal((3, 6, 4)), rng.standard_normal(3)
    _backends_close(api.loss_and_grad, api.prepare(X, y), *init(4096, 4, seed=0))


def test_twostage_long_sentences_backends_agree(rng):
    """Sentences of 1024 tokens."""
    K = 12
    ds = Dataset(rng.integers(0, K, (3, 1024)), np.full(3, 1024), rng.integers(0, K, 3), np.eye(K))
    _backends_close(lambda *a, backend: tm.loss_and_grad(*a, backend=backend), ds, rng.standard_normal((K, K)),
                    rng.standard_normal((K, K)))


def peak_bytes(fn) -> int:
    fn()                                    # compile / warm up outside the measurement
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _shallow_T(T, backend, rng):
    data = shallow.prepare(rng.standard_normal((4, T, 8)), rng.standard_normal(4))
    c, U, W = shallow.iid_init(16, 8, seed=1)
    return lambda: shallow.loss_and_grad(data, c, U, W, backend=backend)


def _shallow_m(m, backend, rng):
    data = shallow.prepare(rng.standard_normal((4, 8, 4)), rng.standard_normal(4))
    c, U, W = shallow.iid_init(m, 4, seed=1)
    return lambda: shallow.loss_and_grad(data, c, U, W, backend=backend)


def _rnn_T(T, backend, rng):
    data = indrnn.prepare(rng.standard_normal((4, T, 8)), rng.standard_normal(4))
    return lambda: indrnn.loss_and_grad(data, *indrnn.paired_init(16, 8, seed=1), backend=backend)


def _rnn_m(m, backend, rng):
    data = indrnn.prepare(rng.standard_normal((4, 8, 4)), rng.standard_normal(4))
    return lambda: indrnn.loss_and_grad(data, *indrnn.paired_init(m, 4, seed=1), backend=backend)


def _twostage_L(L, backend, rng, method=None):
    K = 16
    ds = Dataset(rng.integers(0, K, (4, L)), np.full(4, L), rng.integers(0, K, 4), np.eye(K))
    W1, W2 = rng.standard_normal((K, K)), rng.standard_normal((K, K))
    if method:
        return lambda: tm.direction(ds, W1, W2, wrt="kq", method=method, backend=backend)
    return lambda: tm.loss_and_grad(ds, W1, W2, backend=backend)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("make", [_shallow_T, _shallow_m, _rnn_T, _rnn_m, _twostage_L], ids=lambda f: f.__name__)
def test_memory_linear_in_length_and_width(make, backend, rng):
    """Peak traced memory at 4x the size (T or L: 256 → 1024, m: 1024 → 4096) grows at most ~4x
    (a quadratic term would give ~16x). Numba's internal allocations are not traced by tracemalloc;
    for that backend this checks the Python-side temporaries."""
    small, large = (1024, 4096) if make.__name__.endswith("_m") else (256, 1024)
    ratio = peak_bytes(make(large, backend, rng)) / max(peak_bytes(make(small, backend, rng)), 1)
    assert ratio < 6, ratio


def test_memory_linear_stable_direction_numpy(rng):
    ratio = peak_bytes(_twostage_L(1024, "numpy", rng, "stable")) / peak_bytes(_twostage_L(256, "numpy", rng, "stable"))
    assert ratio < 6, ratio


def test_memory_linear_stable_direction_numba(rng):
    ratio = peak_bytes(_twostage_L(1024, "numba", rng, "stable")) / peak_bytes(_twostage_L(256, "numba", rng, "stable"))
    assert ratio < 6, ratio


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_library_refuses_overflowing_outputs(backend, rng):
    """Finite inputs whose result overflows float64 raise InputError naming the output (never a quiet inf/NaN)."""
    from ntpref.errors import InputError

    X = np.abs(rng.standard_normal((3, 4, 2))) + 0.1          # positive tokens: sigma saturates at +1 below
    y = np.array([1e300, -1e300, 1e300])
    huge = np.full(4, 1e308)                                   # f = 4e308 / 2 overflows
    c, U, W = shallow.paired_init(4, 2, seed=0)
    with pytest.raises(InputError, match="output 'loss'"):
        shallow.loss_and_grad(shallow.prepare(X, y), c, U, W, backend=backend)
    with pytest.raises(InputError, match="output 'f'"):
        shallow.forward(shallow.prepare(X), huge, np.full_like(U, 100.0), W, backend=backend)
    c, u, W_in = indrnn.paired_init(4, 2, seed=0)
    with pytest.raises(InputError, match="output 'loss'"):
        indrnn.loss_and_grad(indrnn.prepare(X, y), c, u, W_in, backend=backend)
    with pytest.raises(InputError, match="output 'f'"):
        indrnn.forward(indrnn.prepare(X), huge, u, np.full_like(W_in, 100.0), backend=backend)


def test_a_users_np_seterr_raise_changes_no_verdict():
    """np.seterr(all="raise") in the user's process (a common debugging setting): the oracle, its float64
    policy and the float32 envelope still judge a late-stage two-stage training (whose attention underflows)."""
    import importlib.util
    from pathlib import Path

    from ntpref.oracle.conformance import cases, check

    path = Path(__file__).parent / "conformance_adapters" / "oracle_numpy.py"
    spec = importlib.util.spec_from_file_location("oracle_numpy_adapter", path)
    adapter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(adapter)
    case = next(c for c in cases(models=["twostage"], stored=False) if "late_stage" in c.id)
    with np.errstate(all="raise"):
        for precision in ("float64", "float32"):
            report = check(adapter, case, precision=precision)
            assert report.ok, str(report)


def test_a_users_np_seterr_raise_changes_no_comparison():
    """np.seterr(all="raise"): compare_one of subnormal arrays (whose bounds underflow), of huge ones (whose
    error-shape scale would overflow) and of mismatched ones still gives its verdict and notes."""
    from ntpref.oracle.compare import compare_one
    from ntpref.tolerance import Tolerance

    tol = Tolerance(rtol=1e-10, atol_max_scale=1e-12)
    tiny, huge = np.full((3, 3), 1e-310), np.full((3, 3), 1e300)
    huge[0, 1] = 3e299
    with np.errstate(all="raise"):
        assert compare_one("x", tiny, tiny.copy(), tol).ok
        assert tol.element_bounds(tiny).shape == (3, 3)
        assert compare_one("x", huge, -huge, tol).note.endswith("; actual = −expected (a sign)")
        assert compare_one("x", huge, 0.5 * huge, tol).note.endswith("(a scale)")
        assert compare_one("x", tiny, np.zeros_like(tiny), tol).note.endswith("; actual is 0 everywhere")
