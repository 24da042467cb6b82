"""``njit``: numba's compiler where numba is installed, else the identity.

The core's functions are plain Python over numpy arrays and integers. Under numba they are
compiled to machine code once (``cache=True`` keeps it, :func:`numbas_cache_dir`); without
numba, or with ``PAGESIM_JIT=0``, the very same functions run in CPython: that is the
readable specification, and ``tests/sim/core/`` compares the two on random runs.

numba is imported when something first needs a compiled function (:func:`use_numba`), not when
the core is imported: its import and set-up cost every process ~0.5 s, and a run whose loop is
already compiled into an extension module (``sim/core/compile/aot.py``) needs none of it. Until then
``njit`` only registers a function; :func:`use_numba` makes each registered function's
dispatcher and binds it, in the module of every registered function, where the plain function
was (numba resolves the names a function calls in its module when it compiles it). Python calls
the loops' machine code; a call from Python to any other core function runs its source in
CPython (:func:`_interpreted_from_python`), which compiles nothing more.

:func:`use_numba` also changes numba as it loads (``sim/core/compile/numba_patches.py``): it trims numba's
work on a cold compile where the machine code of the core's functions stays the same, keeps every
store into an array that numba's dead-code elimination would delete, and names each compiled
function by an id no other process gives. It compiles the core's functions without C wrappers
(``no_cfunc_wrapper`` in :func:`_dispatcher`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
import sys
import types

from pagesim.sim.core.compile import by_reference, numba_patches
from pagesim.sim.core.compile.families import FAMILIES, FAMILY_FILES, LOOP_FILES, SCHEDULER_GROUPS
from pagesim.sim.core.state import LAZY_ADDRESSES, STATE_ADDRESS, TABLES

#: the core's package (this file's room is one of its sub-packages)
CORE_PACKAGE = __package__.rpartition(".")[0]

#: numba is installed and not turned off (``PAGESIM_JIT=0``): the core runs compiled
COMPILED = os.environ.get("PAGESIM_JIT", "1") != "0" and importlib.util.find_spec("numba") is not None
numba = None  # the module, once use_numba() imported it

#: the core's Python-only files: what builds its state, runs the compiled functions, checks and reads the state
NOT_COMPILED = ("__init__.py", "events/replay.py", "check.py", "build.py", "outcome.py", "compile/aot.py",
                *(f"{room}/__init__.py" for room in ("compile", "events", "kv", "price", "sched")))

_OPTIONS: dict = {}  # each function given to njit -> (inline, refcounted)
_DISPATCHERS: dict = {}  # each function given to njit -> its numba dispatcher, once numba is loaded
_ON_LOAD: list = []  # what runs as numba loads, before the dispatchers are made (on_numba_load)


#: a cache group's name -> the core files only its functions compile: the functions given to
#: ``njit(cache_group=name)``: a scheduler family's loops, and its scheduler's entry in a group of
#: its own (``sim/core/compile/families.py``). A group is cached apart, keyed by the shared sources and its
#: own: an edit of its files recompiles it alone (and drops its family's extension modules)
_GROUP_FILES = {**{FAMILIES[kind]: LOOP_FILES[kind] for kind in FAMILIES},
                **{SCHEDULER_GROUPS[kind]: files for kind, files in FAMILY_FILES.items()}}
_FAMILY_OF_GROUP = {**{name: name for name in FAMILIES.values()},
                    **{SCHEDULER_GROUPS[kind]: FAMILIES[kind] for kind in FAMILIES}}
_GROUPS: dict = {}  # each function given to njit with a cache group -> the group's name
_SHARED_DIGEST: list = []  # sources_digest() of the core's shared sources, once read (_drop_stale_cache)
_DIGESTS: dict = {}  # each cache group's sources_digest() (SHARED: the shared functions'), as this process read them
_LAZY: dict = {}  # each function given to njit(lazy=...) -> (its slot of LAZY_ADDRESSES, when a run needs it)
_CHOSEN: dict = {}  # each interface (njit's lazy and chosen) -> which implementation a run's config chose
_IMPLEMENTS: dict = {}  # each implementation of an interface (njit's implements) -> the interface
_LAZY_ENTRY: dict = {}  # ... -> the dispatcher of its entry (lazy_entry_dispatcher), once made
_LAZY_ENTRIES: dict = {}  # (function, numba's type of the state) -> the address of its machine code
#: what a lazy function's parameters after the state, and its result, may be declared as
_SCALARS = {"int": "int64", "float": "float64", "bool": "boolean", "None": "none"}

def sources_digest(here=None, group: str | None = None, sources: dict | None = None) -> str:
    """A hash of the core sources numba reads for cache ``group``'s functions (None: every other
    function's): their functions and the constants frozen into them. Those are every file of the
    core, in its folder and its sub-folders (:func:`_sources`), but the Python-only glue in
    :data:`NOT_COMPILED` (its edits need no recompile), the files only their entries compile
    (:func:`lazy_only`) and the files the groups keep to themselves, plus ``group``'s own. Each
    file is named by its path from the core's folder, as those lists name it: a file of a
    sub-folder that no list names is shared. ``sources``: :func:`_sources` of ``here``, read."""
    from pathlib import Path

    here = Path(__file__).resolve().parents[1] if here is None else Path(here)  # (the core's folder)
    kept = {name for files in _GROUP_FILES.values() for name in files} | set(lazy_only())
    own = set(_GROUP_FILES.get(group, ()))
    return _files_digest([(name, text) for name, text in (_sources(here) if sources is None else sources).items()
                          if name not in NOT_COMPILED and (name not in kept or name in own)] + _flags())


def _flags() -> list:
    """What changes the machine code beside the sources each digest reads: the compile flags
    numba takes from the environment and its cache does not key by (its index: the signature,
    the CPU and the function's bytecode), ``NUMBA_BOUNDSCHECK`` (the test suite's,
    ``tests/checked_core.py``) where it is set; and the lazy functions' slots (compiled code
    reads an address at a slot's index, a constant; a file of another group declaring a lazy
    function moves the slots after it: :func:`fix_lazy_slots`)."""
    fix_lazy_slots()
    checked = os.environ.get("NUMBA_BOUNDSCHECK")
    slots = "\n".join(_where(fn) for fn in sorted(_LAZY, key=lambda fn: _LAZY[fn][0])).encode()
    return ([] if checked is None else [("NUMBA_BOUNDSCHECK", checked.encode())]) + [("lazy slots", slots)]


_FIXED: list = []  # [True] once the lazy functions' slots are numbered (fix_lazy_slots)


def _where(fn) -> str:
    return f"{fn.__module__}.{fn.__qualname__}"


def fix_lazy_slots() -> None:
    """Number the lazy functions' slots of ``config[LAZY_ADDRESSES]`` (``njit``'s ``lazy``) in the
    order of their names (module and name), once a process, the whole core imported first (its
    loop imports every file: every one declared). Declared, each took the next slot, in the
    order a process happened to import the core's files (a test importing ``kv/extent.py``
    first numbered them otherwise than a run), while machine code cached or written into a
    module by one process is run by others: by name, every process numbers them alike."""
    if _FIXED:
        return
    import importlib

    importlib.import_module(f"{CORE_PACKAGE}.events.loop")
    for slot, fn in enumerate(sorted(_LAZY, key=_where)):
        _LAZY[fn] = (slot, _LAZY[fn][1])
    _FIXED.append(True)


def _sources(here) -> dict:
    """The core's Python files, in ``here`` and every folder below it (a sub-package's), but
    those in a ``__pycache__`` (where the lazy functions' entries are written): each file's path
    from ``here`` (``/`` between folders) -> its bytes, in the paths' order."""
    named = {}
    for folder, folders, files in os.walk(here):
        folders[:] = [name for name in folders if name != "__pycache__"]
        inner = os.path.relpath(folder, here).replace(os.sep, "/")
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), "rb") as f:
                    named[name if inner == "." else f"{inner}/{name}"] = f.read()
    return dict(sorted(named.items()))


