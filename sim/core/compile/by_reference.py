"""The state passed by reference to functions compiled code calls by the address of their machine
code: a family's scheduler entry (``loop.scheduler_entry_for``) and the entry of every function
compiled apart (``jit.njit``'s ``lazy``, ``jit.lazy_entry_dispatcher``), so that their callers
pass one address, not the whole state.

numba passes a tuple of arrays, as the state is, field by field: ~70 arrays' descriptions, ~550
machine words at every call, which cost more than the work of most calls (docs/performance.md,
"The compiler's machinery"). By reference, a call passes the address of one copy of those descriptions, which
the function called loads the fields it reads from (:func:`state_at`). The copy is made by
:func:`pin` on the stack of the compiled function that runs the replica's code: a family's loop,
as it starts, and each function of a cluster's loop that works on a replica between its runs
(``cluster.py``, ``disagg.py``), which :func:`unpin` it before they return; ``pin`` writes its
address into ``config[STATE_ADDRESS]``, where every call below finds it (:func:`state_pointer`),
and ``loop.call_engine`` clears it after each run of a replica. A call that finds it 0 stops the
run, naming the function: a copy made at each call instead (a 4 KB store in every caller, for a
call most runs never make) slowed both the engine and its cold compile (docs/performance.md).

Interpreted (CPython), the reference is the state itself.
"""

from __future__ import annotations

from pagesim.sim.core.state import STATE_ADDRESS


def pin(s):
    """Where functions called by address find the state: compiled, the address of a copy of
    ``s`` (its arrays' descriptions) on the stack of the function this is in, written into
    ``config[STATE_ADDRESS]`` too; interpreted, ``s`` itself."""
    return s


def unpin(s) -> None:
    """The copy :func:`pin` made is about to go with its function: its address cleared."""
    s.config[STATE_ADDRESS] = 0


def state_at(ref, like):
    """The state at ``ref`` (:func:`pin`), of numba's type ``like``; interpreted, ``ref``."""
    return ref


def state_pointer(context, builder, state, value, name: str):
    """In a call's code: the address of the state to pass by reference, ``config[STATE_ADDRESS]``
    of state ``value`` (of numba's type ``state``); where it is 0, the run stops with function
    ``name`` named (its caller did not :func:`pin` the state)."""
    from numba import types

    word = context.get_value_type(types.int64)
    held = builder.load(config_slot(context, builder, state, value, STATE_ADDRESS))
    with builder.if_then(builder.icmp_signed("==", held, word(0)), likely=False):
        context.call_conv.return_user_exc(builder, RuntimeError, (f"{name} called on a state not pinned "
                                                                  f"(sim/core/compile/by_reference.py)",))
    return builder.inttoptr(held, context.get_value_type(types.voidptr))


def config_slot(context, builder, state, value, slot: int):
    """In compiled code: the address of ``config[slot]`` of state ``value`` (of numba's type
    ``state``)."""
    from numba import types

    at = state.fields.index("config")
    data = context.make_array(state[at])(context, builder, value=builder.extract_value(value, at)).data
    return builder.gep(data, [context.get_constant(types.intp, slot)])


def register() -> None:
    """The compiled forms of :func:`pin`, :func:`unpin` and :func:`state_at` (numba loaded), as
    numba's builtins (``type_callable``, ``lower_builtin``): an overload's implementation, even
    one inlined, is compiled as a function of its own first (``jit._lazy_call``)."""
    from llvmlite import ir as llvm_ir
    from numba import types
    from numba.core import cgutils
    from numba.core.imputils import impl_ret_borrowed
    from numba.extending import lower_builtin, type_callable

    @type_callable(pin)
    def _pin(context):
        return lambda s: types.voidptr

    @lower_builtin(pin, types.BaseTuple)
    def pinned(context, builder, signature, args):
        state = signature.args[0]
        copy = cgutils.alloca_once(builder, context.get_value_type(state))  # in the entry block
        builder.store(args[0], copy)
        address = builder.ptrtoint(copy, context.get_value_type(types.int64))
        builder.store(address, config_slot(context, builder, state, args[0], STATE_ADDRESS))
        return builder.bitcast(copy, context.get_value_type(types.voidptr))

    @type_callable(unpin)
    def _unpin(context):
        return lambda s: types.none

    @lower_builtin(unpin, types.BaseTuple)
    def unpinned(context, builder, signature, args):
        at = config_slot(context, builder, signature.args[0], args[0], STATE_ADDRESS)
        builder.store(context.get_constant(types.int64, 0), at)
        return context.get_dummy_value()

    def load_fields(builder, at, value_type):
        """The value at ``at``, loaded field by field: a load of the whole state (~550 words)
        would load every field at each call, where these loads of the fields a function does not
        read are dropped as unused. Each is marked invariant (the arrays' descriptions do not
        change while the function runs), so that LLVM may load a field again where it is used
        rather than hold every field from the function's start, spilled to its stack."""
        if not isinstance(value_type, (llvm_ir.LiteralStructType, llvm_ir.ArrayType)):
            field = builder.load(at)
            field.set_metadata("invariant.load", builder.module.add_metadata([]))
            return field
        value = llvm_ir.Constant(value_type, llvm_ir.Undefined)
        elements = value_type.elements if isinstance(value_type, llvm_ir.LiteralStructType) else (
            [value_type.element] * value_type.count)
        for k, element in enumerate(elements):
            field = load_fields(builder, cgutils.gep_inbounds(builder, at, 0, k), element)
            value = builder.insert_value(value, field, k)
        return value

    @type_callable(state_at)
    def _state_at(context):
        def typer(ref, like):
            if isinstance(ref, types.BaseTuple):  # the state itself: a scheduler inlined into its loop
                return ref
            return like.instance_type
        return typer

    @lower_builtin(state_at, types.BaseTuple, types.Any)
    def the_state_itself(context, builder, signature, args):
        return impl_ret_borrowed(context, builder, signature.return_type, args[0])

    @lower_builtin(state_at, types.RawPointer, types.TypeRef)
    def loaded(context, builder, signature, args):
        value_type = context.get_value_type(signature.return_type)
        size = context.get_abi_sizeof(value_type)
        for arg in builder.function.args:  # its own: only it reads the copy, which nothing writes
            if arg.name == "arg.ref":
                arg.add_attribute("noalias")
                arg.add_attribute("nonnull")
                arg.attributes.dereferenceable = size
                arg.attributes.align = 8
        return load_fields(builder, builder.bitcast(args[0], value_type.as_pointer()), value_type)
