"""ntpref.oracle.policies.bound: the float64 running error bound passes every correct float64 implementation (other
summation orders, another backend, independent straightforward code, ulp-level noise), including
outputs that are exactly zero in exact arithmetic, and fails a 1e-6 relative error in any array
or a 1e-3 relative error in one gradient of a training run."""
import math

import numpy as np
import pytest

from ntpref.errors import InputError
from ntpref import rounding
from ntpref.oracle import contract, kinds, manifest
from ntpref.oracle.exactness import exact_backend
from ntpref.oracle.policies import bound
from ntpref.tolerance import TINY
from ntpref.oracle.compare import compare_arrays
from ntpref.shallow.activation import ACTIVATIONS
from ntpref.twostage import magnitudes
from ntpref.npzio import load_npz

from reference_support import REPO_RUNS

MANIFEST = manifest.load_manifest(REPO_RUNS)
CASES = list(MANIFEST["cases"])
U = 2.0 ** -53


def stored(case):
    entry = MANIFEST["cases"][case]
    expected = load_npz(REPO_RUNS / case / "expected.npz")
    if "intermediates" in entry:
        expected.update(load_npz(REPO_RUNS / case / manifest.INTERMEDIATES))
    return entry, load_npz(REPO_RUNS / case / "input.npz"), expected


_TOLS = {}


def policy(case):
    """The policy's tolerances of a stored case (computed once per test session)."""
    if case not in _TOLS:
        entry, inputs, expected = stored(case)
        _TOLS[case] = bound.bound_tolerances(entry["model"], entry["kind"], inputs, expected)
    return _TOLS[case]


def passes(expected, actual, tols):
    report = compare_arrays(expected, actual, tols, names=list(expected))
    assert report.ok, report.table()
    return report


# --- independent straightforward implementations (the equations of docs/, plain loops, index order) ---
_erf = np.vectorize(math.erf, otypes=[float])
#: (σ, σ') of every activation of the models (ntpref.shallow.activation.ACTIVATIONS), each by its own
#: formula (docs/shallow.md §1).
SIGMA = {"tanh": lambda s: (np.tanh(s), 1.0 - np.tanh(s) ** 2),
         "erf": lambda s: (_erf(s / math.sqrt(2.0)), math.sqrt(2.0 / math.pi) * np.exp(-s * s / 2.0))}


def _sigma(s, activation):
    return SIGMA[activation](s)


def test_the_restatements_follow_the_models_activations():
    """An activation added to the models needs its formula here too: the naive models below read SIGMA."""
    assert set(SIGMA) == set(ACTIVATIONS)


def naive_shallow(inputs):
    """f, loss and gradients of the shallow transformer, heads summed in plain index order (as the
    paper authors' code does), softmax without the max shift."""
    X, y, c, U_, W = (np.asarray(inputs[k], dtype=float) for k in ("X", "y", "c", "U", "W"))
    kappa = float(inputs.get("kappa", 2.0))
    tau = float(inputs.get("tau_att", 1.0))
    keys = X.shape[1] - 1 if bool(inputs.get("mask_last_key", False)) else X.shape[1]
    act = str(inputs.get("activation", "tanh"))
    n, m = X.shape[0], c.shape[0]
    sig, dsig, A, MU = np.zeros((n, m)), np.zeros((n, m)), np.zeros((n, m, X.shape[2])), np.zeros((n, m, X.shape[2]))
    for j in range(n):
        q = X[j, -1]
        for i in range(m):
            z = np.array([X[j, t] @ (W[i] @ q) / tau for t in range(keys)])
            alpha = np.exp(z) / np.exp(z).sum()
            a = sum(alpha[t] * X[j, t] for t in range(keys))
            s = U_[i] @ a
            sig[j, i], dsig[j, i] = _sigma(np.array(s), act)
            A[j, i] = a
            MU[j, i] = sum(alpha[t] * X[j, t] * (X[j, t] @ U_[i] - s) for t in range(keys))
    f = np.zeros(n)
    for i in range(m):
        f = f + c[i] * sig[:, i]
    f = f / math.sqrt(m)
    r = f - y
    g = kappa * r / n
    e = g[:, None] * c[None, :] * dsig / math.sqrt(m)
    return {"f": f, "loss": np.array(kappa / (2 * n) * np.sum(r ** 2)), "grad_c": g @ sig / math.sqrt(m),
            "grad_U": np.einsum("ji,jik->ik", e, A), "grad_W": np.einsum("ji,jik,jl->ikl", e, MU, X[:, -1]) / tau}


