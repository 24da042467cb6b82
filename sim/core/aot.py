"""The core's loop compiled ahead of time into an extension module, so that a run needs no numba.

numba compiles a scheduler family's loop (``loop.loop_for``: the family's ``run`` and all it
calls) the first time it runs; later processes load that machine code from numba's cache, but only after importing numba and setting up its
compiler (~0.5 s, a third of a whole ``pagesim simulate``). So once numba has compiled the
loop, the same function is also written, one module per family, by numba's own ahead-of-time compiler
(``numba.pycc``) into a Python extension module beside numba's cache; a later process imports
it (milliseconds) and never imports numba unless it needs another compiled function (a
cluster's loop). One source, compiled by the same compiler: the module's results are numba's,
bit for bit (``tests/sim/core/test_aot.py``).

The module is named by its family and a hash of the sources of its family's loop (``jit.sources_digest``),
this file, the family and the state's array kinds (``replay.array_kind``: what numba's types depend on), so a stale one
is never loaded; it lies beside numba's cache (``sim/core/__pycache__``, or
``$NUMBA_CACHE_DIR/pagesim_core``), or, built with the package (``sim/precompile.py``, which
``setup.py`` runs for a wheel or ``pip install .``), in ``sim/core/compiled/``, where a first
run finds every family's. Its machine code is for the generic x86-64 (pycc's
default), not this CPU, so a cache shared between machines stays valid. Building it needs a C
compiler and setuptools; where either is missing, or the cache is read-only, runs load
numba's cache as before (the log says so once). ``PAGESIM_JIT=numba`` skips the module.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from pagesim.sim.core import jit, loop

LOG = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Beside numba's cache: ``__pycache__`` here, or ``$NUMBA_CACHE_DIR/pagesim_core``."""
    numba_cache = os.environ.get("NUMBA_CACHE_DIR")
    return Path(numba_cache) / "pagesim_core" if numba_cache else Path(__file__).resolve().parent / "__pycache__"


#: the modules built with the package (read only: a stale one is passed over, never deleted)
SHIPPED = Path(__file__).resolve().parent / "compiled"

_LOADED: dict = {}  # module name -> its run (None: absent)


def exported(family: int):
    """The module's function: a call of the family's loop as numba compiled it (the loop's own
    flags: no reference counting; pycc compiling the loop's source itself would count
    references at each of its calls, several times slower)."""

    def run(s):
        return loop.run_family(s, family)

    return run


def family_of(fn):
    """The scheduler family whose loop ``fn`` is (plain or numba's dispatcher), or None: a
    module holds one family's loop (``loop.loop_for``)."""
    plain = getattr(fn, "py_func", fn)
    for kind in loop.FAMILIES:
        run = loop.run_for(kind)
        if plain is getattr(run, "py_func", run):
            return kind
    return None


def module_name(kinds: tuple, family: int) -> str:
    """Named by what its machine code depends on: its family's sources, this file, the family,
    the state's array kinds, and numpy's version (the module is built against numpy's C interface)."""
    group = loop.FAMILIES[family]  # the sources of this family's loop (sim/core/families.py)
    key = f"{jit.sources_digest(group=group)}|{Path(__file__).read_bytes()!r}|{family}|{kinds!r}|{np.__version__}"
    return f"pagesim_core_{loop.FAMILIES[family]}_" + hashlib.sha256(key.encode()).hexdigest()[:20]


def module_path(name: str) -> Path:
    return cache_dir() / (name + importlib.machinery.EXTENSION_SUFFIXES[0])


def load(kinds: tuple, family: int):
    """The module's loop of ``family`` for states of ``kinds`` if it has been built, else None."""
    if os.environ.get("PAGESIM_JIT") == "numba":
        return None
    name = module_name(kinds, family)
    if name not in _LOADED:
        built = module_path(name)
        entry = None
        for path in (SHIPPED / built.name, built):
            if entry is None and path.exists():
                try:
                    spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    entry = module.run
                except Exception as e:  # noqa: BLE001 - a broken module: numba's cache now, a new module next
                    LOG.debug("the core's extension module %s did not load (%s: %s)", path, type(e).__name__, e)
                    if path == built:
                        with contextlib.suppress(OSError):
                            path.unlink()
        _LOADED[name] = entry
    return _LOADED[name]


def build(s, kinds: tuple, family: int) -> None:
    """Write the module of ``family``'s loop for states of ``kinds`` (numba loaded, the loop
    compiled for ``s``'s types: pycc links numba's machine code of it, ~10 s). One process
    builds it at a time; a failure is said once and remembered beside it, so that it is not
    retried every run."""
    name = module_name(kinds, family)
    path = module_path(name)
    failed = cache_dir() / (name + ".failed")  # delete it to try again
    if os.environ.get("PAGESIM_JIT") == "numba" or path.exists() or failed.exists() or (SHIPPED / path.name).exists():
        return
    try:
        with _build_lock(name) as mine:
            if mine and not path.exists():
                _compile(s, name, path, family)
    except Exception as e:  # noqa: BLE001 - any failure leaves runs on numba's cache
        why = f"{type(e).__name__}: {e}"
        try:  # said once per machine (where the failure can be remembered), else quietly
            failed.write_text(why + "\n")
            say = LOG.info
        except OSError:
            say = LOG.debug
        say("the compiled core was not written into an extension module (%s); runs load numba's cache, ~0.5 s "
            "more each (%s says why)", why.splitlines()[0][:200], failed)


@contextlib.contextmanager
def _build_lock(name: str):
    """Yields whether this process holds the build (another one building: False at once)."""
    import fcntl

    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / (name + ".lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True


def _compile(s, name: str, path: Path, family: int) -> None:
    import warnings

    t0 = time.perf_counter()
    numba = jit.numba
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending deprecation
        from numba.pycc import CC

        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            cc = CC(name)
            cc.output_dir = tmp
            cc.export("run", numba.int64(numba.typeof(s)))(exported(family))
            cc.compile()
            built = Path(tmp) / path.name
            os.replace(built, path)
    for stale in path.parent.glob(f"pagesim_core_{loop.FAMILIES[family]}_*"):
        if not stale.name.startswith(name):  # one module a family: every configuration has the same kinds
            stale.unlink(missing_ok=True)
    LOG.info("wrote the compiled core into an extension module in %.0f s: later runs load it without numba",
             time.perf_counter() - t0)

