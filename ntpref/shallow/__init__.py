"""Paper (2): a shallow multi-head transformer trained by projected GD, its NTK, and the IndRNN baseline
(docs/shallow.md, docs/api.md).

Import from the package: ``from ntpref import shallow`` and ``from ntpref.shallow import indrnn``.
Transformer parameters c [m], U [m, d], W [m, d, d], in that order; samples X [n, T, d], targets y [n].

Data (docs/shallow.md §5)
    teacher_student, TeacherStudent, TeacherStudentConfig, teacher_labels, autoregressive, Autoregressive,
    AutoregressiveConfig, scale_tokens, positional_channels
Transformer (§1–§2)
    Batch, prepare, forward, loss_and_grad, head_states, Forward, LossAndGrad, HeadStates, Params,
    paired_init, iid_init
IndRNN (§6)
    indrnn: the module, with the same shape (indrnn.prepare, indrnn.forward, indrnn.loss_and_grad,
    indrnn.paired_init, ...)
ProjGD / ProjSGD for both models (§3)
    train, TrainResult
NTK (§4)
    ntk: the module (ntk.ntk_gram, ntk.limit_kernel, ntk.jvp, ntk.transport_map, ...)

Importing compiles nothing: the Numba kernels compile (or load from the cache) at their first call.
"""
from . import indrnn, ntk
from .data import Autoregressive, AutoregressiveConfig, autoregressive, positional_channels, scale_tokens
from .model import (Batch, Forward, HeadStates, LossAndGrad, Params, forward, head_states, iid_init, loss_and_grad,
                    paired_init, prepare)
from .teacher import TeacherStudent, TeacherStudentConfig, teacher_labels, teacher_student
from .projgd import TrainResult, train

__all__ = [
    # data
    "teacher_student", "TeacherStudent", "TeacherStudentConfig", "teacher_labels", "autoregressive",
    "Autoregressive", "AutoregressiveConfig", "scale_tokens", "positional_channels",
    # transformer
    "Batch", "prepare", "forward", "loss_and_grad", "head_states", "Forward", "LossAndGrad", "HeadStates",
    "Params", "paired_init", "iid_init",
    # IndRNN
    "indrnn",
    # ProjGD / ProjSGD
    "train", "TrainResult",
    # NTK
    "ntk",
]
