"""The core's loops compiled ahead of time into extension modules, so that a run needs no numba.

numba compiles a scheduler family's loop (``loop.loop_for``: the family's ``run`` and all it
calls) the first time it runs; later processes load that machine code from numba's cache, but
only after importing numba and setting up its compiler (~0.5 s, a third of a whole ``pagesim
simulate``). So once a run has loaded a loop from numba's cache (a later command than the one
that compiled it: a loop run once is not worth a module), the same function is also written by
numba's own ahead-of-time compiler (``numba.pycc``), in a process of its own that the run does
not wait for (:func:`build_in_background`), into a Python extension module beside numba's
cache, one module per family and loop: the engine's (``CORE``) and the cluster's (``CLUSTER``,
``cluster.py``: K engines behind a router). A later process imports it (milliseconds) and
never imports numba for an engine's run (a cluster's imports it, not its compiler: numba's
check of the replicas' list calls ``numba.typeof``). One source, compiled by the same
compiler: the module's results are numba's, bit for bit (``tests/sim/core/test_aot.py``).

The module is named by its loop, its family and a hash of the sources of its family's loops
(``jit.sources_digest``; a scheduling policy's file is not linked in: ``jit.lazy_only``),
this file and the arguments' array kinds (``replay.array_kind``: what numba's types depend on),
so a stale one is never loaded; it lies beside numba's cache
(``sim/core/__pycache__``, or ``$NUMBA_CACHE_DIR/pagesim_core``), or, built with the package
(``sim/precompile.py``, which ``setup.py`` runs for a wheel or ``pip install .``), in
``sim/core/compiled/``, where a first run finds every family's. Its machine code is for the
generic x86-64 (pycc's default), not this CPU, so a cache shared between machines stays valid.
Building it needs a C compiler and setuptools; where either is missing, or the cache is
read-only, runs load numba's cache as before (the log says so once). ``PAGESIM_JIT=numba``
skips the modules.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from pagesim.sim.core.compile import jit
from pagesim.sim.core.events import cluster, loop
from pagesim.sim.core.compile.families import SCHEDULER_BY_ADDRESS
from pagesim.sim.core.state import SCHEDULER_ADDRESS
from pagesim.sim.terminal import NOTICE_KEY

LOG = logging.getLogger(__name__)


def cache_dir() -> Path:
    """Beside numba's cache: ``__pycache__`` here, or ``$NUMBA_CACHE_DIR/pagesim_core``."""
    return jit.modules_dir()


#: the modules built with the package (read only: a stale one is passed over, never deleted)
SHIPPED = Path(__file__).resolve().parents[1] / "compiled"  # sim/core/compiled

_LOADED: dict = {}  # module name -> its run (None: absent)


#: what a module holds: a family's engine loop (``loop.run_for``) or its cluster loop
#: (``cluster.run_for``, K engines of that family behind a router)
CORE, CLUSTER = "core", "cluster"
_RUN_FOR = {CORE: loop.run_for, CLUSTER: cluster.run_for}


def exported(which: tuple[str, int], linked: int):
    """The module's function: a call of the family's loop (``which``: (CORE or CLUSTER, family))
    as numba compiled it, with the loop's own flags (the engine loop counts no references;
    pycc compiling the loop's source itself would count them at each of its calls, several
    times slower), and the lazy functions whose slots are the bits of ``linked`` linked in."""
    entry, family = which
    by_address = SCHEDULER_BY_ADDRESS[family]  # a constant of the closures below
    if entry == CLUSTER:
        target = cluster.run_for(family)

        def run_cluster(replicas, configs, counts, clocks, routed, replica_of, cc, ck, arrival_s):
            # the replicas' loop and scheduler linked into the module, their addresses passed
            # (loop.call_engine) and set (loop.call_scheduler: the configs' rows are the replicas')
            if by_address:
                configs[:, SCHEDULER_ADDRESS] = loop.linked_scheduler(replicas, family)
            for r in range(configs.shape[0]):
                loop.link_lazies(configs[r], replicas, linked)
            return target(replicas, configs, counts, clocks, routed, replica_of, cc, ck, arrival_s,
                          loop.linked_engine(replicas, family))

        return run_cluster

    def run(s):
        if by_address:  # the scheduler linked in (loop.call_scheduler)
            s.config[SCHEDULER_ADDRESS] = loop.linked_scheduler(s, family)
        loop.link_lazies(s.config, s, linked)  # and the lazy functions it links (jit.njit's lazy)
        return loop.run_family(s, family)

    return run


