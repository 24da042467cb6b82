"""A hint to the processor: a row of a table is about to be read.

The paged caches' structures are walked block by block in orders the code knows ahead: a request's
table tail first as it lets its blocks go (each block's ``block_info`` row, last touched when the
block was taken, long out of the core's caches), the prefix map's rows a request's hits are looked
up in, one segment of sixteen keys at a time. Each such row read is a wait on memory; told a few
rows ahead, the processor fetches them while the walk goes on (docs/performance.md, "Mooncake").

Compiled, :func:`prefetch_row` is LLVM's ``llvm.prefetch`` (read, kept in every cache level) of
the row's first byte: no load, no fault on any address, so a row past the table's end costs
nothing. Interpreted (CPython), it does nothing: the hint changes no value, only when memory is
read.
"""

from __future__ import annotations


def prefetch_row(table, row) -> None:
    """Compiled: start fetching the cache line where row ``row`` of ``table`` (a C-contiguous
    array) begins; any ``row`` is allowed, out of range too (nothing is read). Interpreted:
    nothing."""
    return None


def register() -> None:
    """The compiled form of :func:`prefetch_row` (numba loaded), as numba's builtin
    (``type_callable``, ``lower_builtin``), as ``by_reference.register`` does for its own."""
    from llvmlite import ir as llvm_ir
    from numba import types
    from numba.extending import lower_builtin, type_callable

    @type_callable(prefetch_row)
    def _prefetch_row(context):
        def typer(table, row):
            if isinstance(table, types.Array) and isinstance(row, types.Integer):
                return types.none
        return typer

    @lower_builtin(prefetch_row, types.Array, types.Integer)
    def prefetched(context, builder, signature, args):
        table_type, row_type = signature.args
        table = context.make_array(table_type)(context, builder, value=args[0])
        word = context.get_value_type(types.intp)
        row = context.cast(builder, args[1], row_type, types.intp)
        offset = builder.mul(row, builder.extract_value(table.strides, 0))
        address = builder.inttoptr(builder.add(builder.ptrtoint(table.data, word), offset),
                                   context.get_value_type(types.voidptr))
        i32 = llvm_ir.IntType(32)
        hint = builder.module.declare_intrinsic(
            "llvm.prefetch", (address.type,),
            llvm_ir.FunctionType(llvm_ir.VoidType(), [address.type, i32, i32, i32]))
        # (read, the highest locality: every cache level, the data cache)
        builder.call(hint, [address, i32(0), i32(3), i32(1)])
        return context.get_dummy_value()
