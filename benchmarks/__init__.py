"""The benchmark harness of ntpref: one full-batch loss-and-gradient step of each model, ntpref's backends
against PyTorch and JAX, at the papers' sizes and over scaling series (docs/performance.md).

    python -m benchmarks.run [--quick] [--threads 1 2] [--repeats 7] [--models ...] [--figure PATH.png]
                             [--json PATH.json] [--no-scaling] [--no-numpy] [--no-torch] [--no-jax]
                             [--no-whole-runs] [-q]

from the repository root (it imports ``examples.adapters``); it is not installed with ntpref. It is built on
the pieces of ``ntpref bench`` (ntpref/bench.py: the papers' cases, their inputs, the ntpref step, thread
counts, the timing loop) and adds, one job per module:

  cases       scaling series and the stated flop count of a step
  timing      implementations (ntpref numba / numpy) and the timing run over cases and thread counts
  frameworks  the PyTorch and JAX implementations
  whole_runs  the whole Figure-2 run, start-up time, bitwise determinism across thread counts
  report      tables, slopes, figure, machine description, the report text
  run         the command
  limit       the two-stage step's operation counts and the one-core limit (``python -m benchmarks.limit``)
  lanes       the two-stage forward with eight sentences per vector instruction (``python -m benchmarks.lanes``)
  variants    the two-stage pass compiled with K constant, with fast-math, and on two threads
              (``python -m benchmarks.variants``)
"""
