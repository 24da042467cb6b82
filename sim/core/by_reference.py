"""The state passed by reference to functions compiled code calls by the address of their machine
code: a family's scheduler entry (``loop.scheduler_entry_for``) and the entry of every function
compiled apart (``jit.njit``'s ``lazy``, ``jit.lazy_entry_dispatcher``), so that their callers
pass one address, not the whole state.

numba passes a tuple of arrays, as the state is, field by field: ~70 arrays' descriptions, ~550
machine words at every call (the static engine took 70 % longer with its scheduler called so,
2026-11-28). By reference, a call passes the address of one copy of those descriptions, which
the function called loads the fields it reads from (:func:`state_at`). The copy is made by
:func:`pin` on the stack of the compiled function that runs the replica's code: a family's loop,
as it starts, and each function of a cluster's loop that works on a replica between its runs
(``cluster.py``, ``disagg.py``), which :func:`unpin` it before they return; ``pin`` writes its
address into ``config[STATE_ADDRESS]``, where every call below finds it (:func:`state_pointer`),
and ``loop.call_engine`` clears it after each run of a replica. A call that finds it 0 stops the
run, naming the function: a copy made at each call instead (a 4 KB store in every caller, for a
call most runs never make) took vLLM v1's engine ~40 % longer and its cold compile ~20 % (by
hand, 2026-11-28).

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


def state_pointer(context, builder, config_data, name: str):
    """In a call's code: the address of the state to pass by reference, ``config[STATE_ADDRESS]``
    (``config_data``: the config array's data); where it is 0, the run stops with function
    ``name`` named (its caller did not :func:`pin` the state)."""
    from numba import types

    word = context.get_value_type(types.int64)
    held = builder.load(builder.gep(config_data, [context.get_constant(types.intp, STATE_ADDRESS)]))
    with builder.if_then(builder.icmp_signed("==", held, word(0)), likely=False):
        context.call_conv.return_user_exc(builder, RuntimeError, (f"{name} called on a state not pinned "
                                                                  f"(sim/core/by_reference.py)",))
    return builder.inttoptr(held, context.get_value_type(types.voidptr))


def register() -> None:
    """The compiled forms of :func:`pin` and :func:`state_at` (numba loaded)."""
    from llvmlite import ir as llvm_ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic, overload

    @intrinsic
    def pinned(typingctx, s):
        def codegen(context, builder, signature, args):
            copy = cgutils.alloca_once(builder, context.get_value_type(s))  # in the entry block
            builder.store(args[0], copy)
            return builder.bitcast(copy, context.get_value_type(types.voidptr))
        return types.voidptr(s), codegen

    @intrinsic
    def as_integer(typingctx, ref):
        def codegen(context, builder, signature, args):
            return builder.ptrtoint(args[0], context.get_value_type(types.int64))
        return types.int64(ref), codegen

    @overload(pin, inline="always")
    def _pin(s):
        def impl(s):
            ref = pinned(s)
            s.config[STATE_ADDRESS] = as_integer(ref)
            return ref
        return impl

    @overload(unpin, inline="always")
    def _unpin(s):
        def impl(s):
            s.config[STATE_ADDRESS] = 0
        return impl

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

    @intrinsic
    def load(typingctx, ref, like):
        state = like.instance_type

        def codegen(context, builder, signature, args):
            value_type = context.get_value_type(state)
            size = context.get_abi_sizeof(value_type)
            for arg in builder.function.args:  # its own: only it reads the copy, which nothing writes
                if arg.name == "arg.ref":
                    arg.add_attribute("noalias")
                    arg.add_attribute("nonnull")
                    arg.attributes.dereferenceable = size
                    arg.attributes.align = 8
            return load_fields(builder, builder.bitcast(args[0], value_type.as_pointer()), value_type)
        return state(ref, like), codegen

    @overload(state_at, inline="always")
    def _state_at(ref, like):
        if isinstance(ref, types.BaseTuple):  # the state itself: a scheduler inlined into its loop
            return lambda ref, like: ref
        return lambda ref, like: load(ref, like)
