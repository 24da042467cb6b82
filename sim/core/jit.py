"""``njit``: numba's compiler where numba is installed, else the identity.

The core's functions are plain Python over numpy arrays and integers. Under numba they are
compiled to machine code once (``cache=True`` keeps the result in ``__pycache__``); without
numba, or with ``PAGESIM_JIT=0``, the very same functions run in CPython: that is the
readable specification, and ``tests/sim/core/`` compares the two on random runs.

numba is imported when something first needs a compiled function (:func:`use_numba`), not when
the core is imported: its import and set-up cost every process ~0.5 s, and a run whose loop is
already compiled into an extension module (``sim/core/aot.py``) needs none of it. Until then
``njit`` only registers a function; :func:`use_numba` makes each registered function's
dispatcher and binds it, in the module of every registered function, where the plain function
was (numba resolves the names a function calls in its module when it compiles it). Python calls
the loops' machine code; a call from Python to any other core function runs its source in
CPython (:func:`_interpreted_from_python`), which compiles nothing more.

:func:`use_numba` also trims numba's work on a cold compile where the machine code of the core's
functions themselves stays the same (issue #35; ``benchmarks/compile_speed.py --base``): one LLVM
optimization per function (:func:`_one_llvm_optimization`), each inlined function's untyped
code built once (:func:`_untyped_ir_once_per_function`), its scope copied once per inlined
copy (:func:`_inlined_scope_copied_once`) and its blocks once (:func:`_inlined_ir_copied_once`),
the compile's flags compared without reading each option through its property
(:func:`_compile_flags_compared_quickly`), the Python wrappers of
functions only compiled code calls left unoptimized (:func:`_python_wrappers_unoptimized`),
numba's error messages built plain (:func:`_plain_error_messages`), the variables live at each
block's entry computed when asked for (:func:`_lifetimes_on_demand`), an inlined function's
copies of its caller's arguments lowered as those arguments (:func:`_copies_shared`), a field of
the state loaded alone (:func:`_fields_read_in_place`), and no C wrappers (``no_cfunc_wrapper``
in :func:`_dispatcher`). It keeps every store into an
array that numba's dead-code elimination would delete on too narrow a reading of what may alias
an argument (:func:`_stores_kept`: the core allocates no array). And it names each compiled
function by an id no other process gives (:func:`_function_ids_unique_across_processes`): the
families' loops compiled by different processes, then loaded together, ran each other's code.
"""

from __future__ import annotations

import collections
import contextlib
import importlib.util
import os
import sys
import types

from pagesim.sim.core import by_reference
from pagesim.sim.core.families import FAMILIES, FAMILY_FILES, LOOP_FILES, SCHEDULER_GROUPS
from pagesim.sim.core.state import LAZY_ADDRESSES, STATE_ADDRESS, TABLES

#: numba is installed and not turned off (``PAGESIM_JIT=0``): the core runs compiled
COMPILED = os.environ.get("PAGESIM_JIT", "1") != "0" and importlib.util.find_spec("numba") is not None
numba = None  # the module, once use_numba() imported it

#: the core's Python-only files: what builds its state, runs the compiled functions, checks and reads the state
NOT_COMPILED = ("__init__.py", "replay.py", "check.py", "build.py", "outcome.py", "aot.py")

_OPTIONS: dict = {}  # each function given to njit -> (inline, refcounted)
_DISPATCHERS: dict = {}  # each function given to njit -> its numba dispatcher, once numba is loaded
_ON_LOAD: list = []  # what runs as numba loads, before the dispatchers are made (on_numba_load)


#: a cache group's name -> the core files only its functions compile: the functions given to
#: ``njit(cache_group=name)``: a scheduler family's loops, and its scheduler's entry in a group of
#: its own (``sim/core/families.py``). A group is cached apart, keyed by the shared sources and its
#: own: an edit of its files recompiles it alone (and drops its family's extension modules)
_GROUP_FILES = {**{FAMILIES[kind]: LOOP_FILES[kind] for kind in FAMILIES},
                **{SCHEDULER_GROUPS[kind]: files for kind, files in FAMILY_FILES.items()}}
_FAMILY_OF_GROUP = {**{name: name for name in FAMILIES.values()},
                    **{SCHEDULER_GROUPS[kind]: FAMILIES[kind] for kind in FAMILIES}}
#: the core files whose functions compiled code reaches only through their lazy functions' entries
#: (``njit``'s ``lazy``; the file's other functions are inline helpers of those): left out of every
#: shared and group digest, each entry keyed by its own file instead (:func:`_lazy_digest`), so that
#: an edit of one recompiles that file's entries alone (tests/sim/core/test_jit_cache.py checks that
#: no other core file names any function of theirs but a lazy one)
LAZY_ONLY = ("policy_priority.py",)
_GROUPS: dict = {}  # each function given to njit with a cache group -> the group's name
_SHARED_DIGEST: list = []  # sources_digest() of the core's shared sources, once read (_drop_stale_cache)
_LAZY: dict = {}  # each function given to njit(lazy=...) -> (its slot of LAZY_ADDRESSES, when a run needs it)
_LAZY_ENTRY: dict = {}  # ... -> the dispatcher of its entry (lazy_entry_dispatcher), once made
_LAZY_ENTRIES: dict = {}  # (function, numba's type of the state) -> the address of its machine code
#: what a lazy function's parameters after the state, and its result, may be declared as
_SCALARS = {"int": "int64", "float": "float64", "bool": "boolean", "None": "none"}

