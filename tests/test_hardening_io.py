"""Reading and writing npz files at the command line: odd paths, special files, hostile zips, damaged .npy
headers, stale temporaries and file modes. Each case ends in one clear line (exit 2), a correct result,
or an untouched file (ntpref/npzio.py, ntpref/npyheader.py)."""
import io
import os
import re
import signal
import stat
import struct
import subprocess
import sys
import textwrap
import warnings
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.oracle import contract
from ntpref.npzio import MAX_MEMBERS, atomic_write, load_npy, load_npz, save_npz
from ntpref.shallow import iid_init

pytestmark = pytest.mark.skipif(os.name != "posix", reason="FIFOs, symbolic links, umask, SIGKILL")


def shallow_input():
    rng = np.random.default_rng(0)
    c, U, W = iid_init(4, 3, seed=1)
    return {"model": np.array("shallow"), "X": rng.standard_normal((5, 4, 3)), "y": rng.standard_normal(5),
            "c": c, "U": U, "W": W}


@pytest.fixture
def inp(tmp_path):
    path = tmp_path / "in.npz"
    save_npz(path, shallow_input())
    return path


@pytest.fixture
def cli(capsys):
    """Run ``ntpref ARGV`` in-process: (exit status, stderr), after checking the one-line error convention."""
    def run(*argv):
        capsys.readouterr()
        status = main([str(a) for a in argv])
        err = capsys.readouterr().err
        if status == 2:
            assert err.count("\n") == 1 and err.startswith("ntpref: error: "), err
            assert "internal error" not in err and "Traceback" not in err, err
        return status, err
    return run


def listing(folder: Path):
    """Every entry under ``folder`` with its file type (symbolic links not followed)."""
    return sorted((str(p.relative_to(folder)), stat.S_IFMT(p.lstat().st_mode)) for p in folder.rglob("*"))


def npy(descr, shape, data=b"", fortran=False, version=(1, 0), text=None) -> bytes:
    """The bytes of one .npy member; ``text`` replaces the header dict."""
    text = repr({"descr": descr, "fortran_order": fortran, "shape": shape}) if text is None else text
    header = text.encode("latin-1") + b"\n"
    return b"\x93NUMPY" + bytes(version) + struct.pack("<H", len(header)) + header + data


def write_zip(path, members, compression=zipfile.ZIP_STORED):
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w", compression) as zf:
        warnings.simplefilter("ignore")  # zipfile warns about a duplicate name
        for name, data in members:
            zf.writestr(name, data)
    return path


def members_of(arrays):
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    with zipfile.ZipFile(buf) as zf:
        return [(n, zf.read(n)) for n in zf.namelist()]


def expected_eval(arrays, tmp_path, cli):
    """eval's outputs for ``arrays``, through a clean file."""
    save_npz(tmp_path / "clean.npz", arrays)
    assert cli("eval", tmp_path / "clean.npz", "-o", tmp_path / "clean_out.npz", "-q")[0] == 0
    return load_npz(tmp_path / "clean_out.npz")


# ---- 1. outputs that are not regular files ---------------------------------------------------------------

def test_fifo_output_is_refused_and_kept(tmp_path, inp, cli):
    os.mkfifo(tmp_path / "out.npz")
    status, err = cli("eval", inp, "-o", tmp_path / "out.npz", "-q")
    assert status == 2 and "out.npz: cannot write: it is a FIFO, not a regular file" in err
    assert stat.S_ISFIFO(os.lstat(tmp_path / "out.npz").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz", "out.npz"]


def test_character_device_output_is_refused_and_kept(tmp_path, inp, cli):
    if os.geteuid() == 0:  # a private /dev/null, so that a failure could not replace the system's
        dev = tmp_path / "null"
        os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    else:
        dev = Path("/dev/null")
    before = os.lstat(dev)
    status, err = cli("eval", inp, "-o", dev, "-q")
    assert status == 2 and f"{dev}: cannot write: it is a character device, not a regular file" in err
    after = os.lstat(dev)
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_directory_and_socket_outputs_are_refused(tmp_path, inp, cli):
    import socket
    (tmp_path / "d.npz").mkdir()
    assert "d.npz: cannot write: it is a directory" in cli("eval", inp, "-o", tmp_path / "d.npz", "-q")[1]
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "s.npz"))
        assert "s.npz: cannot write: it is a socket" in cli("eval", inp, "-o", tmp_path / "s.npz", "-q")[1]
    (tmp_path / "s.npz").unlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.npz", "in.npz"]


