"""What the core changes in numba as numba loads (``jit.use_numba`` calls :func:`apply`).

It trims numba's work on a cold compile where the machine code of the core's
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
the state loaded alone (:func:`_fields_read_in_place`), an array's element read and written
from its description (:func:`_array_elements_direct`). It keeps every store into an
array that numba's dead-code elimination would delete on too narrow a reading of what may alias
an argument (:func:`_stores_kept`: the core allocates no array). And it names each compiled
function by an id no other process gives (:func:`_function_ids_unique_across_processes`): the
families' loops compiled by different processes, then loaded together, ran each other's code;
and it keys each cached function by the core sources it was compiled from
(:func:`_index_keyed_by_sources`): a process started before an edit saved its code into a cache
a newer process had already found stale and dropped, which then loaded it.

Each change is made once per process; each leaves numba as it is where the part it changes is
not as it expects (its docstring says which).
"""

from __future__ import annotations

import collections
import os
import types


def apply(registered, grouped) -> None:
    """Every change below, made once; ``registered``: the functions given to ``jit.njit`` (its
    options by function), ``grouped``: those given a cache group (the loops Python calls)."""
    _function_ids_unique_across_processes()
    _load_numpy_support_without_scipy()
    _one_llvm_optimization()
    _untyped_ir_once_per_function(registered)
    _inlined_scope_copied_once()
    _inlined_ir_copied_once()
    _compile_flags_compared_quickly()
    _python_wrappers_unoptimized(grouped)
    _lifetimes_on_demand()
    _stores_kept()
    _copies_shared()
    _fields_read_in_place()
    _array_elements_direct()
    _plain_error_messages()
    _index_keyed_by_sources()


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
    which needs the function's use-def, live and dead maps: a twelfth of vLLM v1's cold compile
    (docs/performance.md, "The compiler's machinery"). Only object mode's lowering
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


def _python_wrappers_unoptimized(grouped) -> None:
    """numba compiles, with every function, a wrapper that Python calls it through: it unpacks
    the Python arguments, for the core's functions the state's ~60 arrays one by one, a larger
    function than most of the core's own (2,300 LLVM instructions before optimization, against
    1,000-3,500). Only a loop (a family's, a cluster's: the functions given a cache group) is
    called from Python in a run; every other function is called by compiled code, which calls
    the function itself, not its wrapper, and a call from Python runs its source in CPython:
    most are compiled with no wrapper at all (``jit._interpreted_from_python``). The other
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
        entries = {fn.__qualname__ for fn in grouped}
        if self.name not in entries:
            for fn in self._final_module.functions:
                if fn.name.startswith("_ZN7cpython") and not fn.is_declaration:
                    fn.add_function_attribute("noinline")
                    fn.add_function_attribute("optnone")
        optimize(self)

    _optimize_final_module.pagesim_wrappers = True
    library._optimize_final_module = _optimize_final_module


def _untyped_ir_once_per_function(registered) -> None:
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
        if func not in registered or self.flags is None:
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
    that does not match, tens of thousands while a family compiles cold (docs/performance.md). Its messages are left plain, as numba leaves them with
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
    run. The core allocates no array (``njit``): every array it writes is its
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
    of their optimization on (``llvmlite``'s pass timings; docs/performance.md). Before a function without
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
    and SROA then narrow to the field's own words (``llvmlite``'s pass timings; docs/performance.md). In
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
    at each of the ~1,500 places the vLLM family's functions read or write an element, which
    LLVM's SROA and instcombine then take apart again. For an array indexed by one integer per dimension,
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

    def kinds(index_type) -> tuple:
        return tuple(index_type.types) if isinstance(index_type, numba_types.BaseTuple) else (index_type,)

    def indices(builder, index_type, index) -> tuple:
        if isinstance(index_type, numba_types.BaseTuple):
            return tuple(cgutils.unpack_tuple(builder, index, count=len(index_type)))
        return (index,)

    def element(numbas):
        def lowered(context, builder, signature, args):
            array_type, index_type = signature.args
            index_types = kinds(index_type)
            if not direct(context, array_type, index_types):
                return numbas(context, builder, signature, args)
            at = address(context, builder, array_type, args[0], index_types, indices(builder, index_type, args[1]))
            value = arrayobj.load_item(context, builder, array_type, at)
            return impl_ret_borrowed(context, builder, signature.return_type, value)
        return lowered

    lower_builtin(operator.getitem, numba_types.Array, numba_types.Integer)(element(arrayobj.getitem_arraynd_intp))
    lower_builtin(operator.getitem, numba_types.Array, numba_types.BaseTuple)(element(arrayobj.getitem_array_tuple))

    @lower_builtin(operator.setitem, numba_types.Array, numba_types.Any, numba_types.Any)
    def stored(context, builder, signature, args):
        array_type, index_type, value_type = signature.args
        index_types = kinds(index_type)
        if not direct(context, array_type, index_types) or isinstance(value_type, numba_types.Buffer):
            return arrayobj.setitem_array(context, builder, signature, args)
        at = address(context, builder, array_type, args[0], index_types, indices(builder, index_type, args[1]))
        value = context.cast(builder, args[2], value_type, array_type.dtype)
        arrayobj.store_item(context, builder, array_type, value, at)

    arrayobj.pagesim_elements_direct = True


def _index_keyed_by_sources() -> None:
    """numba's cache index key (``Cache._index_key``, numba/core/caching.py: the signature, the
    CPU, the function's bytecode and closure) with the digest of the core sources the process
    compiled it from, where the core gave its dispatcher one (``jit.keyed_by_sources``): an entry
    of other sources is then a miss, never loaded."""
    from numba.core import caching

    index_key = caching.Cache._index_key

    def keyed(self, sig, codegen):
        sources = getattr(self, "pagesim_sources", None)
        key = index_key(self, sig, codegen)
        return key if sources is None else (key, sources)

    caching.Cache._index_key = keyed
