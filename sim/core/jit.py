"""``njit``: numba's compiler where numba is installed, else the identity.

The core's functions are plain Python over numpy arrays and integers. Under numba they are
compiled to machine code once (``cache=True`` keeps the result in ``__pycache__``); without
numba, or with ``PAGESIM_JIT=0``, the very same functions run in CPython: that is the
readable specification, and ``tests/sim/core/`` compares the two on random runs.
"""

from __future__ import annotations

import os
import types

try:
    if os.environ.get("PAGESIM_JIT", "1") == "0":
        raise ImportError("PAGESIM_JIT=0")
    import numba
except ImportError:  # CPython runs the same functions
    numba = None

COMPILED = numba is not None


#: the core's Python-only files: what builds its state, runs the compiled functions, checks and reads the state
NOT_COMPILED = ("__init__.py", "replay.py", "check.py", "build.py", "outcome.py")


def _drop_stale_cache(here=None) -> None:
    """numba's cache checks only the modification time of a function's own file, not of the
    files whose functions it inlined, nor this file's flags: after any edit of the core a
    cached function could be stale. The cache is therefore keyed by a hash of every core
    source numba reads (functions, and the constants it freezes into them: all but the
    Python-only glue in :data:`NOT_COMPILED`, whose edits need no recompile), and dropped when
    that changes."""
    import hashlib
    from pathlib import Path

    here = Path(__file__).resolve().parent if here is None else Path(here)
    sources = [p.read_bytes() for p in sorted(here.glob("*.py")) if p.name not in NOT_COMPILED]
    digest = hashlib.sha256(b"".join(sources)).hexdigest()
    cache = here / "__pycache__"
    stamp = cache / "core-sources.sha256"
    try:
        if stamp.exists() and stamp.read_text() == digest:
            return
        for f in [*cache.glob("*.nbi"), *cache.glob("*.nbc")]:
            f.unlink()
        cache.mkdir(exist_ok=True)
        stamp.write_text(digest)
    except OSError:  # a read-only install: numba then caches elsewhere or not at all
        pass


def _load_numpy_support_without_scipy() -> None:
    """numba's numpy support, when first loaded (at the first compile or cache load), checks
    that a BLAS exists by importing scipy.linalg (0.2-0.6 s on this project's machine, a third
    of a whole ``pagesim simulate``), though the core calls no BLAS. It is loaded here with
    scipy.linalg hidden, and the one flag that check sets (``_HAVE_BLAS``, which picks BLAS or a loop
    for numba's inner products) is then set as the check would have set it: numba itself
    imports scipy when something compiles a BLAS call (``np.dot``, ``np.linalg``), so nothing
    changes but when scipy is imported. Skipped when scipy.linalg is loaded already."""
    import importlib.util
    import sys

    if "scipy.linalg" in sys.modules:
        return
    sys.modules["scipy.linalg"] = None  # an import of scipy.linalg now raises ImportError
    try:
        from numba.np import arraymath
    finally:
        del sys.modules["scipy.linalg"]
    arraymath._HAVE_BLAS = importlib.util.find_spec("scipy") is not None


if COMPILED:
    _drop_stale_cache()
    _load_numpy_support_without_scipy()


def njit(fn=None, *, inline: bool = False, refcounted: bool = False):
    """Compile ``fn`` with numba, or return it. No Python object, exception or allocation
    inside (errors are return codes; arrays are made by the caller), so the functions are
    compiled without numba's reference counting (``_nrt=False``): with it, every call would
    count references to each of the ~60 arrays of the state, several times slower.
    ``inline=True`` (numba inlines the function's code into its caller's) for the small
    functions of the hot path and for the functions an iteration calls from one place: a call
    passes each array of the state field by field, ~420 machine words (a few hundred
    nanoseconds, more than an iteration's own bookkeeping). A function called from several
    places stays a call (inlined, it would be compiled once per place: numba's compile time
    grows with the inlined code). A constant passed to a function that stays a call is typed
    ``np.int64(...)`` / ``np.bool_(...)`` at the call: numba types a literal by its value and
    would compile the callee once per constant. ``refcounted=True`` keeps numba's reference counting, which
    its typed containers need (the cluster's list of replicas, ``sim/core/cluster.py``); the
    functions it calls keep theirs off."""
    if fn is None:
        return lambda f: njit(f, inline=inline, refcounted=refcounted)
    if numba is None:
        return fn
    return numba.njit(cache=True, nogil=True, _nrt=refcounted, inline="always" if inline else "never")(fn)


_INTERPRETED: dict = {}


def interpreted(fn):
    """The plain Python function behind a core function, calling the plain Python functions
    behind the core functions it calls: the same source, run by CPython. For numpy array
    arguments (compiled, the core's functions allocate nothing, so they take scalars and
    existing arrays only), and where a call from Python costs more than the arithmetic."""
    py = getattr(fn, "py_func", None)
    if py is None:
        return fn
    if fn in _INTERPRETED:  # made already, or being made (a name may lead back: co_names holds
        return _INTERPRETED[fn]  # attribute names too, kv_cache.memory_categories in memory_categories)
    names = dict(py.__globals__)  # a copy: the module's own names stay numba's
    _INTERPRETED[fn] = plain = types.FunctionType(py.__code__, names, py.__name__, py.__defaults__, py.__closure__)
    for name in py.__code__.co_names:
        if hasattr(names.get(name), "py_func"):
            names[name] = interpreted(names[name])
    return plain