def lazy_only() -> tuple[str, ...]:
    """The core files whose functions compiled code reaches only through the entries of their
    implementations of an interface (``njit``'s ``implements``; the file's other functions are
    inline helpers of those): every scheduling policy's file but the inlined default's (the
    first of ``sim.systems.SCHEDULING_POLICIES``). Left out of every shared and group digest,
    each entry keyed by its own file instead (:func:`_lazy_digest`), so that an edit of one, or
    a new one, recompiles that file's entries alone, and no extension module links them
    (``aot.py``; tests/sim/core/test_jit_cache.py checks that no other core file names any
    function of theirs)."""
    from pagesim.sim.systems import SCHEDULING_POLICIES  # (the registry, above the core's files)

    return tuple(f"sched/{policy.file}.py" for policy in list(SCHEDULING_POLICIES.values())[1:])


def _files_digest(named) -> str:
    """A hash of the files ``named``, (name, bytes) pairs, each by its name and its bytes."""
    import hashlib

    return hashlib.sha256(b"".join(name.encode() + b"\0" + text for name, text in named)).hexdigest()


def _beside_numbas_cache(in_users: str, in_tree: str, here=None):
    """A folder beside numba's cache: ``$NUMBA_CACHE_DIR/<in_users>`` where the user set one,
    else ``sim/core/__pycache__/<in_tree>``."""
    from pathlib import Path

    here = Path(__file__).resolve().parents[1] if here is None else Path(here)  # (the core's folder)
    user = os.environ.get("NUMBA_CACHE_DIR")
    return Path(user) / in_users if user else here / "__pycache__" / in_tree


def group_cache_dir(group: str, here=None):
    """The folder that cache ``group``'s functions are cached in (numba's cache of them lies in a
    folder of it per source folder, :func:`numbas_cache_dir`): ``$NUMBA_CACHE_DIR/pagesim-<group>``,
    or ``sim/core/__pycache__/family-<group>``."""
    return _beside_numbas_cache(f"pagesim-{group}", f"family-{group}", here)


