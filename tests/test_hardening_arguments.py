"""What the command is given: every fault a user can cause is one clear line. Mistyped options and names get
a "did you mean", help texts are plain text, minibatches larger than the data are named, longdouble values
beyond float64 are named (those within it rounded) and ASCII bytes where a string belongs are read as the
string.
"""
import re

import numpy as np
import pytest

from ntpref.npzio import load_npz

from cli_support import one_error, run, write
from small_inputs import indrnn_eval, shallow_eval, shallow_train, twostage_eval, twostage_train


# ---- mistyped options and names, help texts ----------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (("reproduce", "width", "--wokers", "2"),
     "ntpref reproduce: error: unrecognized arguments: --wokers (did you mean '--workers'?)"),
    (("verify", "--lst"), "ntpref verify: error: unrecognized arguments: --lst (did you mean '--list'?)"),
    (("verify", "--lst", "--rot=x", "--zzz"), "ntpref verify: error: unrecognized arguments: --lst (did you "
     "mean '--list'?) --rot=x (did you mean '--root'?) --zzz (see 'ntpref verify --help')"),
    (("conformance", "--modle=shallow"),
     "ntpref conformance: error: unrecognized arguments: --modle=shallow (did you mean '--model'?) (see "),
    (("reproduce", "width", "--zzz"), "ntpref reproduce: error: unrecognized arguments: --zzz"),
    (("evl", "x.npz"), "ntpref: error: argument COMMAND: invalid choice: 'evl' (choose from 'eval', 'train', "),
    (("conformance", "--model", "shalow"), "(did you mean 'shallow'?) (see 'ntpref conformance --help')"),
    (("reproduce", "twostag"), "ntpref: error: unknown reproduce target 'twostag' (did you mean 'twostage'?); "),
])
def test_mistyped_options_and_names_get_a_did_you_mean(argv, message, tmp_path, capsys):
    status, err = run(capsys, *argv, "--out", tmp_path) if argv[0] == "reproduce" else run(capsys, *argv)
    assert status == 2
    assert err.count("\n") == 1 and message in err, err
    assert not any(tmp_path.iterdir())


def test_every_help_text_is_plain_text():
    """The help of ntpref and of each sub-command is plain text: no reStructuredText markup of the
    docstrings it may come from (double backticks, :func: roles)."""
    from ntpref.cli import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.choices and a.dest == "command"]
    texts = {"ntpref": parser.format_help(), **{name: p.format_help() for name, p in sub.choices.items()}}
    assert len(texts) > 10
    for name, text in texts.items():
        assert not re.search(r"``|:(func|mod|class|data|meth):`", text), (name, text)


# ---- minibatch sizes ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch", [2 ** 62, 10 ** 9, 6])
def test_batch_beyond_the_data(batch, tmp_path, capsys):
    inp = write(tmp_path / "in.npz", shallow_train(batch=np.array(batch), seed=np.array(0)))
    assert one_error(capsys, "train", inp, "-o", tmp_path / "out.npz", "-q") == (
        f"ntpref: error: {inp}: array 'batch': must be between 1 and n = 5 (the number of training samples), "
        f"got {batch}")


def test_batch_of_every_sample_runs(tmp_path, capsys):
    inp = write(tmp_path / "in.npz", shallow_train(batch=np.array(5), seed=np.array(0)))
    assert run(capsys, "train", inp, "-o", tmp_path / "out.npz", "-q") == (0, "")


# ---- longdouble beyond float64, bytes for strings ----------------------------------------------------------

FLOATS = [("eval", shallow_eval, "X"), ("eval", shallow_eval, "W"), ("eval", indrnn_eval, "u"),
          ("eval", twostage_eval, "W_kq"), ("train", twostage_train, "eta0"), ("train", shallow_train, "eta"),
          ("train", lambda: shallow_train(rho=np.array([1.0, 2.0, 3.0])), "rho"),
          ("eval", lambda: {**shallow_eval(), "kappa": np.array(1.0)}, "kappa")]


@pytest.mark.parametrize("kind, make, name", FLOATS)
def test_longdouble_beyond_float64_names_the_array(kind, make, name, tmp_path, capsys):
    arrays = make()
    value = np.asarray(arrays[name], dtype=np.longdouble).copy()
    if np.finfo(np.longdouble).max <= np.finfo(np.float64).max:
        pytest.skip("longdouble is float64 on this platform")
    value.flat[-1] = np.longdouble("-1e400")
    inp = write(tmp_path / "in.npz", {**arrays, name: value})
    last = tuple(int(i) for i in np.unravel_index(value.size - 1, value.shape))
    where = f" at index {last}" if value.ndim else ""
    assert one_error(capsys, kind, inp, "-o", tmp_path / "out.npz", "-q") == (
        f"ntpref: error: {inp}: array '{name}': value -1e+400{where} is beyond the float64 range (|x| <= 1.798e+308)")


def test_longdouble_within_float64_is_rounded_to_float64(tmp_path, capsys):
    arrays = shallow_eval()
    write(tmp_path / "a.npz", arrays)
    write(tmp_path / "b.npz", {**arrays, "X": arrays["X"].astype(np.longdouble)})
    for f in "ab":
        assert run(capsys, "eval", tmp_path / f"{f}.npz", "-o", tmp_path / f"out_{f}.npz", "-q") == (0, "")
    a, b = load_npz(tmp_path / "out_a.npz"), load_npz(tmp_path / "out_b.npz")
    assert all(a[k].tobytes() == b[k].tobytes() for k in a)


STRINGS = [("eval", twostage_eval, "model"), ("train", lambda: {**twostage_train(), "direction": np.array("naive")},
                                                "direction"),
           ("eval", lambda: {**shallow_eval(), "activation": np.array("erf")}, "activation"),
           ("train", lambda: {**indrnn_eval(), "eta": np.array(0.1), "steps": np.array(2),
                              "activation": np.array("erf")}, "activation")]


@pytest.mark.parametrize("kind, make, name", STRINGS)
def test_ascii_bytes_are_the_string(kind, make, name, tmp_path, capsys):
    arrays = make()
    write(tmp_path / "str.npz", arrays)
    write(tmp_path / "bytes.npz", {**arrays, name: np.array(str(arrays[name]).encode("ascii"))})
    for f in ("str", "bytes"):
        assert run(capsys, kind, tmp_path / f"{f}.npz", "-o", tmp_path / f"out_{f}.npz", "-q") == (0, "")
    a, b = load_npz(tmp_path / "out_str.npz"), load_npz(tmp_path / "out_bytes.npz")
    assert a.keys() == b.keys() and all(a[k].tobytes() == b[k].tobytes() for k in a)
    inp = write(tmp_path / "bad.npz", {**arrays, name: np.array(b"tw\xffo")})
    assert one_error(capsys, kind, inp, "-o", tmp_path / "out.npz", "-q") == (
        f"ntpref: error: {inp}: array '{name}': expected a string, got bytes that are not ASCII (b'tw\\xffo')")