def test_symlink_output_writes_through_to_its_target(tmp_path, inp, cli):
    target = tmp_path / "results" / "target.npz"
    target.parent.mkdir()
    target.write_bytes(b"old")
    os.chmod(target, 0o640)
    os.symlink("results/target.npz", tmp_path / "link.npz")
    assert cli("eval", inp, "-o", tmp_path / "link.npz", "-q")[0] == 0
    assert os.readlink(tmp_path / "link.npz") == "results/target.npz"      # still the same link
    assert stat.S_IMODE(target.stat().st_mode) == 0o640                     # the target's mode kept
    got, want = load_npz(target), contract.evaluate(shallow_input(), backend="auto")   # the command's default
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    assert sorted(p.name for p in target.parent.iterdir()) == ["target.npz"]  # no temporary left


def test_dangling_looping_and_directory_symlink_outputs_are_refused(tmp_path, inp, cli):
    os.symlink("nowhere/missing.npz", tmp_path / "dangling.npz")
    os.symlink("loop_b", tmp_path / "loop_a")
    os.symlink("loop_a", tmp_path / "loop_b")
    (tmp_path / "folder").mkdir()
    os.symlink("folder", tmp_path / "to_dir.npz")
    before = listing(tmp_path)
    status, err = cli("eval", inp, "-o", tmp_path / "dangling.npz", "-q")
    assert status == 2 and "dangling.npz: cannot write (dangling symbolic link to 'nowhere/missing.npz')" in err
    status, err = cli("eval", inp, "-o", tmp_path / "loop_a", "-q")
    assert status == 2 and "loop_a: cannot write (symbolic link loop)" in err
    status, err = cli("eval", inp, "-o", tmp_path / "to_dir.npz", "-q")
    assert status == 2 and "to_dir.npz: cannot write: it is a directory, not a regular file" in err
    assert listing(tmp_path) == before


# ---- 2. duplicate members ---------------------------------------------------------------------------------

@pytest.mark.parametrize("second", ["W.npy", "W"])
def test_an_array_stored_twice_is_refused(tmp_path, cli, second):
    members = members_of(shallow_input())
    w = dict(members)["W.npy"]
    other = npy("<f8", (4, 3, 3), np.ones(36).tobytes())        # the last would have won, silently
    path = write_zip(tmp_path / "dup.npz", members + [(second, other)])
    assert w != other
    status, err = cli("eval", path, "-o", tmp_path / "out.npz", "-q")
    assert status == 2 and f"dup.npz: array 'W' is stored twice (members 'W.npy' and '{second}')" in err
    assert not (tmp_path / "out.npz").exists()


# ---- 3. sizes are budgeted before anything is decompressed ------------------------------------------------