def modules_dir(here=None):
    """Where the extension modules of the core's loops lie (``sim/core/compile/aot.py``), beside numba's
    cache: ``$NUMBA_CACHE_DIR/pagesim_core``, or ``sim/core/__pycache__``."""
    return _beside_numbas_cache("pagesim_core", "", here)


def numbas_cache_dir(folder, group: str | None = None, here=None):
    """Where numba caches the functions of the core's files in ``folder``: cache group ``group``'s
    (None: every other function's), their dispatchers made as :func:`_dispatcher` makes them;
    None where numba caches nowhere. numba's own locators answer (its
    ``numba/core/caching.py``, ``CacheImpl._locator_classes``), for a file of ``folder``:
    ``<cache>/<folder's name>_<sha1 of its path>`` where the cache is ``$NUMBA_CACHE_DIR`` (the
    shared functions') or the group's folder (:func:`group_cache_dir`), else, where that cannot
    be written, ``folder/__pycache__``, else the user's numba cache (``~/.cache/numba/...``)."""
    from pathlib import Path

    from numba.core import caching, config

    source = min(Path(folder).glob("*.py"), default=None)
    if source is None:
        return None
    saved = config.CACHE_DIR
    config.CACHE_DIR = str(group_cache_dir(group, here)) if group else os.environ.get("NUMBA_CACHE_DIR", "")
    try:
        return Path(caching.CompileResultCacheImpl(_function_of(str(source))).locator.get_cache_path())
    except RuntimeError:  # no locator: numba caches none of it
        return None
    finally:
        config.CACHE_DIR = saved


@functools.cache
def _function_of(path: str):
    """A function of the file at ``path`` (numba's cache locators read its file and first line)."""
    code = compile("def f(): pass", path, "exec")
    return types.FunctionType(next(c for c in code.co_consts if isinstance(c, types.CodeType)), {})


SHARED = "shared"  # the shared functions' name in a stamp (:data:`_STAMP`), beside the groups'
#: the file in each of numba's folders of the core's cache (:func:`numbas_cache_dir`) that names
#: the digest of the sources each cache group there was compiled from (:func:`_drop_stale_cache`)
_STAMP = "core-sources.sha256"


def _drop_stale_cache(here=None) -> None:
    """numba's cache checks only a function's own file, not the files whose functions it inlined
    or calls, nor this file's flags: after an edit of the core a cached function could be
    stale. The cache is therefore keyed by :func:`sources_digest`: the shared functions' dropped
    when a shared source changes, each cache group's when a shared source or one of its own
    files does; each with the extension modules built from it (``aot.py``, in
    :func:`modules_dir`: a process with a cache of its own leaves the others' alone). It is
    dropped where numba writes it (:func:`numbas_cache_dir`), for every folder of the core's
    sources: there the files of numba's cache (``*.nbi``, ``*.nbc``) go, nothing else, and that
    folder holds only the functions of that one source folder (numba names it by the folder's
    path, ``$NUMBA_CACHE_DIR`` or not); a file there (:data:`_STAMP`) names the digest of each
    group cached there (several where numba falls back to one folder for all)."""
    from pathlib import Path

    own = here is None
    # (numba names its folders by the path of a function's file as imported, not resolved)
    here = Path(__file__).parents[1] if here is None else Path(here)
    sources = _sources(here)
    digests = {group: sources_digest(here, None if group == SHARED else group, sources)
               for group in (SHARED, *_GROUP_FILES)}
    if own:  # the core's own: its lazy entries' digest and its dispatchers' cache keys read them
        _SHARED_DIGEST[:] = [digests[SHARED]]
        _DIGESTS.update(digests)
    stamps: dict = {}  # numba's folder -> {group: digest} of the groups it caches
    try:
        for folder in sorted({(here / name).parent for name in sources}):
            for group, digest in digests.items():
                where = numbas_cache_dir(folder, None if group == SHARED else group, here)
                if where is not None:
                    stamps.setdefault(where, {})[group] = digest
    except OSError:  # a read-only install: numba then caches elsewhere or not at all
        pass
    for where, cached in stamps.items():
        stamp = where / _STAMP
        try:
            lines = stamp.read_text().splitlines() if stamp.exists() else []
            before = {group: digest for group, _, digest in (line.partition(" ") for line in lines)}
            changed = [group for group, digest in cached.items() if before.get(group) != digest]
            if not changed:
                continue
            for f in [*where.glob("*.nbi"), *where.glob("*.nbc")]:
                f.unlink(missing_ok=True)  # (another process may be dropping it too)
            for group in changed:  # a group's modules link its family's loop and scheduler; the shared: all
                family = "" if group == SHARED else _FAMILY_OF_GROUP.get(group, group) + "_"
                for f in [*modules_dir(here).glob(f"pagesim_core_{family}*"),
                          *modules_dir(here).glob(f"pagesim_cluster_{family}*")]:
                    f.unlink(missing_ok=True)
            stamp.write_text("".join(f"{group} {digest}\n" for group, digest in sorted(cached.items())))
        except OSError:
            pass


def on_numba_load(fn):
    """Run ``fn`` as numba loads (at once if it has): where the core extends numba or binds a
    name to one of numba's types (``sim/core/events/loop.py``, ``sim/cluster.py``)."""
    if numba is not None:
        fn()
    else:
        _ON_LOAD.append(fn)
    return fn