def sources_digest(here=None, group: str | None = None) -> str:
    """A hash of the core sources numba reads for cache ``group``'s functions (None: every other
    function's): their functions and the constants frozen into them. Those are every file but
    the Python-only glue in :data:`NOT_COMPILED` (its edits need no recompile), the files only lazy
    entries compile (:data:`LAZY_ONLY`) and the files the groups keep to themselves, plus
    ``group``'s own."""
    from pathlib import Path

    here = Path(__file__).resolve().parent if here is None else Path(here)
    kept = {name for files in _GROUP_FILES.values() for name in files} | set(LAZY_ONLY)
    own = set(_GROUP_FILES.get(group, ()))
    return _files_digest([p for p in sorted(here.glob("*.py"))
                          if p.name not in NOT_COMPILED and (p.name not in kept or p.name in own)])


def lazy_only_digest(here=None) -> str:
    """A hash of the :data:`LAZY_ONLY` files, which an extension module (``aot.py``: it links
    every lazy function) compiles besides its groups' sources."""
    from pathlib import Path

    here = Path(__file__).resolve().parent if here is None else Path(here)
    return _files_digest([here / name for name in LAZY_ONLY])


def _files_digest(paths) -> str:
    """A hash of the files ``paths``, each by its name and its bytes."""
    import hashlib

    return hashlib.sha256(b"".join(p.name.encode() + b"\0" + p.read_bytes() for p in paths)).hexdigest()


def _beside_numbas_cache(in_users: str, in_tree: str, here=None):
    """A folder beside numba's cache: ``$NUMBA_CACHE_DIR/<in_users>`` where the user set one,
    else ``sim/core/__pycache__/<in_tree>``."""
    from pathlib import Path

    here = Path(__file__).resolve().parent if here is None else Path(here)
    user = os.environ.get("NUMBA_CACHE_DIR")
    return Path(user) / in_users if user else here / "__pycache__" / in_tree


def group_cache_dir(group: str, here=None):
    """Where cache ``group``'s functions are cached: ``$NUMBA_CACHE_DIR/pagesim-<group>``, or
    ``sim/core/__pycache__/family-<group>``."""
    return _beside_numbas_cache(f"pagesim-{group}", f"family-{group}", here)


def modules_dir(here=None):
    """Where the extension modules of the core's loops lie (``sim/core/aot.py``), beside numba's
    cache: ``$NUMBA_CACHE_DIR/pagesim_core``, or ``sim/core/__pycache__``."""
    return _beside_numbas_cache("pagesim_core", "", here)


def _drop_stale_cache(here=None) -> None:
    """numba's cache checks only the modification time of a function's own file, not of the
    files whose functions it inlined or calls, nor this file's flags: after an edit of the core
    a cached function could be stale. The cache is therefore keyed by :func:`sources_digest`:
    the shared functions' (in ``__pycache__``) dropped when a shared source changes, each cache
    group's (its own folder) when a shared source or one of its own files does; each with the
    extension modules built from it (``aot.py``; a group's, in :func:`modules_dir`, beside the
    group's folder: a process with a cache of its own leaves the others' alone)."""
    import shutil
    from pathlib import Path

    here = Path(__file__).resolve().parent if here is None else Path(here)
    cache = here / "__pycache__"
    try:
        stamp = cache / "core-sources.sha256"
        digest = sources_digest(here)
        if here == Path(__file__).resolve().parent:  # the core's own: its lazy entries' digest reads it
            _SHARED_DIGEST[:] = [digest]
        if not (stamp.exists() and stamp.read_text() == digest):
            for f in [*cache.glob("*.nbi"), *cache.glob("*.nbc"), *cache.glob("pagesim_core_*"),
                      *cache.glob("pagesim_cluster_*")]:
                f.unlink()
            cache.mkdir(exist_ok=True)
            stamp.write_text(digest)
        for group in _GROUP_FILES:
            folder = group_cache_dir(group, here)
            stamp, digest = folder / "sources.sha256", sources_digest(here, group)
            if stamp.exists() and stamp.read_text() == digest:
                continue
            shutil.rmtree(folder, ignore_errors=True)
            family = _FAMILY_OF_GROUP.get(group, group)  # its modules link the loop and the scheduler
            for f in [*modules_dir(here).glob(f"pagesim_core_{family}_*"),
                      *modules_dir(here).glob(f"pagesim_cluster_{family}_*")]:
                f.unlink()
            folder.mkdir(parents=True)
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


