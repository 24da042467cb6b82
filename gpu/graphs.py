"""Decode steps captured in CUDA graphs at padded batch sizes and replayed, as vLLM runs them.

The rules, from vllm 0.33.0:

* **Capture sizes** (``capture_sizes``): 1, 2, 4, then every multiple of 8 below 256, then every
  multiple of 16 from 256, up to ``min(2 x max_num_seqs, 512)`` (config/vllm.py:2403-2410 and
  2575-2590; the decode query length is 1). vLLM also appends ``max_num_batched_tokens`` when it
  fits under that ceiling, which a decode batch never reaches in the programme's runs: left out.
* **Padding** (``padded_size``): a batch of b sequences replays the graph of the smallest capture
  size >= b (v1/cudagraph_dispatcher.py:71-90); a batch above the largest runs eagerly.
* **Order**: the largest size is captured first, so the smaller graphs reuse its memory pool
  (v1/worker/gpu_model_runner.py:6432-6434).

``DecodeGraphs`` captures one backend's decode forward (embedding and the layers run; the LM head
runs eagerly after it, so the layer span can be scaled, see gpu/model_runner.py) over static input
buffers shared by all sizes.

* **Context classes** (``context_ceilings``, ``ceiling_for``): a graph freezes the attention
  kernel's split-K geometry, and one planned for the longest context splits a short one too
  coarsely: on the H100 of 2026-11-26 a llama-2-7b graph planned at 4,096 tokens ran one
  sequence's attention at 300 tokens in 1.05 ms (32 layers) against 0.34 ms eagerly
  (benchmarks/gpu_decode_slope.py). vLLM's full-graph FlashAttention path picks its splits per
  step inside the graph, up to a cap its buffers are sized for (v1/attention/backends/
  flash_attn.py:752-771, 855-866); this runner's kernel takes its partition size as a launch
  argument, so each size is captured once per context class instead (ceilings 256, 512, 1,024 ...
  up to the longest context), planned at the class's ceiling, and a class that splits its contexts
  as the next larger one does is served by that one: both one pass (no partial buffers, no reduce),
  or both split at the same partition size (the larger class's extra partitions exit at once).
  A step replays the graph of its padded size and of the smallest kept ceiling >= its longest
  context.

Padding rows get slot -1 (no KV write), context length 0 (the attention kernel writes zeros) and
position 0. On a CPU device a captured "graph" is the forward function itself, run again on
replay over the same buffers (``CPUGraph``): the tests check the padding, the choice of graph and
the eager fallback with it, through the emulated kernels.
"""

from __future__ import annotations

import bisect
import gc

import numpy as np

#: vLLM's default ceiling of the capture sizes (1024 on data-centre Blackwell, config/vllm.py:2403)
CAPTURE_CEILING = 512
#: the shortest context class of the decode graphs; each next class doubles it
FIRST_CONTEXT_CEILING = 256


def capture_sizes(max_num_seqs: int, ceiling: int = CAPTURE_CEILING) -> list[int]:
    top = min(2 * int(max_num_seqs), ceiling)
    sizes = [s for s in (1, 2, 4) if s <= top]
    if top >= 8:
        sizes += list(range(8, min(top + 1, 256), 8))
    if top >= 256:
        sizes += list(range(256, top + 1, 16))
    return sizes


def padded_size(batch: int, sizes: list[int]) -> int | None:
    """The capture size a decode batch of ``batch`` sequences replays; None: above the largest (eager)."""
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else None


def graph_size_for(plan, sizes: list[int], max_blocks: int) -> int | None:
    """The graph a step replays: a decode-only step whose tables fit the static buffers, padded
    (``padded_size``); None: the step runs eagerly (a prefill in it, a batch above the largest size)."""
    n = len(plan.decode_seq_ids)
    if not sizes or len(plan.prefill_seq_ids) or not n or plan.decode_tables.shape[1] > max_blocks:
        return None
    return padded_size(n, sizes)


