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
buffers shared by all sizes. Padding rows get slot -1 (no KV write), context length 0 (the
attention kernel writes zeros) and position 0. On a CPU device a captured "graph" is the forward
function itself, run again on replay over the same buffers (``CPUGraph``): the tests check the
padding, the choice of graph and the eager fallback with it, through the emulated kernels.
"""

from __future__ import annotations

import bisect

#: vLLM's default ceiling of the capture sizes (1024 on data-centre Blackwell, config/vllm.py:2403)
CAPTURE_CEILING = 512


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

    def __init__(self, be, sizes: list[int]):
        torch = be.torch
        self.be, self.sizes = be, sorted(sizes)
        dev = be.device
        top = self.sizes[-1]
        self.max_blocks = -(-int(be.model.max_seq_len) // be.block_size)
        self.ids = torch.zeros(top, dtype=torch.int64, device=dev)
        self.pos = torch.zeros(top, dtype=torch.int64, device=dev)
        self.slots = torch.full((top,), -1, dtype=torch.int64, device=dev)
        self.tables = torch.zeros((top, self.max_blocks), dtype=torch.int32, device=dev)
        self.lens = torch.zeros(top, dtype=torch.int32, device=dev)
        self.graphs: dict[int, tuple] = {}  # size -> (graph, the final state's tensors, attention plans)
        self.replays: dict[int, int] = {}  # size -> times replayed (the tests read it)

    # ------------------------------------------------------------------ capture
    def capture_all(self) -> None:
        cuda = self.be.device.startswith("cuda")
        pool = self.be.torch.cuda.graph_pool_handle() if cuda else None
        for size in reversed(self.sizes):  # largest first: the smaller graphs reuse its pool
            self.graphs[size] = self._capture(size, pool)

    def _capture(self, size: int, pool):
        be, torch = self.be, self.be.torch
        plans, outs, qbuf = self._plans(size)

        def forward():
            ops = be._layer_ops
            state = ops.start(be.emb[self.ids[:size]])
            for l, w in enumerate(be.layers):
                state, q, _k, _v = ops.qkv(state, w, self.pos[:size], be.kv[l, 0], be.kv[l, 1], self.slots[:size])
                qbuf.copy_(q)
                plans[l].launch()
                state = ops.finish(state, outs[l], w)
            return state

        if not be.device.startswith("cuda"):
            graph = CPUGraph()
            return graph, graph.capture(forward), plans
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            forward()  # a run outside the capture: modules loaded, the allocator grown
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            state = forward()
        return graph, state, plans

    def _plans(self, size: int):
        """One attention plan per layer run, over a static query buffer and the static tables and
        lengths, planned for the model's longest context (the launch geometry is frozen in the
        graph; partitions past a sequence's length exit at once)."""
        from pagesim.gpu import paged_attention as pa
        be, torch = self.be, self.be.torch
        qbuf = torch.zeros((size, be.H, be.D), dtype=be.tdtype, device=be.device)
        plans = [pa.prepare(qbuf, be.kv[l, 0], be.kv[l, 1], self.tables[:size], self.lens[:size], be.block_size,
                            int(be.model.max_seq_len), check=False) for l in range(be.L_run)]
        outs = [be._as_torch(p.out, qbuf) for p in plans]
        return plans, outs, qbuf

    # ------------------------------------------------------------------ replay
    def load(self, plan, ids) -> int | None:
        """Copy a decode-only step's inputs into the static buffers (padding past the batch); the
        size to replay, or None when the batch is above the largest (run it eagerly)."""
        torch = self.be.torch
        n = len(plan.decode_seq_ids)
        size = padded_size(n, self.sizes)
        width = plan.decode_tables.shape[1]
        if size is None or width > self.max_blocks:
            return None
        dev = self.be.device
        self.ids[:n].copy_(ids)
        self.ids[n:size].zero_()
        self.pos[:n].copy_(torch.as_tensor(plan.decode_context.astype("int64") - 1, device=dev))
        self.pos[n:size].zero_()
        self.slots[:n].copy_(torch.as_tensor(plan.slot_mapping, device=dev))
        self.slots[n:size].fill_(-1)
        self.tables[:n, :width].copy_(torch.as_tensor(plan.decode_tables, device=dev))
        self.tables[:size, width:].zero_()
        self.tables[n:size].zero_()
        self.lens[:n].copy_(torch.as_tensor(plan.decode_context, device=dev))
        self.lens[n:size].zero_()
        return size

    def replay(self, size: int):
        """Run the graph of ``size``; its final layer state (padded rows included)."""
        graph, state, _plans = self.graphs[size]
        state = graph.replay() or state
        self.replays[size] = self.replays.get(size, 0) + 1
        return state