def _one_llvm_optimization() -> None:
    """numba optimizes each compiled function's LLVM code twice: alone, by LLVM's function
    passes, as the function is added to its library (``CPUCodeLibrary._optimize_functions``),
    then with the code of every function it calls linked in, by LLVM's module passes at the same
    level (``_optimize_final_module``), whose inlining and scalar passes redo the first's work.
    For the core, whose loop is one function of a few thousand lines with its callees linked in
    under it, the first pass is a fifth of a cold compile and changes no engine time (measured
    by ``benchmarks/engine_speed.py --only-systems`` run with and without it, each compiling
    every family first),
    so it is skipped: each function's code is optimized once, with its callees. The data layout
    the first pass set is still set. Left as numba has it where its library class differs."""
    from numba.core import codegen

    library = getattr(codegen, "CPUCodeLibrary", None)
    if library is None or not hasattr(library, "_optimize_functions"):
        return

    def _optimize_functions(self, ll_module):
        ll_module.data_layout = self._codegen._data_layout

    library._optimize_functions = _optimize_functions


def _lifetimes_on_demand() -> None:
    """numba's ``PostProcessor.run``, after most of its passes (~2,000 times for vLLM v1's
    family), computes every block's live variables at entry (``FunctionIR.block_entry_vars``),
    which needs the function's use-def, live and dead maps: in vLLM v1's cold compile 5.9 of
    74.7 s of CPU (timed in the process, by hand; 1.6 s with this). Only object mode's lowering
    and a generator's analysis read those variables (the core has neither), ``del``s are
    inserted by the runs that ask for them (``emit_dels``), and the maps are computed when first
    read (``VariableLifetime``'s cached properties). So, without ``emit_dels`` and for a function
    that is no generator, the entry variables are computed when first asked for, from the blocks
    that run saw. Left as numba has it where its post-processor differs."""
    from numba.core import analysis, postproc, transforms

    run = getattr(postproc.PostProcessor, "run", None)
    if run is None or getattr(run, "pagesim_on_demand", False) or not hasattr(postproc, "VariableLifetime"):
        return

    class EntryVariables(dict):
        """Each block's live variables at entry, computed when one is first asked for (an empty
        dict to anything else: ``FunctionIR.copy`` leaves the copy's to its own run)."""

        def __init__(self, blocks, lifetime):
            super().__init__()
            self.pending = (blocks, lifetime)

        def __missing__(self, block):
            if self.pending is None:
                raise KeyError(block)
            blocks, lifetime = self.pending
            self.pending = None
            entry = analysis.compute_live_variables(lifetime.cfg, blocks, lifetime.usedefs.defmap,
                                                    lifetime.deadmaps.combined)
            self.update((b, entry[offset]) for offset, b in blocks.items())
            return self[block]

    def on_demand(self, emit_dels: bool = False, extend_lifetimes: bool = False):
        if emit_dels or self.func_ir.is_generator:
            return run(self, emit_dels, extend_lifetimes)
        self.func_ir.blocks = transforms.canonicalize_cfg(self.func_ir.blocks)
        lifetime = postproc.VariableLifetime(self.func_ir.blocks)
        self.func_ir.variable_lifetime = lifetime
        self.func_ir.block_entry_vars = EntryVariables(self.func_ir.blocks, lifetime)
        self.func_ir.generator_info = None

    on_demand.pagesim_on_demand, on_demand.numbas = True, run
    postproc.PostProcessor.run = on_demand


def _python_wrappers_unoptimized() -> None:
    """numba compiles, with every function, a wrapper that Python calls it through: it unpacks
    the Python arguments, for the core's functions the state's ~60 arrays one by one, a larger
    function than most of the core's own (2,300 LLVM instructions before optimization, against
    1,000-3,500). Only a loop (a family's, a cluster's: the functions given a cache group) is
    called from Python in a run; every other function is called by compiled code, which calls
    the function itself, not its wrapper, and a call from Python runs its source in CPython:
    most are compiled with no wrapper at all (:func:`_interpreted_from_python`). The other
    wrappers (a reference-counted function's) are marked for LLVM not to optimize
    (``optnone``, which asks ``noinline`` with it): LLVM's optimization and machine code of the
    wrappers were about half of each small function's. The function
    itself, and the loops' wrappers, are optimized as before. Left as numba has it where its
    library class differs."""
    from numba.core import codegen

    library = getattr(codegen, "CPUCodeLibrary", None)
    optimize = getattr(library, "_optimize_final_module", None)
    if optimize is None or getattr(optimize, "pagesim_wrappers", False):
        return

    def _optimize_final_module(self):
        entries = {fn.__qualname__ for fn in _GROUPS}
        if self.name not in entries:
            for fn in self._final_module.functions:
                if fn.name.startswith("_ZN7cpython") and not fn.is_declaration:
                    fn.add_function_attribute("noinline")
                    fn.add_function_attribute("optnone")
        optimize(self)

    _optimize_final_module.pagesim_wrappers = True
    library._optimize_final_module = _optimize_final_module


