"""Gradient checking by central finite differences (``gradcheck`` and ``ntpref gradcheck``).

Library use, like ``torch.autograd.gradcheck`` but for closed-form gradients::

    report = gradcheck(fun, {"W": W, "b": b})       # fun(**inputs) -> (loss, {"W": dL/dW, ...})
    assert report.ok, report.table()

Every gradient array returned by ``fun`` is checked entry by entry against
``(L(x + eps e_k) - L(x - eps e_k)) / (2 eps)``; an entry passes when
``|grad - fd| <= atol + rtol * |fd|``. With eps = 1e-6 the truncation error is O(eps^2 |L'''|) ~ 1e-12
and the rounding error about ulp(L)/eps ~ 2e-10 |L|, hence the default atol 1e-8 (losses of order
one or less) and rtol 1e-7 (:func:`ntpref.oracle.policies.defaults.gradcheck_tolerance`).

Command line: ``ntpref gradcheck INPUT.npz [GRADS.npz]`` differentiates our loss of the model in an
interchange input file (docs/contract.md; twostage, shallow, indrnn) numerically and compares the
gradients stored in GRADS.npz (e.g. a PyTorch or JAX result saved as npz) with it. Array names
follow the ``ntpref eval`` outputs: ``grad_P`` is dL/dP of the output ``loss`` for input array P,
``grad0_P`` is dL0/dP of ``loss0`` (the twostage collocation loss); other arrays (``f``, ``logits``,
...) are ignored, so a whole eval output may be given. Without GRADS.npz our own closed-form
gradients (``ntpref eval``) are checked. Every given array has at least one entry checked
(``--max-entries`` >= 1); the report says how many entries of each array were. A gradient of the
model that GRADS.npz lacks is not checked, and the verdict line names it ("not given, so not checked:
grad_W_kq"). Exit 0 when all given agree, 1 otherwise, 2 on bad input (messages name the file).
"""
from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from ..backend import AUTO, CHOICES, HELP, describe
from ..checks import integer_at_least, positive_argument
from ..errors import InputError, NtprefError
from .compare import Report, compare_arrays
from .policies.defaults import GRADCHECK_ATOL, GRADCHECK_RTOL, gradcheck_tolerance

_GRAD = re.compile(r"grad(\d*)_(.+)")


def numeric_gradient(loss: Callable[[dict], float], inputs: Mapping[str, np.ndarray], name: str,
                     eps: float = 1e-6, indices: np.ndarray | None = None) -> np.ndarray:
    """Central differences of ``loss(arrays)`` with respect to ``inputs[name]``.

    indices: flat indices to differentiate (all when None); other entries of the result are NaN.
    """
    base = np.asarray(inputs[name])
    if base.dtype.kind != "f":
        raise InputError(f"array '{name}': cannot differentiate with respect to dtype {base.dtype}")
    x = np.array(base, dtype=np.float64, order="C")
    flat = x.reshape(-1)
    arrays = {**inputs, name: x}
    out = np.full(x.size, np.nan)
    for k in range(x.size) if indices is None else indices:
        orig = flat[k]
        flat[k] = orig + eps
        up = float(loss(arrays))
        flat[k] = orig - eps
        down = float(loss(arrays))
        flat[k] = orig
        out[k] = (up - down) / (2.0 * eps)
    return out.reshape(x.shape)


def _sample(size: int, max_entries: int | None, rng: np.random.Generator) -> np.ndarray | None:
    """Sorted flat indices of a random sample of ``max_entries`` entries (None: all of them)."""
    if max_entries is None or size <= max_entries:
        return None
    return np.sort(rng.choice(size, size=max_entries, replace=False))


def _with_nonfinite(idx: np.ndarray | None, given: np.ndarray | None, shape: tuple) -> np.ndarray | None:
    """The sampled flat indices ``idx`` together with every entry of ``given`` that is NaN or infinite, so a
    sample never hides a non-finite value (None, all entries, stays None)."""
    if idx is None or given is None or given.shape != shape or given.dtype.kind not in "iuf":
        return idx
    bad = np.flatnonzero(~np.isfinite(np.asarray(given, dtype=np.float64)))
    return np.union1d(idx, bad) if bad.size else idx


def _check_max_entries(max_entries) -> int | None:
    if max_entries is not None and (isinstance(max_entries, bool) or not isinstance(max_entries, (int, np.integer))
                                    or max_entries < 1):
        raise InputError(f"max_entries must be an integer >= 1 (or None for all entries), got {max_entries!r}")
    return max_entries


def gradcheck(fun: Callable[..., tuple[float, Mapping[str, np.ndarray]]], inputs: Mapping[str, np.ndarray],
              eps: float = 1e-6, rtol: float = GRADCHECK_RTOL, atol: float = GRADCHECK_ATOL, names: Iterable[str] | None = None,
              max_entries: int | None = None, seed: int = 0) -> Report:
    """Check the gradients returned by ``fun(**inputs) -> (loss, {name: dloss/dname})``.

    names: check only these gradients (default: every one ``fun`` returns; each must name a float
    input of the same shape). max_entries: check at most this many (>= 1) randomly chosen entries
    per array (``seed``), for large arrays. Returns a :class:`ntpref.oracle.compare.Report` whose
    expected side is the finite-difference gradient ("finite diff") and actual side the given one,
    with ``counts`` = entries checked per array; given gradients are compared as float64.
    """
    _, grads = fun(**inputs)
    names = list(grads) if names is None else list(names)
    unknown = [n for n in names if n not in inputs]
    if unknown:
        raise InputError(f"gradient '{unknown[0]}' does not name an input array ({', '.join(inputs)})")

    def loss(arrays):
        return fun(**arrays)[0]

    return _check({n: (loss, n) for n in names}, inputs, grads, eps, rtol, atol, max_entries, seed)


