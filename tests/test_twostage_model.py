"""ntpref/twostage/model.py: Eq. 1 forward/loss/gradients, L0, ideal feed-forward, both backends."""
import numba
import numpy as np
import pytest

from common_checks import Size, check_backends_agree, twostage_case
from ntpref.errors import InputError
from ntpref.oracle.gradcheck import gradcheck
from ntpref import twostage
from ntpref.twostage import Dataset, kernels, model

K, D_GAUSS = 7, 5


def random_dataset(rng, embedding="onehot", N=12, K=K, d=D_GAUSS):
    """Lengths 1..6 (every length present), random tokens, some sentences with forced repeats."""
    sentences = []
    for i in range(N):
        L = 1 + i % 6
        s = list(rng.integers(0, K, size=L))
        if L >= 3 and i % 2 == 0:
            s[1] = s[0] = s[-1]                       # repeated token, also equal to the query
        elif L >= 2:
            s[0] = s[1]
        sentences.append(s)
    targets = rng.integers(0, K, size=N)
    succ = rng.permutation(K)
    succ[rng.integers(0, K)] = -1                     # C ≠ V
    if embedding == "onehot":
        return Dataset.from_sentences(sentences, targets, K=K, succ=succ)
    return Dataset.from_sentences(sentences, targets, E=rng.normal(size=(d, K)), succ=succ)


def weights_for(ds, rng, scale=0.7):
    return scale * rng.normal(size=(ds.d, ds.d)), scale * rng.normal(size=(ds.d, ds.d))


def assert_close(actual, expected, rtol=1e-12):
    """rtol relative to each entry, plus rtol times the array's largest entry (cancellation-prone zeros)."""
    expected = np.asarray(expected, dtype=float)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(np.abs(expected).max(), 1e-300))


def l0_and_grad(ds, W_ov, C=None, weights=None, backend="numba"):
    """(L0, ∇L0) through the public API: Eq. 1 on the collocation set D0, W_kq None."""
    loss, grad, _ = twostage.loss_and_grad(twostage.prepare_collocations(ds.E, ds.succ, C, weights), W_ov, None,
                                           backend=backend)
    return loss, grad


def stage1_direction(ds, W_ov, weights=None, method="stable", backend="numba"):
    """Stage-1 direction: of ∇L0 on D0."""
    D0 = twostage.prepare_collocations(ds.E, ds.succ, weights=weights)
    return twostage.direction(D0, W_ov, None, wrt="ov", method=method, backend=backend)


# Eq. 1 and its gradients (finite differences, NumPy against Numba, threads, parameter validation) are
# checked for every model by tests/test_common_checks.py; this file checks what is specific to the
# two-stage model: L0, the normalized directions, the ideal feed-forward loss and closed forms.

