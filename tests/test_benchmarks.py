"""The benchmark harness (benchmarks/, ``python -m benchmarks.run``, imported from the repository root): its
outputs and thread counts are checked before anything is timed, its JSON and figure are written atomically,
the process is set up as the ``ntpref`` command's, and its cases, flop counts, slopes, ratios and
implementations are what docs/performance.md states; ntpref itself never imports it.
"""
import ast
import json
import os
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numba
import numpy as np
import pytest

import ntpref
from benchmark_harness import harness as bm
from ntpref import bench

ROOT = Path(__file__).resolve().parent.parent
FIFO_REFUSED = "cannot write: it is a FIFO, not a regular file (only regular files are replaced)"
QUICK = ["--models", "twostage", "--no-torch", "--no-jax", "--no-whole-runs", "-q"]


@pytest.fixture
def configured(monkeypatch):
    """configure_process of the harness recorded instead of changing this process's environment."""
    calls = []
    monkeypatch.setattr(bm.run, "configure_process", lambda: calls.append(True))
    return calls


@pytest.fixture
def no_timing(monkeypatch, configured):
    """bm.timing.run replaced by one that fails the test: whatever is checked must be checked before bm.timing."""
    def timed(*args, **kwargs):
        raise AssertionError("the benchmark ran")
    monkeypatch.setattr(bm.timing, "run", timed)


@pytest.fixture
def threads_restored():
    """Numba's thread count put back after a test that sets it."""
    before = numba.get_num_threads()
    yield
    numba.set_num_threads(before)


def harness(capsys, *argv) -> tuple[int, str]:
    """``python -m benchmarks.run ARGV`` in this process: (exit status, stderr)."""
    capsys.readouterr()
    status = bm.run.main([str(a) for a in argv])
    return status, capsys.readouterr().err


def timing_row(series=None, size=None, implementation=None, threads=1, seconds=0.5, best=0.25):
    """A Timing row of a shallow case (``size`` overrides the paper size; the implementation is ntpref numba
    unless given)."""
    implementation = bm.timing.BASELINE if implementation is None else implementation
    c = bench.case("shallow", series, **(size or {}))
    return bm.timing.Timing(c.label, c.model, series, dict(c.size), implementation, threads, seconds, best, 1e9)


# ---- the command: checks before the run, outputs, set-up ------------------------------------------------

@pytest.mark.parametrize("option", ["--json", "--figure"])
def test_output_that_is_a_fifo_is_refused_before_the_run(option, tmp_path, capsys, no_timing):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    assert harness(capsys, option, fifo, *QUICK) == (2, f"{bm.run.PROG}: error: {fifo}: {FIFO_REFUSED}\n")


@pytest.mark.parametrize("option", ["--json", "--figure"])
def test_output_below_a_file_is_refused_before_the_run(option, tmp_path, capsys, no_timing):
    (tmp_path / "file").write_text("a file")
    target = tmp_path / "file" / "bench.out"
    assert harness(capsys, option, target, *QUICK) == (
        2, f"{bm.run.PROG}: error: {target}: cannot write: '{tmp_path / 'file'}' is a regular file, not a directory\n")


def test_threads_beyond_numba_are_refused(capsys, no_timing):
    limit = numba.config.NUMBA_NUM_THREADS
    status, err = harness(capsys, "--threads", limit + 1, *QUICK)
    assert (status, err) == (2, f"{bm.run.PROG}: error: --threads {limit + 1}: expected 1 to {limit}, the threads "
                                f"Numba runs on this machine ({os.cpu_count()} cores; NUMBA_NUM_THREADS sets "
                                f"another limit)\n")


@pytest.mark.parametrize("option, value", [("--threads", "0"), ("--repeats", "0"), ("--repeats", "1.5")])
def test_counts_below_one_are_usage_errors(option, value, capsys, no_timing):
    with pytest.raises(SystemExit) as exit_:
        bm.run.main([option, value, *QUICK])
    assert exit_.value.code == 2
    assert f"argument {option}: expected a whole number >= 1, got '{value}'" in capsys.readouterr().err


