"""A broken implementation: the two-stage attention softmax runs over the padding too (padding read as
token 0). Attention is a function of the set of tokens, so this is the oracle on sentences whose
padding is moved to the front as real copies of token 0 (the query stays the last token); the
attention is mapped back to the original positions. NumPy only."""
import numpy as np

from ntpref.oracle import contract


def evaluate(model, inputs):
    if model != "twostage":
        raise NotImplementedError("only the two-stage model has padding")
    tokens, lengths = np.asarray(inputs["tokens"]), np.asarray(inputs["lengths"])
    N, Lmax = tokens.shape
    shift = Lmax - lengths                                   # padding entries per sentence
    cols = (np.arange(Lmax)[None, :] - shift[:, None]) % Lmax  # padded position l holds original l - shift
    padded = np.where(np.arange(Lmax)[None, :] < shift[:, None], 0, tokens[np.arange(N)[:, None], cols])
    out = contract.evaluate({"model": model, **inputs, "tokens": padded, "lengths": np.full(N, Lmax)})
    back = (np.arange(Lmax)[None, :] + shift[:, None]) % Lmax   # original position l sits at l + shift
    out["attn"] = out["attn"][np.arange(N)[:, None], back]
    return out