def _untyped_ir_once_per_function() -> None:
    """numba inlines a function (``inline="always"``) by running its whole untyped pipeline
    (bytecode to IR, rewrites, branch pruning, and the inlining of its own inlined callees, each
    by the same route) at every place that calls it, then copying that IR in; nested inlining
    thus builds a function's IR once per path to it from the loop (``InlineWorker.
    run_untyped_passes``, called by ``inline_function``). That IR depends on the function and the
    compile's flags only (the pipeline sees no argument's type or value: the caller prunes the
    inlined copy by its own constants after), and the inliner deep-copies it before it changes
    it, so the core's functions' IR is built once per function and flags and copied at each
    place: the same IR, under a fresh identity each time as numba gives it (the inlined
    variables' names carry it). Numba's own functions take numba's route. Left as numba has it
    where its inliner differs."""
    from numba.core import bytecode, inline_closurecall

    worker = getattr(inline_closurecall, "InlineWorker", None)
    built = getattr(worker, "run_untyped_passes", None)
    if built is None or getattr(built, "pagesim_once", False):
        return
    memo: dict = {}

    def run_untyped_passes(self, func, enable_ssa=False):
        if func not in _OPTIONS or self.flags is None:
            return built(self, func, enable_ssa)
        self.flags.enable_ssa = enable_ssa  # as numba's does to the flags it shares with its caller
        key = (func, self.flags.summary())
        if key not in memo:
            memo[key] = built(self, func, enable_ssa)
        ir = memo[key].copy()  # the blocks' list of statements copied; the inliner deep-copies them
        ir.func_id = bytecode.FunctionIdentity.from_function(func)
        return ir

    run_untyped_passes.pagesim_once = True
    worker.run_untyped_passes = run_untyped_passes


def _inlined_scope_copied_once() -> None:
    """numba copies a function's IR into each place that inlines it (``InlineWorker.inline_ir``,
    twice: the second copy is returned as "the original", and both of numba's callers drop it)
    one block at a time, each block deep-copied on its own: each copy takes with it the
    function's variable scope, every variable of the function, so inlining a function of B
    blocks and V variables copies B x V variables, and numba then finds the one scope of the
    inlined blocks by comparing those B scopes' dictionaries (``_get_all_scopes``). The core's
    loops inline ~260 places (deep copies were a fifth of the vLLM family's cold compile,
    comparisons of the copied scopes more): within one ``inline_ir`` each scope is copied once,
    and its blocks share that copy, as the function's own blocks share their one scope. The
    copied blocks, statements and variables are as before. Left as numba has it where its
    inliner or IR differs."""
    import copy

    from numba.core import inline_closurecall, ir

    worker = getattr(inline_closurecall, "InlineWorker", None)
    inline_ir = getattr(worker, "inline_ir", None)
    if inline_ir is None or getattr(inline_ir, "pagesim_scope_once", False) or "__deepcopy__" in vars(ir.Scope):
        return
    copies: list = [None]  # the scopes copied so far in the inline_ir running (None: none running)

    def __deepcopy__(self, memo):
        done = copies[0]
        if done is not None and id(self) in done:
            out = memo[id(self)] = done[id(self)][1]
            return out
        out = copy._reconstruct(self, memo, *self.__reduce_ex__(4))  # what deepcopy does without this
        if done is not None:
            done[id(self)] = (self, out)  # the scope kept alive: its id is not reused meanwhile
        return out

    once = _with_state_per_call(inline_ir, copies)
    ir.Scope.__deepcopy__ = __deepcopy__
    once.pagesim_scope_once = True
    worker.inline_ir = once


def _with_state_per_call(inline_ir, state: list):
    """``inline_ir`` with ``state[0]`` a new dictionary while each call runs (the caller's
    restored after it: an inlining may nest in another)."""

    def once(self, *args, **kwargs):
        saved, state[0] = state[0], {}
        try:
            return inline_ir(self, *args, **kwargs)
        finally:
            state[0] = saved

    return once


def _inlined_ir_copied_once() -> None:
    """numba's ``InlineWorker.inline_ir`` deep-copies the inlined function's blocks, then
    deep-copies that copy again, unchanged, as "the original" it returns, and both of numba's
    callers drop it (``untyped_passes.InlineInlinables``, ``typed_passes``' overload inlining:
    ``_, _, _, new_blocks = ...``): half of the inliner's copying (with the flags' quick equality
    below, ~6 % of a family's cold compile).
    Within one ``inline_ir`` a block it has just copied is returned as it is when asked to be
    copied again; every other copy is numba's. Left as numba has it where its inliner copies
    otherwise (``copy.deepcopy`` by the module's name, once per block)."""
    import copy

    from numba.core import inline_closurecall, ir

    worker = getattr(inline_closurecall, "InlineWorker", None)
    inline_ir = getattr(worker, "inline_ir", None)
    if inline_ir is None or getattr(inline_ir, "pagesim_ir_once", False) or inline_closurecall.copy is not copy:
        return
    made: list = [None]  # id -> block, of the blocks the running inline_ir copied (None: none running)

    def deepcopy(x, memo=None):
        done = made[0]
        if done is not None and id(x) in done and done[id(x)] is x:
            return x  # the copy of a copy it made: the caller drops it
        out = copy.deepcopy(x, memo)
        if done is not None and type(out) is ir.Block:
            done[id(out)] = out  # kept alive while it runs: its id is not reused meanwhile
        return out

    shim = types.ModuleType("copy")
    shim.__dict__.update(vars(copy))
    shim.deepcopy = deepcopy
    inline_closurecall.copy = shim

    once = _with_state_per_call(inline_ir, made)
    once.pagesim_ir_once = True
    worker.inline_ir = once


