"""Teacher–student width sweep (docs/shallow.md §5): min training loss vs the width m, log–log axes,
mean ± 95% CI over seeds and the medians, power law fitted to the medians (as the authors' plotting script
does), for the authors' teacher and the full-W teacher.

Setting (the authors' training script and README command): d = 8 tokens of T = 16 per input (i.i.d.
N(0, I) scaled to norm ≤ 1), the kernel-machine teacher of :func:`ntpref.shallow.teacher_student`
(R = 16 anchors, ν = 3, K random heads), 80/20 train/validation split. Two teachers
(:data:`ntpref.reproduce.teacher_student.TEACHERS`, both labelling the same inputs): "diagonal", the authors' code
(attention logits from diag(W_k)), and "full", the theory's kernel. Student: the shallow transformer
(full W) with paired initialisation, full-batch ProjGD for ``steps`` steps with η = 1.75/√steps and ρ = 3
for all three blocks, loss = mean squared error (κ = 2). Metric: the minimum over the steps of the
pre-update training loss.

Seeds. The data seed s draws the tokens, anchors and teacher heads; the student's initial heads come from
seed s + :data:`ntpref.reproduce.teacher_student.INIT_SEED_OFFSET`, so they are never the same random numbers as the
data. The authors split by a random permutation; here the first 80% of the i.i.d. samples train (the same
distribution).

Teacher reuse. Every width of a (seed, teacher) trains on the same data set, built once per worker process
by :func:`ntpref.reproduce.teacher_student.teacher_data` (in-memory cache).
"""
from __future__ import annotations

from pathlib import Path

from . import Summary
from .configs import by_axis, config_text, select_config
from .plots import loglog_panel, pyplot, save_figure
from .stats import axis_table, medians, slope_text, stats
from .teacher_student import D, TEACHERS, student_arrays, teacher_data, train_student

DESCRIPTION = "teacher-student: min training loss vs width m (authors' and full-W teacher), log-log, median fit"

SIZES = {
    # quick: n = 1000 (800 training samples), a K = 1024-head teacher, 1500 steps (η = 1.75/√1500),
    # 3 seeds, widths 8..128 (600 steps gave a slope of only -0.32 with the full-W teacher: too few steps).
    "quick": dict(seeds=(1, 2, 3), widths=(8, 16, 32, 64, 128), n=1000, K=1024, steps=1500, T=16,
                  teachers=("diagonal", "full")),
    # full: the authors' README command (10 seeds, n = 5000, K = 8192, 4000 steps), both teachers.
    "full": dict(seeds=tuple(range(1, 11)), widths=(8, 16, 32, 64, 128, 256), n=5000, K=8192, steps=4000, T=16,
                 teachers=("diagonal", "full")),
}

STYLE = {"diagonal": ("C0", "o"), "full": ("C1", "s")}
EXPECTED = ("expected slope about -1/2: this project's reconstruction (docs/shallow.md §5); not stated in the "
            "paper's available text, and the authors' plotting script prints no expected value")


def cells(seeds, widths, n, K, steps, T, teachers) -> list[dict]:
    """One cell per (seed, teacher, m): teacher by teacher in the order given (the authors' first, so a run
    stopped early has the default teacher's seeds complete), then seed by seed, the widest student first (the
    longest cells start early)."""
    return [dict(seed=s, teacher=t, m=m, n=n, K=K, steps=steps, T=T)
            for t in teachers for s in seeds for m in sorted(widths, reverse=True)]


def cell(seed, teacher, m, n, K, steps, T) -> dict:
    """Train one student of width m on the seed's data set of ``teacher`` (see the module docstring)."""
    return train_student(teacher_data(seed, n, T, K, teacher), m, seed, steps)


def cell_arrays(seed, teacher, m, n, K, steps, T) -> dict:
    """What :func:`cell` returns: :func:`ntpref.reproduce.teacher_student.student_arrays`."""
    return student_arrays(steps)


def summarize(results, outdir) -> Summary:
    """Per teacher: the min training loss per width (mean ± CI, median), the slope fitted to the medians;
    ``width.png`` with both teachers."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.6))
    lines, numbers, config = [], {}, {}
    for teacher in [t for t in TEACHERS if any(p["teacher"] == t for p, _ in results)]:
        config, rows, note = select_config([r for r in results if r[0]["teacher"] == teacher], ("seed", "m"))
        m, groups = by_axis(rows, "m", "min_train_loss")
        mean, ci = stats(groups)
        med = medians(groups)
        color, marker = STYLE[teacher]
        slope = loglog_panel(ax, m, mean, ci, label=f"{teacher} teacher", color=color, marker=marker,
                             median=med, fit=med)
        lines += ["", f"{TEACHERS[teacher]} ({config_text(config)})", axis_table(m, groups, mean, ci)]
        if slope is not None:
            lines.append(f"log-log slope fitted to the medians: {slope_text(slope, m, groups)}")
            numbers[f"slope_{teacher}"] = slope
        lines += [note] if note else []
    ax.set_xlabel("width m (heads)")
    ax.set_ylabel("min training loss (MSE)")
    ax.set_title(f"Teacher–student, d={D}, T={config.get('T')}, n={config.get('n')}, {config.get('steps')} "
                 "ProjGD steps (open markers: medians)", fontsize=9)
    ax.legend(fontsize=7)
    fig_path = save_figure(fig, Path(outdir) / "width.png")
    head = ["Teacher-student width sweep: min training loss vs m (default: the authors' teacher)", EXPECTED]
    return Summary("\n".join(head + lines), [fig_path], numbers)