def entry_of(fn):
    """(CORE or CLUSTER, family) when ``fn`` (plain or numba's dispatcher) is a family's engine
    or cluster loop, else None: a module holds one of them."""
    plain = getattr(fn, "py_func", fn)
    for entry, run_for in _RUN_FOR.items():
        for family in loop.FAMILIES:
            run = run_for(family)
            if plain is getattr(run, "py_func", run):
                return entry, family
    return None


def module_prefix(which: tuple[str, int]) -> str:
    """What every module of the loop ``which`` is named by first (the rest: a hash)."""
    return f"pagesim_{which[0]}_{loop.FAMILIES[which[1]]}_"


def module_name(kinds: tuple, which: tuple[str, int]) -> str:
    """Named by what its machine code depends on: its family's sources, this file, the loop it
    holds, the arrays' kinds, and numpy's version (the module is built against numpy's C
    interface)."""
    entry, family = which
    # the sources of this family's loops and of its scheduler, linked in (sim/core/compile/families.py;
    # a policy's file is not: jit.lazy_only)
    groups = (loop.FAMILIES[family], loop.SCHEDULER_GROUPS[family])
    digests = "|".join(jit.digest_read(group) for group in groups)
    key = f"{digests}|{Path(__file__).read_bytes()!r}|{entry}|{family}|{kinds!r}|{np.__version__}"
    return module_prefix(which) + hashlib.sha256(key.encode()).hexdigest()[:20]


def module_path(name: str) -> Path:
    return cache_dir() / (name + importlib.machinery.EXTENSION_SUFFIXES[0])


def load(kinds: tuple, which: tuple[str, int]):
    """The module's loop ``which`` for arguments of ``kinds`` if it has been built, else None;
    called with the lazy functions it does not link set first (:func:`_with_unlinked`)."""
    if os.environ.get("PAGESIM_JIT") == "numba":
        return None
    name = module_name(kinds, which)
    if name not in _LOADED:
        built = module_path(name)
        entry = None
        for path in (SHIPPED / built.name, built):
            if entry is None and path.exists():
                try:
                    spec = importlib.util.spec_from_file_location(name, path)
                    module = importlib.util.module_from_spec(spec)
                    spec.loader.exec_module(module)
                    entry = functools.partial(_with_unlinked, module.run, module.linked(), which[0] == CLUSTER)
                except Exception as e:  # noqa: BLE001 - a broken module: numba's cache now, a new module next
                    LOG.debug("the core's extension module %s did not load (%s: %s)", path, type(e).__name__, e)
                    if path == built:
                        with contextlib.suppress(OSError):
                            path.unlink()
        _LOADED[name] = entry
    return _LOADED[name]


def _with_unlinked(run, linked: int, cluster: bool, *args):
    """``run(*args)``, an extension module's loop, each state's lazy functions that the module
    does not link (``linked``: the slots it does, as bits) and the run needs set, and the
    implementations of the policy it chose (``jit.set_lazy_addresses``)."""
    for s in args[0] if cluster else args[:1]:
        jit.set_lazy_addresses(s, linked=linked)
    return run(*args)


_BACKGROUND: list = []  # the processes build_in_background started

