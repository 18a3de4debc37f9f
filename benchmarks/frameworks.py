"""PyTorch and JAX implementations of the benchmark's step, when the frameworks are installed:

  "torch eager f64"  PyTorch eager, float64, autograd (torch.set_num_threads per row)
  "torch eager f32"  the same in float32 (the setting of the shallow paper's public code)
  "jax jit f64"      jax.jit(jax.value_and_grad(...)), float64; XLA's CPU thread pool cannot be
                     resized in a running process: these rows use XLA's default (all cores) and show
                     "default" threads; set XLA_FLAGS="--xla_cpu_multi_thread_eigen=false
                     intra_op_parallelism_threads=1" before the run for single-threaded JAX rows.

The models are the shipped conformance adapters' restatements (examples/adapters/torch_restatement.py,
examples/adapters/jax_float64.py; written from the equations of docs/, not from ntpref's code, and checked
against the oracle by ``ntpref conformance``); every step returns the loss and the gradients of all
trained parameters (twostage: W_ov and W_kq; shallow: c, U, W; indrnn: c, u, W_in), and for the JAX rows
the result is blocked on before the clock stops.
"""
from __future__ import annotations

from ntpref.bench import BenchCase

from .timing import Implementation

#: options of the benchmark's shallow / indrnn steps (the defaults of the contract)
OPTIONS = {"kappa": 2.0, "tau_att": 1.0, "mask_last_key": False, "activation": "tanh"}


def torch_implementations() -> list[Implementation]:
    """"torch eager f64" and "torch eager f32" (none without PyTorch)."""
    try:
        import torch
    except ImportError:
        return []
    from examples.adapters import torch_restatement as tr

    def setup(dtype):
        def make(case: BenchCase, inputs: dict):
            if case.model == "twostage":
                ds = inputs["ds"]
                data = tr.Sentences(torch.tensor(ds.E, dtype=dtype), ds.tokens, ds.lengths, ds.targets)
                W = [torch.tensor(inputs[k], dtype=dtype, requires_grad=True) for k in ("W_ov", "W_kq")]

                def step():
                    loss = data.forward(*W)[0].mean()
                    return loss.item(), torch.autograd.grad(loss, W)
                return step
            opts = {"model": case.model, **OPTIONS}
            X = torch.tensor(inputs["X"], dtype=dtype)
            y = torch.tensor(inputs["y"], dtype=dtype)
            params = [torch.tensor(p, dtype=dtype, requires_grad=True) for p in inputs["params"]]

            def step():
                _, loss = tr.mse(opts, X, y, params)
                return loss.item(), torch.autograd.grad(loss, params)
            return step
        return make

    return [Implementation("torch eager f64", setup(torch.float64), torch.set_num_threads),
            Implementation("torch eager f32", setup(torch.float32), torch.set_num_threads)]


def jax_implementations() -> list[Implementation]:
    """"jax jit f64" (none without JAX)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError:
        return []
    from examples.adapters import jax_float64 as jx     # enables jax_enable_x64
    twostage_grad = jax.jit(jax.value_and_grad(jx.twostage_loss, argnums=(0, 1), has_aux=True))
    shallow_grad = jax.jit(jax.value_and_grad(jx.mse, argnums=3, has_aux=True), static_argnums=0)

    def make(case: BenchCase, inputs: dict):
        if case.model == "twostage":
            ds = inputs["ds"]
            data = jx.sentences({"E": ds.E, "tokens": ds.tokens, "lengths": ds.lengths, "targets": ds.targets})
            W_ov, W_kq = jnp.asarray(inputs["W_ov"]), jnp.asarray(inputs["W_kq"])
            return lambda: jax.block_until_ready(twostage_grad(W_ov, W_kq, data))
        X, y = jnp.asarray(inputs["X"]), jnp.asarray(inputs["y"])
        params = tuple(jnp.asarray(p) for p in inputs["params"])
        frozen = _Frozen({"model": case.model, **OPTIONS})
        return lambda: jax.block_until_ready(shallow_grad(frozen, X, y, params))

    return [Implementation("jax jit f64", make, None)]


class _Frozen(dict):
    """A hashable options dict (a static argument of jax.jit)."""

    def __hash__(self):
        return hash(tuple(sorted(self.items())))