def max_blocks_for(max_context: int, block_size: int) -> int:
    """Block-table columns of the static buffers: the longest context a graph takes."""
    return -(-int(max_context) // int(block_size))


def context_ceilings(max_context: int, first: int = FIRST_CONTEXT_CEILING) -> list[int]:
    """The context classes' ceilings: ``first``, doubled while below ``max_context``, then
    ``max_context`` itself (the longest context a graph takes)."""
    out, c = [], int(first)
    while c < int(max_context):
        out.append(c)
        c *= 2
    return out + [int(max_context)]


def ceiling_for(max_context: int, ceilings: list[int]) -> int | None:
    """The smallest ceiling >= a step's longest context (None: longer than every class)."""
    i = bisect.bisect_left(ceilings, int(max_context))
    return ceilings[i] if i < len(ceilings) else None


def split_of(plan) -> int | None:
    """How an attention plan splits the contexts it takes: None for one pass (each sequence one
    partition, no reduce: the kernel reads a sequence's tokens alone, whatever the partition's
    size), else the partition size."""
    return None if plan.max_parts == 1 else plan.partition_size


def sizes_to_capture(sizes: list[int], max_num_seqs: int) -> list[int]:
    """The capture sizes a decode batch of at most ``max_num_seqs`` can pad to (the larger ones
    would never replay: not captured, which saves their memory and capture time)."""
    top = padded_size(max_num_seqs, sizes) or sizes[-1]
    return [s for s in sizes if s <= top]


def padded_inputs(plan, size: int, max_blocks: int) -> dict[str, np.ndarray]:
    """A decode-only plan's inputs padded to ``size`` rows (numpy): ``pos`` (padding 0), ``slots``
    (-1: no KV write), ``tables`` [size, max_blocks] (0 past each row's entries; never read), ``lens``
    (0: the attention kernel writes zeros)."""
    n = len(plan.decode_seq_ids)
    pos = np.zeros(size, np.int64)
    pos[:n] = plan.decode_context.astype(np.int64) - 1
    slots = np.full(size, -1, np.int64)
    slots[:n] = plan.slot_mapping
    tables = np.zeros((size, max_blocks), np.int32)
    tables[:n, :plan.decode_tables.shape[1]] = plan.decode_tables
    lens = np.zeros(size, np.int32)
    lens[:n] = plan.decode_context
    return {"pos": pos, "slots": slots, "tables": tables, "lens": lens}


class CPUGraph:
    """A CPU device's stand-in for ``torch.cuda.CUDAGraph``: capture runs the function once and keeps
    it, replay runs it again over the same static buffers."""

    def capture(self, fn):
        self.fn = fn
        return fn()

    def replay(self):
        return self.fn()  # a new state (torch's graph replays into the captured tensors instead)


class DecodeGraphs:
    """The decode graphs of one ``TorchCupyBackend`` after its setup (ops "fused", attention "kernel")."""

    def __init__(self, be, sizes: list[int], max_context: int):
        torch = be.torch
        self.be, self.sizes = be, sorted(sizes)
        dev = be.device
        top = self.sizes[-1]
        self.max_blocks = max_blocks_for(max_context, be.block_size)
        self.ids = torch.zeros(top, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(top, dtype=torch.int64, device=dev)
        self.slots = torch.full((top,), -1, dtype=torch.int64, device=dev)
        self.tables = torch.zeros((top, self.max_blocks), dtype=torch.int32, device=dev)
        self.lens = torch.zeros(top, dtype=torch.int32, device=dev)
        self.max_context = self.max_blocks * be.block_size  # the longest context the buffers take
        # (size, context ceiling) -> (graph, the final state's tensors, attention plan)
        self.graphs: dict[tuple[int, int], tuple] = {}
        self.ceilings: dict[int, list[int]] = {}  # size -> its kept context ceilings, ascending
        self.replays: dict[int, int] = {}  # size -> times replayed (the tests read it)
        self.last_replayed: tuple[int, int] | None = None  # the graph of the last replay (the tests read it)

    # ------------------------------------------------------------------ capture
    def capture_all(self) -> None:
        cuda = self.be.device.startswith("cuda")
        pool = self.be.torch.cuda.graph_pool_handle() if cuda else None
        # A dead reference cycle that holds an earlier backend's graph, collected during a capture,
        # destroys that graph there, which CUDA forbids while a stream captures: the capture is
        # invalidated, and torch's generator stays in capture mode ("Offset increment outside graph
        # capture", seen on an H200 when the GPU tests shared a process). torch's own context collects
        # first only under force_cudagraph_gc (torch 2.13 torch/cuda/graphs.py:441), so the garbage
        # goes now and the collector waits until every graph is captured.
        gc.collect()
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool
                self.ceilings[size] = self.kept_ceilings(size)
                for ceiling in reversed(self.ceilings[size]):  # longest first, as the sizes
                    self.graphs[(size, ceiling)] = self._capture(size, ceiling, pool)
        finally:
            if was_enabled:
                gc.enable()
        if cuda:  # each replayed once here, so that no timed step pays
            for graph, _state, _plan in self.graphs.values():  # a graph's first launch (the buffers
                graph.replay()  # hold padding: no KV written, no context read)
            self.be._sync()

    def kept_ceilings(self, size: int) -> list[int]:
        """The context classes a size is captured for: a class that splits its contexts as the next
        longer class does (:func:`split_of`) is left to that one."""
        kept, last = [], None
        for ceiling in reversed(context_ceilings(self.max_context)):
            split = split_of(self._plan(size, ceiling)[0])
            if not kept or split != last:
                kept.append(ceiling)
                last = split
        return kept[::-1]

    def _capture(self, size: int, ceiling: int, pool):
        be, torch = self.be, self.be.torch
        if not be.device.startswith("cuda"):
            graph, plan = CPUGraph(), self._plan(size, ceiling)
            return graph, graph.capture(lambda: self._forward(size, plan)), plan[0]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            # the plan binds the current stream when it is made: the capture's, so its launches are recorded
            plan = self._plan(size, ceiling)
            self._forward(size, plan)  # a run outside the capture: modules loaded, the allocator grown
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            state = self._forward(size, plan)
        return graph, state, plan[0]

    def _forward(self, size: int, planned):
        """The decode forward over the static buffers' first ``size`` rows (what a graph records)."""
        be = self.be
        plan, out, qbuf = planned
        ops = be._layer_ops
        state = ops.start(be.emb[self.ids[:size]])
        for l, w in enumerate(be.layers):
            state, q, _k, _v = ops.qkv(state, w, self.pos[:size], be.kv[l, 0], be.kv[l, 1], self.slots[:size])
            qbuf.copy_(q)
            plan.rebind(qbuf, be.kv[l, 0], be.kv[l, 1]).launch()  # each layer's launch, recorded
            state = ops.finish(state, out, w)
        return state

    def _plan(self, size: int, ceiling: int):
        """The attention plan of a size and context class, over a static query buffer and the
        static tables and lengths, planned for the class's ceiling (the launch geometry is frozen
        in the graph; partitions past a sequence's length exit at once), rebound to each layer's
        caches as the forward records them: one output and one set of partial buffers a graph."""
        from pagesim.gpu import paged_attention as pa
        be, torch = self.be, self.be.torch
        qbuf = torch.zeros((size, be.H, be.D), dtype=be.tdtype, device=be.device)
        plan = pa.prepare(qbuf, be.kv[0, 0], be.kv[0, 1], self.tables[:size], self.lens[:size], be.block_size,
                          ceiling, check=False)
        return plan, be._as_torch(plan.out, qbuf), qbuf

    # ------------------------------------------------------------------ replay
    def load(self, plan, ids) -> tuple[int, int] | None:
        """Copy a decode-only step's inputs into the static buffers (padding past the batch); the
        graph to replay (size, context ceiling), or None when the batch is above the largest or its
        context past the longest (run it eagerly)."""
        n = len(plan.decode_seq_ids)
        size = graph_size_for(plan, self.sizes, self.max_blocks)
        ceiling = None if size is None else ceiling_for(plan.decode_max_context, self.ceilings[size])
        if ceiling is None:
            return None
        self.ids[:n].copy_(ids)
        self.ids[n:size].zero_()
        for name, arr in padded_inputs(plan, size, self.max_blocks).items():
            getattr(self, name)[:size].copy_(self.be.torch.as_tensor(arr, device=self.be.device))
        return size, ceiling

    def replay(self, key: tuple[int, int]):
        """Run the graph of ``key`` (size, context ceiling); its final layer state (padded rows included)."""
        size = key[0]
        graph, state, _plans = self.graphs[key]
        state = graph.replay() or state
        self.replays[size] = self.replays.get(size, 0) + 1
        self.last_replayed = key
        return state
