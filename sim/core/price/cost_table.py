"""The table model's price of one iteration: a measured profile, interpolated, stated once.

:class:`sim.cost.roofline.TableCostModel` reads the profile (``sim/cost/profile_format.py``) and
packs it for :func:`table_step_time`, which the core's loop calls too:

* the constants array: the roofline's (``sim.core.cost``; the table prices prefill without
  ``attn_prefill`` rows, swap and copy-on-write as the roofline does), with the profile's
  overheads at the overhead indices, then the sizes of the tables (indices below);
* the tables array: float64, one after the other, ``linear`` (token counts, then seconds),
  ``attn_decode`` (batches, contexts, then the batch x context grid of seconds by rows) and
  ``attn_prefill`` (token counts, then seconds), each sorted by its keys.

Between two points of a table the price is np.interp's (``slope * (x - x_j) + y_j``, the same
float); below the first point it is the first point's; beyond the last it follows the last
segment's slope; a one-point table scales through the origin (``y_0 * x / x_0``). No function
allocates: the tables are read through views of the one array.
"""

from __future__ import annotations

from pagesim.sim.core.price.cost import (NUM_CONSTANTS as ROOFLINE_CONSTANTS, OVERHEAD_S, PER_SEQ_OVERHEAD_S,
                           plus_transfers, prefill_attention_seconds)
from pagesim.sim.core.compile.jit import njit

# indices into the constants array after the roofline's (TableCostModel.constants())
LINEAR_POINTS = ROOFLINE_CONSTANTS  # token counts in the linear table
DECODE_BATCHES = ROOFLINE_CONSTANTS + 1  # rows of the decode grid
DECODE_CONTEXTS = ROOFLINE_CONSTANTS + 2  # its columns
PREFILL_POINTS = ROOFLINE_CONSTANTS + 3  # token counts in the prefill table (0: the roofline prices prefill)
NUM_CONSTANTS = ROOFLINE_CONSTANTS + 4


@njit(inline=True)
def segment(x, xs):
    """Which segment of the table ``xs`` (sorted) prices ``x``: the index ``j`` of its first
    point (the last ``j`` with ``xs[j] <= x``, as np.interp finds it); the last segment at
    and beyond the table's end; 0 below it and in a one-point table."""
    n = len(xs)
    if n < 2 or x < xs[0]:
        return 0
    if x >= xs[n - 1]:
        return n - 2
    lo, hi = 0, n - 1  # xs[lo] <= x < xs[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if xs[mid] <= x:
            lo = mid
        else:
            hi = mid
    return lo


@njit(inline=True)
def on_segment(x, xs, j, y_j, y_next):
    """The table's value at ``x`` from its segment ``j`` (:func:`segment`), whose points
    ``xs[j]`` and ``xs[j + 1]`` have the values ``y_j`` and ``y_next``."""
    n = len(xs)
    if n == 1:  # one point: through the origin
        return y_j * x / xs[0]
    if x < xs[0]:  # below the table: its first value
        return y_j
    last = xs[n - 1]
    if x > last:  # beyond the table: the last segment's slope
        return y_next + (y_next - y_j) / (last - xs[n - 2]) * (x - last)
    if x == last:
        return y_next
    if x == xs[j]:  # np.interp's shortcut on a point
        return y_j
    return (y_next - y_j) / (xs[j + 1] - xs[j]) * (x - xs[j]) + y_j  # np.interp's arithmetic


@njit
def interp_extrap(x, xs, ys):
    """The table ``(xs, ys)`` at ``x``: see the module docstring."""
    j = segment(x, xs)
    return on_segment(x, xs, j, ys[j], ys[min(j + 1, len(xs) - 1)])


@njit
def decode_seconds(num_decode, mean_context, batches, contexts, grid):
    """Bilinear on (batch, context): the two rows of the batch's segment, each interpolated at
    the mean context, then interpolated between at the batch (``grid``: the rows one after the
    other, ``len(contexts)`` each). Beyond either axis the last segment's slope extends."""
    width = len(contexts)
    j = segment(num_decode, batches)
    k = min(j + 1, len(batches) - 1)
    y_j = interp_extrap(mean_context, contexts, grid[j * width:(j + 1) * width])
    y_k = interp_extrap(mean_context, contexts, grid[k * width:(k + 1) * width])
    return on_segment(num_decode, batches, j, y_j, y_k)


@njit
def table_step_time(c, tables, num_seqs, num_tokens, num_decode, decode_context_sum, num_prefill_seqs,
                    prefill_context, prefill_flop_sum, prefill_cached_sum, swapped_tokens, copied_tokens):
    """Seconds for one iteration: the overheads, ``linear(num_tokens)``, the decode attention
    at the decode batch and its mean context, ``attn_prefill`` at each prefilling sequence's
    context after its chunk (``prefill_context[:num_prefill_seqs]``), summed in order (the
    roofline's prefill attention, from ``prefill_flop_sum`` and ``prefill_cached_sum`` as
    :func:`sim.core.cost.roofline_step_time` takes them, where the profile has no prefill
    rows), swap and copy-on-write; the terms in this fixed order."""
    num_linear, num_batches = int(c[LINEAR_POINTS]), int(c[DECODE_BATCHES])
    num_contexts, num_prefill_points = int(c[DECODE_CONTEXTS]), int(c[PREFILL_POINTS])
    t = c[OVERHEAD_S] + c[PER_SEQ_OVERHEAD_S] * num_seqs
    # the keys as floats (exact), as np.interp takes them: one compiled version of each function
    if num_tokens:
        t += interp_extrap(float(num_tokens), tables[:num_linear], tables[num_linear:2 * num_linear])
    at = 2 * num_linear
    if num_decode:
        batches = tables[at:at + num_batches]
        contexts = tables[at + num_batches:at + num_batches + num_contexts]
        grid = tables[at + num_batches + num_contexts:at + num_batches + num_contexts + num_batches * num_contexts]
        t += decode_seconds(float(num_decode), decode_context_sum / num_decode, batches, contexts, grid)
    at += num_batches + num_contexts + num_batches * num_contexts
    if num_prefill_seqs:
        if num_prefill_points:
            xs = tables[at:at + num_prefill_points]
            ys = tables[at + num_prefill_points:at + 2 * num_prefill_points]
            prefill = 0.0
            for k in range(num_prefill_seqs):
                prefill += interp_extrap(float(prefill_context[k]), xs, ys)
            t += prefill
        else:
            t += prefill_attention_seconds(c, prefill_flop_sum, prefill_cached_sum)
    return plus_transfers(c, t, swapped_tokens, copied_tokens)
