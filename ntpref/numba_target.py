"""The Numba environment of ntpref: vector width, cache directory, thread variables.

The ``ntpref`` command calls :func:`configure_process` (:func:`use_full_vector_width` and
:func:`ensure_cache_dir`) before any ntpref module imports Numba, and :func:`check_thread_variables` before
it runs anything. ``import ntpref`` calls none of them: a program that wants the same set-up calls
:func:`configure_process` itself, before its first use of a model (both change ``os.environ``).

Vector width
------------
Let LLVM use the full width of AVX-512 registers in ntpref's Numba kernels.

On CPUs with AVX-512 (Skylake-X and later), LLVM's tuning flag ``prefer-256-bit`` makes its loop
vectorizer use 256-bit vectors although 512-bit ones exist. The kernels here are throughput-bound
loops over heads or units (products, sums and the polynomial exponential of :mod:`ntpref.vmath`), which
run faster with the wider vectors (docs/performance.md gives the measured gain).

This changes speed only, never a result: the kernels are compiled without fastmath, so LLVM may not
reassociate a sum or contract a product into an FMA, and a vector lane computes exactly what the
scalar loop would, whatever the vector width (tests/test_numba_target.py compares both settings
bitwise).

Numba reads the target features from ``NUMBA_CPU_FEATURES`` when it creates its code generator (at
the first compilation or cache load of the process). :func:`use_full_vector_width` sets that variable
to the host's features plus ``-prefer-256-bit``, unless the user has set it (or turned AVX off with
``NUMBA_ENABLE_AVX=0``), or the host has no AVX-512. A process that compiled other Numba code before
importing ntpref keeps Numba's default (256-bit vectors, same results). Numba's cache keys include the
feature string, so both settings keep separate cache entries.

Cache directory
---------------
The kernels are compiled with ``cache=True``; Numba stores them in ``NUMBA_CACHE_DIR`` when set, else in
the ``__pycache__`` directory next to each module, else in the user's cache directory (``~/.cache/numba``
or ``$XDG_CACHE_HOME/numba``), and refuses to import a module when none of these is writable (a read-only
installation run by a user without a writable home). :func:`ensure_cache_dir` then points
``NUMBA_CACHE_DIR`` at ``ntpref-numba-cache-UID`` in the temporary directory (a private fresh one when
that name is taken by another user or writable by others) and prints a one-line notice.

Thread variables
----------------
Numba reads ``NUMBA_NUM_THREADS`` and ``NUMBA_THREADING_LAYER`` late (the first parallel kernel) and
fails with a traceback, or crashes starting a huge number of threads; :func:`check_thread_variables`
refuses bad values first, naming the variable.
"""
import importlib
import os
import stat
import sys
import tempfile
from pathlib import Path

from .errors import InputError

PREFER_256 = "-prefer-256-bit"
#: Largest NUMBA_NUM_THREADS accepted: this many (or the number of CPUs, if larger); Numba crashes when
#: the system cannot start the threads it is told to (e.g. 100000).
MAX_THREADS = 1024
#: Values of NUMBA_THREADING_LAYER Numba knows, and for those that need a library not always installed
#: (TBB, OpenMP), whether to check at start that Numba can load one.
THREADING_LAYERS = {"default": False, "workqueue": False, "forksafe": False, "omp": True, "tbb": True,
                    "safe": True, "threadsafe": True}
CACHE_NOTICE = "ntpref: notice: no writable Numba cache directory ({tried}); compiled kernels are cached in {dir}"


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


def configure_process() -> None:
    """The ``ntpref`` command's Numba set-up of its process: :func:`use_full_vector_width` (speed only, results
    are the same) and :func:`ensure_cache_dir` (needed where no cache directory is writable). Call it before
    the first ntpref model is imported; it sets environment variables, which child processes inherit."""
    use_full_vector_width()
    ensure_cache_dir()


def use_full_vector_width() -> None:
    """Set ``NUMBA_CPU_FEATURES`` to :func:`full_width_features` (module docstring) unless it is set, or
    the user turned AVX off with ``NUMBA_ENABLE_AVX=0``."""
    if "NUMBA_CPU_FEATURES" in os.environ or os.environ.get("NUMBA_ENABLE_AVX", "").strip() == "0":
        return
    features = full_width_features()
    if features is None:
        return
    _set_numba_variable("NUMBA_CPU_FEATURES", features)


