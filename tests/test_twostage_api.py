"""The public API of ntpref.twostage (docs/api.md): the exported names, the named results and their field
order, and a Dataset against its Prepared set (bitwise the same results)."""
import contextlib
import io
import re
from pathlib import Path

import numpy as np
import pytest

from ntpref import twostage

from test_twostage_model import random_dataset, weights_for

API_MD = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def documented_names() -> list[str]:
    """The names in the first column of the table of the `## ntpref.twostage` section of docs/api.md."""
    section = API_MD.read_text().split("## ntpref.twostage\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `([A-Za-z_][A-Za-z0-9_]*)`", section, flags=re.MULTILINE)


def test_the_package_exports_exactly_the_documented_names():
    names = documented_names()
    assert len(names) == len(set(names)) and len(names) > 30
    assert sorted(twostage.__all__) == sorted(names)
    for name in names:
        assert getattr(twostage, name).__module__.startswith("ntpref.twostage."), name
    listed = {w for line in twostage.__doc__.splitlines() if line.startswith("    ") for w in re.findall(r"\w+", line)}
    assert set(names) <= listed                                   # the package docstring lists every name


@pytest.mark.parametrize("result,fields", [
    (twostage.Forward, ("loss", "losses", "logits", "attn")),
    (twostage.LossAndGrad, ("loss", "grad_W_ov", "grad_W_kq")),
    (twostage.Step, ("loss", "logits", "attn", "direction")),
    (twostage.Direction, ("unit", "log_norm")),
    (twostage.Prepared, ("tokens", "lengths", "targets", "weights", "E", "onehot")),
])
def test_named_results_have_the_documented_fields_in_order(result, fields):
    assert result._fields == fields


def _bits(x) -> bytes:
    if isinstance(x, tuple):
        return b"".join(_bits(v) for v in x)
    return b"none" if x is None else np.asarray(x).tobytes()


@pytest.mark.parametrize("embedding", ["onehot", "gaussian"])
@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_a_dataset_and_its_prepared_set_give_bitwise_identical_results(rng, embedding, backend):
    ds = random_dataset(rng, embedding, N=15)
    W_ov, W_kq = weights_for(ds, rng)
    prep = twostage.prepare(ds)
    assert isinstance(prep, twostage.Prepared) and prep.weights.tolist() == [1 / 15] * 15
    calls = [lambda data: twostage.forward(data, W_ov, W_kq, backend=backend),
             lambda data: twostage.loss_and_grad(data, W_ov, W_kq, backend=backend)]
    calls += [lambda data, m=m: twostage.step(data, W_ov, W_kq, wrt="kq", method=m, backend=backend)
              for m in ("stable", "naive")]
    for call in calls:
        a, b = call(ds), call(prep)
        assert type(a) is type(b) and _bits(a) == _bits(b)
    fw, lg = calls[0](ds), calls[1](ds)
    assert isinstance(fw, twostage.Forward) and isinstance(lg, twostage.LossAndGrad)
    assert fw.loss == lg.loss and fw.logits.shape == (15, ds.K) and fw.attn.shape == (15, ds.Lmax)
    assert lg.grad_W_ov.shape == lg.grad_W_kq.shape == (ds.d, ds.d)


@pytest.mark.parametrize("backend", ["numba", "numpy"])
def test_step_is_the_forward_pass_and_the_direction(rng, backend):
    """A step's loss, logits and attention are those of forward, bitwise; its direction is direction()'s and,
    for "naive", the normalised gradient of loss_and_grad."""
    ds = random_dataset(rng, "gaussian")
    W_ov, W_kq = weights_for(ds, rng)
    fw = twostage.forward(ds, W_ov, W_kq, backend=backend)
    g = twostage.loss_and_grad(ds, W_ov, W_kq, backend=backend).grad_W_kq
    for method in ("stable", "naive"):
        st = twostage.step(ds, W_ov, W_kq, wrt="kq", method=method, backend=backend)
        assert isinstance(st, twostage.Step) and isinstance(st.direction, twostage.Direction)
        assert _bits((st.loss, st.logits, st.attn)) == _bits((fw.loss, fw.logits, fw.attn))
        assert _bits(st.direction) == _bits(twostage.direction(ds, W_ov, W_kq, wrt="kq", method=method,
                                                               backend=backend))
        np.testing.assert_allclose(st.direction.unit, g / np.linalg.norm(g), rtol=0, atol=1e-13)
        assert st.direction.log_norm == pytest.approx(np.log(np.linalg.norm(g)), rel=1e-13)


def test_collocation_set_is_the_l0_set(rng):
    """prepare_collocations is D0 = {([x], n(x)) : x ∈ C} with its weights; W_kq may be None there only."""
    ds = random_dataset(rng, "gaussian")
    W_ov = weights_for(ds, rng)[0]
    D0 = twostage.prepare_collocations(ds.E, ds.succ, weights=np.arange(1.0, ds.K + 1))
    C = np.flatnonzero(ds.succ >= 0)
    assert D0.tokens[:, 0].tolist() == C.tolist() and D0.targets.tolist() == ds.succ[C].tolist()
    np.testing.assert_allclose(D0.weights, (C + 1) / (C + 1).sum(), rtol=1e-15)
    loss, g_ov, g_kq = twostage.loss_and_grad(D0, W_ov, None)
    assert _bits((loss, g_ov)) == _bits(twostage.loss_and_grad(D0, W_ov, np.zeros((ds.d, ds.d)))[:2])
    assert not np.any(g_kq)


def test_api_example_of_the_docs_runs():
    """The example of docs/api.md's `## ntpref.twostage` section, run as written, prints the correlations its
    comment states."""
    section = API_MD.read_text().split("## ntpref.twostage\n", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(code) == 1
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code[0], str(API_MD), "exec"), {})
    claimed = re.search(r"ρ\(W_kq, W_kq\*\): \[([\d. ]+)\]", code[0]).group(1).split()
    assert [f"{float(v):.5f}" for v in re.findall(r"\d\.\d+", out.getvalue())] == claimed
