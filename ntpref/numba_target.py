"""Let LLVM use the full width of AVX-512 registers in ntpref's Numba kernels.

On CPUs with AVX-512 (Skylake-X and later), LLVM's tuning flag ``prefer-256-bit`` makes its loop
vectorizer use 256-bit vectors although 512-bit ones exist. The kernels here are throughput-bound
loops over heads or units (products, sums and the polynomial exponential of :mod:`ntpref.vmath`), and
512-bit vectors made the shallow transformer's gradient step (n = 4000, T = 16, d = 8, m = 64) about
1.3× faster on one thread and 1.4× on two on the 2-core Xeon of the README's benchmark.

This changes speed only, never a result: the kernels are compiled without fastmath, so LLVM may not
reassociate a sum or contract a product into an FMA, and a vector lane computes exactly what the
scalar loop would, whatever the vector width (tests/test_numba_target.py compares both settings
bitwise).

Numba reads the target features from ``NUMBA_CPU_FEATURES`` when it creates its code generator (at
the first compilation or cache load of the process). :func:`use_full_vector_width` sets that variable
to the host's features plus ``-prefer-256-bit``, unless the user has set it (or turned AVX off with
``NUMBA_ENABLE_AVX=0``), or the host has no AVX-512; ``import ntpref`` calls it before any ntpref module imports Numba. A process that compiled
other Numba code before importing ntpref keeps Numba's default (256-bit vectors, same results).
Numba's cache keys include the feature string, so both settings keep separate cache entries.
"""
import os
import sys

PREFER_256 = "-prefer-256-bit"


def full_width_features() -> str | None:
    """The host's LLVM feature string with ``-prefer-256-bit`` appended, or None without AVX-512 (or when
    LLVM cannot read the host's features)."""
    import llvmlite.binding as llvm

    try:
        features = llvm.get_host_cpu_features().flatten()
    except RuntimeError:
        return None
    if "+avx512f" not in features.split(","):
        return None
    return f"{features},{PREFER_256}"


def use_full_vector_width() -> None:
    """Set ``NUMBA_CPU_FEATURES`` to :func:`full_width_features` (module docstring) unless it is set, or
    the user turned AVX off with ``NUMBA_ENABLE_AVX=0``."""
    if "NUMBA_CPU_FEATURES" in os.environ or os.environ.get("NUMBA_ENABLE_AVX", "").strip() == "0":
        return
    features = full_width_features()
    if features is None:
        return
    os.environ["NUMBA_CPU_FEATURES"] = features
    config = sys.modules.get("numba.core.config")
    if config is not None:            # Numba already imported: its compiler re-reads the environment
        config.reload_config()