def configured_target() -> dict:
    """The Numba CPU target this process compiles ntpref's kernels for, as Numba's configuration has it now
    (read only; for the provenance of stored results): ``cpu``, the LLVM CPU name (``NUMBA_CPU_NAME`` or the
    host's), and ``features``: "host" (Numba's default, the host's features), "host,-prefer-256-bit" (what
    :func:`use_full_vector_width` sets: 512-bit vectors), "host without AVX" (``NUMBA_ENABLE_AVX=0``), or
    the ``NUMBA_CPU_FEATURES`` string set otherwise ("" for ``NUMBA_CPU_NAME=generic`` alone)."""
    import llvmlite.binding as llvm
    from numba.core import config

    features = config.CPU_FEATURES
    if features is None:
        features = "host" if config.ENABLE_AVX else "host without AVX"
    elif features == full_width_features():
        features = f"host,{PREFER_256}"
    return {"cpu": config.CPU_NAME or llvm.get_host_cpu_name(), "features": features}


def _set_numba_variable(name: str, value: str) -> None:
    """Set a Numba environment variable, also in a Numba imported already (its config re-reads them)."""
    os.environ[name] = value
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.reload_config()


def _writable_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is, or can be created as, a directory this process can write files in (Numba's own
    test: create it, then a temporary file in it)."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
    except OSError:
        return False
    return True


def _user_cache_dir() -> Path:
    """Numba's user-wide cache directory (numba.misc.appdirs.user_cache_dir of "numba")."""
    if sys.platform == "darwin":
        return Path("~/Library/Caches/numba").expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path("~/.cache").expanduser(), "numba")


def _source_dirs() -> list[Path]:
    """The directories of ntpref's modules (each gets its own in-tree ``__pycache__``)."""
    root = Path(__file__).resolve().parent
    return [Path(d) for d, dirs, files in os.walk(root)
            if any(f.endswith(".py") for f in files) and "__pycache__" not in Path(d).parts]


def _private_temporary_cache() -> str | None:
    """``ntpref-numba-cache-UID`` in the temporary directory, created with mode 0700; a fresh private
    directory instead when that one is not a directory of this user closed to others; None when the
    temporary directory is not writable either."""
    try:
        base = tempfile.gettempdir()
        path = os.path.join(base, f"ntpref-numba-cache-{os.geteuid()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022 and _writable_dir(path):
            return path
        return tempfile.mkdtemp(prefix="ntpref-numba-cache-")
    except OSError:
        return None


def ensure_cache_dir(stream=None) -> str | None:
    """Point NUMBA_CACHE_DIR at a private temporary directory when Numba has nowhere to cache ntpref's
    kernels (module docstring); returns that directory (after a one-line notice on ``stream``, stderr
    unless given), or None when Numba's own choice works."""
    tried = []
    user_dir = os.environ.get("NUMBA_CACHE_DIR", "")
    if user_dir:
        if _writable_dir(user_dir):
            return None
        tried.append(f"NUMBA_CACHE_DIR={user_dir}")
    if all(_writable_dir(d / "__pycache__") for d in _source_dirs()):
        return None
    tried.append(f"{Path(__file__).resolve().parent}/__pycache__")
    try:
        user_wide = _user_cache_dir()
    except RuntimeError:  # no home directory at all
        user_wide = None
    if user_wide is not None and _writable_dir(user_wide):
        return None
    tried.append(str(user_wide or "~/.cache/numba"))
    fallback = _private_temporary_cache()
    if fallback is None:
        return None  # nothing writable at all: Numba's own error names the module it cannot cache
    _set_numba_variable("NUMBA_CACHE_DIR", fallback)
    print(CACHE_NOTICE.format(tried=", ".join(tried), dir=fallback), file=stream or sys.stderr, flush=True)
    return fallback


def check_thread_variables() -> None:
    """InputError naming the variable when NUMBA_NUM_THREADS is not a whole number from 1 to
    max(MAX_THREADS, CPUs), or NUMBA_THREADING_LAYER is not a layer Numba knows or can load here."""
    text = os.environ.get("NUMBA_NUM_THREADS")
    if text is not None:
        limit = max(MAX_THREADS, os.cpu_count() or 1)
        try:
            count = int(text.strip())
        except ValueError:
            count = 0
        if not 1 <= count <= limit:
            raise InputError(f"environment variable NUMBA_NUM_THREADS={text!r}: expected a whole number of "
                             f"threads from 1 to {limit}")
    layer = os.environ.get("NUMBA_THREADING_LAYER")
    if layer is None:
        return
    name = layer.strip().lower()
    if name not in THREADING_LAYERS:
        raise InputError(f"environment variable NUMBA_THREADING_LAYER={layer!r}: not a threading layer; "
                         f"expected one of {', '.join(THREADING_LAYERS)}")
    if THREADING_LAYERS[name]:
        parallel = importlib.import_module("numba.np.ufunc.parallel")
        try:
            parallel._launch_threads()  # what the first parallel kernel would do; fails the same way
        except ValueError as exc:
            why = " ".join(str(exc).replace("HINT:", "").split())
            raise InputError(f"environment variable NUMBA_THREADING_LAYER={layer!r}: {why} (or unset the "
                             "variable to use the default layer)") from None
