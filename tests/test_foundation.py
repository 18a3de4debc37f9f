"""Foundation: validation helpers, npz I/O and the command line's error contract."""
import gc
import subprocess
import sys

import numpy as np
import pytest

from ntpref.checks import as_float, as_int, as_scalar, check_names
from ntpref.cli import main
from ntpref.errors import InputError
from ntpref.npzio import load_npz, save_npz


def test_as_float_rejects_nan_and_wrong_shape():
    with pytest.raises(InputError, match="'W'.*non-finite"):
        as_float("W", [[1.0, np.nan]])
    with pytest.raises(InputError, match=r"'W'.*expected shape \[2, \*\]"):
        as_float("W", np.zeros((3, 2)), (2, None))
    a = as_float("W", np.arange(6, dtype=np.int32).reshape(2, 3)[:, ::2])
    assert a.dtype == np.float64 and a.flags.c_contiguous and a.tolist() == [[0, 2], [3, 5]]


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_as_float_finds_one_non_finite_value_anywhere(bad):
    """The finiteness check is a vectorised loop: one bad entry is found at every position of vectors
    whose lengths leave every remainder after the vector width, and in a 3-d array it is located."""
    for n in range(1, 40):
        for i in range(n):
            a = np.ones(n)
            a[i] = bad
            with pytest.raises(InputError, match=rf"^array 'v': non-finite value {bad} at index \({i},\)$"):
                as_float("v", a)
    a = np.zeros((3, 4, 5))
    a[2, 1, 3] = bad
    with pytest.raises(InputError, match=rf"^array 'X': non-finite value {bad} at index \(2, 1, 3\)$"):
        as_float("X", a)


def test_as_float_accepts_every_finite_extreme():
    f = np.finfo(np.float64)
    a = np.array([f.max, -f.max, f.tiny, f.smallest_subnormal, -0.0, 0.0, 1.0])
    assert as_float("v", a) is a


def test_as_int_rejects_floats_and_range():
    with pytest.raises(InputError, match="'tokens'.*integers"):
        as_int("tokens", np.array([1.0, 2.0]))
    with pytest.raises(InputError, match=r"'tokens'.*value 7 at index \(1,\) is above 4"):
        as_int("tokens", [0, 7], high=4)


def test_as_scalar_kinds():
    assert as_scalar("eta", np.array(0.5)) == 0.5
    assert as_scalar("model", np.array("shallow"), kind="str") == "shallow"
    with pytest.raises(InputError, match="'eta'.*> 0"):
        as_scalar("eta", 0.0, low=0, low_open=True)
    with pytest.raises(InputError, match="0-d"):
        as_scalar("T", np.array([1, 2]), kind="int")


def test_check_names_suggests_typo():
    with pytest.raises(InputError, match="unknown array 'W_KQ'.*did you mean 'W_kq'"):
        check_names({"W_KQ": 1, "W_ov": 1}, ["W_ov"], ["W_kq"])
    with pytest.raises(InputError, match="missing array 'W_ov'"):
        check_names({}, ["W_ov"])


def test_npz_roundtrip_and_refusals(tmp_path):
    p = tmp_path / "a.npz"
    save_npz(p, {"x": np.arange(3.0), "model": np.array("twostage")})
    back = load_npz(p)
    assert back["x"].tolist() == [0.0, 1.0, 2.0] and str(back["model"]) == "twostage"
    assert [f.name for f in tmp_path.iterdir()] == ["a.npz"]  # no temporary left behind
    with pytest.raises(InputError, match="object arrays"):
        save_npz(tmp_path / "b.npz", {"o": np.array([{}, 1], dtype=object)})
    obj = tmp_path / "obj.npz"
    np.savez(obj, o=np.array([{}, 1], dtype=object))
    with pytest.raises(InputError, match="unpickling"):
        load_npz(obj)
    (tmp_path / "text.npz").write_text("not a zip")
    with pytest.raises(InputError, match="not an npz"):
        load_npz(tmp_path / "text.npz")
    raw = p.read_bytes()
    (tmp_path / "trunc.npz").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(InputError):
        load_npz(tmp_path / "trunc.npz")