def naive_indrnn(inputs):
    """f, loss and gradients of the IndRNN: readout c @ h in BLAS order, BPTT as in docs/shallow.md §6."""
    X, y, c, u, W_in = (np.asarray(inputs[k], dtype=float) for k in ("X", "y", "c", "u", "W_in"))
    kappa = float(inputs.get("kappa", 2.0))
    act = str(inputs.get("activation", "tanh"))
    n, T, _ = X.shape
    m = c.shape[0]
    H, P = [np.zeros((n, m))], []
    for t in range(T):
        P.append(X[:, t] @ W_in.T + u * H[-1])
        H.append(_sigma(P[-1], act)[0])
    f = H[T] @ c / math.sqrt(m)
    r = f - y
    g = kappa * r / n
    gW, gu = np.zeros_like(W_in), np.zeros_like(u)
    delta = g[:, None] * c / math.sqrt(m)
    for t in reversed(range(T)):
        eps = delta * _sigma(P[t], act)[1]
        gW += eps.T @ X[:, t]
        gu += (eps * H[t]).sum(axis=0)
        delta = eps * u
    return {"f": f, "loss": np.array(kappa / (2 * n) * r @ r), "grad_c": H[T].T @ g / math.sqrt(m), "grad_u": gu,
            "grad_W_in": gW}


def naive_twostage(inputs):
    """Eq. 1 and L0 by the plain softmax formulas of docs/twostage.md §2–§3, one sentence at a time."""
    tokens, lengths, targets = inputs["tokens"], inputs["lengths"], inputs["targets"]
    E = np.asarray(inputs["E"], dtype=float) if "E" in inputs else np.eye(int(inputs["K"]))
    W_ov, W_kq = np.asarray(inputs["W_ov"], dtype=float), np.asarray(inputs["W_kq"], dtype=float)
    N, Lmax = tokens.shape

    def sentence(toks, y):
        X = E[:, toks]
        s = X.T @ (W_kq @ X[:, -1])
        phi = np.exp(s) / np.exp(s).sum()
        z = E.T @ (W_ov @ (X @ phi))
        p = np.exp(z) / np.exp(z).sum()
        gz = p.copy()
        gz[y] -= 1.0
        a = X.T @ (W_ov.T @ (E @ gz))
        gs = phi * (a - phi @ a)
        return -math.log(p[y]), z, phi, np.outer(E @ gz, X @ phi), np.outer(X @ gs, X[:, -1])

    out = {"loss": 0.0, "logits": np.zeros((N, E.shape[1])), "attn": np.zeros((N, Lmax)),
           "grad_W_ov": 0.0, "grad_W_kq": 0.0}
    for j in range(N):
        loss, z, phi, g_ov, g_kq = sentence(tokens[j, :lengths[j]], targets[j])
        out["loss"] += loss / N
        out["logits"][j], out["attn"][j, :lengths[j]] = z, phi
        out["grad_W_ov"] = out["grad_W_ov"] + g_ov / N
        out["grad_W_kq"] = out["grad_W_kq"] + g_kq / N
    if "succ" in inputs:
        C = np.flatnonzero(inputs["succ"] >= 0)
        out["loss0"], out["grad0_W_ov"] = 0.0, 0.0
        for x in C:
            loss, _, _, g_ov, _ = sentence(np.array([x]), inputs["succ"][x])
            out["loss0"] += loss / len(C)
            out["grad0_W_ov"] = out["grad0_W_ov"] + g_ov / len(C)
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


NAIVE = {"shallow": naive_shallow, "indrnn": naive_indrnn, "twostage": naive_twostage}