class _ProcessUniqueIds:
    """numba's ids of compiled functions drawn at random (see :func:`_function_ids_unique_across_processes`)."""

    def __iter__(self):
        return self

    def __next__(self) -> int:
        return int.from_bytes(os.urandom(8), "little") >> 2  # os.urandom: a forked child draws its own


def _function_ids_unique_across_processes() -> None:
    """numba names a compiled function's machine code by its module, qualified name, argument
    types and an id (``FunctionIdentity.from_function``: ``next(_unique_ids)``, a counter from 1
    in every process). The families' loops are closures of one qualified name
    (``loop_for.<locals>.run``, the cluster's and the disaggregated pools' likewise), so two
    processes that compile two families each from a new cache (two runs, or the suite's
    warm-up, a process a family) can name different code alike. numba links a function into
    each caller's code as a weak symbol, and a later process that loads both families from the
    cache links the second's calls to the first's code: seen, vLLM v1's disaggregated pools run
    after a vLLM run in one process left every request unfinished, and a cluster's loop ran
    forever (numba's issue #10486, where forked processes collide so). The ids are drawn at
    random here instead (62 bits), so no two processes name two functions alike."""
    from numba.core import bytecode

    identity = getattr(bytecode, "FunctionIdentity", None)
    if identity is None or isinstance(getattr(identity, "_unique_ids", None), _ProcessUniqueIds):
        return
    identity._unique_ids = _ProcessUniqueIds()


def _compile_flags_compared_quickly() -> None:
    """numba keys its cache of each overloaded function's implementations by the compile's
    flags (``templates._get_impl``), and a flags object hashes and compares by ``values()``, a
    dictionary of its ~20 options each read through a property: typing the vLLM family's loop
    looked that cache up ~350,000 times (a tenth of its cold compile). ``values()`` is read
    here from the set values and the options' defaults directly, the same dictionary, and two
    flags of one class whose set values are equal are equal without it; the hash,
    which is numba's of the sorted option names (``sorted`` of a dictionary sorts its keys), is
    computed once per class. Left as numba has it where its flags differ."""
    from numba.core import targetconfig

    config = getattr(targetconfig, "TargetConfig", None)
    if config is None or getattr(config.values, "pagesim_quick", False) or "_values" not in config.__slots__:
        return
    hashes: dict = {}

    def values(self):
        own = self._values
        return {name: own[name] if name in own else option.default for name, option in self.options.items()}

    def __hash__(self):
        kind = type(self)
        if kind not in hashes:
            hashes[kind] = hash(tuple(sorted(kind.options)))
        return hashes[kind]

    def __eq__(self, other):  # the options set alike first: no default read
        if not isinstance(other, config):
            return NotImplemented
        return (type(self) is type(other) and self._values == other._values) or self.values() == other.values()

    values.pagesim_quick = True
    config.values = values
    config.__hash__ = __hash__
    config.__eq__ = __eq__


def _plain_error_messages() -> None:
    """numba marks up each error message it builds (``errors.termcolor``) where colorama is
    installed (the test extras' mkdocs pulls it in), wrapping stdout and stderr around every
    one, even those it drops: typing tries each overload of a call and builds a message for each
    that does not match, ~29,000 while the vLLM v1 family compiles cold, 17 us each (~0.5 s of
    CPU, by hand, 2026-11-28). Its messages are left plain, as numba leaves them with
    ``NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING`` (read only as numba is first imported)."""
    from numba.core import errors

    scheme = getattr(errors, "HighlightColorScheme", None)  # (none without colorama)
    if scheme is not None:
        scheme._markup = lambda self, msg, color=None, style=None: msg


