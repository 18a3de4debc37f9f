"""Paper (1): two-stage normalized gradient descent for next-token prediction (docs/twostage.md, docs/api.md).

Import from the package: ``from ntpref import twostage``. Parameters W_ov, W_kq [d, d], in that order.

Data (docs/twostage.md §1, §7, §8)
    Dataset, random_realizable, RandomTask, five_token_example, unseen_sentences, UnseenSplit,
    optimal_tokens, optimal_token_sentences, observed_relations, find_cycle, extended_order, check_realizable
Model (§2–§4)
    Prepared, prepare, prepare_collocations, forward, loss_and_grad, step, direction,
    Forward, LossAndGrad, Step, Direction, ideal_ff_loss
Max-margin solutions (§5)
    W_ov_star, W_kq_star, rho, Certificate
Algorithm 1 (§4, §6)
    train, TwoStageResult, Stop, loss_floor, token_frequency, with_collocations
Generalization (§6.4)
    evaluate_part, evaluate_unseen, PartMetrics, unseen_parts, needs_transitive_step, generalization_curve,
    GeneralizationCurve

Importing compiles nothing: the Numba kernels compile (or load from the cache) at their first call.
"""
from .dataset import Dataset
from .generalization import (GeneralizationCurve, PartMetrics, evaluate_part, evaluate_unseen, generalization_curve,
                             needs_transitive_step, unseen_parts)
from .generators import RandomTask, five_token_example, random_realizable
from .least_norm import Certificate
from .model import (Direction, Forward, LossAndGrad, Prepared, Step, direction, forward, ideal_ff_loss, loss_and_grad,
                    prepare, prepare_collocations, step)
from .orders import (check_realizable, extended_order, find_cycle, observed_relations, optimal_token_sentences,
                     optimal_tokens)
from .svm import W_kq_star, W_ov_star, rho
from .two_stage import Stop, TwoStageResult, loss_floor, token_frequency, train, with_collocations
from .unseen import UnseenSplit, unseen_sentences

__all__ = [
    # data
    "Dataset", "random_realizable", "RandomTask", "five_token_example", "unseen_sentences", "UnseenSplit",
    "optimal_tokens", "optimal_token_sentences", "observed_relations", "find_cycle", "extended_order",
    "check_realizable",
    # model
    "Prepared", "prepare", "prepare_collocations", "forward", "loss_and_grad", "step", "direction",
    "Forward", "LossAndGrad", "Step", "Direction", "ideal_ff_loss",
    # max-margin solutions
    "W_ov_star", "W_kq_star", "rho", "Certificate",
    # Algorithm 1
    "train", "TwoStageResult", "Stop", "loss_floor", "token_frequency", "with_collocations",
    # generalization
    "evaluate_part", "evaluate_unseen", "PartMetrics", "unseen_parts", "needs_transitive_step",
    "generalization_curve", "GeneralizationCurve",
]
