"""A broken implementation: one gradient 1e-3 too large (relative): grad_W_kq, grad_W or grad_W_in, in
evaluation and in every ProjGD / ProjSGD step. Built on ntpref's own functions (no other framework)."""
import numpy as np

from ntpref import shallow
from ntpref.oracle import contract
from ntpref.shallow.projection import head_radii, project
from ntpref.shallow.contract import input_data, input_kappa
from ntpref.shallow.projgd import model_named

ERROR = 1e-3
WRONG = {"twostage": "W_kq", "shallow": "W", "indrnn": "W_in"}
API = {"shallow": shallow, "indrnn": shallow.indrnn}


def evaluate(model, inputs):
    out = contract.evaluate({"model": model, **inputs})
    out["grad_" + WRONG[model]] = out["grad_" + WRONG[model]] * (1.0 + ERROR)
    return out


def train(model, inputs):
    """ProjGD / ProjSGD (docs/shallow.md §3, the draws of docs/contract.md) with the faulty gradient."""
    if model == "twostage":
        raise NotImplementedError("a relative error of a whole gradient leaves the NGD direction unchanged")
    spec, api = model_named(model), API[model]
    data = input_data(model, inputs)
    val = input_data(model, {**inputs, "X": inputs["X_val"], "y": inputs["y_val"]}) if "X_val" in inputs else None
    kappa, eta = input_kappa(inputs), float(inputs["eta"])
    theta0 = tuple(np.asarray(inputs[b], dtype=float) for b in spec.blocks)
    radii = head_radii(inputs.get("rho"), len(theta0[0]), len(theta0))
    rng = np.random.default_rng(int(inputs["seed"])) if "batch" in inputs else None
    theta, logs = theta0, {"train_loss": [], "grad_norm_" + spec.logged: [], "val_loss": []}
    for _ in range(int(inputs["steps"])):
        logs["train_loss"].append(api.loss_and_grad(data, *theta, kappa=kappa).loss)
        if rng is None:
            rows = data
        else:
            idx = rng.integers(0, len(data.y), size=int(inputs["batch"]))
            rows = data._replace(X=data.X[idx], y=data.y[idx])
        grads = list(api.loss_and_grad(rows, *theta, kappa=kappa)[1:-1])
        grads[spec.blocks.index(WRONG[model])] *= 1.0 + ERROR
        logs["grad_norm_" + spec.logged].append(np.linalg.norm(grads[spec.blocks.index(spec.logged)]))
        theta = project([p - eta * g for p, g in zip(theta, grads)], theta0, radii)
        if val is not None:
            logs["val_loss"].append(api.loss_and_grad(val, *theta, kappa=kappa).loss)
    out = {k: np.array(v) for k, v in logs.items() if v}
    return {**out, **dict(zip(spec.blocks, theta))}
