"""pytest helpers: each conformance case its own pytest test (docs/conformance.md, "In your own test suite").

    import my_adapter                       # defines evaluate(model, inputs) and/or train(model, inputs)
    from ntpref.testing import assert_conforms, parametrize_with_cases

    @parametrize_with_cases(models=["shallow"], random=4)
    def test_matches_the_oracle(case):
        assert_conforms(my_adapter, case)

:func:`parametrize_with_cases` makes one test per case, its id the case id
(``test_matches_the_oracle[r0_shallow_1_eval_T1_erf]``). :func:`assert_conforms` checks one case: a failing
case raises an AssertionError whose message is the case's summary line and its whole table (every array's
row), which pytest prints in full at its default verbosity; a case the adapter declines (NotImplementedError,
or exit status 3 of a command) is skipped with the adapter's reason. pytest is imported only inside these
functions, so ntpref does not depend on it.
"""
from __future__ import annotations

from .oracle.conformance import CaseReport, cases, check

__all__ = ["assert_conforms", "parametrize_with_cases"]


def parametrize_with_cases(models=None, *, kind: str | None = None, **selection):
    """``pytest.mark.parametrize("case", ...)`` over ``cases(models, **selection)`` (random, seed, stored,
    root: :func:`ntpref.oracle.conformance.cases`), only the cases of ``kind`` ("eval" | "train") when given,
    each with its case id as the test id. Apply it to a test function taking ``case``."""
    import pytest

    if kind not in (None, "eval", "train"):
        raise ValueError(f"kind must be 'eval', 'train' or None, not {kind!r}")
    selected = [c for c in cases(models, **selection) if kind in (None, c.kind)]
    return pytest.mark.parametrize("case", selected, ids=[c.id for c in selected])


def assert_conforms(adapter, case, precision: str = "float64", policy: str | None = None) -> CaseReport:
    """Check ``case`` with ``adapter`` (:func:`ntpref.oracle.conformance.check`: a path, module, object,
    dict or CommandAdapter) and return its report when it passes. A failing case raises AssertionError
    carrying its summary and its whole table; a skipped one calls ``pytest.skip`` with the reason."""
    __tracebackhide__ = True      # pytest shows the caller's line, not this helper's
    report = check(adapter, case, precision, policy)
    if report.skipped is not None:
        import pytest

        pytest.skip(report.skipped)
    if not report.ok:
        raise AssertionError(f"{report.summary()}\n{report.table()}")
    return report
