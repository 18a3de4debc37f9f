"""The ``auto`` backend (ntpref/backend.py): small inputs go to the NumPy backend, large ones to Numba, an explicit
backend wins, an auto run gives the chosen backend's bits, and the commands and reports say which backend computed."""
import numpy as np
import pytest

from ntpref import backend
from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.npzio import load_npz, save_npz
from ntpref.oracle import contract
from ntpref.oracle.cases import random_case, random_cases, stored_cases
from ntpref.oracle.conformance import check
from ntpref.twostage.generators import random_realizable
from small_inputs import indrnn_eval, shallow_eval, train_of, twostage_eval, twostage_train

ORACLE_NUMPY = "tests/conformance_adapters/oracle_numpy.py"
SMALL = {"twostage": twostage_eval, "shallow": shallow_eval, "indrnn": indrnn_eval}


def _large_twostage() -> dict:
    """Paper-like sizes at which the NumPy backend takes tenths of a second (K = 100, N = 2000)."""
    ds = random_realizable(K=100, N=2000, min_len=2, max_len=10, seed=0).dataset
    return {"model": np.array("twostage"), "tokens": ds.tokens, "lengths": ds.lengths, "targets": ds.targets,
            "K": np.array(100), "W_ov": np.eye(100), "W_kq": np.eye(100)}


def _large_shallow() -> dict:
    rng = np.random.default_rng(0)
    n, T, m, d = 1000, 16, 64, 16
    return {"model": np.array("shallow"), "X": rng.standard_normal((n, T, d)), "y": rng.standard_normal(n),
            "c": np.ones(m), "U": np.ones((m, d)), "W": np.ones((m, d, d))}


def test_small_inputs_go_to_numpy_large_to_numba_explicit_wins():
    for make in SMALL.values():
        assert backend.resolve("auto", "eval", make()) == "numpy"
    assert backend.resolve("auto", "train", twostage_train()) == "numpy"
    assert backend.resolve("auto", "train", train_of(shallow_eval())) == "numpy"
    long_run = {**twostage_train(), "T0": np.array(10 ** 6), "T": np.array(10 ** 6)}   # 2e6 steps
    for kind, big in (("eval", _large_twostage()), ("eval", _large_shallow()), ("train", long_run)):
        assert backend.numpy_seconds(kind, big) > backend.SMALL_SECONDS
        assert backend.resolve("auto", kind, big) == "numba"
        assert backend.resolve("numpy", kind, big) == "numpy"
    assert backend.resolve("numba", "eval", twostage_eval()) == "numba"
    with pytest.raises(InputError, match="backend must be one of"):
        backend.resolve("cuda", "eval", twostage_eval())


def test_unreadable_sizes_go_to_numpy_which_rejects_them():
    bad = {**shallow_eval(), "X": np.zeros(3)}            # X not [n, T, d]
    assert backend.numpy_seconds("eval", bad) is None
    assert backend.resolve("auto", "eval", bad) == "numpy"
    assert "do not read" in backend.describe("auto", "eval", bad)
    with pytest.raises(InputError):
        contract.evaluate(bad, "auto")


@pytest.mark.parametrize("model", sorted(SMALL))
def test_auto_gives_the_chosen_backends_bits(model):
    inputs = SMALL[model]()
    auto = contract.evaluate(inputs, "auto")
    chosen = contract.evaluate(inputs, backend.resolve("auto", "eval", inputs))
    assert auto.keys() == chosen.keys()
    for name in auto:
        assert auto[name].tobytes() == chosen[name].tobytes(), name
    trained = contract.train(train_of(inputs) if model != "twostage" else twostage_train(), "auto")
    again = contract.train(train_of(inputs) if model != "twostage" else twostage_train(), "numpy")
    assert all(trained[k].tobytes() == again[k].tobytes() for k in trained)


def test_eval_command_names_the_backend(tmp_path, capsys):
    save_npz(tmp_path / "in.npz", twostage_eval())
    assert main(["eval", str(tmp_path / "in.npz"), "-o", str(tmp_path / "out.npz")]) == 0
    err = capsys.readouterr().err
    assert "ntpref eval: backend numpy (auto: NumPy run estimated at" in err
    out = load_npz(tmp_path / "out.npz")
    numpy_out = contract.evaluate(twostage_eval(), "numpy")
    assert all(out[k].tobytes() == numpy_out[k].tobytes() for k in numpy_out)
    assert main(["eval", "-q", "--backend", "numba", str(tmp_path / "in.npz"), "-o", str(tmp_path / "b.npz")]) == 0
    assert capsys.readouterr().err == ""
    assert main(["eval", "--backend", "numba", str(tmp_path / "in.npz"), "-o", str(tmp_path / "b.npz")]) == 0
    assert "backend numba\n" in capsys.readouterr().err
    assert main(["eval", "--help"]) == 0
    assert "'auto' (the default)" in capsys.readouterr().out


def test_random_cases_record_and_use_their_backend():
    cases = random_cases(["indrnn"], n=2, seed=5)
    assert [c.backend for c in cases] == ["numpy", "numpy"]        # the random cases are small
    case = cases[0]
    numpy_out = contract.oracle_outputs(case.kind, case.inputs, "numpy")
    assert all(case.expected[k].tobytes() == numpy_out[k].tobytes() for k in numpy_out)
    assert random_case("indrnn", 0, 5, "numba").backend == "numba"
    assert {c.backend for c in stored_cases(["indrnn"])} == {"numba"}
    report = check(ORACLE_NUMPY, case, policy="bound")             # the NumPy oracle against itself: passes
    assert report.ok and report.to_dict()["backend"] == "numpy"


def test_conformance_header_names_the_backend(capsys):
    status = main(["conformance", ORACLE_NUMPY, "--model", "indrnn", "--random", "1", "--no-stored",
                   "--policy", "bound"])
    out = capsys.readouterr().out
    assert status == 0
    assert "expected values by the oracle's numpy for 1 random case (auto: by each input's size)" in out
