"""``ntpref conformance`` as a command: usage errors and a damaged or missing reference directory (exit status
2), a JSON report that cannot be written refused before any case runs, the verbose table and the JSON report
of a passing and of a failing run, and a failing report that reads as its table in an assert.
"""
import json
import os
import shutil

import numpy as np

from ntpref.cli import main
from ntpref.npzio import load_npz, save_npz
from ntpref.oracle.manifest import default_root

from conformance_support import ADAPTERS, conformance


def test_usage_errors_exit_2(capsys, tmp_path):
    rc, _, err = conformance(capsys, tmp_path / "missing.py")
    assert (rc, err) == (2, f"ntpref: error: {tmp_path / 'missing.py'}: no such adapter file\n")
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    rc, _, err = conformance(capsys, empty)
    assert (rc, err) == (2, f"ntpref: error: {empty}: defines neither evaluate(model, inputs) nor train(model, inputs)\n")
    broken = tmp_path / "broken.py"
    broken.write_text("import numpy\n\nraise RuntimeError('cannot start')\n")
    rc, _, err = conformance(capsys, broken)
    assert rc == 2
    assert f'  File "{broken}", line 3, in <module>' in err.splitlines()
    assert err.splitlines()[-1] == f"ntpref: error: {broken}: loading the adapter raised RuntimeError: cannot start"
    for args, text in ((["--model", "gpt"], "argument --model: invalid choice: 'gpt'"),
                       (["--random", "-1"], "argument --random: expected a whole number >= 0, got '-1'"),
                       (["--seed", "-3"], "argument --seed: expected a whole number >= 0, got '-3'"),
                       (["--precision", "float16"], "argument --precision: invalid choice: 'float16'")):
        rc, _, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", *args)
        assert rc == 2 and text in err, err


def test_verbose_shows_every_row_and_json_report(capsys, tmp_path):
    rc, quiet, _ = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--no-stored", "--model", "indrnn", "--random", 2)
    assert rc == 0 and "max abs err" not in quiet               # no failures: no table
    report_path = tmp_path / "report.json"
    rc, out, _ = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--no-stored", "--model", "indrnn", "--random", 2,
                             "-v", "--json", report_path)
    assert rc == 0
    rows = [line.split()[:2] for line in out.splitlines() if line.startswith("r0_indrnn")]
    assert rows == [[c, a] for c in ("r0_indrnn_0_eval_paired", "r0_indrnn_1_eval_T1_erf")
                    for a in ("f", "loss", "grad_c", "grad_u", "grad_W_in")]
    doc = json.loads(report_path.read_text())
    assert (doc["ok"], doc["precision"], doc["models"]) == (True, "float64", ["indrnn"])
    assert [c["case"] for c in doc["cases"]] == ["r0_indrnn_0_eval_paired", "r0_indrnn_1_eval_T1_erf"]
    assert all(r["ok"] and r["err/tol"] < 1 for c in doc["cases"] for r in c["rows"])


def test_json_report_of_a_failing_run(capsys, tmp_path):
    path = tmp_path / "report.json"
    rc, _, _ = conformance(capsys, ADAPTERS / "detached_attention.py", "--no-stored", "--model", "twostage",
                           "--json", path)
    assert rc == 1
    doc = json.loads(path.read_text())
    assert doc["ok"] is False
    naive = next(c for c in doc["cases"] if c["case"] == "r0_twostage_2_train_naive")
    assert naive["status"] == "FAIL"
    assert naive["departure"] == {"array": "stage2_loss", "step": 1}
    assert {r["array"] for r in naive["rows"] if not r["ok"]} == {"W_kq", "stage2_loss", "stage2_norm", "stage2_corr"}


def test_damaged_stored_case_exit_2(capsys, tmp_path):
    root = tmp_path / "runs"
    shutil.copytree(default_root(), root)
    expected = load_npz(root / "indrnn_eval" / "expected.npz")
    expected["f"] = expected["f"] * (1 + 1e-6)
    save_npz(root / "indrnn_eval" / "expected.npz", expected)
    rc, _, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--model", "indrnn", "--random", 0, "--root", root)
    assert rc == 2
    assert err == (f"ntpref: error: reference case indrnn_eval/expected.npz: array 'f' bytes differ from the manifest "
                   f"(sha256) ({root})\n")


def test_missing_reference_directory_exit_2(capsys, tmp_path, monkeypatch):
    """A --root (or NTPREF_REFERENCE_RUNS) without cases is refused as by ntpref verify, not run on the random
    cases alone."""
    missing = tmp_path / "missing"
    line = f"ntpref: error: {missing}: no reference cases (manifest.json missing or empty)\n"
    rc, out, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--model", "indrnn", "--random", 1, "--root", missing)
    assert (rc, err) == (2, line)
    assert (main(["verify", "--root", str(missing)]), capsys.readouterr().err) == (2, line)
    assert (main(["verify", "--list", "--root", str(missing)]), capsys.readouterr().err) == (2, line)
    assert (main(["export", "indrnn_eval", "-o", str(tmp_path / "out"), "--root", str(missing)]),
            capsys.readouterr().err) == (2, line)
    monkeypatch.setenv("NTPREF_REFERENCE_RUNS", str(missing))
    rc, out, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--model", "indrnn", "--random", 1)
    assert (rc, err) == (2, line)


def test_a_failing_report_reads_as_its_table_in_an_assert(tmp_path):
    """pytest shows repr() of an assert's message: the docs' ``assert report.ok, report`` shows the table."""
    from ntpref.oracle.conformance import cases, check

    case = next(c for c in cases(models=["shallow"], stored=False) if c.kind == "eval")
    report = check({"evaluate": lambda model, inputs: {"loss": np.array(1e9)}}, case)
    assert not report.ok and repr(report) == str(report)
    assert "loss" in repr(report) and "object at 0x" not in repr(report)


def test_an_unwritable_json_report_is_refused_before_any_case_runs(capsys, tmp_path):
    (tmp_path / "afile").write_text("")
    os.mkfifo(tmp_path / "fifo.json")
    for path, why in ((tmp_path / "afile" / "r.json", "afile' is a regular file, not a directory"),
                      (tmp_path / "fifo.json", "it is a FIFO, not a regular file")):
        rc, out, err = conformance(capsys, ADAPTERS / "oracle_numpy.py", "--no-stored", "--json", path)
        assert rc == 2 and out == "" and why in err and err.count("\n") == 1, err
