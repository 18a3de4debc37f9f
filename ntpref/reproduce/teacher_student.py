"""The teacher–student setting of paper (2) shared by the width, approx, length, ntk and projsgd targets
(the rnn target shares its seed offsets): constants, the cached data set of a seed, the student's step size
and one training run."""
from __future__ import annotations

import math
import time
from functools import lru_cache

import numpy as np

from ..errors import InputError
from ..sweep import CellArray
from .. import shallow
from ..shallow import TeacherStudent

D, R, NU, RHO, ETA_SCALE, TRAIN_FRACTION = 8, 16, 3.0, 3.0, 1.75, 0.8
INIT_SEED_OFFSET = 1_000_003
"""Student seed = data seed + INIT_SEED_OFFSET: paired_init and the data generators both start drawing
standard normals from ``default_rng(seed)``, so the student's initial heads must use another seed."""
SGD_SEED_OFFSET = 2_000_003
"""ProjSGD's minibatch seed = data seed + SGD_SEED_OFFSET (again never the data's random numbers)."""
TEACHERS = {"diagonal": "authors' teacher: attention logits from diag(W)",
            "full": "full-W teacher (the theory's kernel)"}
"""teacher_attention of :func:`ntpref.shallow.teacher_student`. The authors' code computes the teacher's
attention logits with diag(W_k) only (a repeated einsum index), the theory's kernel uses the full W_k."""


@lru_cache(maxsize=4)
def teacher_data(seed: int, n: int, T: int, K: int, teacher: str = "diagonal") -> TeacherStudent:
    """The seed's teacher–student data set (d = 8, R = 16, ν = 3, 80/20 split; ``teacher`` one of
    :data:`TEACHERS`), cached in this process.

    The tokens are the first draws of the seed, so both teachers label the same inputs. Every width of a
    seed trains on the same data set; cells are listed seed by seed, so a worker process builds a seed's
    teacher at most once (with w workers at most w times). No files, nothing can go stale."""
    if teacher not in TEACHERS:
        raise InputError(f"teacher must be one of {', '.join(TEACHERS)}, got {teacher!r}")
    return shallow.teacher_student(n=n, d=D, T=T, R=R, K=K, nu=NU, n_train=round(TRAIN_FRACTION * n), seed=seed,
                                   teacher_attention=teacher)


def student_eta(steps: int) -> float:
    """The step size η = 1.75/√steps of the authors' training script (0.0277 at 4000 steps)."""
    return ETA_SCALE / math.sqrt(steps)


def student_arrays(steps: int) -> dict[str, CellArray]:
    """What :func:`train_student` returns for ``steps`` steps: the losses (MSE, >= 0) and the CPU seconds as
    float64 scalars, the training loss [steps] (:class:`ntpref.sweep.CellArray`)."""
    scalar = CellArray("f8", low=0.0)
    return dict(min_train_loss=scalar, final_train_loss=scalar, final_val_loss=scalar,
                train_loss=CellArray("f8", (steps,), low=0.0), cpu_seconds=scalar)


def train_student(data: TeacherStudent, m: int, seed: int, steps: int, n_train: int | None = None,
                  batch: int | None = None) -> dict:
    """Train a width-m student (paired init from seed + INIT_SEED_OFFSET) by ProjGD (``batch`` None) or
    ProjSGD (minibatches of ``batch`` drawn from seed + SGD_SEED_OFFSET), η = 1.75/√steps, ρ = 3 for all
    blocks, MSE, on the first ``n_train`` training samples (all by default). Returns min_train_loss,
    final_train_loss, final_val_loss (L_val(θ(steps)) on the whole validation split), train_loss [steps]
    (pre-update, so train_loss[0] is the loss at the paired initialisation, where f = 0) and the cell's
    CPU seconds (Numba threads included)."""
    start = time.process_time()
    train = shallow.prepare(data.X_train[:n_train], data.y_train[:n_train])
    params = shallow.paired_init(m, D, seed + INIT_SEED_OFFSET)
    sgd = {} if batch is None else dict(batch_size=batch, seed=seed + SGD_SEED_OFFSET)
    res = shallow.train(train, params, eta=student_eta(steps), steps=steps, rho=(RHO,) * 3, **sgd)
    r = shallow.forward(shallow.prepare(data.X_val), *(res.params[b] for b in shallow.Params._fields)).f - data.y_val
    return dict(min_train_loss=res.min_train_loss, final_train_loss=res.final_train_loss,
                final_val_loss=float(np.mean(r * r)), train_loss=res.train_loss,
                cpu_seconds=time.process_time() - start)
