"""Bad input: every command and public function fails at the boundary with one clear line.

Command line cases run ``ntpref.cli.main`` in-process and check exit status 2, exactly one stderr line
"ntpref: error: ..." naming the file and the array or option, no traceback, and no output file.
"""
import io
import pickle
import zipfile

import numpy as np
import pytest

from ntpref.checks import MAX_STEPS
from ntpref.cli import main
from ntpref.errors import InfeasibleError, InputError
from ntpref.oracle import contract
from ntpref.npzio import load_npz, save_npz
from ntpref import shallow
from ntpref.shallow import indrnn
from ntpref import twostage
from ntpref.twostage import Dataset, check_realizable, five_token_example

from small_inputs import indrnn_eval, shallow_eval, train_of, twostage_eval, twostage_train


# ---- valid inputs of every model ---------------------------------------------------------------------

VALID = {"twostage eval": ("eval", twostage_eval), "twostage train": ("train", twostage_train),
         "shallow eval": ("eval", shallow_eval), "shallow train": ("train", lambda: train_of(shallow_eval())),
         "indrnn eval": ("eval", indrnn_eval), "indrnn train": ("train", lambda: train_of(indrnn_eval()))}


def run_cli(tmp_path, capsys, kind, arrays=None, raw=None):
    """Write the input (np.savez, so object arrays get in), run ntpref KIND in-process: (status, stderr)."""
    inp, out = tmp_path / "in.npz", tmp_path / "out.npz"
    if raw is not None:
        inp.write_bytes(raw)
    else:
        np.savez(inp, **arrays)
    out.unlink(missing_ok=True)
    capsys.readouterr()
    status = main([kind, str(inp), "-o", str(out), "-q"])
    err = capsys.readouterr().err
    return status, err, out.exists()


def assert_rejected(tmp_path, capsys, kind, arrays=None, *needles, raw=None):
    status, err, written = run_cli(tmp_path, capsys, kind, arrays, raw=raw)
    assert status == 2, err
    assert err.count("\n") == 1 and err.startswith("ntpref: error: "), err
    assert "internal error" not in err and "Traceback" not in err
    assert str(tmp_path / "in.npz") in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    assert not written
    return err


@pytest.mark.parametrize("case", sorted(VALID))
def test_valid_inputs_run(case, tmp_path, capsys):
    kind, make = VALID[case]
    status, err, written = run_cli(tmp_path, capsys, kind, make())
    assert status == 0 and written and err == "", err


# ---- names: missing, unknown, misspelled; model name -----------------------------------------------------

@pytest.mark.parametrize("case", sorted(VALID))
def test_missing_unknown_misspelled_arrays(case, tmp_path, capsys):
    kind, make = VALID[case]
    good = make()
    for name in sorted(set(good) - {"model"}):
        missing = {k: v for k, v in good.items() if k != name}
        if name in ("K", "succ") and kind == "eval":
            continue  # optional / alternative
        assert_rejected(tmp_path, capsys, kind, missing, f"'{name}'")
        typo = {**missing, name.swapcase(): good[name]}
        assert_rejected(tmp_path, capsys, kind, typo, f"unknown array '{name.swapcase()}'", f"did you mean '{name}'")
    assert_rejected(tmp_path, capsys, kind, {**good, "extra": np.array(1.0)}, "unknown array 'extra'")


def test_model_name(tmp_path, capsys):
    good = shallow_eval()
    assert_rejected(tmp_path, capsys, "eval", {**good, "model": np.array("transformer")},
                    "unknown model 'transformer'", "twostage")
    assert_rejected(tmp_path, capsys, "eval", {k: v for k, v in good.items() if k != "model"}, "missing array 'model'")
    assert_rejected(tmp_path, capsys, "eval", {**good, "model": np.array(["shallow"])}, "'model'", "0-d")
    assert_rejected(tmp_path, capsys, "eval", {**good, "model": np.array(3)}, "'model'", "string")


# ---- dtype, shape, rank -------------------------------------------------------------------------------------

