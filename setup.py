"""Packaging for ntpref: closed-form CPU oracle for two shallow-transformer training papers."""
import re

from setuptools import find_packages, setup


def long_description() -> str:
    """README.md for a package index page, where the repository's relative links lead nowhere: a link to a
    documentation page becomes its name and the command that finds the installed copy (`ntpref docs
    PAGE`), any other relative link its text and path in the source distribution."""
    text = open("README.md", encoding="utf-8").read()
    text = re.sub(r"\[([^\]]+)\]\(docs/([A-Za-z0-9_]+)\.md(#[^)]*)?\)", r"\1 (`ntpref docs \2`)", text)
    return re.sub(r"\[([^\]]+)\]\((?!https?:)([^)]+)\)", r"\1 (`\2` in the source distribution)", text)


setup(
    name="ntpref",
    version="0.1.0",
    description=(
        "Gold-standard CPU oracle (closed-form gradients, Numba kernels, float64) for two-stage "
        "normalized GD on a one-layer transformer and projected GD on a shallow multi-head transformer"
    ),
    long_description=long_description(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10,<3.14",
    # the stored reference cases, the conformance adapters, the C example and the documentation ship inside
    # the package (ntpref/reference_runs, ntpref/adapters, ntpref/numpy_adapters, ntpref/c_example,
    # ntpref/docs; ntpref.shipped finds them), so `ntpref verify`, `ntpref conformance --adapter NAME`,
    # `ntpref adapters [NAME]` and `ntpref docs` work on any install
    packages=find_packages(include=["ntpref", "ntpref.*"]) + ["ntpref.reference_runs", "ntpref.adapters",
                                                             "ntpref.numpy_adapters", "ntpref.c_example",
                                                             "ntpref.docs"],
    package_dir={"ntpref.reference_runs": "reference_runs", "ntpref.adapters": "examples/adapters",
                 "ntpref.numpy_adapters": "tests/conformance_adapters", "ntpref.c_example": "examples/c",
                 "ntpref.docs": "docs"},
    package_data={"ntpref.reference_runs": ["manifest.json", "README.md", "*/*.npz"],
                  "ntpref.c_example": ["*.c"],
                  "ntpref.docs": ["*.md", "figures/*.png", "results/*/*/README.md", "results/*/*/summary.txt",
                                  "results/*/*/*.png"]},
    install_requires=[
        "numpy>=2.0,<2.5",
        "numba>=0.68,<0.69",
        "tabulate>=0.9,<0.11",
        "threadpoolctl>=3.1,<4",
        "mpmath>=1.3,<2",   # the exact backend: ntpref conformance's calibrated tolerances, ntpref certify
    ],
    extras_require={
        # every module the tests import (torch and jax excepted: those tests skip, with a reason, without
        # the crosscheck extra), and pytest-xdist, which runs the suite on every core (pytest.ini; from 3.6
        # its workers run the tests in their main thread, which the signal tests need)
        "test": [
            "pytest>=8,<10", "pytest-xdist>=3.6,<4", "hypothesis>=6.100,<7", "matplotlib>=3.8,<4",
            "dask[distributed]>=2024.8", "cloudpickle>=3",
        ],
        "plot": ["matplotlib>=3.8,<4"],
        "crosscheck": ["torch==2.13.0", "jax>=0.4.30,<0.13", "jaxlib>=0.4.30,<0.13"],
        "dist": ["dask[distributed]>=2024.8"],
    },
    entry_points={"console_scripts": ["ntpref=ntpref.cli:command"]},
)
