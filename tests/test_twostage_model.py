"""ntpref.twostage.model: Eq. 1 forward/loss/gradients, L0, ideal feed-forward, both backends."""
import numba
import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref.twostage import kernels, model
from ntpref.twostage.data import Dataset

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


def central_fd(f, W, h=1e-6):
    G = np.zeros_like(W)
    for idx in np.ndindex(W.shape):
        Wp, Wm = W.copy(), W.copy()
        Wp[idx] += h
        Wm[idx] -= h
        G[idx] = (f(Wp) - f(Wm)) / (2 * h)
    return G


def rel_err(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def assert_close(actual, expected, rtol=1e-12):
    """rtol relative to each entry, plus rtol times the array's largest entry (cancellation-prone zeros)."""
    expected = np.asarray(expected, dtype=float)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=rtol * max(np.abs(expected).max(), 1e-300))


@pytest.mark.parametrize("embedding", ["onehot", "gaussian"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_gradients_match_central_differences(rng, embedding, backend):
    ds = random_dataset(rng, embedding)
    W_ov, W_kq = weights_for(ds, rng)
    loss, g_ov, g_kq = model.loss_and_grad(ds, W_ov, W_kq, backend=backend)
    assert loss == pytest.approx(model.forward(ds, W_ov, W_kq, backend=backend).loss, rel=1e-15)
    fd_ov = central_fd(lambda W: model.forward(ds, W, W_kq, backend=backend).loss, W_ov)
    fd_kq = central_fd(lambda W: model.forward(ds, W_ov, W, backend=backend).loss, W_kq)
    assert rel_err(g_ov, fd_ov) <= 1e-7
    assert rel_err(g_kq, fd_kq) <= 1e-7


@pytest.mark.parametrize("embedding", ["onehot", "gaussian"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_collocation_gradient_matches_central_differences(rng, embedding, backend):
    ds = random_dataset(rng, embedding)
    W_ov = weights_for(ds, rng)[0]
    weights = rng.uniform(0.0, 3.0, size=ds.K)
    for C, w in ((None, None), (np.flatnonzero(ds.succ >= 0)[:4], None), (None, weights)):
        loss, grad = model.collocation_loss_and_grad(ds.E, ds.succ, W_ov, C=C, weights=w, backend=backend)
        fd = central_fd(lambda W: model.collocation_loss_and_grad(ds.E, ds.succ, W, C=C, weights=w,
                                                                  backend=backend)[0], W_ov)
        assert rel_err(grad, fd) <= 1e-7


def test_collocation_loss_is_eq1_on_one_token_sentences(rng):
    """L0 = Eq. 1 restricted to D0 = {([x], n(x))}; the weighted version is the normalised weighted mean."""
    ds = random_dataset(rng, "gaussian")
    W_ov = weights_for(ds, rng)[0]
    C = np.flatnonzero(ds.succ >= 0)
    d0 = Dataset.from_sentences([[x] for x in C], ds.succ[C], E=ds.E)
    f = model.forward(d0, W_ov, np.zeros((ds.d, ds.d)))
    assert model.collocation_loss_and_grad(ds.E, ds.succ, W_ov)[0] == pytest.approx(f.loss, rel=1e-14)
    w = rng.uniform(0.5, 2.0, size=ds.K)
    expected = (w[C] * f.losses).sum() / w[C].sum()
    assert model.collocation_loss_and_grad(ds.E, ds.succ, W_ov, weights=w)[0] == pytest.approx(expected, rel=1e-14)
    # one-token sentences: attention is 1, so W_kq has no gradient
    assert np.array_equal(model.loss_and_grad(d0, W_ov, weights_for(ds, rng)[1])[2], np.zeros((ds.d, ds.d)))


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
        f = model.forward(ds, W_ov, W_kq, backend=backend)
        assert f.loss == pytest.approx(loss, rel=1e-13)
        assert_close(f.attn[0], phi, 1e-13)
        assert_close(f.logits[0], z, 1e-13)


@pytest.mark.parametrize("embedding", ["onehot", "gaussian"])
def test_backends_agree(rng, embedding):
    ds = random_dataset(rng, embedding, N=20)
    W_ov, W_kq = weights_for(ds, rng, scale=1.5)
    weights = rng.uniform(0.0, 2.0, size=ds.K)
    res = {}
    for b in ("numba", "numpy"):
        f = model.forward(ds, W_ov, W_kq, backend=b)
        out = dict(loss=f.loss, losses=f.losses, logits=f.logits, attn=f.attn)
        out["L"], out["g_ov"], out["g_kq"] = model.loss_and_grad(ds, W_ov, W_kq, backend=b)
        out["L0"], out["g0"] = model.collocation_loss_and_grad(ds.E, ds.succ, W_ov, weights=weights, backend=b)
        out["ideal"] = model.ideal_ff_loss(ds, W_kq, 3.0, backend=b)
        for m in model.METHODS:
            kq = model.kq_direction(ds, W_ov, W_kq, method=m, backend=b)
            ov = model.ov_direction(ds.E, ds.succ, W_ov, weights=weights, method=m, backend=b)
            out[f"kq_{m}"], out[f"kq_{m}_log"] = kq.unit, kq.log_norm
            out[f"ov_{m}"], out[f"ov_{m}_log"] = ov.unit, ov.log_norm
        res[b] = out
    for name, expected in res["numpy"].items():
        assert_close(res["numba"][name], expected, 1e-12)
    assert np.all(res["numba"]["attn"][ds.tokens < 0] == 0)


def test_parallel_driver_bitwise_for_any_thread_count(rng, monkeypatch):
    ds = random_dataset(rng, "gaussian", N=2 * kernels.BLOCK + 13)       # two whole blocks and a partial one
    W_ov, W_kq = weights_for(ds, rng)

    def everything():
        f = model.forward(ds, W_ov, W_kq)
        L, g_ov, g_kq = model.loss_and_grad(ds, W_ov, W_kq)
        kq = model.kq_direction(ds, W_ov, W_kq)
        ov = model.ov_direction(ds.E, ds.succ, W_ov)
        return [f.loss, f.losses, f.logits, f.attn, L, g_ov, g_kq, kq.unit, kq.log_norm, ov.unit, ov.log_norm]

    serial = everything()
    monkeypatch.setattr(model, "PARALLEL_MIN_WORK", 0)
    old = numba.get_num_threads()
    try:
        runs = []
        for n in (1, 2) if numba.config.NUMBA_NUM_THREADS >= 2 else (1,):
            numba.set_num_threads(n)
            runs.append(everything())
    finally:
        numba.set_num_threads(old)
    for run in runs:
        for a, b in zip(run, serial):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("scale", [1e4, 1e6, 1e8])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_saturated_weights_stay_finite(rng, scale, backend):
    ds = random_dataset(rng, "gaussian")
    W_ov, W_kq = weights_for(ds, rng, scale=scale)
    f = model.forward(ds, W_ov, W_kq, backend=backend)
    loss, g_ov, g_kq = model.loss_and_grad(ds, W_ov, W_kq, backend=backend)
    L0, g0 = model.collocation_loss_and_grad(ds.E, ds.succ, W_ov, backend=backend)
    for x in (f.loss, f.losses, f.logits, f.attn, loss, g_ov, g_kq, L0, g0,
              model.ideal_ff_loss(ds, W_kq, scale, backend=backend)):
        assert np.all(np.isfinite(x))
    assert np.all(f.losses >= 0)
    for m in model.METHODS:
        for direction in (model.kq_direction(ds, W_ov, W_kq, method=m, backend=backend),
                          model.ov_direction(ds.E, ds.succ, W_ov, method=m, backend=backend)):
            if direction.unit is not None:
                assert np.isfinite(direction.log_norm)
                assert np.linalg.norm(direction.unit) == pytest.approx(1.0, abs=1e-14)


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
        expected = model.forward(ds, lam * M / np.linalg.norm(M), W_kq, backend=backend).loss
        assert model.ideal_ff_loss(ds, W_kq, lam, backend=backend) == pytest.approx(expected, rel=1e-13)
    # orthonormal E: W_ov* = E M E^T gives the same logits
    Q = np.linalg.qr(rng.normal(size=(ds.K + 2, ds.K)))[0]
    dq = Dataset(ds.tokens, ds.lengths, ds.targets, Q, ds.succ)
    W_kq = weights_for(dq, rng)[1]
    expected = model.forward(dq, 5.0 * Q @ M @ Q.T / np.linalg.norm(M), W_kq, backend=backend).loss
    assert model.ideal_ff_loss(dq, W_kq, 5.0, backend=backend) == pytest.approx(expected, rel=1e-12)


def test_ideal_ff_uniform_attention_closed_form():
    """W_kq = 0: φ uniform, z_v = λ'(ψ_v - 1/K) by hand for one sentence (C = V)."""
    K, lam = 4, 3.0
    ds = Dataset.from_sentences([[0, 0, 2]], [1], K=K, succ=[1, 2, 3, 0])
    lam_p = lam / np.sqrt(K * (K - 1) / K)
    psi = np.array([0, 2 / 3, 0, 1 / 3])                          # n(0) = 1 twice, n(2) = 3 once
    z = lam_p * (psi - 1 / K)
    expected = np.log(np.exp(z).sum()) - z[1]
    for backend in ("numba", "numpy"):
        assert model.ideal_ff_loss(ds, np.zeros((K, K)), lam, backend=backend) == pytest.approx(expected, rel=1e-14)


def test_vocabulary_of_one_token():
    ds = Dataset.from_sentences([[0, 0], [0]], [0, 0], K=1)
    for b in ("numba", "numpy"):
        loss, g_ov, g_kq = model.loss_and_grad(ds, [[2.0]], [[3.0]], backend=b)
        assert loss == 0 and g_ov[0, 0] == 0 and g_kq[0, 0] == 0
        assert model.kq_direction(ds, [[2.0]], [[3.0]], backend=b) == (None, -np.inf)


def test_validation_names_the_input(rng):
    ds = random_dataset(rng, "onehot")
    good = np.zeros((ds.d, ds.d))
    with pytest.raises(InputError, match="W_ov"):
        model.forward(ds, np.zeros((ds.d, ds.d + 1)), good)
    bad = good.copy()
    bad[1, 2] = np.nan
    with pytest.raises(InputError, match="W_kq"):
        model.loss_and_grad(ds, good, bad)
    with pytest.raises(InputError, match="backend"):
        model.forward(ds, good, good, backend="torch")
    with pytest.raises(InputError, match="method"):
        model.kq_direction(ds, good, good, method="exact")
    x = int(np.flatnonzero(ds.succ < 0)[0])
    with pytest.raises(InputError, match="'C'"):
        model.collocation_loss_and_grad(ds.E, ds.succ, good, C=[x])
    with pytest.raises(InputError, match="'weights'"):
        model.ov_direction(ds.E, ds.succ, good, weights=-np.ones(ds.K))
    with pytest.raises(InputError, match="'weights'"):
        model.ov_direction(ds.E, ds.succ, good, weights=np.zeros(ds.K))
    with pytest.raises(InputError, match="succ"):
        model.ideal_ff_loss(Dataset(ds.tokens, ds.lengths, ds.targets, ds.E), good, 1.0)
    with pytest.raises(InputError, match="lam"):
        model.ideal_ff_loss(ds, good, -1.0)
    with pytest.raises(InputError, match="ds"):
        model.forward({"tokens": ds.tokens}, good, good)
    # array-likes are accepted
    assert model.forward(ds, good.tolist(), good.tolist()).loss == pytest.approx(np.log(ds.K), rel=1e-15)