def test_dtype_shape_rank(tmp_path, capsys):
    ts = twostage_eval()
    assert_rejected(tmp_path, capsys, "eval", {**ts, "tokens": ts["tokens"].astype(float)}, "'tokens'", "integers")
    assert_rejected(tmp_path, capsys, "eval", {**ts, "targets": ts["targets"].astype(np.float32)}, "'targets'")
    assert_rejected(tmp_path, capsys, "eval", {**ts, "W_kq": ts["W_kq"].astype(complex)}, "'W_kq'", "real")
    assert_rejected(tmp_path, capsys, "eval", {**ts, "W_ov": np.zeros((4, 4))}, "'W_ov'", "[5, 5]")
    assert_rejected(tmp_path, capsys, "eval", {**ts, "lengths": ts["lengths"][:-1]}, "'lengths'", "shape")
    assert_rejected(tmp_path, capsys, "eval", {**ts, "K": np.array(5.0)}, "'K'", "integer")
    sh = shallow_eval()
    assert_rejected(tmp_path, capsys, "eval", {**sh, "X": sh["X"][0]}, "'X'", "[*, *, *]")
    assert_rejected(tmp_path, capsys, "eval", {**sh, "W": sh["W"][:, :2]}, "'W'", "[4, 3, 3]")
    assert_rejected(tmp_path, capsys, "eval", {**sh, "U": np.array(["a", "b"])}, "'U'", "real numbers")
    assert_rejected(tmp_path, capsys, "eval", {**sh, "kappa": np.array([2.0])}, "'kappa'", "0-d")
    assert_rejected(tmp_path, capsys, "eval", {**sh, "activation": np.array("relu")}, "relu")
    assert_rejected(tmp_path, capsys, "eval", {**sh, "mask_last_key": np.array(2)}, "'mask_last_key'")
    rn = indrnn_eval()
    assert_rejected(tmp_path, capsys, "eval", {**rn, "u": rn["u"][:3]}, "'u'", "[4]")
    assert_rejected(tmp_path, capsys, "eval", {**rn, "W_in": rn["W_in"].astype(bool)}, "'W_in'", "bool")
    assert_rejected(tmp_path, capsys, "eval", {**rn, "tau_att": np.array(1.0)}, "unknown array 'tau_att'")


# ---- ranges: ids, targets, lengths, padding --------------------------------------------------------------

def test_ids_targets_lengths_padding(tmp_path, capsys):
    ts = twostage_eval()
    tokens = ts["tokens"].copy()
    tokens[0, 0] = 5
    assert_rejected(tmp_path, capsys, "eval", {**ts, "tokens": tokens}, "'tokens'", "value 5", "above 4")
    tokens[0, 0] = -2
    assert_rejected(tmp_path, capsys, "eval", {**ts, "tokens": tokens}, "'tokens'", "below -1")
    targets = ts["targets"].copy()
    targets[1] = 7
    assert_rejected(tmp_path, capsys, "eval", {**ts, "targets": targets}, "'targets'", "value 7")
    lengths = ts["lengths"].copy()
    lengths[0] = 0
    assert_rejected(tmp_path, capsys, "eval", {**ts, "lengths": lengths}, "'lengths'", "below 1")
    lengths[0] = ts["tokens"].shape[1] + 1
    assert_rejected(tmp_path, capsys, "eval", {**ts, "lengths": lengths}, "'lengths'", "above")
    # padding that disagrees with the lengths, both ways (one more padding column, so Lmax = 4)
    padded = {**ts, "tokens": np.pad(ts["tokens"], ((0, 0), (0, 1)), constant_values=-1)}
    assert run_cli(tmp_path, capsys, "eval", padded)[0] == 0  # sanity: the padded input itself is fine
    longer = ts["lengths"].copy()
    longer[2] += 1
    assert_rejected(tmp_path, capsys, "eval", {**padded, "lengths": longer}, "'tokens'", "sentence 2", "padding -1")
    shorter = ts["lengths"].copy()
    shorter[3] -= 1
    assert_rejected(tmp_path, capsys, "eval", {**padded, "lengths": shorter}, "'tokens'", "sentence 3",
                    "past its length")
    succ = ts["succ"].copy()
    succ[0] = 9
    assert_rejected(tmp_path, capsys, "eval", {**ts, "succ": succ}, "'succ'", "value 9")