@pytest.mark.parametrize("embedding", ["onehot", "gaussian"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
@pytest.mark.parametrize("restriction", ["all", "subset", "weighted"])
def test_collocation_gradient_matches_finite_differences(rng, embedding, backend, restriction):
    """∇L0 against central differences for C = every token with a successor, a subset of C, and token weights."""
    ds = random_dataset(rng, embedding)
    W_ov = weights_for(ds, rng)[0]
    C = np.flatnonzero(ds.succ >= 0)[:4] if restriction == "subset" else None
    w = rng.uniform(0.0, 3.0, size=ds.K) if restriction == "weighted" else None

    def fun(W_ov):
        loss, grad = l0_and_grad(ds, W_ov, C=C, weights=w, backend=backend)
        return loss, {"W_ov": grad}

    report = gradcheck(fun, {"W_ov": W_ov})
    assert report.counts == {"W_ov": (ds.d * ds.d, ds.d * ds.d)}
    assert report.ok, report.table()


def _one_token_sentences(ds):
    """D0 = {([x], n(x)) : x ∈ C} as a Dataset, and C."""
    C = np.flatnonzero(ds.succ >= 0)
    return Dataset.from_sentences([[x] for x in C], ds.succ[C], E=ds.E), C


def test_collocation_loss_is_eq1_on_one_token_sentences(rng):
    """L0 = Eq. 1 restricted to D0 = {([x], n(x))}."""
    ds = random_dataset(rng, "gaussian")
    W_ov = weights_for(ds, rng)[0]
    d0, _ = _one_token_sentences(ds)
    f = twostage.forward(d0, W_ov, np.zeros((ds.d, ds.d)))
    assert l0_and_grad(ds, W_ov)[0] == pytest.approx(f.loss, rel=1e-14)


def test_weighted_collocation_loss_is_the_normalised_weighted_mean(rng):
    ds = random_dataset(rng, "gaussian")
    W_ov = weights_for(ds, rng)[0]
    d0, C = _one_token_sentences(ds)
    losses = twostage.forward(d0, W_ov, np.zeros((ds.d, ds.d))).losses
    w = rng.uniform(0.5, 2.0, size=ds.K)
    expected = (w[C] * losses).sum() / w[C].sum()
    assert l0_and_grad(ds, W_ov, weights=w)[0] == pytest.approx(expected, rel=1e-14)


def test_one_token_sentences_give_no_w_kq_gradient(rng):
    """A one-token sentence attends to its only token with weight 1 whatever W_kq: ∇_{W_kq} = 0 exactly."""
    ds = random_dataset(rng, "gaussian")
    d0, _ = _one_token_sentences(ds)
    W_ov, W_kq = weights_for(ds, rng)
    for backend in ("numba", "numpy"):
        assert np.array_equal(twostage.loss_and_grad(d0, W_ov, W_kq, backend=backend).grad_W_kq,
                              np.zeros((ds.d, ds.d)))


def test_forward_values_by_hand(rng):
    """Eq. 1 for one sentence written out with plain NumPy."""
    ds = random_dataset(rng, "gaussian", N=1)
    ds = Dataset.from_sentences([[3, 1, 3, 0]], [2], E=ds.E)
    W_ov, W_kq = weights_for(ds, rng)
    X = ds.E[:, [3, 1, 3, 0]]
    s = X.T @ W_kq @ X[:, -1]
    phi = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
    z = ds.E.T @ W_ov @ X @ phi
    loss = np.log(np.exp(z - z.max()).sum()) + z.max() - z[2]
    for backend in ("numba", "numpy"):
        f = twostage.forward(ds, W_ov, W_kq, backend=backend)
        assert f.loss == pytest.approx(loss, rel=1e-13)
        assert_close(f.attn[0], phi, 1e-13)
        assert_close(f.logits[0], z, 1e-13)


def _specific_outputs(ds, W_ov, W_kq, weights, backend):
    """The outputs of the two-stage model beyond Eq. 1: L0 and ∇L0, the ideal feed-forward loss, and the
    unit directions of both stages by both methods."""
    out = {}
    out["L0"], out["g0"] = l0_and_grad(ds, W_ov, weights=weights, backend=backend)
    out["ideal"] = twostage.ideal_ff_loss(ds, W_kq, 3.0, backend=backend)
    for m in model.METHODS:
        kq = twostage.direction(ds, W_ov, W_kq, wrt="kq", method=m, backend=backend)
        ov = stage1_direction(ds, W_ov, weights=weights, method=m, backend=backend)
        out[f"kq_{m}"], out[f"kq_{m}_log"] = kq.unit, kq.log_norm
        out[f"ov_{m}"], out[f"ov_{m}_log"] = ov.unit, ov.log_norm
    return out


@pytest.mark.parametrize("embedding", ["onehot", "gaussian"])
def test_backends_agree_on_collocation_ideal_and_directions(rng, embedding):
    ds = random_dataset(rng, embedding, N=20)
    W_ov, W_kq = weights_for(ds, rng, scale=1.5)
    weights = rng.uniform(0.0, 2.0, size=ds.K)
    numpy = _specific_outputs(ds, W_ov, W_kq, weights, "numpy")
    numba_ = _specific_outputs(ds, W_ov, W_kq, weights, "numba")
    assert list(numba_) == list(numpy)
    for name, expected in numpy.items():
        assert_close(numba_[name], expected, 1e-12)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_attention_is_zero_on_padding(rng, backend):
    ds = random_dataset(rng, "gaussian")
    attn = twostage.forward(ds, *weights_for(ds, rng), backend=backend).attn
    assert np.array_equal(attn[ds.tokens < 0], np.zeros(int((ds.tokens < 0).sum())))
    np.testing.assert_allclose(attn.sum(axis=1), np.ones(ds.N), rtol=1e-15, atol=0)


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2, reason="Numba was started with a single thread")
def test_parallel_directions_bitwise_for_one_and_two_threads_and_serial(rng, monkeypatch):
    """L0 and the stable directions on the parallel driver (two whole blocks and a partial one) are bitwise
    those of the serial pass, with 1 and with 2 threads."""
    ds = random_dataset(rng, "gaussian", N=2 * kernels.BLOCK + 13)
    W_ov, W_kq = weights_for(ds, rng)
    serial = _specific_outputs(ds, W_ov, W_kq, None, "numba")
    monkeypatch.setattr(model, "PARALLEL_MIN_WORK", 0)
    old = numba.get_num_threads()
    try:
        runs = []
        for n in (1, 2):
            numba.set_num_threads(n)
            runs.append(_specific_outputs(ds, W_ov, W_kq, None, "numba"))
    finally:
        numba.set_num_threads(old)
    for run in runs:
        for name, value in serial.items():
            assert np.array_equal(run[name], value), name


@pytest.mark.parametrize("scale", [1e4, 1e6, 1e8])
def test_saturated_weights_backends_agree(scale):
    """‖W‖ up to 1e8: attention and softmax saturate; the loss, logits, attention and gradients of the two
    backends still agree within the float64 policy (so both are finite)."""
    case = twostage_case("twostage-gaussian", "gaussian")
    inputs = case.draw(np.random.default_rng(3), Size(n=12, T=6, d=7, scale=scale))
    check_backends_agree(case, inputs)


@pytest.mark.parametrize("scale", [1e4, 1e6, 1e8])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_saturated_weights_give_unit_directions(rng, scale, backend):
    ds = random_dataset(rng, "gaussian")
    W_ov, W_kq = weights_for(ds, rng, scale=scale)
    for m in model.METHODS:
        for direction in (twostage.direction(ds, W_ov, W_kq, wrt="kq", method=m, backend=backend),
                          stage1_direction(ds, W_ov, method=m, backend=backend)):
            if direction.unit is not None:
                assert np.isfinite(direction.log_norm)
                assert np.linalg.norm(direction.unit) == pytest.approx(1.0, abs=1e-14)


@pytest.mark.parametrize("scale", [1e4, 1e8])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_saturated_collocation_and_ideal_losses_match_the_other_backend(rng, scale, backend):
    ds = random_dataset(rng, "gaussian")
    W_ov, W_kq = weights_for(ds, rng, scale=scale)
    other = "numpy" if backend == "numba" else "numba"
    L0, g0 = l0_and_grad(ds, W_ov, backend=backend)
    L0_other, g0_other = l0_and_grad(ds, W_ov, backend=other)
    assert L0 >= 0 and L0 == pytest.approx(L0_other, rel=1e-9, abs=1e-9 * scale)
    assert_close(g0, g0_other, 1e-9)
    ideal = twostage.ideal_ff_loss(ds, W_kq, scale, backend=backend)
    assert ideal >= 0 and ideal == pytest.approx(twostage.ideal_ff_loss(ds, W_kq, scale, backend=other), rel=1e-9,
                                                 abs=1e-9 * scale)


def _w_ov_star(succ, K):
    """W_ov*[v, x] = 1[v = n(x)] - 1/K for x with a successor (docs/twostage.md §5, E = I), 0 elsewhere."""
    M = np.zeros((K, K))
    for x in range(K):
        if succ[x] >= 0:
            M[succ[x], x] = 1.0
            M[:, x] -= 1.0 / K
    return M


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_ideal_ff_equals_eq1_with_scaled_w_ov_star(rng, backend):
    ds = random_dataset(rng, "onehot")
    W_kq = weights_for(ds, rng)[1]
    M = _w_ov_star(ds.succ, ds.K)
    nC = (ds.succ >= 0).sum()
    assert np.linalg.norm(M) ** 2 == pytest.approx(nC * (ds.K - 1) / ds.K, rel=1e-14)
    for lam in (0.0, 1.0, 37.5):
        expected = twostage.forward(ds, lam * M / np.linalg.norm(M), W_kq, backend=backend).loss
        assert twostage.ideal_ff_loss(ds, W_kq, lam, backend=backend) == pytest.approx(expected, rel=1e-13)
    # orthonormal E: W_ov* = E M E^T gives the same logits
    Q = np.linalg.qr(rng.normal(size=(ds.K + 2, ds.K)))[0]
    dq = Dataset(ds.tokens, ds.lengths, ds.targets, Q, ds.succ)
    W_kq = weights_for(dq, rng)[1]
    expected = twostage.forward(dq, 5.0 * Q @ M @ Q.T / np.linalg.norm(M), W_kq, backend=backend).loss
    assert twostage.ideal_ff_loss(dq, W_kq, 5.0, backend=backend) == pytest.approx(expected, rel=1e-12)


def test_ideal_ff_uniform_attention_closed_form():
    """W_kq = 0: φ uniform, z_v = λ'(ψ_v - 1/K) by hand for one sentence (C = V)."""
    K, lam = 4, 3.0
    ds = Dataset.from_sentences([[0, 0, 2]], [1], K=K, succ=[1, 2, 3, 0])
    lam_p = lam / np.sqrt(K * (K - 1) / K)
    psi = np.array([0, 2 / 3, 0, 1 / 3])                          # n(0) = 1 twice, n(2) = 3 once
    z = lam_p * (psi - 1 / K)
    expected = np.log(np.exp(z).sum()) - z[1]
    for backend in ("numba", "numpy"):
        ideal = twostage.ideal_ff_loss(ds, np.zeros((K, K)), lam, backend=backend)
        assert ideal == pytest.approx(expected, rel=1e-14)


def test_vocabulary_of_one_token():
    ds = Dataset.from_sentences([[0, 0], [0]], [0, 0], K=1)
    for b in ("numba", "numpy"):
        loss, g_ov, g_kq = twostage.loss_and_grad(ds, [[2.0]], [[3.0]], backend=b)
        assert loss == 0 and g_ov[0, 0] == 0 and g_kq[0, 0] == 0
        assert twostage.direction(ds, [[2.0]], [[3.0]], wrt="kq", backend=b) == (None, -np.inf)


@pytest.mark.parametrize("call,pattern", [
    (lambda ds, W: twostage.forward(ds, W, W, backend="torch"), "^backend must be one of numba, numpy, got 'torch'$"),
    (lambda ds, W: twostage.direction(ds, W, W, wrt="kq", method="exact"),
     "^method must be one of stable, naive, got 'exact'$"),
    (lambda ds, W: twostage.step(ds, W, W, wrt="qk"), "^wrt must be one of kq, ov, got 'qk'$"),
    (lambda ds, W: twostage.prepare_collocations(ds.E, ds.succ, C=[int(np.flatnonzero(ds.succ < 0)[0])]),
     r"^array 'C': token \d+ has no successor \(succ\[\d+\] = -1\)$"),
    (lambda ds, W: twostage.prepare_collocations(ds.E, ds.succ, weights=-np.ones(ds.K)),
     "^array 'weights': negative value at index 0$"),
    (lambda ds, W: twostage.prepare_collocations(ds.E, ds.succ, weights=np.zeros(ds.K)),
     "^array 'weights': the weights of the collocation set C sum to 0$"),
    (lambda ds, W: twostage.ideal_ff_loss(Dataset(ds.tokens, ds.lengths, ds.targets, ds.E), W, 1.0),
     "^ideal_ff_loss: the dataset has no collocation map 'succ'$"),
    (lambda ds, W: twostage.ideal_ff_loss(ds, W, -1.0), r"^array 'lam': must be >= 0\.0, got -1\.0$"),
    (lambda ds, W: twostage.forward({"tokens": ds.tokens}, W, W),
     r"^data: expected a ntpref\.twostage\.Dataset or Prepared, got dict$"),
    (lambda ds, W: twostage.prepare({"tokens": ds.tokens}), r"^ds: expected a ntpref\.twostage\.Dataset, got dict$"),
    (lambda ds, W: twostage.loss_and_grad(ds, W, None),
     r"^array 'W_kq': None is allowed only for one-token sentences \(Lmax = 1\), got Lmax = 6$"),
    (lambda ds, W: twostage.forward(twostage.prepare(ds), W[:-1], W),
     r"^array 'W_ov': expected shape \[7, 7\], got \[6, 7\]$"),
], ids=["backend", "method", "wrt", "C-without-successor", "negative-weights", "zero-weights", "no-succ",
        "negative-lam", "not-data", "not-a-dataset", "W_kq-None", "W_ov-shape"])
def test_bad_argument_is_an_input_error_naming_it(rng, call, pattern):
    ds = random_dataset(rng, "onehot")
    with pytest.raises(InputError, match=pattern):
        call(ds, np.zeros((ds.d, ds.d)))


def test_array_likes_are_accepted(rng):
    """Nested lists for W_ov and W_kq: at W = 0 every logit is 0 and the loss is log K."""
    ds = random_dataset(rng, "onehot")
    zero = np.zeros((ds.d, ds.d)).tolist()
    assert twostage.forward(ds, zero, zero).loss == pytest.approx(np.log(ds.K), rel=1e-15)



def test_serial_gradient_is_bitwise_the_kernel_pass_whatever_the_layout(rng, monkeypatch):
    """The Numba loss_and_grad of a one-hot set that runs serially, with plain float64 matrices (what a training
    loop passes every step), is bitwise the kernels' serial pass called directly (pass_serial in MODE_GRAD), the
    parallel driver with 1 and 2 threads, and the same matrices in another layout (Fortran order, read-only,
    nested lists); float32 matrices give the bits of their float64 values."""
    ds = random_dataset(rng, "onehot", N=2 * kernels.BLOCK + 13)
    prep = twostage.prepare(ds)
    W_ov, W_kq = weights_for(ds, rng, scale=3.0)
    assert not model.runs_parallel(prep)
    got = twostage.loss_and_grad(prep, W_ov, W_kq)
    loss, _, _, _, _, G_ov, G_kq = kernels.pass_serial(prep.tokens, prep.lengths, prep.targets, prep.weights,
                                                       W_ov, W_kq, kernels.MODE_GRAD)
    references = [(loss, G_ov, G_kq)]
    monkeypatch.setattr(model, "PARALLEL_MIN_WORK", 0)
    old = numba.get_num_threads()
    try:
        for n in range(1, min(2, numba.config.NUMBA_NUM_THREADS) + 1):
            numba.set_num_threads(n)
            references.append(tuple(twostage.loss_and_grad(prep, W_ov, W_kq)))
    finally:
        numba.set_num_threads(old)
    monkeypatch.setattr(model, "PARALLEL_MIN_WORK", 1 << 20)
    read_only = W_kq.copy()
    read_only.flags.writeable = False
    for other in (np.asfortranarray(W_kq), read_only, W_kq.tolist()):
        references.append(tuple(twostage.loss_and_grad(prep, W_ov, other)))
    for ref in references:
        assert got.loss == ref[0]
        assert got.grad_W_ov.tobytes() == ref[1].tobytes() and got.grad_W_kq.tobytes() == ref[2].tobytes()
    W32 = W_ov.astype(np.float32)
    assert np.array_equal(twostage.loss_and_grad(prep, W32, W_kq).grad_W_kq,
                          twostage.loss_and_grad(prep, W32.astype(np.float64), W_kq).grad_W_kq)


@pytest.mark.parametrize("which", ["W_ov", "W_kq"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_serial_gradient_refuses_a_non_finite_matrix_by_name(rng, which, bad):
    """A non-finite entry of a plain float64 matrix (checked without a conversion) is named with its index."""
    prep = twostage.prepare(random_dataset(rng, "onehot"))
    W = {"W_ov": rng.normal(size=(K, K)), "W_kq": rng.normal(size=(K, K))}
    W[which][2, 3] = bad
    with pytest.raises(InputError, match=rf"^array '{which}': non-finite value {bad} at index \(2, 3\)$"):
        twostage.loss_and_grad(prep, W["W_ov"], W["W_kq"])