#: the wheel's modules (``sim/precompile.py``): written by the run that compiled the loop, and
#: linking every lazy function (a run's links those it needs)
FOR_THE_WHEEL = False


def build_in_background(args: tuple, kinds: tuple, which: tuple[str, int], compiled: bool = False) -> None:
    """:func:`build`, in a process of its own at a lower priority, which goes on after this one
    ends: the run does not wait the seconds the module takes (the tests neither, on a machine's
    other core). The process loads the loop from numba's cache. A failure is said by the next
    run that would build it. ``compiled``: this run compiled the loop (numba's cache did not
    have it); then none is built, nor by another process of the same command that loads it
    from the cache (a sweep's worker: :func:`_compiled_by_this_command`), but for the wheel: the
    next command that loads the loop builds it, so that a command run once on a machine (a
    first try, a CI job) pays for no module it would never load. ``PAGESIM_AOT_WAIT=1``: the run
    builds it itself, compiled or loaded, and waits (``benchmarks/``: a build beside a timed run
    would share its core, and a benchmark's later processes time the module)."""
    if os.environ.get("PAGESIM_AOT_WAIT") == "1":  # the benchmarks' runs: none goes on beside a timing
        build(args, kinds, which)
        return
    name = module_name(kinds, which)
    if not FOR_THE_WHEEL and (compiled or _compiled_by_this_command(name)):
        if compiled:
            _note_compiled(name)
        return
    if not _wanted(name):
        _say_failure_once(name)
        return
    import pickle
    import subprocess
    import sys

    request = pickle.dumps((tuple(jit.numba.typeof(a) for a in args), kinds, which, linked_for(args, which)))
    try:
        child = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
        child.stdin.write(request)
        child.stdin.close()
    except OSError as e:  # no process to be had: runs load numba's cache
        LOG.debug("the extension module's build did not start (%s)", e)
        return
    _BACKGROUND[:] = [*(p for p in _BACKGROUND if p.poll() is None), child]  # the ended ones reaped
    # (the compile notice says it, once a command: replay.compile_notice)
    LOG.debug("writing the compiled core into an extension module in the background (later runs load it)")


def _command() -> str:
    """This command, as its processes share it: the CLI's marker (``NOTICE_KEY``, set once a
    command and inherited by its workers), else this process."""
    return os.environ.get(NOTICE_KEY) or f"process {os.getpid()}"


def _note_compiled(name: str) -> None:
    """Remember beside the module that this command compiled its loop (where the cache can be written)."""
    with contextlib.suppress(OSError):
        cache_dir().mkdir(parents=True, exist_ok=True)
        (cache_dir() / (name + ".compiled")).write_text(_command())


def _compiled_by_this_command(name: str) -> bool:
    """Whether a process of this command compiled the loop of module ``name`` (:func:`_note_compiled`)."""
    try:
        return (cache_dir() / (name + ".compiled")).read_text() == _command()
    except OSError:
        return False


def wait_for_builds() -> None:
    """Until every build this process started in the background has ended."""
    while _BACKGROUND:
        _BACKGROUND.pop().wait()


def _wanted(name: str) -> bool:
    """Whether module ``name`` is to be built: neither built, shipped, failed before
    (``.failed``: delete it to try again) nor turned off (``PAGESIM_JIT=numba``)."""
    path = module_path(name)
    return not (os.environ.get("PAGESIM_JIT") == "numba" or path.exists() or (SHIPPED / path.name).exists()
                or (cache_dir() / (name + ".failed")).exists())


def _say_failure_once(name: str) -> None:
    """A background build's failure, said by the first run after it (``.said`` beside it)."""
    failed, said = cache_dir() / (name + ".failed"), cache_dir() / (name + ".said")
    if failed.exists() and not said.exists():
        with contextlib.suppress(OSError):
            said.touch()
            _say_not_written(LOG.info, failed.read_text(), failed)