def use_numba() -> None:
    """Import numba and put every registered function's dispatcher in its place (see the module
    docstring); nothing without numba or once done."""
    global numba
    if numba is not None or not COMPILED:
        return
    # the whole core imported while numba is not yet bound (no dispatcher made at an import,
    # none keyed by digests that read the slots), its slots numbered before any code reads one
    fix_lazy_slots()
    import numba as loaded

    numba = loaded
    _drop_stale_cache()
    numba_patches.apply(_OPTIONS, _GROUPS)
    by_reference.register()
    for fn in _ON_LOAD:
        fn()
    for fn in list(_OPTIONS):
        _DISPATCHERS[fn] = _dispatcher(fn, *_OPTIONS[fn], _GROUPS.get(fn))
    for fn in _LAZY:
        _set_apart(fn)
    for module in {sys.modules[fn.__module__] for fn in _OPTIONS}:
        for name, value in list(vars(module).items()):
            if isinstance(value, types.FunctionType) and value in _DISPATCHERS:
                setattr(module, name, _DISPATCHERS[value])


def njit(fn=None, *, inline: bool = False, refcounted: bool = False, cache_group: str | None = None,
         by_address: bool = False, lazy=None, chosen=None, implements=None):
    """Compile ``fn`` with numba (from :func:`use_numba` on), or return it. No Python object,
    exception or allocation inside (errors are return codes; arrays are made by the caller), so
    the functions are compiled without numba's reference counting (``_nrt=False``): with it,
    every call would count references to each of the ~60 arrays of the state, several times slower.
    ``inline=True`` (numba inlines the function's code into its caller's) for the small
    functions of the hot path and for the functions an iteration calls from one place: a call
    passes each array of the state field by field, ~420 machine words (a few hundred
    nanoseconds, more than an iteration's own bookkeeping). A function called from several
    places stays a call (inlined, it would be compiled once per place: numba's compile time
    grows with the inlined code); which is which, measured both ways: ``sim/core/events/loop.py``'s
    docstring, "Compiled per family". A constant passed to a function that stays a call is typed as
    its type, not as a literal of its value (``get_call_template`` in
    :func:`_interpreted_from_python`): numba would compile the callee once per constant (SGLang's
    radix tree compiled four functions twice); the ``np.int64(...)`` at older calls does the same
    by hand. A scheduler family reaches a call as a constant of its closure instead
    (``lifecycle.preempt_for``: numba prunes branches by a constant it sees, not by a literal
    argument). ``refcounted=True`` keeps numba's reference counting,
    which its lists need (the cluster's list of replicas, ``sim/core/events/cluster.py``); the
    functions it calls keep theirs off. Such a function is best inlined into its loop and kept
    short, its work done by calls that take one replica: numba counts references to each of a
    replica's ~80 arrays wherever a replica is bound to a name, and compiles, with each function
    that takes the list, a Python wrapper that unboxes and reflects back every array of every
    replica (the static family's cluster loop compiled in a quarter of the time so:
    docs/performance.md, "The compiler's machinery").
    ``cache_group``: see :data:`_GROUP_FILES`. ``by_address``: compiled code calls the function by
    the address of its machine code (a family's scheduler, ``loop.scheduler_entry_for``): compiled
    with no Python wrapper, as a function compiled code calls; Python calls run its source.
    ``lazy``: a feature's function that most runs never call (the CPU offload tier's, hybrid
    models' groups', a policy's), ``lazy(config)`` true for the runs that may: compiled code
    calls it at the address in its slot of ``config[LAZY_ADDRESSES]``, which a run's set-up
    writes (:func:`set_lazy_addresses`), compiling it then, so that the other runs never compile
    it (numba compiles every function its loop's code names, reached or not). It takes the
    state first, passed by reference (``by_reference.py``; its entry:
    :func:`lazy_entry_dispatcher`), then scalars, each declared (``int``, ``float``, ``bool``),
    and declares its result (those or ``None``): its caller is typed without it. A function
    that a family's scheduler entry (``loop.scheduler_entry_for``, itself given the state by
    reference) calls rather than inlines is lazy for that reference, whatever runs call it
    (``kv_cache.allocate_cached_blocks``, ``lifecycle.preempt_v1``, ``radix_cache.checkpoint``):
    a call of numba's would pass the state field by field, so that the entry loaded all ~550
    words of it as it started, at every step, called or not (vLLM v1's and SGLang's engines were
    slower so: docs/performance.md; ``tests/sim/core/test_scheduler_address.py`` checks).
    ``chosen``, with ``lazy``: the function is an interface, its body never compiled: its slot
    holds the entry of the implementation ``chosen(config)`` names for the run (a plain function
    given to ``njit(implements=...)`` this one; a scheduling policy's, ``policies.py``), so that
    compiled code calls whichever a run chose and names none of them. ``implements``: the
    interface this function implements, declared alike; compiled only as its entry, keyed by
    its own file, when a run chooses it (nothing else names it: :func:`lazy_only`)."""
    if fn is None:
        return lambda f: njit(f, inline=inline, refcounted=refcounted, cache_group=cache_group,
                              by_address=by_address, lazy=lazy, chosen=chosen, implements=implements)
    if lazy is not None:  # (declared whether compiled or not, where a mistake is met at import)
        if len(_LAZY) == min(63, {f.name: f.width for f in TABLES["config"]}["LAZY_ADDRESSES"]):
            # (63: an extension module names the slots it links by the bits of an int64, lazy_mask)
            raise RuntimeError("config[LAZY_ADDRESSES] is full: widen it (sim/core/state.py), and lazy_mask's bits")
        _declared(fn)
        if _FIXED:
            raise RuntimeError(f"{_where(fn)}: a lazy function declared after the slots were numbered "
                               "(jit.fix_lazy_slots): declare it in a core file the loop imports")
        _LAZY[fn] = (len(_LAZY), lazy)
        if chosen is not None:
            _CHOSEN[fn] = chosen
    if implements is not None:
        interface = getattr(implements, "py_func", implements)
        if interface not in _CHOSEN or _declared(fn)[1:] != _declared(interface)[1:] or \
                _declared(fn)[0][1:] != _declared(interface)[0][1:]:
            raise TypeError(f"{fn.__module__}.{fn.__qualname__}: implements an interface (njit's lazy and chosen) "
                            "with its parameters' names and types and its result's")
        _IMPLEMENTS[fn] = interface
    if not COMPILED:
        return fn
    _OPTIONS[fn] = (inline, refcounted, by_address)
    if cache_group is not None:
        _GROUPS[fn] = cache_group
    if numba is None:
        return fn
    _DISPATCHERS[fn] = _dispatcher(fn, inline, refcounted, by_address, cache_group)
    if lazy is not None:
        _set_apart(fn)
    return _DISPATCHERS[fn]