def test_cli_bad_input_is_one_line_exit_2(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "missing.npz"), "-o", str(tmp_path / "o.npz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.npz" in err
    np.savez(tmp_path / "m.npz", model=np.array("nosuchmodel"))
    assert main(["eval", str(tmp_path / "m.npz"), "-o", str(tmp_path / "o.npz")]) == 2
    assert "unknown model 'nosuchmodel'" in capsys.readouterr().err


def test_console_script_usage_error_exit_2():
    r = subprocess.run([sys.executable, "-m", "ntpref.cli", "eval"], capture_output=True, text=True)
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_the_console_script_returns_mains_status_and_leaves_the_collector_frozen():
    """``ntpref`` is ``cli.command``: main's exit status, then the process's objects frozen for its exit
    (main itself, which tests and embedding programs call, freezes nothing)."""
    code = ("import gc, sys; from ntpref import cli; sys.argv = ['ntpref', *sys.argv[1:]]; "
            "frozen = gc.get_freeze_count(); status = cli.command(); "
            "print(status, frozen, gc.get_freeze_count() > 0, file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code, "eval"], capture_output=True, text=True)
    assert r.stderr.splitlines()[-1] == "2 0 True"
    r = subprocess.run([sys.executable, "-c", code, "--version"], capture_output=True, text=True)
    assert r.stderr.splitlines()[-1] == "0 0 True" and r.stdout.startswith("ntpref ")
    before = gc.get_freeze_count()
    assert main(["--version"]) == 0 and gc.get_freeze_count() == before


def test_progress_throttles_and_prints_completion_once():
    import io

    from ntpref.progress import Progress

    out = io.StringIO()
    p = Progress(every=3600, stream=out)
    for done in range(0, 11):
        p("stage 2", done, 10)
    p("stage 2", 10, 10)
    lines = out.getvalue().splitlines()
    assert [ln.split(" (")[0] for ln in lines] == ["stage 2: 0/10", "stage 2: 10/10"]


def test_progress_prints_first_line_on_a_clock_that_starts_near_zero():
    """perf_counter counts from boot, so on a machine up for less than ``every`` seconds the clock is
    small; the first line must still print, and the throttle then applies from that line."""
    import io

    from ntpref.progress import Progress

    now = [0.5]
    out = io.StringIO()
    p = Progress(every=3600, stream=out, clock=lambda: now[0])
    p("stage 1", 1, 10)
    now[0] = 100.0
    p("stage 1", 2, 10)          # 99.5 s after the first line: throttled
    now[0] = 3601.0
    p("stage 1", 3, 10)          # past `every`: prints
    lines = [ln.split(" (")[0] for ln in out.getvalue().splitlines()]
    assert lines == ["stage 1: 1/10", "stage 1: 3/10"]


def test_progress_estimates_a_resumed_run_from_the_work_done_now():
    """A resumed sweep starts with finished cells counted in ``done``: 30 of 120 at its first call. Its
    first new cell carries the start-up (200 s, no estimate yet); the next two take 100 s, which leaves
    87 cells of 50 s: about 4350 s, not 87 × 300 / 3 nor 87 × 300 / 33."""
    import io

    from ntpref.progress import Progress

    now = [10.0]
    out = io.StringIO()
    p = Progress(every=0, stream=out, clock=lambda: now[0])
    p("sweep", 30, 120)
    now[0] = 210.0
    p("sweep", 31, 120)
    now[0] = 310.0
    p("sweep", 33, 120)
    assert out.getvalue().splitlines() == ["sweep: 30/120 (0.0 s elapsed)", "sweep: 31/120 (200.0 s elapsed)",
                                           "sweep: 33/120 (300.0 s elapsed, ~4350.0 s left)"]
