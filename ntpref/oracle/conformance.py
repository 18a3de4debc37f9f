"""``ntpref conformance``: check any implementation of the three models against the oracle (docs/conformance.md).

An **adapter** is a Python file (or module, object or dict) that defines one or both of

    evaluate(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]   # ntpref eval outputs
    train(model: str, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]      # ntpref train outputs

``model`` is a model of the registry (:mod:`ntpref.models`: "twostage", "shallow", "indrnn"); ``inputs`` are the arrays of an ``ntpref eval`` /
``ntpref train`` input (docs/contract.md) without ``model``, copies the adapter may keep or modify.
Every case of :mod:`ntpref.oracle.cases` is run through the function of its kind and the returned
arrays are compared with the oracle's outputs under a tolerance policy at a precision: in float64
(docs/tolerance.md) the calibrated tolerances by default, the running error bound with ``policy="bound"``;
with ``precision="float32"`` (docs/conformance.md, float32 mode) the calibrated float32 tolerances by
default, the float32 envelope (:mod:`ntpref.oracle.policies.envelope`) with ``policy="bound"``:

* an array the oracle does not output fails (a misspelt name is never ignored); an output the
  adapter does not return is listed in its case, not failed, unless the adapter returns it on another case
  of the same model and kind: then the cases that leave it out fail (an adapter that cannot do a case
  raises ``NotImplementedError``); a case whose outputs the adapter returns none of fails;
* an array whose tolerance on a case admits every value of its quantity (docs/tolerance.md) is *unchecked*
  there, never "within tolerance": the case and the verdict count and name it; an output unchecked on every
  case that compared it fails the run unless it is named in ``accept_unchecked`` (``--accept-unchecked NAME``);
* a run passes only if every **required** output of its cases was compared in at least one case:
  every output except the :data:`OPTIONAL` diagnostics of the models' specifications (the two-stage
  max-margin solutions ``W_ov_star``, ``W_kq_star`` and the correlations with them, ``stage1_corr``,
  ``stage2_corr``, which need a QP solver). So the loss, the model output and every gradient of an eval case, the trained parameters,
  ``loss_floor`` and the per-step logs of a train case are required; a required output that no case
  returned fails the run unless it is named in ``skip_outputs`` (``--skip-output NAME``);
* ``NotImplementedError`` raised by the adapter marks the case skipped, with its message; anything
  else it raises while it loads or runs (any exception, also ``SystemExit`` and ``KeyboardInterrupt``)
  is an :class:`AdapterError` carrying the adapter's own traceback (exit status 2). Only a signal is
  an interruption: one that :mod:`ntpref.interrupt` recorded (the command's handlers), or, under
  Python's default SIGINT handler, a KeyboardInterrupt (a Ctrl-C cannot be told from a raised one);
* the report names the failing quantity the run computes first (the model's ``timeline``: stage 1 before
  stage 2; at a step the loss, the gradient and its logged norm, then the update and the validation loss;
  the forward pass before the gradients), for a per-step log with the first step where the adapter leaves
  tolerance.

An implementation in another language is a :class:`CommandAdapter` (``--command 'CMD {input} {output}'``):
a command run once per case on a temporary input file, whose output file is judged as above. Its
non-zero exit status, timeout or unreadable output fails that case only (:class:`CaseError`); exit status
:data:`NOT_IMPLEMENTED` skips it.

Python API: ``check(adapter, case)`` gives one case's :class:`CaseReport`, ``run(adapter, ...)`` a selection's
:class:`RunReport`. In a pytest suite, :mod:`ntpref.testing` makes each case its own test whose failure
message is the case's whole table::

    from ntpref.testing import assert_conforms, parametrize_with_cases
    @parametrize_with_cases()
    def test_oracle(case):
        assert_conforms(my_adapter_module, case)

This module is that API's entry point: it runs a selection of cases (:func:`run`) and gives the names
above from the modules that do each job: loading a Python adapter (:mod:`ntpref.oracle.adapters`),
running a command (:mod:`ntpref.oracle.command_adapter`), judging one case (:mod:`ntpref.oracle.judging`),
the reports (:mod:`ntpref.oracle.report`); the command line is :mod:`ntpref.oracle.cli_conformance`.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

from ..errors import InputError
from .adapters import Adapter, AdapterError, load_adapter
from .cases import DEFAULT_RANDOM, KINDS, Case, cases
from .command_adapter import NOT_IMPLEMENTED, CaseError, CommandAdapter
from .judging import check
from .report import OPTIONAL, CaseReport, RunReport

__all__ = ["Adapter", "AdapterError", "CaseError", "CaseReport", "CommandAdapter", "NOT_IMPLEMENTED", "OPTIONAL",
           "RunReport", "cases", "check", "load_adapter", "run"]


def _check_names(option: str, names: Iterable[str], selected: list[Case]) -> None:
    """InputError for a name of ``names`` (given with ``option``) that no selected case outputs (a misspelt
    name is never ignored)."""
    outputs = {n for case in selected for n in case.expected}
    unknown = [n for n in names if n not in outputs]
    if unknown:
        raise InputError(f"{option} {unknown[0]}: not an output of the cases run "
                         f"({', '.join(sorted(outputs)) or 'none'})")


def run(adapter, models=None, random: int = DEFAULT_RANDOM, seed: int = 0, precision: str = "float64",
        stored: bool = True, root=None, progress: Callable[[CaseReport], None] | None = None,
        skip_outputs: Iterable[str] = (), kind: str | None = None, policy: str | None = None,
        accept_unchecked: Iterable[str] = (), backend: str = "auto") -> RunReport:
    """:func:`check` on every case of ``models`` whose kind the adapter defines (and is ``kind``, "eval" or
    "train", when given): the stored cases (of ``root``; none when ``stored`` is False) and ``random``
    random cases per model from ``seed``. ``adapter`` is anything :func:`load_adapter` takes, a
    :class:`CommandAdapter` included. ``progress`` sees each report as it is made, and again when a later
    case fails it (:meth:`RunReport.settle`). ``skip_outputs`` names required outputs the run passes without,
    ``accept_unchecked`` arrays it passes with although their tolerance admitted every value on some case
    (InputError for a name no case outputs); ``policy``: the tolerance policy (:func:`check`); ``backend``: the
    oracle's backend of the random cases (:func:`ntpref.oracle.cases.random_case`; "auto" by default)."""
    if kind is not None and kind not in KINDS:
        raise InputError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    adapter = load_adapter(adapter)
    selected = [case for case in cases(models, random, seed, stored, root, backend)
                if adapter.function(case.kind) and kind in (None, case.kind)]
    skip_outputs, accept_unchecked = list(skip_outputs), list(accept_unchecked)
    _check_names("--skip-output", skip_outputs, selected)
    _check_names("--accept-unchecked", accept_unchecked, selected)
    reports = RunReport(skip_outputs=skip_outputs, accept_unchecked=accept_unchecked)
    for case in selected:
        reports.append(check(adapter, case, precision, policy))
        changed = reports.settle()
        if progress is not None:
            for report in [reports[-1]] + [r for r in changed if r is not reports[-1]]:
                progress(report)
    return reports