def _declared(fn):
    """A lazy function's parameters' names, and numba's types of its scalar parameters (after
    the state) and of its result, from its annotations."""
    names = fn.__code__.co_varnames[:fn.__code__.co_argcount]
    notes = fn.__annotations__
    where = f"{fn.__module__}.{fn.__qualname__}"
    if not names or names[0] != "s" or "s" in notes:
        raise TypeError(f"{where}: a lazy function takes the state first, as s")
    undeclared = [name for name in (*names[1:], "return") if notes.get(name) not in _SCALARS]
    if undeclared:
        raise TypeError(f"{where}: declare {', '.join(undeclared)} as one of {', '.join(_SCALARS)}")
    if numba is None:
        return names, None, None
    scalar = {note: getattr(numba.types, name) for note, name in _SCALARS.items()}
    return names, tuple(scalar[notes[name]] for name in names[1:]), scalar[notes["return"]]


def _set_apart(fn) -> None:
    """What compiled code calls in lazy function ``fn``'s place (:func:`_lazy_call`), bound where
    its dispatcher was."""
    _DISPATCHERS[fn] = _lazy_call(fn)


#: the text of a lazy function's entry, a module of its own (:func:`lazy_entry_dispatcher`)
_ENTRY_SOURCE = '''"""The entry of lazy function {where}, written by pagesim.sim.core.compile.jit (its sources'
digest {digest})."""

from pagesim.sim.core.compile.by_reference import state_at
from pagesim.sim.core.compile.jit import inlined_lazy

body = inlined_lazy("{where}")


def entry(ref, like{params}):
    return body(state_at(ref, like){params})
'''


def lazy_entry_dispatcher(fn):
    """The dispatcher of lazy function ``fn``'s entry, which compiled code calls by address: the
    state loaded from the reference passed (``by_reference.state_at``), then the function, inlined
    into it as numba inlines a function before typing (:func:`inlined_lazy`). The entry is a
    file of its own written into :func:`lazy_entries_dir`, so that numba caches it by that file:
    its text holds a digest of the sources it compiles (the shared ones and the function's own
    file, :func:`_lazy_digest`), and the file's time is set from that digest, so that an edit
    of either makes its cached code stale and an unchanged entry written again by another
    process leaves it fresh. (One entry shared by every function, an overload by its slot, either
    called the function compiled on its own, the state passed field by field, or compiled its
    code twice, an overload's code being typed on its own before it is inlined.)"""
    if fn in _LAZY_ENTRY:
        return _LAZY_ENTRY[fn]
    import hashlib
    import importlib.util
    import re
    import tempfile

    where = f"{fn.__module__}.{fn.__qualname__}"
    digest = _lazy_digest(fn)
    params = "".join(f", {name}" for name in _declared(fn)[0][1:])
    text = _ENTRY_SOURCE.format(where=where, digest=digest, params=params)
    # (a closure's name holds "<locals>": letters, digits and "_" alone in a module's name)
    name = "pagesim_lazy_" + re.sub(r"\W+", "_", where.removeprefix(CORE_PACKAGE + "."))
    try:
        folder = lazy_entries_dir()
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only install without NUMBA_CACHE_DIR: this user's folder for them
        from pathlib import Path

        folder = Path(tempfile.gettempdir()) / f"pagesim-lazy-{os.getuid() if hasattr(os, 'getuid') else 0}"
        folder.mkdir(exist_ok=True)
    path = folder / f"{name}.py"
    if not (path.exists() and path.read_text() == text):
        written = path.with_suffix(f".{os.getpid()}.tmp")
        written.write_text(text)
        os.replace(written, path)
    stamp = 10**9 + int(hashlib.sha256(text.encode()).hexdigest()[:7], 16)  # a time in 2001-2009
    if path.stat().st_mtime != stamp:
        os.utime(path, (stamp, stamp))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (numba's cache finds the function's module by its name)
    spec.loader.exec_module(module)
    _LAZY_ENTRY[fn] = _dispatcher(module.entry, inline=False, refcounted=False, by_address=True)
    return _LAZY_ENTRY[fn]