def _stores_kept() -> None:
    """numba's dead-code elimination deletes a store into an array unless it finds that the array
    may be an argument's (``ir_utils.find_potential_aliases``), and it finds too few: ``x =
    s.field`` counts when ``s`` already does, but it reads the function's blocks once, in the
    order they are numbered, so where ``s``'s own alias of an argument (an inlined function's
    copy of the caller's ``s``) stands in a later block, ``x`` is missed; and a state loaded
    from its address (``by_reference.state_at``) is no argument at all. numba runs it after it inlines
    an overload into a function (``typed_passes.InlineOverloads``): with the family's scheduler
    called through one (``loop.call_scheduler``), the loop's step-table stores of a step's start
    and duration (``s.row_floats[r, ROW_START] = ...``) were deleted and every row read 0, and
    vLLM v1's scheduler entry, its state loaded from its address, lost stores and never ended a
    run (found 2026-11-28). The core allocates no array (``njit``): every array it writes is its
    caller's, so every variable of a mutable type counts as an argument's alias here and no
    store into one is deleted. Left as numba has it where its function differs."""
    from numba.core import ir, ir_utils

    found = getattr(ir_utils, "find_potential_aliases", None)
    if found is None or getattr(found, "pagesim_stores_kept", False):
        return

    def find_potential_aliases(blocks, args, typemap, func_ir, alias_map=None, arg_aliases=None):
        alias_map, arg_aliases = found(blocks, args, typemap, func_ir, alias_map, arg_aliases)
        for block in blocks.values():
            for stmt in block.body:
                if isinstance(stmt, ir.Assign) and not ir_utils.is_immutable_type(stmt.target.name, typemap):
                    arg_aliases.add(stmt.target.name)
        return alias_map, arg_aliases

    find_potential_aliases.pagesim_stores_kept = True
    ir_utils.find_potential_aliases = find_potential_aliases


def _copies_shared() -> None:
    """numba gives each variable that lives across blocks a stack slot and an assignment ``y = x``
    a load of ``x``'s slot and a store into ``y``'s, whatever their size. Inlining makes such a
    copy of each argument at every place that inlines a function (its ``s = <caller's s>``), and
    the state is a ~550-word aggregate: vLLM v1's loop and scheduler entry lowered ~300 of them,
    which LLVM's first passes (SROA splitting each into its words, instcombine) then spent half
    of their optimization on (2026-11-28, ``llvmlite``'s pass timings). Before a function without
    reference counting is lowered, its copies of values assigned once in its first block are
    those values (:func:`share_copies`); a reference-counted function, which would count each
    copy, is left as it is. Left as numba has it where its pass differs."""
    from numba.core import typed_passes

    lowering = getattr(typed_passes, "NativeLowering", None)
    run_pass = getattr(lowering, "run_pass", None)
    if run_pass is None or getattr(run_pass, "pagesim_copies_shared", False):
        return

    def run(self, state):
        if not state.flags.nrt:
            share_copies(state.func_ir, state.typemap)
        return run_pass(self, state)

    run.pagesim_copies_shared = True
    lowering.run_pass = run


def share_copies(func_ir, typemap) -> dict:
    """Every variable of ``func_ir`` that is only ever a copy (``y = x``, or a copy of a copy) of
    a variable assigned once, in the function's first block (an argument, the state loaded from
    its address), and of the same type (``typemap``), made that variable: its uses read the first
    one, its assignments go. The first block runs once, before any loop, so the value copied
    never changes. Returns what each name became (numba loaded)."""
    from numba.core import analysis, ir, ir_utils

    blocks = func_ir.blocks
    first = min(blocks)
    if list(analysis.compute_cfg_from_blocks(blocks).predecessors(first)):
        return {}
    defined = collections.Counter(stmt.target.name for block in blocks.values()
                                  for stmt in block.find_insts(ir.Assign))
    once = {stmt.target.name: stmt.target for stmt in blocks[first].find_insts(ir.Assign)
            if defined[stmt.target.name] == 1}
    copied = {stmt.target.name: stmt.value.name for block in blocks.values()
              for stmt in block.find_insts(ir.Assign)
              if isinstance(stmt.value, ir.Var) and defined[stmt.target.name] == 1}

    def root(name):
        seen = set()
        while name in copied and name not in seen:
            seen.add(name)
            name = copied[name]
        return name

    same = {}
    for name in copied:
        source = root(name)
        if source in once and source != name and typemap.get(name) == typemap.get(source):
            same[name] = once[source]
    if not same:
        return {}
    # a del of a variable zero-fills its slot (and counts a reference, here none): the first
    # one's now stand where a copy was still to be read, so they go with the copies' own
    gone = set(same) | {var.name for var in same.values()}
    for block in blocks.values():
        block.body = [stmt for stmt in block.body
                      if not (isinstance(stmt, ir.Assign) and stmt.target.name in same)
                      and not (isinstance(stmt, ir.Del) and stmt.value in gone)]
    ir_utils.replace_vars(blocks, same)
    func_ir._definitions = ir_utils.build_definitions(blocks)
    return {name: var.name for name, var in same.items()}


#: a named tuple with more fields than this (the state) has each field read from its stack slot
#: alone (:func:`_fields_read_in_place`)
_FIELDS_IN_PLACE = 16