def test_figure_without_scaling_series_is_refused_before_the_run(tmp_path, capsys, no_timing):
    status, err = harness(capsys, "--figure", tmp_path / "bench.png", "--no-scaling", *QUICK)
    assert (status, err) == (2, f"{bm.run.PROG}: error: --figure plots the scaling series, which --no-scaling "
                                "leaves out\n")
    assert list(tmp_path.iterdir()) == []


def test_json_and_figure_replace_the_files_after_the_run(tmp_path, capsys, monkeypatch, configured):
    rows = [timing_row(), *(timing_row("n", {"n": n}, seconds=n * 1e-5) for n in (500, 1000, 2000))]
    seen = []
    monkeypatch.setattr(bm.timing, "run", lambda impls, cases, threads, **kwargs: seen.append((cases, threads)) or rows)
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    out.write_text("an older run")
    assert harness(capsys, "--json", out, "--figure", png, "--threads", "1", "--quick", *QUICK) == (0, "")
    assert configured == [True]
    document = json.loads(out.read_text())
    assert document["rows"] == [asdict(r) for r in rows] and document["extras"] == {}
    assert set(document["machine"]) >= {"cpu", "cores", "python", "numpy", "numba"}
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "bench.png"]
    (timed_cases, threads), = seen
    assert threads == [1]
    assert [c.label for c in timed_cases] == [c.label for c in bench.paper_cases(["twostage"])] + [
        c.label for c in bm.cases.scaling_cases(3) if c.model == "twostage"]


