"""Small valid inputs of every model (the five-token example; tiny shallow and IndRNN problems), shared by
the command-line tests: each test mutates one array of a known-good input."""
import numpy as np

from ntpref.shallow import iid_init, indrnn
from ntpref.twostage import five_token_example


def twostage_eval():
    five = five_token_example()
    return {"model": np.array("twostage"), "tokens": five.tokens, "lengths": five.lengths,
            "targets": five.targets, "W_ov": np.full((5, 5), 0.1), "W_kq": np.eye(5), "K": np.array(5),
            "succ": five.succ}


def twostage_train():
    return {**twostage_eval(), "eta0": np.array(0.1), "eta": np.array(0.05), "T0": np.array(2), "T": np.array(2)}


def shallow_eval():
    rng = np.random.default_rng(0)
    c, U, W = iid_init(4, 3, seed=1)
    return {"model": np.array("shallow"), "X": rng.standard_normal((5, 4, 3)), "y": rng.standard_normal(5),
            "c": c, "U": U, "W": W}


def indrnn_eval():
    rng = np.random.default_rng(0)
    c, u, W_in = indrnn.paired_init(4, 3, seed=1)
    return {"model": np.array("indrnn"), "X": rng.standard_normal((5, 4, 3)), "y": rng.standard_normal(5),
            "c": c, "u": u, "W_in": W_in}


def train_of(base):
    return {**base, "eta": np.array(0.1), "steps": np.array(2)}


def shallow_train(**extra):
    return {**train_of(shallow_eval()), **extra}