def _fields_read_in_place() -> None:
    """numba lowers ``s.field`` as a load of the whole of ``s`` from its stack slot, then the
    field taken out of the value: for the state, ~550 words loaded for one array's description,
    at each of the thousands of places the core reads a field, which LLVM's first instcombine
    and SROA then narrow to the field's own words (2026-11-28, ``llvmlite``'s pass timings). In
    a function without reference counting, a field of a named tuple of more than
    :data:`_FIELDS_IN_PLACE` fields that lives in a stack slot is loaded from its place in the
    slot alone. Left as numba has it where its lowering differs."""
    from numba.core import cgutils, lowering, types as numba_types

    lower_expr = getattr(lowering.Lower, "lower_expr", None)
    if lower_expr is None or getattr(lower_expr, "pagesim_fields_in_place", False):
        return

    def in_place(self, resty, expr):
        if (expr.op == "getattr" and not self.context.enable_nrt and not self._disable_sroa_like_opt
                and not isinstance(resty, numba_types.BoundFunction)):
            name = expr.value.name
            ty = self.typeof(name)
            if (isinstance(ty, numba_types.BaseNamedTuple) and len(ty) > _FIELDS_IN_PLACE
                    and expr.attr in ty.fields and name not in self._blk_local_varmap
                    and name not in self._singly_assigned_vars):
                index = ty.fields.index(expr.attr)
                field = self.builder.load(cgutils.gep_inbounds(self.builder, self.getvar(name), 0, index))
                return self.context.cast(self.builder, field, ty[index], resty)
        return lower_expr(self, resty, expr)

    in_place.pagesim_fields_in_place = True
    lowering.Lower.lower_expr = in_place


def _array_elements_direct() -> None:
    """numba lowers ``a[i]`` on an array (``arrayobj``'s ``getitem_arraynd_intp``, and
    ``setitem_array`` for ``a[i] = v``) by storing the array's whole description (7 words) into
    a stack slot of its own, loading its shape and strides back from there, then the element:
    at each of the ~2,000 places a family's loop reads or writes an element, which LLVM's SROA
    and instcombine then take apart again. For an array indexed by one integer per dimension,
    its element is a scalar (nothing counted or viewed), and numba's bounds check off, the data
    pointer and the dimensions are taken from the description itself, the index fixed and the
    element's address computed by numba's own functions (``fix_integer_index``,
    ``get_item_pointer2``), as numba's lowering does after its detour. Registered for
    ``types.Array``, more specific than numba's ``types.Buffer``; every other case is numba's."""
    import operator

    from numba.core import cgutils, types as numba_types
    from numba.core.imputils import impl_ret_borrowed, lower_builtin
    from numba.np import arrayobj

    if getattr(arrayobj, "pagesim_elements_direct", False):
        return

    def direct(context, array_type, index_types) -> bool:
        return (type(array_type) is numba_types.Array and len(index_types) == array_type.ndim
                and all(isinstance(kind, numba_types.Integer) for kind in index_types)
                and not context.enable_boundscheck)

    def address(context, builder, array_type, array, index_types, indices):
        model = context.data_model_manager[array_type]
        data = builder.extract_value(array, model.get_field_position("data"))
        shape_at, strides_at = model.get_field_position("shape"), model.get_field_position("strides")
        shape = [builder.extract_value(array, [shape_at, k]) for k in range(array_type.ndim)]
        strides = ([] if array_type.layout in "CF"
                   else [builder.extract_value(array, [strides_at, k]) for k in range(array_type.ndim)])
        fixed = [arrayobj.fix_integer_index(context, builder, kind, index, size)
                 for kind, index, size in zip(index_types, indices, shape)]
        return cgutils.get_item_pointer2(context, builder, data, shape, strides, array_type.layout, fixed)

    def indices_of(builder, index_type, index):
        if isinstance(index_type, numba_types.BaseTuple):
            return tuple(index_type.types), cgutils.unpack_tuple(builder, index, count=len(index_type))
        return (index_type,), (index,)

    def element(numbas):
        def lowered(context, builder, signature, args):
            array_type, index_type = signature.args
            index_types, indices = indices_of(builder, index_type, args[1])
            if not direct(context, array_type, index_types):
                return numbas(context, builder, signature, args)
            at = address(context, builder, array_type, args[0], index_types, indices)
            value = arrayobj.load_item(context, builder, array_type, at)
            return impl_ret_borrowed(context, builder, signature.return_type, value)
        return lowered

    lower_builtin(operator.getitem, numba_types.Array, numba_types.Integer)(element(arrayobj.getitem_arraynd_intp))
    lower_builtin(operator.getitem, numba_types.Array, numba_types.BaseTuple)(element(arrayobj.getitem_array_tuple))

    @lower_builtin(operator.setitem, numba_types.Array, numba_types.Any, numba_types.Any)
    def stored(context, builder, signature, args):
        array_type, index_type, value_type = signature.args
        index_types, indices = indices_of(builder, index_type, args[1])
        if not direct(context, array_type, index_types) or isinstance(value_type, numba_types.Buffer):
            return arrayobj.setitem_array(context, builder, signature, args)
        at = address(context, builder, array_type, args[0], index_types, indices)
        value = context.cast(builder, args[2], value_type, array_type.dtype)
        arrayobj.store_item(context, builder, array_type, value, at)

    arrayobj.pagesim_elements_direct = True