def ulp_noise(case_or_inputs, model, kind, expected, k=4.0):
    """The stored values moved by ±k ulps of each array's problem scale M (bound.eval_scales)."""
    scales = bound.eval_scales(model, case_or_inputs, kind)
    rng = np.random.default_rng(7)
    return {n: v + k * U * float(np.max(scales[n][0])) * rng.choice((-1.0, 1.0), size=v.shape)
            for n, v in expected.items()}


# --- generated inputs ----------------------------------------------------------------------------
def gen_shallow(seed, paired=True, **options):
    from ntpref.shallow import paired_init

    rng = np.random.default_rng(seed)
    n, T, d, m = 7, 4, 3, 6
    X = rng.normal(size=(n, T, d)) / 2
    c, U_, W = paired_init(m, d, seed)
    if not paired:
        c, U_, W = (v + 0.3 * rng.normal(size=v.shape) for v in (c, U_, W))
    return {"model": np.array("shallow"), "X": X, "y": rng.normal(size=n), "c": c, "U": U_, "W": W,
            **{k: np.array(v) for k, v in options.items()}}


def gen_indrnn(seed):
    from ntpref.shallow import indrnn

    rng = np.random.default_rng(seed)
    c, u, W_in = indrnn.paired_init(6, 3, seed)
    X = rng.normal(size=(9, 5, 3)) / 2
    return {"model": np.array("indrnn"), "X": X, "y": rng.normal(size=9), "c": c, "u": u, "W_in": W_in}


def gen_twostage(seed):
    from ntpref.twostage import random_realizable

    ds = random_realizable(K=6, N=15, min_len=1, max_len=5, seed=seed, embedding="gaussian", d=4).dataset
    rng = np.random.default_rng(seed)
    return {"model": np.array("twostage"), "tokens": ds.tokens, "lengths": ds.lengths, "targets": ds.targets,
            "E": ds.E, "succ": ds.succ, "W_ov": rng.normal(size=(4, 4)), "W_kq": rng.normal(size=(4, 4))}


GENERATED = {"shallow_paired": lambda: gen_shallow(1), "shallow_paired_erf_mask": lambda: gen_shallow(
    2, mask_last_key=True, activation="erf", tau_att=1.7, kappa=1.0), "shallow_perturbed": lambda: gen_shallow(
    3, paired=False), "indrnn_paired": lambda: gen_indrnn(4), "twostage_gaussian": lambda: gen_twostage(5)}


# --- the policy's values -------------------------------------------------------------------------
def test_gamma_and_a_hand_computed_bound():
    """One head, one token, d = 1: every magnitude of the shallow f is a closed form."""
    assert rounding.gamma(10) == pytest.approx(10 * U / (1 - 10 * U), rel=1e-15)
    x, Wv, Uv, c, y, tau = 0.6, -1.3, 0.8, 1.0, 0.25, 1.0
    inputs = {"model": np.array("shallow"), "X": np.array([[[x]]]), "y": np.array([y]), "c": np.array([c]),
              "U": np.array([[Uv]]), "W": np.array([[[Wv]]])}
    s = Uv * x                                               # α = 1: a = x
    R = 1 + 4 * abs(x * Wv * x) / tau
    Mf = abs(math.tanh(s)) + (1 - math.tanh(s) ** 2) * R * abs(Uv * x)
    K = 2 * 1 + 1 + 2 + 2 * rounding.TRANSCENDENTAL_ULPS + 1 + 1   # 2 T + d² + 2 d + transcendentals + n + m
    tols = bound.bound_tolerances("shallow", "eval", inputs, {"f": None})
    assert tols["f"].atol == pytest.approx(rounding.SAFETY * rounding.gamma(K) * Mf, rel=1e-14)
    assert tols["f"].rtol == 0.0 and "γ_23" in tols["f"].reason


def test_exactly_zero_output_gets_a_problem_scaled_bound():
    """f = 0 exactly at the paired initialisation, yet its tolerance is about 1e-14 of the head sum."""
    entry, inputs, expected = stored("shallow_eval_paired_init")
    assert not np.any(expected["f"])
    atol = policy("shallow_eval_paired_init")["f"].atol
    scale = np.abs(inputs["c"]) @ np.abs(np.tanh(kinds.intermediates("shallow", "eval", inputs)["head_s"])).T
    assert 1e-16 * scale.max() < atol < 1e-11 * scale.max()