def inlined_lazy(where: str):
    """A dispatcher of the lazy function (or implementation) named ``where`` (its module and
    name) that numba inlines into its entry (and nowhere else: compiled code calls the function
    through :func:`_lazy_call`)."""
    fn = next(fn for fn in (*_LAZY, *_IMPLEMENTS) if f"{fn.__module__}.{fn.__qualname__}" == where)
    return _dispatcher(fn, inline=True, refcounted=False, by_address=False)


def lazy_entries_dir():
    """Where the lazy functions' entries are written (:func:`lazy_entry_dispatcher`), numba's
    cache of them beside: ``$NUMBA_CACHE_DIR/pagesim-lazy``, or ``sim/core/__pycache__/lazy``."""
    return _beside_numbas_cache("pagesim-lazy", "lazy")


def _lazy_digest(fn) -> str:
    """A digest of what lazy function ``fn``'s entry compiles: the shared sources
    (:func:`sources_digest`) and ``fn``'s own file (it may be a cache group's, which the shared
    digest leaves out)."""
    import hashlib
    from pathlib import Path

    if not _SHARED_DIGEST:
        _SHARED_DIGEST.append(sources_digest())
    own = Path(fn.__code__.co_filename).read_bytes()
    return hashlib.sha256(_SHARED_DIGEST[0].encode() + own + fn.__qualname__.encode()).hexdigest()[:16]


def _lazy_call(fn):
    """What compiled code calls for lazy function ``fn``: the machine code at the address in its
    slot (an error where the run's set-up wrote none: its ``lazy`` is wrong), the state passed
    by reference (``by_reference.state_pointer``), called as numba calls a compiled function;
    Python calls run its source. Typed and lowered as one of numba's builtins (``type_callable``,
    ``lower_builtin``), with no code of its own to compile: an overload's implementation, even
    one inlined, is compiled as a function of its own first (the state's ~70 arrays its
    arguments), a sixth of vLLM v1's cold compile where each place that calls compiled one
    (docs/performance.md)."""
    from numba.core.errors import TypingError
    from numba.core.typeconv.castgraph import Conversion
    from numba.core.typing import signature
    from numba.extending import lower_builtin, type_callable

    slot = LAZY_ADDRESSES + _LAZY[fn][0]
    names, declared, result = _declared(fn)

    def call(*args):
        return interpreted(fn)(*args)

    call.py_func = fn
    call.__name__, call.__qualname__, call.__module__ = fn.__name__, fn.__qualname__, fn.__module__

    where = f"{fn.__module__}.{fn.__qualname__}"
    missing = f"{where} called, but not compiled for this run (its lazy)"

    def typed(context, *args):
        """The call's signature: its arguments as given, none cast to its declared type with a loss."""
        for name, given, wanted in zip(names[1:], args[1:], declared):
            conversion = context.can_convert(given, wanted)
            if conversion is None or conversion > Conversion.safe:
                raise TypingError(f"{fn.__qualname__}'s {name} is declared {wanted}, given {given}")
        return signature(result, *args)

    @type_callable(call)
    def typing(context):
        scope = {"typed": typed, "context": context}
        listed = ", ".join(names)  # the typer's parameters fold keywords and check the count
        exec(f"def typer({listed}):\n    return typed(context, {listed})\n", scope)
        return scope["typer"]

    @lower_builtin(call, numba.types.VarArg(numba.types.Any))
    def lowered(context, builder, sig, values):
        state = sig.args[0]
        address = builder.load(by_reference.config_slot(context, builder, state, values[0], slot))
        with builder.if_then(builder.icmp_signed("==", address, address.type(0)), likely=False):
            context.call_conv.return_user_exc(builder, RuntimeError, (missing,))
        argtys = _entry_signature(fn, state)
        scalars = [context.cast(builder, v, t, d) for v, t, d in zip(values[1:], sig.args[1:], declared)]
        ref = by_reference.state_pointer(context, builder, state, values[0], where)
        answer = call_by_address(context, builder, address, result, argtys,
                                 (ref, context.get_constant_null(argtys[1]), *scalars))
        return context.get_dummy_value() if result == numba.types.none else answer

    return call