def linked_for(args: tuple | None, which: tuple[str, int]) -> int:
    """The lazy functions a module built for the run of ``args`` links, as bits of their slots
    (``jit.lazy_mask``): those the run needs (its configuration's, or its replicas'), or, for
    the wheel's or without a run, every one. A later run that needs another loads it from numba's
    cache, as a policy's implementation (:func:`_with_unlinked`): a module costs no compile of
    code its run did not need (every lazy function compiled for it cost more than the loop's own
    compile: docs/performance.md, "The first command's compile bill")."""
    if FOR_THE_WHEEL or args is None:
        return jit.lazy_mask((), every=True)
    configs = args[1] if which[0] == CLUSTER else (args[0].config,)
    return jit.lazy_mask(configs)


def build(args: tuple, kinds: tuple, which: tuple[str, int]) -> None:
    """Write the module of the loop ``which`` for arguments of ``kinds`` (numba loaded, the loop
    compiled for the types of ``args``: pycc links numba's optimized code of it and emits it)."""
    _build(tuple(jit.numba.typeof(a) for a in args) if args is not None else None, kinds, which,
           linked_for(args, which))


def _build(types: tuple, kinds: tuple, which: tuple[str, int], linked: int, wait: bool = False) -> None:
    """:func:`build` for arguments of numba's ``types``. One process builds it at a time: while
    another does, nothing is done, or, with ``wait`` (a background build), that one is waited
    for, so that :func:`wait_for_builds` returns with the module written whoever wrote it. A
    failure is said once and remembered beside it, so that it is not retried every run."""
    name = module_name(kinds, which)
    path = module_path(name)
    failed = cache_dir() / (name + ".failed")
    if not _wanted(name):
        return
    try:
        with _build_lock(name, wait) as mine:
            if mine and _wanted(name):  # not written, nor failed, by a build waited for
                _compile(types, name, path, which, linked)
    except Exception as e:  # noqa: BLE001 - any failure leaves runs on numba's cache
        why = f"{type(e).__name__}: {e}"
        try:  # said once per machine (where the failure can be remembered), else quietly
            failed.write_text(why + "\n")
            say = LOG.info
        except OSError:
            say = LOG.debug
        _say_not_written(say, why, failed)


def _say_not_written(say, why: str, failed: Path) -> None:
    """A build's failure, as the run that met it or the next one says it (``say``: a log level's)."""
    say("the compiled core was not written into an extension module (%s); runs load numba's cache, ~0.5 s "
        "more each (%s says why)", why.splitlines()[0][:200], failed)