@pytest.mark.parametrize("bad, message", [
    (("transformer", "eval"), "unknown model 'transformer'; models: twostage, shallow, indrnn"),
    (("twostage", "ntk"), "kind must be one of eval, train, got 'ntk'"),
    (("shallow", "fit"), "kind must be one of eval, train, ntk, got 'fit'")])
def test_unknown_model_or_kind(bad, message):
    with pytest.raises(InputError, match=message):
        bound.bound_tolerances(*bad, {}, {})


def test_unknown_output_name_and_invalid_input():
    inputs = gen_shallow(1)
    with pytest.raises(InputError, match="array 'logits': not an output of a shallow eval run"):
        bound.bound_tolerances("shallow", "eval", inputs, {"f": 0, "logits": 0})
    with pytest.raises(InputError, match="array 'c'"):
        bound.bound_tolerances("shallow", "eval", {**inputs, "c": inputs["c"][:2]}, {"f": 0})


def test_run_kind():
    assert bound.run_kind(gen_shallow(1)) == "eval"
    assert bound.run_kind({**gen_shallow(1), "eta": np.array(0.1)}) == "train"
    assert bound.run_kind(stored("shallow_ntk_gram")[1]) == "ntk"


# --- every stored case: correct implementations pass, a 1e-6 error fails ---------------------------
@pytest.mark.parametrize("case", CASES)
def test_stored_case_other_backend_passes(case):
    entry, inputs, expected = stored(case)
    other = kinds.compute(entry["kind"], inputs, "numpy")
    other.update(kinds.intermediates(entry["model"], entry["kind"], inputs, "numpy"))
    passes(expected, other, policy(case))


#: The stored cases whose scores and logits exceed exp's overflow (709.8): the textbook softmax gives NaN there.
OVERFLOW = {"twostage_eval_overflow", "shallow_eval_overflow"}


@pytest.mark.parametrize("case", [c for c in CASES if MANIFEST["cases"][c]["kind"] == "eval" and c not in OVERFLOW])
def test_stored_eval_independent_implementation_passes(case):
    entry, inputs, expected = stored(case)
    mine = NAIVE[entry["model"]](inputs)
    report = passes({k: expected[k] for k in mine}, mine, policy(case))
    if case == "shallow_eval_paired_init":                   # index-order head sum: f is not exactly 0
        assert np.any(mine["f"]) and report.rows[0].max_abs_err > 0 and report.rows[0].max_rel_err is None


@pytest.mark.parametrize("case", [c for c in CASES if MANIFEST["cases"][c]["kind"] != "train"])
def test_stored_case_ulp_noise_passes(case):
    entry, inputs, expected = stored(case)
    passes(expected, ulp_noise(inputs, entry["model"], entry["kind"], expected), policy(case))


@pytest.mark.parametrize("case", sorted(OVERFLOW))
def test_the_textbook_softmax_fails_beyond_the_overflow(case):
    entry, inputs, expected = stored(case)
    with np.errstate(over="ignore", invalid="ignore"):
        mine = NAIVE[entry["model"]](inputs)
    report = compare_arrays({k: expected[k] for k in mine}, mine, policy(case))
    assert report.failures == list(mine) and all(not np.all(np.isfinite(v)) for v in mine.values()), report.table()


#: Arrays whose honest float64 uncertainty exceeds 1e-6 of their value: the five-token L* is about
#: 1e-9 while its logits are about 20, so a textbook log-sum-exp minus z_y is only accurate to
#: about 5e-6 relative (absolute error ~ u·|z|).
UNRESOLVABLE = {("twostage_train_five_token", "loss_floor")}
#: Arrays whose running bound admits 1e-6 of their largest entry: with logits about 1000 the bound counts
#: their rounding, u·|z|, in p and so in both gradients, and the attention gradient's bound counts the
#: magnitude of a_l − φ·a, which cancels. Their calibrated tolerance fails 1e-6.
BOUND_WIDE = {("twostage_eval_overflow", "grad_W_ov"), ("twostage_eval_overflow", "grad_W_kq")}