def call_by_address(context, builder, address, result, argtys, args):
    """A call of the compiled function (of ``argtys`` to ``result``, numba's types) at
    ``address``, as numba calls a compiled function (``imputils.user_function``): its status
    checked, an error passed up."""
    from numba.core import cgutils

    fnty = context.call_conv.get_function_type(result, argtys)
    fn = builder.inttoptr(address, fnty.as_pointer())
    status, answer = context.call_conv.call_function(builder, fn, result, argtys, args)
    with cgutils.if_unlikely(builder, status.is_error):
        context.call_conv.return_status_propagate(builder, status)
    return answer


def set_lazy_addresses(s, state_type=None, linked: int = 0) -> None:
    """Write into ``s.config`` the address of each lazy function (``njit``'s ``lazy``) the run
    may call, or of the implementation the run chose for an interface (``njit``'s ``chosen``),
    compiling it (or loading it from numba's cache) at its first need in this process, and 0
    for the others; but the slots that are the bits of ``linked``: the lazy functions an
    extension module links (``aot.py``, ``loop.link_lazies``; never an interface), which it
    writes itself. ``state_type``: numba's type of ``s`` (None: ``numba.typeof``, numba loaded
    only where a slot needs an address: a module's run of a default policy, of the features the
    module was built for, imports no numba)."""
    fix_lazy_slots()
    s.config[STATE_ADDRESS] = 0  # (the running loop writes it)
    for fn, (slot, needed) in _LAZY.items():
        if linked >> slot & 1:
            continue
        address = 0
        if needed(s.config):
            if state_type is None:  # (typed once a call: ~70 arrays)
                use_numba()
                state_type = numba.typeof(s)
            address = lazy_address(_CHOSEN.get(fn, _itself)(fn, s.config), state_type)
        s.config[LAZY_ADDRESSES + slot] = address


def _itself(fn, config):
    return fn


def lazy_mask(configs, every: bool = False) -> int:
    """The slots, as bits, of the lazy functions but the interfaces that a run of any of
    ``configs`` needs (``every``: all of them, needed or not): what an extension module links
    (``aot.exported``)."""
    fix_lazy_slots()
    return sum(1 << slot for fn, (slot, needed) in _LAZY.items()
               if fn not in _CHOSEN and (every or any(needed(config) for config in configs)))


def every_entry() -> list:
    """Every function compiled as an entry of its own: each lazy function but the interfaces
    (which have no code), and every implementation of an interface, each policy's file imported
    (:func:`lazy_only`): what ``pagesim.sim.precompile --warm`` compiles beside the families."""
    import importlib

    for path in lazy_only():
        importlib.import_module(f"{CORE_PACKAGE}.{path[:-3].replace('/', '.')}")
    return [fn for fn in _LAZY if fn not in _CHOSEN] + list(_IMPLEMENTS)


def is_interface(fn) -> bool:
    """Whether lazy function ``fn`` is an interface (``njit``'s ``chosen``): no code of its own."""
    return getattr(fn, "py_func", fn) in _CHOSEN


def lazy_address(fn, state_type) -> int:
    """The address of lazy function ``fn``'s machine code for states of numba's type ``state_type``."""
    key = (fn, state_type)
    if key not in _LAZY_ENTRIES:
        _LAZY_ENTRIES[key] = address_of(lazy_compiled(fn, state_type))
    return _LAZY_ENTRIES[key]


def lazy_compiled(fn, state_type):
    """Lazy function ``fn`` compiled (or loaded from numba's cache) for states of ``state_type``."""
    dispatcher = lazy_entry_dispatcher(fn)
    sig = _entry_signature(fn, state_type)
    dispatcher.compile(sig)
    return dispatcher.overloads[sig]


def _entry_signature(fn, state_type) -> tuple:
    """The types lazy function ``fn``'s entry is compiled for: the state's address, its type, and
    its scalar parameters."""
    return (numba.types.voidptr, numba.types.TypeRef(state_type), *_declared(fn)[1])


def lazy_functions_compiled() -> list:
    """The lazy functions compiled (or loaded) in this process, for a state type or more."""
    return [fn for fn, dispatcher in _LAZY_ENTRY.items() if dispatcher.overloads]


def address_of(compiled_function) -> int:
    """The address of a compiled function's machine code (numba's ``CompileResult``)."""
    address = compiled_function.library.get_pointer_to_function(compiled_function.fndesc.llvm_func_name)
    if not address:
        raise RuntimeError(f"numba gave no address for {compiled_function.fndesc.llvm_func_name}")
    return address


def _dispatcher(fn, inline: bool, refcounted: bool, by_address: bool, group: str | None = None):
    # no_cfunc_wrapper: numba would also compile each function a C-callable wrapper (for its
    # ``.address`` or a first-class function value), which nothing of the core uses: in LLVM's
    # work on a small function it weighs a seventh (the state's ~80 arrays unpacked)
    options = dict(nogil=True, _nrt=refcounted, inline="always" if inline else "never", no_cfunc_wrapper=True)
    with _cached_in(group):
        # a loop, called by Python; a cluster's function
        if refcounted or (group is not None and not by_address):
            dispatcher = numba.njit(cache=True, **options)(fn)
        else:
            dispatcher = _interpreted_from_python(fn, options)
    keyed_by_sources(dispatcher, group)
    return dispatcher


