"""A broken implementation: no gradient flows through the attention weights (as if the softmax output
were detached). grad_W_kq / grad_W are zero; in training the attention parameters never move.
Built from the oracle's outputs with the fault injected (NumPy only)."""
import numpy as np

from ntpref.oracle import contract

ATTENTION = {"twostage": "W_kq", "shallow": "W"}


def _attention(model):
    if model not in ATTENTION:
        raise NotImplementedError(f"model {model} has no attention")
    return ATTENTION[model]


def evaluate(model, inputs):
    out = contract.evaluate({"model": model, **inputs})
    out["grad_" + _attention(model)] = np.zeros_like(out["grad_" + _attention(model)])
    return out


def train(model, inputs):
    _attention(model)         # NotImplementedError for the IndRNN, which has no attention
    if model == "twostage":   # stage 2 sees a zero gradient at once: it stops, its logs repeat t = 0
        out = contract.train({"model": model, **inputs, "T": np.array(0)})
        steps = int(inputs["T"]) + 1
        return {**out, **{k: np.repeat(out[k], steps) for k in ("stage2_loss", "stage2_norm", "stage2_corr")}}
    rho = np.asarray(inputs.get("rho", [np.inf] * 3), dtype=float).copy()
    rho[2] = 0.0              # W frozen at its initial value, as with a zero gradient
    out = contract.train({"model": model, **inputs, "rho": rho})
    out["grad_norm_W"] = np.zeros_like(out["grad_norm_W"])
    return out