@contextlib.contextmanager
def _build_lock(name: str, wait: bool = False):
    """Yields whether this process holds the build (another one building: False at once, or,
    with ``wait``, True once that one has ended)."""
    import fcntl

    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / (name + ".lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True


def _compile(types: tuple, name: str, path: Path, which: tuple[str, int], linked: int) -> None:
    import warnings

    t0 = time.perf_counter()
    numba = jit.numba
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pycc's pending deprecation
        from numba.pycc import CC

        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
            cc = CC(name)
            cc.output_dir = tmp
            _reuse_shared_objects(cc)
            cc.export("run", numba.int64(*types))(exported(which, linked))
            cc.export("linked", numba.int64())(lambda: linked)
            with _linked_as_optimized():
                cc.compile()
            built = Path(tmp) / path.name
            os.replace(built, path)
    (cache_dir() / (name + ".compiled")).unlink(missing_ok=True)  # (_note_compiled's, done with)
    for stale in path.parent.glob(module_prefix(which) + "*"):
        if not stale.name.startswith(name):  # one module a family: every configuration has the same kinds
            stale.unlink(missing_ok=True)
    LOG.info("wrote the compiled core into an extension module in %.0f s: later runs load it without numba",
             time.perf_counter() - t0)


@contextlib.contextmanager
def _linked_as_optimized():
    """pycc's library of the module not optimized again as a whole: what it links is numba's
    code of each function as numba optimized it, its callees linked in (``CPUCodeLibrary.
    _get_module_for_linking``, the final module after ``finalize``): optimizing the whole once
    more repeated that work, for machine code no faster (docs/performance.md).
    Each exported function's own code is still optimized as a function (``add_llvm_module``)."""
    from numba.core import codegen

    library = codegen.AOTCodeLibrary
    had = library.__dict__.get("_optimize_final_module")
    library._optimize_final_module = lambda self: None
    try:
        yield
    finally:
        if had is None:
            del library._optimize_final_module
        else:
            library._optimize_final_module = had


#: the one C source of pycc's that names its module (``PYCC_MODULE_NAME``, numba/pycc/modulemixin.c):
#: every other one compiles to the same object for every module
_NAMES_ITS_MODULE = "modulemixin.c"


def _reuse_shared_objects(cc) -> None:
    """Make ``cc`` compile numba's C sources that do not name the module (its dict, list and set
    objects, its runtime: ``CC._get_mixin_sources``) once per machine, into a folder beside the
    modules keyed by their text, the compiler's flags and numba's version, and link those objects
    into every later module: about 2.5 s of each module's build (the one that names its module,
    modulemixin.c, still compiles each time). Left as numba has it where pycc's internals differ."""
    numbas = getattr(cc, "_compile_mixins", None)
    if numbas is None or not all(hasattr(cc, a) for a in ("_get_mixin_sources", "_get_mixin_defines", "_toolchain")):
        return
    import shutil
    import sysconfig

    def compile_objects(sources, build_dir, macros):
        return cc._toolchain.compile_objects(sources, build_dir, include_dirs=cc._toolchain.get_python_include_dirs(),
                                             macros=macros, extra_cflags=cc._get_extra_cflags())

    def compile_mixins(build_dir):
        try:
            return reusing(build_dir)
        except Exception as e:  # noqa: BLE001 - numba's own way then, which builds the module as before
            LOG.debug("numba's C objects not reused (%s: %s)", type(e).__name__, e)
            return numbas(build_dir)

    def reusing(build_dir):
        sources = cc._get_mixin_sources()
        own = [s for s in sources if Path(s).name == _NAMES_ITS_MODULE]
        # a path without '..': the compiler's object mirrors it under the build folder, and an
        # 'a/pycc/../core' there exists only where the one that names its module made 'a/pycc'
        shared = [os.path.normpath(s) for s in sources if s not in own]
        macros = [(k, "pagesim_shared" if k == "PYCC_MODULE_NAME" else v) for k, v in cc._get_mixin_defines()]
        key = hashlib.sha256(repr((jit.numba.__version__, macros, cc._get_extra_cflags(),
                                   sysconfig.get_config_var("CC"), sysconfig.get_config_var("CFLAGS"),
                                   [Path(s).read_bytes() for s in shared])).encode())
        folder = cache_dir() / f"pycc-objects-{key.hexdigest()[:20]}"
        if not folder.is_dir():
            cache_dir().mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
                objects = compile_objects(shared, tmp, macros)
                staged = Path(tmp) / "objects"
                staged.mkdir()
                for i, obj in enumerate(objects):  # numbered: the order pycc links them in
                    shutil.copyfile(obj, staged / f"{i:02d}-{Path(obj).name}")
                with contextlib.suppress(OSError):  # another build's folder came first: that one is used
                    os.rename(staged, folder)
        reused = [str(p) for p in sorted(folder.glob("*.o"))]
        return [*compile_objects(own, build_dir, cc._get_mixin_defines()), *reused]

    cc._compile_mixins = compile_mixins


if __name__ == "__main__":  # build_in_background's process: (types, kinds, which, linked) pickled on stdin
    import pickle
    import sys

    os.nice(10)
    jit.use_numba()
    _build(*pickle.loads(sys.stdin.buffer.read()), wait=True)