def test_the_command_runs_from_the_repository_root(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.run", *QUICK, "--no-scaling", "--no-numpy", "--threads",
                           "1", "--repeats", "2", "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "| twostage K=20 N=200 | ntpref numba" in proc.stdout
    (row,) = json.loads(out.read_text())["rows"]
    paper = bench.case("twostage")
    assert (row["implementation"], row["threads"]) == (bm.timing.BASELINE, 1)
    assert row["flops"] == bm.cases.flops(paper, bench.make_inputs(paper)) and 0 < row["best"] <= row["seconds"]


def test_ntpref_never_imports_the_harness():
    """The harness is not installed: no module of ntpref imports benchmarks, scripts or examples."""
    found = []
    for path in sorted(Path(ntpref.__file__).parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.name}: {n}" for n in names if n.split(".")[0] in ("benchmarks", "scripts", "examples")]
    assert found == []


# ---- cases, flop counts, timing -----------------------------------------------------------------------

def test_each_scaling_series_doubles_one_size_of_its_base_case():
    series = {}
    for c in bm.cases.scaling_cases():
        series.setdefault((c.model, c.series), []).append(c.size)
    assert sorted(series) == [("indrnn", "T"), ("indrnn", "n"), ("shallow", "T"), ("shallow", "m"),
                              ("shallow", "n"), ("twostage", "K"), ("twostage", "N")]
    for (model, name), sizes in series.items():
        assert [s[name] / sizes[0][name] for s in sizes] == [1, 2, 4, 8]
        assert all({k: v for k, v in s.items() if k != name} == {k: v for k, v in sizes[0].items() if k != name}
                   for s in sizes)


def test_flop_counts_are_the_stated_formulas():
    shallow, indrnn = bench.case("shallow"), bench.case("indrnn")
    assert bm.cases.flops(shallow, {}) == 4000 * 64 * (4 * 64 + 8 * 16 * 8 + 8 * 16 + 3 * 8)
    assert bm.cases.flops(indrnn, {}) == 4000 * 64 * 97 * (4 * 17 + 10)
    two = bench.case("twostage", K=5, N=10)
    inputs = bench.make_inputs(two)
    L = inputs["ds"].lengths
    assert bm.cases.flops(two, inputs) == sum(6 * l * 5 + 5 * 5 + 11 * l for l in L)


def test_run_times_every_implementation_that_covers_the_case(threads_restored):
    seen = []
    impls = bm.timing.ntpref_implementations() + [bm.timing.Implementation("other", lambda c, i: None, seen.append)]
    c = bench.case("twostage", K=5, N=10)
    rows = bm.timing.run(impls, [c], threads=(1, 1), repeats=2, warmup=1)
    # without a thread setting ("ntpref numpy"): timed once, at its default; "other" covers no case
    assert [(r.implementation, r.threads) for r in rows] == [
        ("ntpref numba", 1), ("ntpref numpy", 0), ("ntpref numba", 1)]
    assert all(r.case == c.label and 0 < r.best <= r.seconds and r.flops > 0 for r in rows)
    assert seen == []


def test_thread_determinism_compares_the_bits_of_every_thread_count(threads_restored):
    c = bench.case("shallow", n=40, T=4, m=8)
    assert bm.whole_runs.thread_determinism([c], threads=(1, numba.config.NUMBA_NUM_THREADS)) == {c.label: True}


@pytest.mark.parametrize("make", ["torch_implementations", "jax_implementations"])
def test_framework_steps_compute_ntprefs_loss(make):
    impls = getattr(bm.frameworks, make)()
    if not impls:
        pytest.skip(f"{make}: the framework is not installed (the crosscheck extra)")
    for c in (bench.case("twostage", K=5, N=10), bench.case("shallow", n=20, T=4, m=8),
              bench.case("indrnn", n=20, T=5, m=8)):
        inputs = bench.make_inputs(c)
        expected = bench.ntpref_step(c, inputs)().loss
        for impl in impls:
            loss = impl.setup(c, inputs)()[0]
            loss = float(loss[0] if isinstance(loss, tuple) else loss)     # JAX: (loss, aux)
            assert loss == pytest.approx(expected, rel=1e-5 if "f32" in impl.name else 1e-12), (impl.name, c.label)


# ---- reports --------------------------------------------------------------------------------------------

def test_slopes_of_a_power_law_are_its_exponent():
    rows = [timing_row("n", {"n": n}, seconds=3e-9 * n ** 1.5, best=1e-9 * n) for n in (500, 1000, 2000, 4000)]
    ((model, series, impl, threads, b_median, b_min, b_flops),) = bm.report.slopes(rows)
    assert (model, series, impl, threads) == ("shallow", "n", bm.timing.BASELINE, 1)
    assert (b_median, b_min, b_flops) == (pytest.approx(1.5), pytest.approx(1.0), pytest.approx(0.0, abs=1e-12))
    assert "n = 500..4000" in bm.report.slope_table(rows)


def test_table_ratios_are_to_the_baseline_at_the_same_thread_count():
    rows = [timing_row(threads=1, seconds=0.2), timing_row(threads=2, seconds=0.1),
            timing_row(implementation="other", threads=1, seconds=0.6),
            timing_row(implementation="default threads", threads=0, seconds=0.3)]
    ratios = [line.split("|")[-2].strip() for line in bm.report.table(rows).splitlines()[2:]]
    assert ratios == ["1.0x", "1.0x", "3.0x", "3.0x"]     # a "default" row: against the baseline's best median


def test_figure_needs_scaling_series(tmp_path):
    with pytest.raises(ntpref.InputError, match="no scaling series"):
        bm.report.figure([timing_row()], tmp_path / "bench.png")
    assert list(tmp_path.iterdir()) == []


def test_report_names_the_machine_and_the_extras():
    text = bm.report.report([timing_row()], {"a measurement": "1 s"})
    assert text.startswith("machine: cpu ") and text.endswith("\na measurement: 1 s")
    (line,) = [line for line in text.splitlines() if line.startswith("| shallow")]
    assert [cell.strip() for cell in line.strip("|").split("|")] == [
        "shallow n=4000 d=8 T=16 m=64", bm.timing.BASELINE, "1", "500.000 ms", "250.000 ms", "2", "1.0x"]


def test_the_step_script_computes_each_models_step(capsys):
    """benchmarks/step.py (instruction counts, docs/performance.md): each model's step is the public
    loss-and-gradient call, finite; a bad usage is exit 2 with one line."""
    for model in ("twostage", "shallow", "indrnn"):
        result = bm.step.step(model)()
        assert np.isfinite(result.loss) and result.loss > 0
        assert bm.step.main([model, "1"]) == 0
    assert bm.step.main(["gpt", "1"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)


def test_limit_counts_are_the_per_sentence_formulas():
    """benchmarks.limit's step counts: the per-sentence formulas of its docstring summed sentence by sentence."""
    lengths, K, Lmax = np.array([2, 3, 6, 1]), 5, 6
    c = bm.limit.counts(lengths, K, Lmax)
    per = [dict(adds=3 * L * K + 3 * K + 5 * L + 3, muls=3 * L * K + K + 4 * L + 1, divs=L, compares=L - 1 + K,
                exps=Lmax + K + 2, logs=1) for L in lengths.tolist()]
    for name in per[0]:
        assert c[name] == sum(p[name] for p in per), name
    assert c["slot_bytes"] == 8 * 4 * (7 + 3 * K + 7 * Lmax + 1)
    assert c["compulsory_bytes"] == 8 * (4 * Lmax + 3 * 4 + 4 * K * K)


@pytest.mark.parametrize("K, lengths", [(5, (1, 6)), (20, (2, 6))])
def test_lanes_forward_is_the_kernels_forward_bit_for_bit(K, lengths):
    """benchmarks.lanes restates the forward pass with eight sentences per vector: the same loss, per-sentence
    losses, logits and attention as kernels.pass_serial, bit for bit (one-token sentences, padding, negative
    and positive r_max included)."""
    from ntpref import twostage
    from ntpref.twostage import kernels

    prep = twostage.prepare(twostage.random_realizable(K=K, N=48, min_len=lengths[0], max_len=lengths[1],
                                                       seed=3).dataset)
    assert (prep.lengths == 1).any() == (lengths[0] == 1) and (prep.lengths < prep.tokens.shape[1]).any()
    rng = np.random.default_rng(K)
    votes = np.zeros((K, K))                       # W_ov[y, τ] += 1 for each token of a sentence with target y
    for tokens, L, y in zip(prep.tokens, prep.lengths, prep.targets):
        np.add.at(votes[y], tokens[:L], 1.0)
    signs = []
    for W_ov, W_kq in (*rng.standard_normal((2, 2, K, K)), (30.0 * votes, rng.standard_normal((K, K)))):
        data = (prep.tokens, prep.lengths, prep.targets, prep.weights, W_ov, W_kq)
        serial = kernels.pass_serial(*data, kernels.MODE_FORWARD)
        lanes = bm.lanes.forward_lanes(*data)
        for a, b in zip((serial[0], *serial[2:5]), lanes):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
        r = serial[3] - serial[3][np.arange(48), prep.targets][:, None]
        r[np.arange(48), prep.targets] = -np.inf
        signs += np.sign(r.max(axis=1)).tolist()
    assert {-1.0, 1.0} <= set(signs)               # both branches of the loss: r_max > 0 and r_max < 0
    with pytest.raises(ValueError, match="multiple of 8"):
        bm.lanes.forward_lanes(prep.tokens[:7], prep.lengths[:7], prep.targets[:7], prep.weights[:7], W_ov, W_kq)


def test_variants_apply_every_edit_to_the_kernels_source():
    """benchmarks.variants builds each variant from ntpref/twostage/kernels.py as it is: the text of every edit
    occurs as often as the edit states (so it replaces what it means to and nothing else; at least once for
    an edit of every occurrence), a variant with edits differs from the control, and an edit whose text
    occurs another number of times stops the command with one line naming the variant."""
    variants = bm.variants
    source = variants.SOURCE.read_text()
    control = variants.variant_source("control", (), 20)
    assert "from ntpref import vmath" in control and "cache=True" not in control
    for name, edits in {**variants.VARIANTS, "even blocks": variants.even_blocks(200)}.items():
        for old, new, count in edits:
            assert source.count(old) == count or (count is None and source.count(old) > 0), (name, old)
        assert (variants.variant_source(name, edits, 20) == control) == (edits == ()), name
    assert variants.even_blocks(200) == ((f"BLOCK = {bm.variants.kernels.BLOCK} ", "BLOCK = 100 ", 1),)
    assert "K_LOGITS = 20\n" in variants.variant_source("K constant", variants.VARIANTS["K constant"], 20)
    with pytest.raises(SystemExit, match="variant 'gone': 'BLOCK = 63' occurs 0 times in .*kernels.py, not 1; "):
        variants.variant_source("gone", (("BLOCK = 63", "BLOCK = 1", 1),), 20)
    with pytest.raises(SystemExit, match="variant 'twice': 'gz.shape.1.' occurs 3 times in .*, not 2; "):
        variants.variant_source("twice", (("gz.shape[1]", "K", 2),), 20)
    with pytest.raises(SystemExit, match="variant 'none': 'fastmath=True' occurs 0 times in .*, not at least once; "):
        variants.variant_source("none", (("fastmath=True", "", None),), 20)


@pytest.mark.slow
def test_variants_compute_the_kernels_values():
    """The compiled variants on a small set (K = 5, one-token sentences and padding): K constant gives the
    shipped pass bit for bit, fastmath (reassoc, contract, arcp) the same values within 1e-13 relative, and
    the parallel driver with the script's even blocks the serial pass's bits."""
    import tempfile

    from ntpref import twostage
    from ntpref.twostage import kernels

    prep = twostage.prepare(twostage.random_realizable(K=5, N=48, min_len=1, max_len=6, seed=3).dataset)
    W_ov, W_kq = np.random.default_rng(5).standard_normal((2, 5, 5))
    data = (prep.tokens, prep.lengths, prep.targets, prep.weights, W_ov, W_kq)
    shipped = kernels.pass_serial(*data, kernels.MODE_GRAD)
    with tempfile.TemporaryDirectory() as directory:
        built = {name: bm.variants.build(name, bm.variants.VARIANTS[name], 5, directory)
                 for name in ("as shipped", "K constant", "fastmath")}
        even = bm.variants.build("even", bm.variants.even_blocks(48), 5, directory)
    for name in ("as shipped", "K constant"):
        assert bm.variants.differences(shipped, built[name].pass_serial(*data, kernels.MODE_GRAD)) == "same bits"
    for a, b in zip(shipped, built["fastmath"].pass_serial(*data, kernels.MODE_GRAD)):
        np.testing.assert_allclose(b, a, rtol=1e-13, atol=1e-15 * max(1.0, float(np.max(np.abs(a)))))
    loss, _, G_ov, G_kq = bm.variants.parallel_pass(even, data)
    assert bm.variants.gradient_bits(loss, G_ov, G_kq) == bm.variants.gradient_bits(shipped[0], shipped[5], shipped[6])


def test_readme_commands_are_the_two_that_ci_runs():
    """benchmarks.readme_commands times the same two README lines as .ci/run's parser extracts."""
    from benchmarks.readme_commands import readme_commands

    root = Path(__file__).resolve().parent.parent
    if not (root / ".ci" / "run").is_file():
        pytest.skip(".ci/run is in a clone of the repository, not in the source distribution")
    ci = (root / ".ci" / "run").read_text()
    parser = ci[ci.index("readme_command() {"):ci.index("first=$(readme_command 1)")]
    lines = [subprocess.run(["bash", "-c", f"{parser}\nreadme_command {k}"], cwd=root, capture_output=True,
                            text=True, check=True).stdout.strip() for k in (1, 2)]
    commands = readme_commands(root / "README.md")
    assert [commands["first"], commands["tests"]] == lines
    assert "pytest" in commands["tests"] and "reproduce" in commands["first"]


def test_readme_commands_table_totals_the_steps():
    from benchmarks.readme_commands import markdown

    table = markdown("abc1234", {"tests": [("pip install -e .", 20.4, 0, ""),
                                           ("python -m pytest", 166.2, 0, "3 passed in 166.0s")]})
    assert "| tests | total | 187 | | |" in table and "| tests | `python -m pytest` | 166 | 0 | 3 passed in 166.0s |" in table