def test_many_members_are_refused_before_any_is_read(tmp_path, cli, monkeypatch):
    path = write_zip(tmp_path / "many.npz", [(f"m{i}.npy", bytes(1 << 20)) for i in range(1000)],
                     zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 2 << 20                                   # 1000 MiB in about 1 MB

    def no_reading(*args, **kwargs):
        raise AssertionError("a member was opened")

    monkeypatch.setattr(zipfile.ZipFile, "open", no_reading)
    status, err = cli("compare", path, path)
    assert status == 2 and f"many.npz: 1000 members, more than the {MAX_MEMBERS} an npz file may hold" in err


def test_memory_budget_counts_all_members_and_can_be_raised(tmp_path, cli, monkeypatch):
    path = tmp_path / "two.npz"
    save_npz(path, {"a": np.zeros(200), "b": np.zeros(200)})               # 2 x 1728 bytes with headers
    monkeypatch.setenv("NTPREF_MAX_NPZ_BYTES", "3K")
    status, err = cli("compare", path, path)
    assert status == 2 and ("two.npz: its arrays take 3456 bytes decompressed, more than the memory budget of "
                            "3072 bytes (set NTPREF_MAX_NPZ_BYTES") in err
    monkeypatch.setenv("NTPREF_MAX_NPZ_BYTES", "4K")
    assert cli("compare", path, path)[0] == 0
    monkeypatch.setenv("NTPREF_MAX_NPZ_BYTES", "lots")
    status, err = cli("compare", path, path)
    assert status == 2 and "NTPREF_MAX_NPZ_BYTES='lots': expected a number of bytes such as 8G" in err


@pytest.mark.parametrize("descr", ["|V0", "|S0", "<U0"])
def test_zero_byte_items_are_refused(tmp_path, cli, descr):
    path = write_zip(tmp_path / "v0.npz", [("a.npy", npy(descr, (2 * 10 ** 9,)))])
    assert path.stat().st_size < 300
    status, err = cli("compare", path, path)
    assert status == 2 and f"v0.npz: array 'a' (member 'a.npy'): dtype '{descr}' has zero-byte items" in err
    with pytest.raises(InputError, match="array 'a': dtype '|V0' has zero-byte items"):
        save_npz(tmp_path / "w.npz", {"a": np.zeros(3, dtype="V0")})
    with pytest.raises(InputError, match=f"{MAX_MEMBERS + 1} arrays, more than the {MAX_MEMBERS}"):
        save_npz(tmp_path / "w.npz", {f"a{i}": np.zeros(1) for i in range(MAX_MEMBERS + 1)})
    assert not (tmp_path / "w.npz").exists()


# ---- 4. compressible but legitimate files are read; real bombs are not ------------------------------------

def test_compressed_zero_weights_at_K_1000_are_accepted(tmp_path, cli):
    K = 1000
    arrays = {"model": np.array("twostage"), "tokens": np.array([[0, 1, 2], [3, 4, -1]]), "lengths": np.array([3, 2]),
              "targets": np.array([3, 5]), "W_ov": np.zeros((K, K)), "W_kq": np.zeros((K, K)), "K": np.array(K)}
    np.savez_compressed(tmp_path / "zeros.npz", **arrays)
    with zipfile.ZipFile(tmp_path / "zeros.npz") as zf:
        info = zf.getinfo("W_ov.npy")
    assert info.file_size > 1000 * info.compress_size                  # what the old ratio limit refused
    status, err = cli("eval", tmp_path / "zeros.npz", "-o", tmp_path / "out.npz", "-q")
    assert status == 0, err
    got, want = load_npz(tmp_path / "out.npz"), contract.evaluate(arrays)
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    np.testing.assert_allclose(got["loss"], np.log(K), rtol=1e-15)       # uniform logits: loss = log K


def test_member_padded_with_compressed_zeros_is_refused_as_a_bomb(tmp_path, cli):
    data = npy("<f8", (3,), np.ones(3).tobytes()) + bytes(16 << 20)
    path = write_zip(tmp_path / "bomb.npz", [("x.npy", data)], zipfile.ZIP_DEFLATED)
    status, err = cli("compare", path, path)
    assert status == 2
    assert ("bomb.npz: array 'x' (member 'x.npy'): 16777216 unexpected bytes after its data (float64 [3]) "
            "(it expands") in err and "x: zip bomb?)" in err


# ---- 5. temporaries of a killed writer ---------------------------------------------------------------------

KILLED_WRITER = textwrap.dedent("""
    import os, signal, sys
    from ntpref.npzio import atomic_write

    def write(fh):
        fh.write(b"PK\\x03\\x04 half a file")
        fh.flush()
        os.kill(os.getpid(), signal.{signal})

    atomic_write(sys.argv[1], write)
""")


@pytest.mark.parametrize("sig", ["SIGKILL", "SIGTERM"])
def test_next_write_removes_stale_temporaries_of_its_own_name_only(tmp_path, inp, cli, sig):
    out = tmp_path / "out.npz"
    proc = subprocess.run([sys.executable, "-c", KILLED_WRITER.format(signal=sig), str(out)], cwd=tmp_path)
    assert proc.returncode == -getattr(signal, sig)
    stale = [p.name for p in tmp_path.glob(".out.npz.*.tmp")]
    assert len(stale) == 1 and not out.exists()
    # look-alikes that are not this output's temporaries, or not regular files, are left alone
    (tmp_path / ".other.npz.abcd1234.tmp").write_bytes(b"another output's")
    (tmp_path / ".out.npz.abcd1234.tmp.keep").write_bytes(b"not the pattern")
    (tmp_path / ".out.npz.dirdirdi.tmp").mkdir()
    (tmp_path / "victim").write_bytes(b"keep me")
    os.symlink("victim", tmp_path / ".out.npz.linklink.tmp")
    assert cli("eval", inp, "-o", out, "-q")[0] == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".other.npz.abcd1234.tmp", ".out.npz.abcd1234.tmp.keep", ".out.npz.dirdirdi.tmp", ".out.npz.linklink.tmp",
        "in.npz", "out.npz", "victim"]
    assert (tmp_path / "victim").read_bytes() == b"keep me"
    assert set(load_npz(out)) == set(contract.evaluate(shallow_input()))