def on_numba_load(fn):
    """Run ``fn`` as numba loads (at once if it has): where the core extends numba
    (``rng.py``'s overload) or binds a name to one of numba's types (``sim/cluster.py``)."""
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
    import numba as loaded

    numba = loaded
    _drop_stale_cache()
    _function_ids_unique_across_processes()
    _load_numpy_support_without_scipy()
    _one_llvm_optimization()
    _untyped_ir_once_per_function()
    _inlined_scope_copied_once()
    _inlined_ir_copied_once()
    _compile_flags_compared_quickly()
    _python_wrappers_unoptimized()
    _lifetimes_on_demand()
    _stores_kept()
    _copies_shared()
    _fields_read_in_place()
    _array_elements_direct()
    _plain_error_messages()
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
         by_address: bool = False, lazy=None):
    """Compile ``fn`` with numba (from :func:`use_numba` on), or return it. No Python object,
    exception or allocation inside (errors are return codes; arrays are made by the caller), so
    the functions are compiled without numba's reference counting (``_nrt=False``): with it,
    every call would count references to each of the ~60 arrays of the state, several times slower.
    ``inline=True`` (numba inlines the function's code into its caller's) for the small
    functions of the hot path and for the functions an iteration calls from one place: a call
    passes each array of the state field by field, ~420 machine words (a few hundred
    nanoseconds, more than an iteration's own bookkeeping). A function called from several
    places stays a call (inlined, it would be compiled once per place: numba's compile time
    grows with the inlined code); which is which, measured both ways: ``sim/core/loop.py``'s
    docstring, "Compiled per family". A constant passed to a function that stays a call is typed as
    its type, not as a literal of its value (``get_call_template`` in
    :func:`_interpreted_from_python`): numba would compile the callee once per constant (SGLang's
    radix tree compiled four functions twice); the ``np.int64(...)`` at older calls does the same
    by hand. A scheduler family reaches a call as a constant of its closure instead
    (``lifecycle.preempt_for``: numba prunes branches by a constant it sees, not by a literal
    argument). ``refcounted=True`` keeps numba's reference counting,
    which its lists need (the cluster's list of replicas, ``sim/core/cluster.py``); the
    functions it calls keep theirs off. Such a function is best inlined into its loop and kept
    short, its work done by calls that take one replica: numba counts references to each of a
    replica's ~80 arrays wherever a replica is bound to a name, and compiles, with each function
    that takes the list, a Python wrapper that unboxes and reflects back every array of every
    replica (the static family's cluster loop: 74 s of CPU to compile cold, 19 s so).
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
    and declares its result (those or ``None``): its caller is typed without it."""
    if fn is None:
        return lambda f: njit(f, inline=inline, refcounted=refcounted, cache_group=cache_group,
                              by_address=by_address, lazy=lazy)
    if lazy is not None:  # (declared whether compiled or not, where a mistake is met at import)
        if len(_LAZY) == {f.name: f.width for f in TABLES["config"]}["LAZY_ADDRESSES"]:
            raise RuntimeError("config[LAZY_ADDRESSES] is full: widen it (sim/core/state.py)")
        _declared(fn)
        _LAZY[fn] = (len(_LAZY), lazy)
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
_ENTRY_SOURCE = '''"""The entry of lazy function {where}, written by pagesim.sim.core.jit (its sources'
digest {digest})."""

from pagesim.sim.core.by_reference import state_at
from pagesim.sim.core.jit import inlined_lazy

body = inlined_lazy({slot})


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
    code twice, an overload's code being typed on its own before it is inlined: 2026-11-28.)"""
    if fn in _LAZY_ENTRY:
        return _LAZY_ENTRY[fn]
    import hashlib
    import importlib.util
    import tempfile

    slot, where = _LAZY[fn][0], f"{fn.__module__}.{fn.__qualname__}"
    digest = _lazy_digest(fn)
    params = "".join(f", {name}" for name in _declared(fn)[0][1:])
    text = _ENTRY_SOURCE.format(where=where, digest=digest, slot=slot, params=params)
    name = "pagesim_lazy_" + where.removeprefix(__package__ + ".").replace(".", "_")
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


def inlined_lazy(slot: int):
    """A dispatcher of the lazy function in ``slot`` that numba inlines into its entry (and
    nowhere else: compiled code calls the function through :func:`_lazy_call`)."""
    fn = next(fn for fn, (at, _) in _LAZY.items() if at == slot)
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
    arguments), ~0.2 s of CPU for each place that calls, a sixth of vLLM v1's cold compile
    (2026-11-28)."""
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


def set_lazy_addresses(s, state_type) -> None:
    """Write into ``s.config`` the address of each lazy function (``njit``'s ``lazy``) the run
    may call, compiling it (or loading it from numba's cache) at its first need in this process,
    and 0 for the others; ``state_type``: numba's type of ``s``."""
    s.config[STATE_ADDRESS] = 0  # (the running loop writes it)
    for fn, (slot, needed) in _LAZY.items():
        s.config[LAZY_ADDRESSES + slot] = lazy_address(fn, state_type) if needed(s.config) else 0


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
            return numba.njit(cache=True, **options)(fn)
        return _interpreted_from_python(fn, options)


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
        elif isinstance(value, types.ModuleType) and value.__name__.startswith(__package__ + "."):
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