@pytest.mark.parametrize("case", CASES)
def test_stored_case_relative_error_1e6_fails_in_every_array(case):
    entry, inputs, expected = stored(case)
    tols = policy(case)
    for name, value in expected.items():
        if not np.any(value):
            continue
        report = compare_arrays(expected, {**expected, name: value * (1 + 1e-6)}, tols)
        if (case, name) in BOUND_WIDE:
            assert report.ok
            calibrated = manifest.calibrated_of(MANIFEST["cases"][case])
            assert compare_arrays(expected, {**expected, name: value * (1 + 1e-6)}, calibrated).failures == [name]
        elif (case, name) in UNRESOLVABLE:
            assert report.ok and 1e-6 * abs(float(value)) < tols[name].atol < 1e-2 * abs(float(value))
            assert abs(float(value)) < 1e-8 < 1.0 < np.abs(contract.evaluate(
                {**{k: inputs[k] for k in ("model", "tokens", "lengths", "targets", "K", "succ", "W_kq")},
                 "W_ov": expected["W_ov"]})["logits"]).max()
        else:
            assert report.failures == [name], (case, name, report.table())


# --- generated inputs ----------------------------------------------------------------------------
@pytest.mark.parametrize("which", list(GENERATED))
def test_generated_inputs(which):
    inputs = GENERATED[which]()
    model = str(inputs["model"])
    ours = contract.evaluate(inputs)
    tols = bound.bound_tolerances(model, "eval", inputs, ours)
    passes(ours, contract.evaluate(inputs, "numpy"), tols)
    passes(ours, NAIVE[model](inputs), tols)
    passes(ours, ulp_noise(inputs, model, "eval", ours), tols)
    for name in ours:
        if np.any(ours[name]):
            assert not compare_arrays(ours, {**ours, name: ours[name] * (1 - 1e-6)}, tols).ok, name


# --- training: per-step rounding passes, a 1e-3 error in one gradient fails --------------------------
def _shallow_gradients(monkeypatch, model, change):
    """Make the trainer's gradients change(block index, gradient) (NumPy backend)."""
    from ntpref.shallow.projgd import MODELS

    spec = MODELS[model]

    def gradients(data, params, kappa, backend):
        f, grads = spec.gradients(data, params, kappa, backend)
        return f, grads._make(change(b, g) for b, g in enumerate(grads))

    monkeypatch.setitem(MODELS, model, spec._replace(gradients=gradients))


def _twostage_direction(monkeypatch, change):
    """Make the NumPy trainer's gradient G change before it is normalised (model.unit_direction)."""
    from ntpref.twostage import model

    unit = model.unit_direction
    monkeypatch.setattr(model, "unit_direction",
                        lambda G, log_scale, *, backend: unit(change(G), log_scale, backend=backend))


def _ulps(rng):
    return lambda *args: args[-1] * (1 + 4 * U * rng.choice((-1.0, 1.0), size=np.shape(args[-1])))


def _one_entry(x):
    x = np.array(x)
    x.flat[int(np.argmax(np.abs(x)))] *= 1 + 1e-3
    return x


TRAIN_CASES = [c for c in CASES if MANIFEST["cases"][c]["kind"] == "train"]


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_train_rounding_every_step_passes(case, monkeypatch):
    """Every gradient moved by a few ulps at every step (on top of the NumPy backend's own order)."""
    entry, inputs, expected = stored(case)
    rng = np.random.default_rng(3)
    if entry["model"] == "twostage":
        _twostage_direction(monkeypatch, _ulps(rng))
    else:
        _shallow_gradients(monkeypatch, entry["model"], _ulps(rng))
    passes(expected, contract.train(inputs, "numpy"), policy(case))


@pytest.mark.parametrize("case", TRAIN_CASES)
def test_train_gradient_error_1e3_fails(case, monkeypatch):
    entry, inputs, expected = stored(case)
    if entry["model"] == "twostage":
        _twostage_direction(monkeypatch, _one_entry)
    else:
        _shallow_gradients(monkeypatch, entry["model"], lambda b, g: g * (1 + 1e-3) if b == 2 else g)
    report = compare_arrays(expected, contract.train(inputs, "numpy"), policy(case))
    assert not report.ok
    trajectory = [n for n in report.failures if n.startswith(("stage2_", "train_loss", "grad_norm"))]
    assert trajectory, report.table()