LIVE_WRITER = textwrap.dedent("""
    import sys
    from ntpref.npzio import atomic_write

    def write(fh):
        fh.write(b"from the slow writer")
        fh.flush()
        print("writing", flush=True)
        sys.stdin.readline()            # hold the temporary until told to finish

    atomic_write(sys.argv[1], write)
""")


def test_a_live_writers_temporary_is_not_removed(tmp_path):
    out = tmp_path / "out.txt"
    proc = subprocess.Popen([sys.executable, "-c", LIVE_WRITER, str(out)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "writing\n"
        live = list(tmp_path.glob(".out.txt.*.tmp"))
        assert len(live) == 1
        atomic_write(out, lambda fh: fh.write(b"from the quick writer"))
        assert live[0].exists() and out.read_bytes() == b"from the quick writer"
    finally:
        proc.communicate("go\n", timeout=60)
    assert proc.returncode == 0 and out.read_bytes() == b"from the slow writer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


# ---- 6. file modes follow the umask; an overwritten file keeps its mode ------------------------------------

@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600), (0o002, 0o664)],
                         ids=["022", "027", "077", "002"])
def test_new_outputs_follow_the_umask(tmp_path, inp, cli, umask, mask, mode):
    from ntpref.sweep import run_sweep

    umask(mask)
    assert cli("eval", inp, "-o", tmp_path / "new" / "out.npz", "-q")[0] == 0
    assert stat.S_IMODE((tmp_path / "new" / "out.npz").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o777 & ~mask      # a directory it created
    run_sweep(_cell, [{"x": 2.0}], tmp_path / "sweep")
    (cell,) = (tmp_path / "sweep").glob("*.npz")
    assert stat.S_IMODE(cell.stat().st_mode) == mode and load_npz(cell)["y"] == 4.0


def _cell(x):
    return {"y": np.array(x * x)}


@pytest.mark.parametrize("mode", [0o604, 0o640, 0o444], ids=["604", "640", "444"])
def test_overwritten_output_keeps_its_mode(tmp_path, inp, cli, umask, mode):
    umask(0o077)
    out = tmp_path / "out.npz"
    out.write_bytes(b"old")
    os.chmod(out, mode)
    assert cli("eval", inp, "-o", out, "-q")[0] == 0
    assert stat.S_IMODE(out.stat().st_mode) == mode and "loss" in load_npz(out)


# ---- 7. inputs that are not regular files ------------------------------------------------------------------

def test_input_directory_device_and_links_say_what_they_are(tmp_path, cli):
    (tmp_path / "d.npz").mkdir()
    os.symlink("loop_b", tmp_path / "loop_a")
    os.symlink("loop_a", tmp_path / "loop_b")
    os.symlink("gone.npz", tmp_path / "dangling.npz")
    (tmp_path / "afile").write_bytes(b"x")
    out = tmp_path / "out.npz"
    cases = {tmp_path / "d.npz": "d.npz: is a directory, not an npz file",
             Path("/dev/zero"): "/dev/zero: is a character device, not an npz file",
             tmp_path / "loop_a": "loop_a: symbolic link loop",
             tmp_path / "dangling.npz": "dangling.npz: dangling symbolic link to 'gone.npz'",
             tmp_path / "afile" / "x.npz": "x.npz: no such file ('" + str(tmp_path / "afile") + "' is a regular file, "
                                                                                          "not a directory)",
             tmp_path / "nope.npz": "nope.npz: no such file"}
    for path, message in cases.items():
        for argv in (("eval", path, "-o", out, "-q"), ("compare", path, path)):
            status, err = cli(*argv)
            assert status == 2 and message in err, (argv, err)
    assert cli("eval", "", "-o", out)[1] == "ntpref: error: input file name is empty\n"
    assert not out.exists()


def test_fifo_input_is_refused_without_blocking(tmp_path):
    os.mkfifo(tmp_path / "in.npz")
    # a reader that opened the FIFO would wait for a writer forever: the timeout (TimeoutExpired) catches it
    proc = subprocess.run([sys.executable, "-m", "ntpref.cli", "eval", "in.npz", "-o", "out.npz", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr == "ntpref: error: in.npz: is a FIFO, not an npz file\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.npz"]


# ---- 8. damaged .npy headers say what is wrong ------------------------------------------------------------

GOOD_X = np.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("member, message", [
    (npy("<f8", (2, 3), GOOD_X.tobytes())[:20], "the 58-byte .npy header is truncated (10 of 58 bytes)"),
    (npy("<f8", (2, 3), GOOD_X.tobytes())[:5], "the .npy header is truncated (5 of 8 bytes)"),
    (npy("<f8", (2, 3), GOOD_X.tobytes())[:8] + struct.pack("<H", 60000) + npy("<f8", (2, 3))[10:],
     "the 60000-byte .npy header is truncated"),
    (npy("<f8", (2, -3), GOOD_X.tobytes()), "the .npy header's shape (2, -3) has a negative dimension"),
    (npy("<f8", (2.0, 3), GOOD_X.tobytes()), "the .npy header's shape (2.0, 3) is not a tuple of integers"),
    (npy(None, None, text="{'descr': '<f8', 'shape': (2, 3)"), "the .npy header is not a Python dict literal"),
    (npy(None, None, text="[1, 2, 3]"), "the .npy header is a list, not a dict of 'descr', 'fortran_order'"),
    (npy(None, None, text="{'descr': '<f8', 'shape': (2, 3)}"),
     "the .npy header holds 'descr', 'shape'; expected exactly 'descr', 'fortran_order' and 'shape'"),
    (npy("<f7", (2, 3), GOOD_X.tobytes()), "the .npy header's descr '<f7' is not a NumPy dtype"),
    (npy("<f8", (2, 3), GOOD_X.tobytes(), fortran="no"), "the .npy header's fortran_order 'no' is not True or False"),
    (npy("<f8", (2, 3), GOOD_X.tobytes(), version=(9, 0)), "unsupported .npy format version 9.0"),
    (npy("<f8", (2, 3), GOOD_X.tobytes()[:40]),
     "truncated: its header describes float64 [2, 3], 48 bytes of data, but only 40 follow"),
    (npy("<f8", (4, 3), GOOD_X.tobytes()), "truncated: its header describes float64 [4, 3], 96 bytes of data"),
    (npy("|O", (2,), b"\x80\x04N."), "dtype object: object arrays cannot be written without pickle nor read "
                                      "without unpickling"),
    (b"just some bytes", "not a .npy array (it does not start with the .npy magic string)"),
    (npy("<f8", (0, 2 ** 62)), "the .npy header's shape (0, 4611686018427387904) of float64 is larger than any "
                               "array can be (its nonzero sizes times the item size pass 9223372036854775807 "
                               "bytes, even when a size is 0)"),
    (npy("|u1", (0, 2 ** 40, 2 ** 40)), "the .npy header's shape (0, 1099511627776, 1099511627776) of uint8 is "
                                        "larger than any array can be"),
], ids=["cut_header", "cut_magic", "lying_length", "negative_shape", "float_shape", "garbage", "list", "missing_key",
        "bad_descr", "bad_fortran_order", "version", "short_data", "lying_shape", "object", "no_magic",
        "absurd_empty_shape", "absurd_empty_bytes"])
def test_damaged_headers_say_what_is_wrong(tmp_path, cli, member, message):
    members = [(n, member if n == "X.npy" else data) for n, data in members_of(shallow_input())]
    path = write_zip(tmp_path / "bad.npz", members)
    status, err = cli("eval", path, "-o", tmp_path / "out.npz", "-q")
    assert status == 2 and f"bad.npz: array 'X' (member 'X.npy'): {message}" in err
    assert not (tmp_path / "out.npz").exists()


def test_a_single_npy_file_gets_the_same_header_checks(tmp_path):
    """load_npy (``{output_dir}`` of a command adapter) refuses a zero-byte array of absurd shape as load_npz
    does, and still reads the largest empty shape NumPy represents."""
    (tmp_path / "absurd.npy").write_bytes(npy("<f8", (0, 2 ** 62)))
    with pytest.raises(InputError, match=re.escape(f"{tmp_path / 'absurd.npy'}: the .npy header's shape (0, "
                                                   "4611686018427387904) of float64 is larger than any array can be")):
        load_npy(tmp_path / "absurd.npy")
    (tmp_path / "empty.npy").write_bytes(npy("<f8", (0, 2 ** 59)))
    assert load_npy(tmp_path / "empty.npy").shape == (0, 2 ** 59)


def test_fortran_order_and_big_endian_members_are_read_as_numpy_does(tmp_path, cli):
    arrays = {**shallow_input()}
    arrays["X"] = np.asfortranarray(arrays["X"])
    arrays["y"] = arrays["y"].astype(">f8")
    np.savez(tmp_path / "f.npz", **arrays)
    got = load_npz(tmp_path / "f.npz")
    with np.load(tmp_path / "f.npz") as ref:
        for k in arrays:
            assert got[k].dtype == ref[k].dtype and np.array_equal(got[k], ref[k])
    assert got["X"].flags.f_contiguous
    want = expected_eval(shallow_input(), tmp_path, cli)
    assert cli("eval", tmp_path / "f.npz", "-o", tmp_path / "out.npz", "-q")[0] == 0
    got = load_npz(tmp_path / "out.npz")
    assert all(np.array_equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("version", [(1, 0), (2, 0), (3, 0)])
def test_npy_format_versions_are_read(tmp_path, version):
    x = np.arange(12.0).reshape(3, 4)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NumPy warns that version 2.0/3.0 files need NumPy >= 1.9/1.17
        np.lib.format.write_array(buf, x, version=version)
    path = write_zip(tmp_path / "v.npz", [("x.npy", buf.getvalue())], zipfile.ZIP_DEFLATED)
    got = load_npz(path)["x"]
    assert got.dtype == np.float64 and np.array_equal(got, x)


# ---- 9. bytes after an array's data -------------------------------------------------------------------

@pytest.mark.parametrize("extra", [b"\0", b"trailing garbage", bytes(4096)])
def test_trailing_bytes_after_an_arrays_data_are_refused(tmp_path, cli, extra):
    members = [(n, data + extra if n == "y.npy" else data) for n, data in members_of(shallow_input())]
    path = write_zip(tmp_path / "t.npz", members, zipfile.ZIP_DEFLATED)
    status, err = cli("eval", path, "-o", tmp_path / "out.npz", "-q")
    assert status == 2 and f"t.npz: array 'y' (member 'y.npy'): {len(extra)} unexpected bytes after its data (float64 [5])" in err


# ---- 10. output names that cannot be files ------------------------------------------------------------

def test_output_names_that_cannot_be_files(tmp_path, inp, cli):
    (tmp_path / "afile").write_bytes(b"x")
    before = listing(tmp_path)
    assert cli("eval", inp, "-o", "", "-q")[1] == "ntpref: error: output file name is empty\n"
    status, err = cli("eval", inp, "-o", f"{tmp_path}/newdir/", "-q")
    assert status == 2 and "newdir/: output file name ends with '/': give a file, not a directory" in err
    for out in (tmp_path / "afile" / "out.npz", tmp_path / "afile" / "deeper" / "out.npz"):
        status, err = cli("eval", inp, "-o", out, "-q")
        assert status == 2 and f"{out}: cannot write: '{tmp_path / 'afile'}' is a regular file, not a directory" in err
    assert listing(tmp_path) == before


def test_failed_write_removes_the_directories_it_created(tmp_path, inp, cli, monkeypatch):
    (tmp_path / "exists").mkdir()
    before = listing(tmp_path)

    def disk_full(fh, **arrays):
        fh.write(b"PK\x03\x04 half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", disk_full)
    out = tmp_path / "exists" / "new" / "deeper" / "out.npz"
    status, err = cli("eval", inp, "-o", out, "-q")
    assert status == 2 and f"{out}: cannot write (No space left on device)" in err
    assert listing(tmp_path) == before
