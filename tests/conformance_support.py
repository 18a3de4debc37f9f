"""Shared by the tests of ``ntpref conformance``: the adapters under tests/conformance_adapters/, the command
run in this process, the oracle's outputs as a dict adapter, and the float32 adapter's evaluate()."""
from pathlib import Path

from ntpref.cli import main
from ntpref.oracle import contract
from ntpref.oracle.conformance import load_adapter

ADAPTERS = Path(__file__).resolve().parent / "conformance_adapters"


def conformance(capsys, *args):
    """(exit status, stdout, stderr) of ``ntpref conformance ARGS`` (an adapter file, or ``--command CMD``,
    and options) run in-process."""
    rc = main(["conformance", *map(str, args)])
    out, err = capsys.readouterr()
    return rc, out, err


def oracle(model, inputs, **changes):
    """The oracle's eval / train outputs of a case's inputs (a helper for dict adapters)."""
    run = contract.train if "eta" in inputs else contract.evaluate
    return run({"model": model, **inputs, **changes})


#: The evaluate() of tests/conformance_adapters/float32_outputs.py: the oracle's outputs rounded to float32.
float32_outputs = load_adapter(ADAPTERS / "float32_outputs.py").evaluate