def digest_read(group: str | None = None) -> str:
    """The digest of cache group ``group``'s sources (None: the shared functions') as this process
    read them when numba loaded (:func:`_drop_stale_cache`), else as they are now."""
    return _DIGESTS.get(group or SHARED) or sources_digest(group=group)


def keyed_by_sources(dispatcher, group: str | None) -> None:
    """Key ``dispatcher``'s cache entries by the digest of the sources this process compiles it
    from (``numba_patches._index_keyed_by_sources``). numba's own key is the signature, the CPU
    and the function's own bytecode, not the functions it inlines or calls, and the cache is
    dropped only as a process starts (:func:`_drop_stale_cache`): a process started before an
    edit and compiling after it would otherwise save code of the old sources into a folder a
    newer process has already stamped as current, and that one load it."""
    cache = getattr(dispatcher, "_cache", None)
    if cache is not None:
        cache.pagesim_sources = digest_read(group)


@contextlib.contextmanager
def _cached_in(group: str | None):
    """Dispatchers made here cache in cache group ``group``'s folder (None: numba's own)."""
    from numba.core import config

    saved = config.CACHE_DIR
    if group is not None:  # numba's cache locator reads it as the dispatcher is made
        config.CACHE_DIR = str(group_cache_dir(group))
    try:
        yield
    finally:
        config.CACHE_DIR = saved


_InterpretedFromPython = None  # the dispatcher class below, made once numba is loaded


def _interpreted_from_python(fn, options: dict):
    """The dispatcher of a function that compiled code calls or inlines (every core function but
    the loops): compiled without the Python wrapper numba compiles with each function by
    default, which unboxes the Python arguments (for the core's, the state's ~80 arrays one by
    one) and is a large part of a small function's compile: the v1 family's cold compile, 148 s
    of CPU with them, 123 s without (``benchmarks/compile_speed.py``). Compiled callers call the
    function itself (or inline it). A call from Python (a test; the set-up's ``placement.init``)
    runs the same source in CPython (:func:`interpreted`): compiled, it would first compile the
    function a second time with the wrapper (a few seconds each, cold: the test suite's calls
    cost it about two minutes of CPU), then type the state's arrays at every call (1-3 ms), more
    than the arithmetic of one call. The loops alone are called from Python as machine code."""
    global _InterpretedFromPython
    if _InterpretedFromPython is None:
        from numba.core.registry import CPUDispatcher

        class InterpretedFromPython(CPUDispatcher):
            def __call__(self, *args, **kwargs):
                return interpreted(self.py_func)(*args, **kwargs)

            def get_call_template(self, args, kws):
                # a constant passed by compiled code typed as its type: numba would compile the
                # function again for each constant passed (a literal's own type)
                unliteral = numba.types.unliteral
                return super().get_call_template(tuple(map(unliteral, args)),
                                                 {name: unliteral(t) for name, t in kws.items()})

        _InterpretedFromPython = InterpretedFromPython
    dispatcher = _InterpretedFromPython(py_func=fn, locals={},
                                        targetoptions=dict(options, nopython=True, boundscheck=None,
                                                           no_cpython_wrapper=True))
    dispatcher.enable_caching()
    return dispatcher


def compiled(fn):
    """The dispatcher of the core function ``fn`` (numba loaded first); ``fn`` itself when it
    is not one (or without numba)."""
    use_numba()
    return _DISPATCHERS.get(getattr(fn, "py_func", fn), fn)


_INTERPRETED: dict = {}


def interpreted(fn):
    """The plain Python function behind a core function, calling the plain Python functions
    behind the core functions it calls: the same source, run by CPython whether numba has
    loaded or not. For numpy array arguments (compiled, the core's functions allocate nothing,
    so they take scalars and existing arrays only), and where a call from Python costs more
    than the arithmetic."""
    py = getattr(fn, "py_func", fn)
    if py not in _OPTIONS:
        return fn
    if py in _INTERPRETED:  # made already, or being made (a name may lead back: co_names holds
        return _INTERPRETED[py]  # attribute names too, kv_cache.memory_categories in memory_categories)
    names = dict(py.__globals__)  # a copy: the module's own names become numba's when it loads
    _INTERPRETED[py] = plain = types.FunctionType(py.__code__, names, py.__name__, py.__defaults__, py.__closure__)
    for name in py.__code__.co_names:
        value = names.get(name)
        callee = getattr(value, "py_func", value)
        if isinstance(callee, types.FunctionType) and callee in _OPTIONS:
            names[name] = interpreted(callee)
        elif isinstance(value, types.ModuleType) and value.__name__.startswith(CORE_PACKAGE + "."):
            names[name] = InterpretedModule(value)  # extent.memory_categories: a core module's function
    return plain


class InterpretedModule:
    """A core module seen by :func:`interpreted` code: its functions interpreted too, the rest
    (constants, classes) as they are."""

    def __init__(self, module: types.ModuleType):
        self._module = module

    def __getattr__(self, name: str):
        value = getattr(self._module, name)
        return interpreted(value) if isinstance(getattr(value, "py_func", value), types.FunctionType) else value