def _check(targets: Mapping[str, tuple[Callable[[dict], float], str]], inputs: Mapping[str, np.ndarray],
           given: Mapping[str, np.ndarray], eps: float, rtol: float, atol: float, max_entries: int | None,
           seed: int) -> Report:
    """For each ``name → (loss, wrt)``: central differences of ``loss`` w.r.t. ``inputs[wrt]`` against
    ``given[name]`` (reported missing when absent)."""
    if not (eps > 0 and np.isfinite(eps)):
        raise InputError(f"eps must be a positive number, got {eps}")
    max_entries = _check_max_entries(max_entries)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be an integer >= 0, got {seed!r}")
    rng = np.random.default_rng(seed)
    numeric, actual, counts = {}, {}, {}
    for name, (loss, target) in targets.items():
        x = np.asarray(inputs[target])
        g = np.asarray(given[name]) if name in given else None
        idx = _with_nonfinite(_sample(x.size, max_entries, rng), g, x.shape)
        counts[name] = (x.size if idx is None else idx.size, x.size)
        fd = numeric_gradient(loss, inputs, target, eps, idx)
        if g is not None and g.shape == x.shape and idx is not None:
            fd, g = fd.reshape(-1)[idx], np.asarray(g, dtype=np.float64).reshape(-1)[idx]
        numeric[name] = fd
        if g is not None:
            actual[name] = np.asarray(g, dtype=np.float64) if g.dtype.kind in "iuf" else g
    report = compare_arrays(numeric, actual, default=gradcheck_tolerance(rtol, atol), labels=("finite diff", "given"))
    report.counts = counts
    return report


def _handle(args) -> int:
    from . import contract
    from ..npzio import load_npz

    inputs = load_npz(args.input)
    try:
        ours = contract.evaluate(inputs, args.backend)
    except NtprefError as exc:
        raise type(exc)(f"{args.input}: {exc}") from None
    source = args.grads or args.input
    given = load_npz(args.grads) if args.grads else ours
    targets, ignored = {}, []
    for name in given:
        m = _GRAD.fullmatch(name)
        if not m:
            ignored.append(name)
            continue
        loss_name, wrt = f"loss{m.group(1)}", m.group(2)
        if wrt not in inputs or loss_name not in ours:
            raise InputError(f"{source}: array '{name}': the input {args.input} has no array '{wrt}' or the model "
                             f"no output '{loss_name}'")
        if np.asarray(inputs[wrt]).dtype.kind != "f":
            raise InputError(f"{source}: array '{name}': input array '{wrt}' of {args.input} is "
                             f"{inputs[wrt].dtype}, not a float array to differentiate")
        targets[name] = (lambda arrays, key=loss_name: contract.evaluate(arrays, args.backend)[key], wrt)
    if not targets:
        raise InputError(f"{source}: no gradient arrays (named grad_P or grad0_P)")
    report = _check(targets, inputs, given, args.eps, args.rtol, args.atol, args.max_entries, args.seed)
    not_given = [name for name in ours if _GRAD.fullmatch(name) and name not in given]
    print(f"the oracle's backend: {describe(args.backend, 'eval', inputs)}")
    print(report.table())
    if ignored and args.grads:
        print(f"(not gradients, ignored: {', '.join(ignored)})")
    print(report.summary() + (f"; not given, so not checked: {', '.join(not_given)}" if not_given else ""))
    return 0 if report.ok else 1




def register(subparsers) -> None:
    """Add ``ntpref gradcheck INPUT.npz [GRADS.npz] [--eps --rtol --atol --max-entries --backend]``."""
    text = "check gradients against central finite differences of the oracle's loss"
    p = subparsers.add_parser("gradcheck", help=text, description=text + ". GRADS.npz holds grad_P (dloss/dP) "
                              "and grad0_P (dloss0/dP) arrays, e.g. another framework's gradients for INPUT.npz; "
                              "without it the oracle's own gradients are checked. The report says how many "
                              "entries of each array were checked. Exit 0 ok, 1 mismatch, 2 bad input.")
    p.add_argument("input", metavar="INPUT.npz")
    p.add_argument("grads", metavar="GRADS.npz", nargs="?")
    p.add_argument("--eps", type=positive_argument, default=1e-6, help="finite-difference step (default 1e-6)")
    p.add_argument("--rtol", type=float, default=GRADCHECK_RTOL, help=f"relative tolerance (default {GRADCHECK_RTOL:g})")
    p.add_argument("--atol", type=float, default=GRADCHECK_ATOL, help=f"absolute tolerance (default {GRADCHECK_ATOL:g})")
    p.add_argument("--max-entries", type=integer_at_least(1, " (every array gets at least one entry checked)"), default=None, metavar="N",
                   help="check N >= 1 random entries per array (default all)")
    p.add_argument("--seed", type=integer_at_least(0), default=0, help="seed of the entry sample")
    p.add_argument("--backend", choices=CHOICES, default=AUTO, help=HELP)
    p.set_defaults(func=_handle)