def test_train_from_paired_init_with_index_order_heads_passes(monkeypatch):
    """ProjGD from the paired initialisation with f summed in index order (f(θ(0)) ≈ 1e-16, not 0)."""
    from ntpref.shallow import model

    def index_order(c, s, activation):
        h = c * model.sigma_np(s, activation)
        f = np.zeros(h.shape[0])
        for i in range(h.shape[1]):
            f = f + h[:, i]
        return f / math.sqrt(len(c))

    monkeypatch.setattr(model, "_output_np", index_order)
    entry, inputs, expected = stored("shallow_train_projgd")
    assert np.any(model.forward(model.prepare(inputs["X"]), inputs["c"], inputs["U"], inputs["W"], backend="numpy").f)
    passes(expected, contract.train(inputs, "numpy"), policy("shallow_train_projgd"))


def test_trajectory_bound_grows_with_the_step():
    tols = policy("twostage_train_K20")
    for name in ("stage1_loss", "stage2_loss", "stage2_norm"):
        assert tols[name].atol_per_step > 0 and "trajectory" in tols[name].reason
    assert tols["W_ov_star"].atol == pytest.approx(1e-9 * np.abs(stored("twostage_train_K20")[2]["W_ov_star"]).max())


# --- the stable direction where the float64 gradient has lost its direction --------------------------
def _attention_cancel():
    """The conformance case of attention margins >= 40 on x* (its inputs and the oracle's outputs)."""
    from ntpref.oracle.cases import random_cases

    case = next(c for c in random_cases(["twostage"]) if c.id.endswith("train_attention_cancel"))
    return case.inputs, case.expected


def test_stable_direction_bound_where_the_naive_gradient_cancels():
    """At the start of stage 2 the naive gradient's ‖M(G)‖/‖G‖ is astronomical (its direction is lost),
    while the log-scale direction is accurate: both backends agree within the bound 2 γ_K ρ of each."""
    from ntpref import twostage
    from ntpref.twostage.contract import input_dataset

    inputs, expected = _attention_cancel()
    W_kq0 = inputs["W_kq"]
    prep = twostage.prepare(input_dataset(inputs))
    sc, _ = magnitudes.twostage_scales(prep, expected["W_ov"], W_kq0)
    G = twostage.loss_and_grad(prep, expected["W_ov"], W_kq0).grad_W_kq
    assert np.linalg.norm(sc.M["grad_W_kq"]) / np.linalg.norm(G) > 1e20
    naive = twostage.direction(prep, expected["W_ov"], W_kq0, wrt="kq", method="naive").unit
    stable = {b: twostage.direction(prep, expected["W_ov"], W_kq0, wrt="kq", backend=b).unit
              for b in ("numba", "numpy")}
    assert np.abs(naive - stable["numba"]).max() > 1e-3                  # the float64 gradient points elsewhere
    rho = magnitudes.stable_accuracy(prep, expected["W_ov"], W_kq0, "kq")
    assert 1.0 < rho < 1e6
    assert np.linalg.norm(stable["numba"] - stable["numpy"]) <= 4 * rounding.gamma(sc.count) * rho


def test_attention_cancellation_tolerances_are_sensible():
    inputs, expected = _attention_cancel()
    tols = bound.bound_tolerances("twostage", "train", inputs, expected)
    largest = np.abs(expected["W_kq"]).max()
    assert tols["W_kq"].atol < 1e-9 * largest
    steps = len(expected["stage2_norm"]) - 1
    line = tols["stage2_norm"].atol + tols["stage2_norm"].atol_per_step * steps
    assert line < 1e-9 * expected["stage2_norm"].max()
    assert tols["W_ov"].atol < 1e-9 * np.abs(expected["W_ov"]).max()
    passes(expected, contract.train(inputs, "numpy"), tols)
    report = compare_arrays(expected, {**expected, "W_kq": expected["W_kq"] * (1 + 1e-6)}, tols)
    assert report.failures == ["W_kq"], report.table()
    naive = contract.train({**inputs, "direction": np.array("naive")})
    assert {"W_kq", "stage2_norm"} <= set(compare_arrays(expected, naive, tols).failures)