# ---- NaN / inf anywhere --------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", sorted(VALID))
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_anywhere(case, bad, tmp_path, capsys):
    kind, make = VALID[case]
    good = make()
    for name, value in good.items():
        a = np.asarray(value)
        if a.dtype.kind != "f" or a.size == 0:
            continue
        a = a.copy()
        a.reshape(-1)[a.size // 2] = bad
        assert_rejected(tmp_path, capsys, kind, {**good, name: a}, f"'{name}'", "finite")


# ---- options: step sizes, step counts, radii, paired init ----------------------------------------------------

def test_step_sizes_counts_radii(tmp_path, capsys):
    tt = twostage_train()
    for name, value, needle in (("eta0", 0.0, "> 0"), ("eta", -0.1, "> 0"), ("T", -1, ">= 0"),
                                ("T0", -3, ">= 0"), ("T", MAX_STEPS + 1, f"<= {MAX_STEPS}"), ("T0", 2.5, "integer")):
        assert_rejected(tmp_path, capsys, "train", {**tt, name: np.array(value)}, f"'{name}'", needle)
    assert_rejected(tmp_path, capsys, "train", {**tt, "direction": np.array("fast")}, "'direction'", "stable")
    for base in (shallow_eval(), indrnn_eval()):
        st = train_of(base)
        for name, value, needle in (("eta", 0.0, "> 0"), ("eta", -1.0, "> 0"), ("steps", 0, ">= 1"),
                                    ("steps", -5, ">= 1"), ("steps", 10 ** 12, f"<= {MAX_STEPS}")):
            assert_rejected(tmp_path, capsys, "train", {**st, name: np.array(value)}, f"'{name}'", needle)
        assert_rejected(tmp_path, capsys, "train", {**st, "rho": np.array([1.0, -0.5, 1.0])}, "'rho'", ">= 0")
        assert_rejected(tmp_path, capsys, "train", {**st, "rho": np.array([1.0, 1.0])}, "'rho'", "[3]")
        assert_rejected(tmp_path, capsys, "train", {**st, "batch": np.array(0), "seed": np.array(1)}, "'batch'")
        assert_rejected(tmp_path, capsys, "train", {**st, "batch": np.array(2)}, "'seed'")
        assert_rejected(tmp_path, capsys, "train", {**st, "X_val": st["X"]}, "'y_val'")


def test_library_options():
    with pytest.raises(InputError, match="even width"):
        shallow.paired_init(5, 3, seed=0)
    with pytest.raises(InputError, match="even width"):
        indrnn.paired_init(3, 2, seed=0)
    with pytest.raises(InputError, match="'m'"):
        shallow.paired_init(0, 3, seed=0)
    sh = shallow_eval()
    data, params = shallow.prepare(sh["X"], sh["y"]), (sh["c"], sh["U"], sh["W"])
    with pytest.raises(InputError, match="'rho'.*>= 0"):
        shallow.train(data, params, eta=0.1, steps=2, rho=(1.0, -1.0, 1.0))
    with pytest.raises(InputError, match="'eta'.*> 0"):
        shallow.train(data, params, eta=0.0, steps=2)
    with pytest.raises(InputError, match="'steps'.*>= 1"):
        shallow.train(data, params, eta=0.1, steps=0)
    with pytest.raises(InputError, match=r"^data: expected prepared data \(ntpref.shallow.prepare or "
                                         r"ntpref.shallow.indrnn.prepare\), got numpy.ndarray$"):
        shallow.train(sh["X"], params, eta=0.1, steps=2)
    with pytest.raises(InputError, match="'tau_att'.*> 0"):
        shallow.prepare(sh["X"], sh["y"], tau_att=0.0)
    with pytest.raises(InputError, match="'kappa'"):
        shallow.loss_and_grad(data, *params, kappa=3.0)
    five = five_token_example()
    for kwargs, name in (({"eta0": 0.0}, "eta0"), ({"eta": -1.0}, "eta"), ({"T": -1}, "'T'"), ({"T0": 1.5}, "T0")):
        with pytest.raises(InputError, match=name):
            twostage.train(five, **kwargs)
    with pytest.raises(InputError, match="backend"):
        twostage.forward(five, np.eye(5), np.eye(5), backend="torch")


# ---- unrealizable and empty datasets -------------------------------------------------------------------------

def cyclic():
    """Query 3: sentence 0 (target n(0) = 2) says 0 > 1, sentence 1 (target n(1) = 0) says 1 > 0: a cycle."""
    succ = np.array([2, 0, 1, -1])                  # n(0) = 2, n(1) = 0, n(2) = 1
    return Dataset.from_sentences([[0, 1, 3], [1, 0, 3]], [2, 0], K=4, succ=succ)


def test_unrealizable_dataset_names_the_cycle(tmp_path, capsys):
    ds = cyclic()
    with pytest.raises(InfeasibleError, match=r"cyclic, q=3: 0 > 1 > 0"):
        check_realizable(ds)
    arrays = {"model": np.array("twostage"), "tokens": ds.tokens, "lengths": ds.lengths, "targets": ds.targets,
              "W_ov": np.zeros((4, 4)), "W_kq": np.zeros((4, 4)), "K": np.array(4), "succ": ds.succ,
              "eta0": np.array(0.1), "eta": np.array(0.1), "T0": np.array(2), "T": np.array(2)}
    assert_rejected(tmp_path, capsys, "train", arrays, "unrealizable", "q=3", "0 > 1 > 0")
    no_optimal = {**arrays, "targets": np.array([3, 0])}   # nothing has successor 3
    assert_rejected(tmp_path, capsys, "train", no_optimal, "unrealizable", "sentence 0", "no token has successor 3")


def test_empty_datasets(tmp_path, capsys):
    ts = twostage_eval()
    empty = {**ts, "tokens": np.zeros((0, 3), dtype=np.int64), "lengths": np.zeros(0, dtype=np.int64),
             "targets": np.zeros(0, dtype=np.int64)}
    assert_rejected(tmp_path, capsys, "eval", empty, "'tokens'", "empty dataset")
    assert_rejected(tmp_path, capsys, "eval", {**ts, "tokens": np.zeros((6, 0), dtype=np.int64)}, "empty dataset")
    for make in (shallow_eval, indrnn_eval):
        base = make()
        assert_rejected(tmp_path, capsys, "eval", {**base, "X": base["X"][:0], "y": base["y"][:0]}, "'X'", "n, T, d >= 1")
        assert_rejected(tmp_path, capsys, "eval", {**base, "X": base["X"][:, :0]}, "'X'", ">= 1")
        no_heads = {b: np.asarray(v)[:0] for b, v in base.items() if b not in ("model", "X", "y")}
        assert_rejected(tmp_path, capsys, "eval", {**base, **no_heads}, "m >= 1")
    with pytest.raises(InputError, match="empty dataset"):
        Dataset.from_sentences([], [], K=3)


# ---- files: not npz, truncated, zip bomb, object arrays, lying headers, raw members ------------------------

class Tripwire:
    """Unpickling this object would create a file: proof that a loader never unpickles."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _npz(arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_files_not_npz_truncated_bomb(tmp_path, capsys):
    good = _npz(shallow_eval())
    assert_rejected(tmp_path, capsys, "eval", None, "not an npz", raw=b"hello, I am text\n")
    assert_rejected(tmp_path, capsys, "eval", None, "not an npz", raw=b"")
    for cut in (10, len(good) // 3, len(good) - 30):
        assert_rejected(tmp_path, capsys, "eval", None, raw=good[:cut])
    npy = io.BytesIO()
    np.save(npy, np.zeros(3))
    assert_rejected(tmp_path, capsys, "eval", None, "not an npz", raw=npy.getvalue())
    # a zip bomb: 64 MiB of zeros deflated to about 64 KiB
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("X.npy", bytes(64 << 20), compresslevel=9)
    assert len(bomb.getvalue()) < 100_000
    assert_rejected(tmp_path, capsys, "eval", None, "'X.npy'", "zip bomb", raw=bomb.getvalue())
    # a lying central directory claiming 4 GiB for a tiny member
    raw = bytearray(good)
    at = raw.find(b"PK\x01\x02")
    raw[at + 24: at + 28] = (2 ** 32 - 1).to_bytes(4, "little")
    assert_rejected(tmp_path, capsys, "eval", None, raw=bytes(raw))
    # one flipped bit in a member's data: CRC mismatch
    raw = bytearray(good)
    with zipfile.ZipFile(io.BytesIO(good)) as zf:
        info = zf.getinfo("X.npy")
    raw[info.header_offset + 30 + len(info.filename) + len(info.extra) + info.file_size - 1] ^= 1
    assert_rejected(tmp_path, capsys, "eval", None, "corrupted", raw=bytes(raw))


def test_object_arrays_never_unpickled(tmp_path, capsys):
    marker = tmp_path / "unpickled"
    evil = np.array([Tripwire(marker), 1], dtype=object)
    assert pickle.loads(pickle.dumps(evil[0])) is not None and marker.exists()   # the tripwire works
    marker.unlink()
    assert_rejected(tmp_path, capsys, "eval", {**shallow_eval(), "c": evil}, "'c'", "unpickling")
    assert not marker.exists()
    with pytest.raises(InputError, match="object arrays"):
        save_npz(tmp_path / "o.npz", {"c": evil})
    assert not marker.exists()


def test_non_npy_member(tmp_path, capsys):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("model.npy", b"shallow")
        zf.writestr("notes.txt", b"hello")
    assert_rejected(tmp_path, capsys, "eval", None, raw=buf.getvalue())
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("model", b"shallow")
    assert_rejected(tmp_path, capsys, "eval", None, "member 'model' is not a .npy array", raw=buf.getvalue())


def test_missing_input_and_unwritable_output(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "nope.npz"), "-o", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nope.npz" in err and "no such file" in err
    save_npz(tmp_path / "in.npz", shallow_eval())
    (tmp_path / "dir.npz").mkdir()
    assert main(["eval", str(tmp_path / "in.npz"), "-o", str(tmp_path / "dir.npz"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dir.npz" in err and "cannot write" in err and "internal" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.npz", "in.npz"]   # no temporary left


@pytest.mark.parametrize("argv", [["eval"], ["eval", "a.npz"], ["eval", "a.npz", "-o", "b.npz", "--backend", "jax"],
                                  ["frobnicate"], ["train", "a.npz", "-o", "b.npz", "--bogus"], []])
def test_usage_errors_are_one_line(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error:" in err, err


# ---- outputs that would overflow float64 are refused, never written as inf / NaN ----------------------------

def test_overflowing_outputs_are_refused(tmp_path, capsys):
    sh = shallow_eval()
    assert_rejected(tmp_path, capsys, "eval", {**sh, "X": sh["X"] * 1e300}, "too large", "float64")
    assert_rejected(tmp_path, capsys, "eval", {**sh, "y": sh["y"] * 1e300}, "output 'loss'", "float64")
    rn = indrnn_eval()
    assert_rejected(tmp_path, capsys, "eval", {**rn, "y": rn["y"] * 1e300}, "output 'loss'")
    tt = twostage_train()
    assert_rejected(tmp_path, capsys, "train", {**tt, "W_ov": np.full((5, 5), 1e300)}, "too large")
    with pytest.raises(InputError, match="output 'f'"):
        contract.evaluate({**sh, "X": sh["X"] * 1e300}, backend="numpy")


def test_twostage_huge_K_does_not_allocate(tmp_path, capsys):
    assert_rejected(tmp_path, capsys, "eval", {**twostage_eval(), "K": np.array(2 ** 40)}, "'W_ov'",
                    f"[{2 ** 40}, {2 ** 40}]")


def test_library_loaders_name_the_file(tmp_path):
    (tmp_path / "bad.npz").write_bytes(b"PK\x03\x04garbage")
    with pytest.raises(InputError, match="bad.npz"):
        load_npz(tmp_path / "bad.npz")
    with pytest.raises(InputError, match="bad.npz"):
        contract.run_file("eval", tmp_path / "bad.npz", tmp_path / "out.npz")
    ds = cyclic()
    save_npz(tmp_path / "cyc.npz", {"model": np.array("twostage"), "tokens": ds.tokens, "lengths": ds.lengths,
                                     "targets": ds.targets, "W_ov": np.zeros((4, 4)), "W_kq": np.zeros((4, 4)),
                                     "K": np.array(4), "succ": ds.succ, "eta0": np.array(0.1), "eta": np.array(0.1),
                                     "T0": np.array(1), "T": np.array(1)})
    with pytest.raises(InfeasibleError, match="cyc.npz: unrealizable"):
        contract.run_file("train", tmp_path / "cyc.npz", tmp_path / "out.npz")
    assert not (tmp_path / "out.npz").exists()


def test_rnn_library_validation():
    rn = indrnn_eval()
    with pytest.raises(InputError, match="'y'.*non-finite"):
        indrnn.prepare(rn["X"], np.full(5, np.nan))
    with pytest.raises(InputError, match="'W_in'.*shape"):
        indrnn.loss_and_grad(indrnn.prepare(rn["X"], rn["y"]), rn["c"], rn["u"], rn["W_in"].T)


@pytest.mark.parametrize("make", [twostage_train, lambda: train_of(shallow_eval()), lambda: train_of(indrnn_eval())])
def test_eval_of_a_train_input_says_to_run_train(tmp_path, capsys, make):
    train_input = make()
    first = sorted(n for n in train_input if n in ("T", "T0", "eta", "eta0", "steps"))[0]
    assert_rejected(tmp_path, capsys, "eval", train_input, f"unknown array '{first}', an input of training: "
                    "run it with 'ntpref train'")


def test_every_missing_array_is_named(tmp_path, capsys):
    good = twostage_train()
    err = assert_rejected(tmp_path, capsys, "train", {k: v for k, v in good.items() if k not in ("eta", "T")})
    assert err.endswith("twostage train input: missing arrays 'eta', 'T'\n"), err
    err = assert_rejected(tmp_path, capsys, "eval", {k: v for k, v in good.items() if k not in ("eta", "T")})
    assert "unknown array 'T0', an input of training" in err


@pytest.mark.parametrize("make", [shallow_eval, indrnn_eval, lambda: train_of(shallow_eval())])
def test_x_in_the_n_d_T_layout_is_said_to_look_transposed(tmp_path, capsys, make):
    good = make()
    kind = "train" if "eta" in good else "eval"
    n, T, d = good["X"].shape
    err = assert_rejected(tmp_path, capsys, kind, {**good, "X": good["X"].transpose(0, 2, 1).copy()},
                          f"X looks transposed: the parameters fit tokens of dimension {d} = X.shape[1]",
                          "X.transpose(0, 2, 1)")
    assert err.count("X looks transposed") == 1


@pytest.mark.parametrize("call, message", [
    (lambda: __import__("ntpref").twostage.Dataset.from_sentences(5, [1], K=3),
     "sentences: expected a list of token-id lists, got int"),
    (lambda: __import__("ntpref").twostage.Dataset.from_sentences([[1, "a"]], [1], K=3),
     r"array 'sentences\[0\]': expected integers"),
    (lambda: __import__("ntpref.oracle.contract").oracle.contract.evaluate(None),
     r"inputs: expected a dict of arrays \(name -> array\), got NoneType"),
    (lambda: __import__("ntpref.oracle.compare").oracle.compare.compare_arrays(None, {}),
     "expected: expected a dict of arrays"),
])
def test_wrong_python_types_are_input_errors_naming_the_argument(call, message):
    """The Python API answers a wrong type with an InputError naming the argument, not a raw TypeError."""
    with pytest.raises(InputError, match=message):
        call()


def test_train_without_parameter_blocks_is_an_input_error():
    from ntpref import shallow

    X = np.random.default_rng(0).standard_normal((4, 3, 2))
    with pytest.raises(InputError, match=r"params: expected the parameter blocks \(c, U, W\), got NoneType"):
        shallow.train(shallow.prepare(X, np.zeros(4)), None, eta=0.1, steps=1)
