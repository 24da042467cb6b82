"""KV transfers from a prefill replica to a decode replica: their bytes, and their times on a
link (``sim/specs/links.py`` gives a link's bandwidth and latency).

**Bytes.** A request's prompt KV moves as whole blocks: vLLM's NIXL connector reads a
descriptor per block id (``nixl/pull_worker.py:401-425``, ``_read_blocks`` over local and
remote block ids; ``nixl/base_worker.py:140-180``, one descriptor per block and region), so
the last, partial block travels whole: ``ceil(tokens / block_size) * block_size`` token slots
of ``bytes_per_token`` each (the model's KV per token at its KV dtype, FP8 included:
``ModelSpec.kv_bytes_per_token``).

**Time.** A transfer costs ``latency + bytes / bandwidth`` on its link. Under tensor
parallelism each GPU of the prefill replica holds its heads' share and sends it over its own
NIC, so ``min(prefill TP, decode TP)`` GPU pairs carry a request at once: the bandwidth is
that many times one GPU's (the narrower side's GPUs each receive from several).

**The queue.** Each decode replica's link is one queue in arrival order (first come, first
served): a transfer starts when the previous one's bytes are out (``free_at``), and ends its
latency after its own bytes are out, so latencies overlap and bytes do not. Concurrent
transfers sharing the wire fairly would end at other instants but move the same bytes in the
same busy time; the queue keeps each end known when its transfer starts, which an event
loop needs.

Plain functions over arrays (``free_at``: one float per link), compiled where the cluster
calls them.
"""

from __future__ import annotations

from pagesim.sim.core.compile.jit import njit


@njit(inline=True)
def transfer_bytes(num_tokens, block_size, bytes_per_token):
    """The bytes ``num_tokens`` tokens of KV take on the wire: whole blocks (module docstring)."""
    blocks = (num_tokens + block_size - 1) // block_size
    return blocks * block_size * bytes_per_token


@njit(inline=True)
def pair_bandwidth(bandwidth_per_gpu, prefill_tp, decode_tp):
    """The bytes/s one request's transfer gets: ``min(TP)`` GPU pairs send at once."""
    return bandwidth_per_gpu * min(prefill_tp, decode_tp)


@njit(inline=True)
def start_transfer(free_at, link, now, num_bytes, bandwidth, latency):
    """A transfer of ``num_bytes`` asked for at ``now`` on link ``link``: returns (when its bytes
    start to flow, when it ends) and books the link until its bytes are out."""
    start = max(now, free_at[link])
    out = start + num_bytes / bandwidth
    free_at[link] = out
    return start, out + latency