def test_attention_cancellation_rounding_every_step_passes_and_a_1e3_error_fails(monkeypatch):
    inputs, expected = _attention_cancel()
    tols = bound.bound_tolerances("twostage", "train", inputs, expected)
    _twostage_direction(monkeypatch, _ulps(np.random.default_rng(5)))
    passes(expected, contract.train(inputs, "numpy"), tols)
    monkeypatch.undo()
    _twostage_direction(monkeypatch, _one_entry)
    report = compare_arrays(expected, contract.train(inputs, "numpy"), tols)
    assert {"W_kq", "stage2_norm"} <= set(report.failures), report.table()


def _huge_inputs():
    from small_inputs import indrnn_eval, shallow_eval, twostage_eval

    shallow, rnn = shallow_eval(), indrnn_eval()
    return {"X·1e100": {**shallow, "X": shallow["X"] * 1e100}, "U·1e300": {**shallow, "U": shallow["U"] * 1e300},
            "tau_att 1e-300": {**shallow, "tau_att": np.array(1e-300)},
            "W_ov 1e300": {**twostage_eval(), "W_ov": np.full((5, 5), 1e300)},
            "IndRNN u·1e300": {**rnn, "u": rnn["u"] * 1e300}}


@pytest.mark.parametrize("label", list(_huge_inputs()))
def test_a_bound_that_overflows_float64_says_so_and_a_result_still_matches_itself(label, tmp_path, capsys):
    from ntpref.cli import main
    from ntpref.npzio import save_npz

    inputs = _huge_inputs()[label]
    save_npz(tmp_path / "in.npz", inputs)
    assert main(["eval", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"), "-q"]) == 0
    assert main(["compare", str(tmp_path / "out.npz"), str(tmp_path / "out.npz"), "--input", str(tmp_path / "in.npz")]) == 0
    capsys.readouterr()
    model = str(inputs["model"])
    out = contract.evaluate(inputs)
    tols = bound.bound_tolerances(model, "eval", inputs, out)
    overflowed = [n for n, t in tols.items() if t.reason.startswith("float64 policy: the rounding bound overflows")]
    assert overflowed and all(tols[n].atol == np.finfo(np.float64).max for n in overflowed)
    bad = {**out, overflowed[0]: np.full_like(out[overflowed[0]], np.inf)}      # non-finite values still fail
    assert not compare_arrays(out, bad, tols).ok


def test_a_training_whose_perturbed_rerun_overflows_still_matches_itself(tmp_path, capsys):
    """U·1e200: the given training stays finite, the policy's rerun from a moved θ(0) does not; the bound
    is then unbounded (largest float64), never an error blaming the input's finite arrays."""
    from small_inputs import shallow_eval, train_of

    from ntpref.cli import main
    from ntpref.npzio import save_npz

    inputs = train_of(shallow_eval())
    inputs["U"] = inputs["U"] * 1e200
    save_npz(tmp_path / "in.npz", inputs)
    assert main(["train", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz"), "-q"]) == 0
    assert main(["compare", str(tmp_path / "out.npz"), str(tmp_path / "out.npz"), "--input", str(tmp_path / "in.npz")]) == 0
    out = capsys.readouterr().out
    assert "non-finite" not in out


@pytest.mark.parametrize("make", ["shallow_eval", "indrnn_eval"])
def test_subnormal_inputs_rounded_a_few_subnormals_from_exact_pass(make):
    """X of subnormal numbers (multiples of 3e-320): products below the smallest normal round with an
    absolute error of up to half a subnormal, so the oracle's f and gradients differ from the exact values
    (exact arithmetic rounded once) by one or two subnormals where the relative bound is 0 (a floor of one
    subnormal fails them); the underflow floor covers that, and the NumPy backend, and nothing larger."""
    import small_inputs

    base = getattr(small_inputs, make)()
    failed_before = 0
    for seed in range(6):
        rng = np.random.default_rng(seed)
        inputs = {**base, "X": 3e-320 * rng.integers(-20, 20, base["X"].shape)}
        for k in ("c", "U", "W", "u", "W_in"):
            if k in inputs:
                inputs[k] = inputs[k] * rng.uniform(0.5, 2, inputs[k].shape)
        numba, numpy = contract.evaluate(inputs, "numba"), contract.evaluate(inputs, "numpy")
        exact = exact_backend().compute("eval", inputs)
        tols = bound.bound_tolerances(str(inputs["model"]), "eval", inputs, numba, outputs=numba)
        assert compare_arrays(exact, numba, tols, names=list(numba)).ok
        assert compare_arrays(numba, numpy, tols).ok
        floored = [name for name, tol in tols.items() if tol.atol < 1e-300]
        assert {"f", "grad_c"} <= set(floored), tols
        one_subnormal = {n: t.replace(atol=TINY) if n in floored else t for n, t in tols.items()}
        failed_before += not compare_arrays(exact, numba, one_subnormal, names=list(numba)).ok
        for name in floored:          # a floor of subnormal size: 1e-300 off is far outside
            assert tols[name].atol < 1e-319, (name, tols[name])
            bumped = {**numba, name: numba[name] + 1e-300}
            assert not compare_arrays(numba, bumped, tols).ok, name
    assert failed_before, "a floor of one subnormal passed every seed: the case is lost"


# --- a naive-direction run onto a loss plateau ------------------------------------------------------------
def _plateau_input():
    """A naive-direction stage 2 that walks onto a loss plateau (found by 3000 random trainings): there the
    float64 gradient is rounding noise and two correct backends take different walks."""
    return {"model": np.array("twostage"), "K": np.array(3),
            "tokens": np.array([[0, 2, -1, -1], [2, 1, -1, -1], [2, 0, 1, 2], [0, -1, -1, -1], [1, 0, 1, 2],
                                [2, 0, 1, 2]]),
            "lengths": np.array([2, 2, 4, 1, 4, 4]), "targets": np.array([2, 1, 2, 2, 2, 2]), "succ": np.array([2, 0, 1]),
            "W_ov": np.array([[0.08350509277741591, -0.02215638939350187, -0.09474888851069875],
                              [-0.17580108388565804, -0.2213027859845098, -0.15106777200990318],
                              [0.03346644928675549, -0.01928641652136745, 0.1077627514942619]]),
            "W_kq": np.array([[3.5969787794545596, 2.632221189103582, 4.129936665400938],
                              [-1.424297791523648, -4.404921711480496, 0.7218671218239071],
                              [0.3431452473601235, 0.4245484811966832, 2.419734127113222]]),
            "eta0": np.array(0.3289502165354466), "eta": np.array(0.9540221095681168), "T0": np.array(0),
            "T": np.array(55), "direction": np.array("naive")}


def test_a_naive_walk_onto_a_plateau_passes_both_backends_and_says_where_float64_gives_up():
    """Both backends pass; up to the step where the direction is known to less than 1e-8 the tolerances stay
    tight (a 1e-6 error there fails), after it they bound unrelated unit steps of size eta."""
    inputs = _plateau_input()
    numba, numpy = contract.train(inputs, "numba"), contract.train(inputs, "numpy")
    assert not np.array_equal(numba["W_kq"], numpy["W_kq"])                # the walks differ
    tols = bound.bound_tolerances("twostage", "train", inputs, numba, outputs=numba)
    assert compare_arrays(numba, numpy, tols).ok
    for name in ("stage2_loss", "stage2_norm", "stage2_corr"):
        assert tols[name].head.n == 8 and "a loss plateau" in tols[name].reason
    assert "from stage-2 step 7 float64 determines the gradient's direction to less than 1e-08" in tols["W_kq"].reason
    early = {**numpy, "stage2_norm": numpy["stage2_norm"] * np.where(np.arange(56) == 3, 1 + 1e-6, 1.0)}
    assert not compare_arrays(numba, early, tols).ok                       # before the plateau the run is checked


def test_a_determined_naive_run_gets_no_plateau_bound():
    from ntpref.oracle.cases import random_cases

    case = next(c for c in random_cases(["twostage"], 3, 0) if c.kind == "train")
    assert str(case.inputs["direction"]) == "naive"
    assert all(t.head is None for t in case.tolerances("float64", "bound").values())
