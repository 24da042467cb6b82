"""``FakeBackend``: a CPU stand-in for the GPU backend (``gpu/executor.py``'s :class:`Backend`
protocol), used by tests and ``validate --backend fake`` / ``--dry-run``. It moves *tags* where the
real backend moves K/V, so wrong slot mappings, copies and swaps are caught without a GPU."""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from pagesim.gpu.executor import ExecutorError, StepPlan, slots_for
from pagesim.gpu.graphs import graph_size_for, max_blocks_for, padded_inputs

_I64 = np.int64


class FakeBackend:
    """CPU stand-in for the GPU: records every call, keeps a *tag* pool, returns a formula time.

    Pool model: every slot holds a tag ``(writer seq, position)`` (-1 when never written);
    ``execute`` applies swap-out, swap-in, copies and the new tokens' writes exactly as the real
    backend would move K/V, then (``verify=True``) reads every batch sequence's context through
    its table and checks each position holds a tag written for that position by the sequence or
    one of its fork ancestors (``check_writers=False`` checks positions only, e.g. with prefix
    caching, where blocks come from other requests). So wrong slot mappings, missed or extra
    copy-on-write copies and wrong swaps are caught on CPU.

    Time: ``time_fn(plan) -> seconds`` if given, else ``base_s + per_token_s * tokens +
    per_context_s * sum(decode context) + per_copy_s * (copies + swapped blocks)``;
    ``sleep=True`` also sleeps that long (to exercise wall-clock paths). ``host_fn(plan) -> seconds``
    adds a host share to the step, reported apart in ``last_timing`` (``gpu_s``, ``host_s``) as the
    real backend reports its own.
    """

    name = "fake"
    measures_time = False

    def __init__(self, time_fn: Callable[[StepPlan], float] | None = None, *, base_s: float = 1e-3,
                 per_token_s: float = 2e-5, per_context_s: float = 1e-8, per_copy_s: float = 1e-6,
                 sleep: bool = False, verify: bool = True, check_writers: bool = True, record: bool = True,
                 host_fn: Callable[[StepPlan], float] | None = None, device_name: str | None = None,
                 graph_sizes: list[int] | None = None, graph_max_context: int | None = None):
        self.graph_sizes = list(graph_sizes or [])
        self.graph_max_context = graph_max_context
        self.graph_replays: dict[int, int] = {}  # size -> steps that replayed it
        self.time_fn = time_fn
        self.device_name = device_name  # what validation reports as the GPU (None: the backend's name)
        self.host_fn = host_fn
        self.last_timing: dict = {}
        self.base_s, self.per_token_s = base_s, per_token_s
        self.per_context_s, self.per_copy_s = per_context_s, per_copy_s
        self.sleep = sleep
        self.verify = verify
        self.check_writers = check_writers
        self.record = record
        self.calls: list[tuple[str, object]] = []
        self.plans: list[StepPlan] = []
        self.parent: dict[int, int] = {}

    def setup(self, model, num_blocks: int, block_size: int, host_blocks: int) -> None:
        self.model = model
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.writer = np.full((num_blocks, block_size), -1, _I64)
        self.pos = np.full((num_blocks, block_size), -1, _I64)
        self.host_blocks = int(host_blocks)
        self.host_writer = np.full((max(host_blocks, 1), block_size), -1, _I64)
        self.host_pos = np.full((max(host_blocks, 1), block_size), -1, _I64)
        self.max_blocks = max_blocks_for(self.graph_max_context or model.max_seq_len, block_size)
        self.calls.append(("setup", (num_blocks, block_size, host_blocks)))

    def read_blocks(self, where: str, block_ids) -> np.ndarray:
        """[n, 2 (writer, position), block_size, 1, 1] tags of device or host blocks (gpu/kv_check.py)."""
        ids = np.asarray(block_ids, _I64)
        if where == "host" and self.host_blocks == 0:
            raise ValueError("no host swap space")  # as the real backend: no pool, nothing to read
        w, p = (self.writer, self.pos) if where == "device" else (self.host_writer, self.host_pos)
        return np.stack([w[ids], p[ids]], axis=1)[..., None, None].copy()

    def step_time(self, plan: StepPlan) -> float:
        if self.time_fn is not None:
            return float(self.time_fn(plan))
        moved = len(plan.copies) + len(plan.swap_in) + len(plan.swap_out)
        return (self.base_s + self.per_token_s * plan.num_tokens
                + self.per_context_s * float(plan.decode_context.astype(np.int64).sum())
                + self.per_copy_s * moved)

    def _ancestors(self, s: int) -> set[int]:
        out = {s}
        while s in self.parent:
            s = self.parent[s]
            out.add(s)
        return out

    def execute(self, plan: StepPlan) -> float:
        if self.record:
            self.plans.append(plan)
        for p, c in plan.forks:
            self.parent[c] = p
        bs = self.block_size
        if len(plan.swap_in):
            self.calls.append(("swap_in", plan.swap_in))
            h, d = plan.swap_in[:, 0], plan.swap_in[:, 1]
            self.writer[d], self.pos[d] = self.host_writer[h], self.host_pos[h]
        if len(plan.swap_out):
            self.calls.append(("swap_out", plan.swap_out))
            d, h = plan.swap_out[:, 0], plan.swap_out[:, 1]
            self.host_writer[h], self.host_pos[h] = self.writer[d], self.pos[d]
        if len(plan.copies):
            self.calls.append(("copy_blocks", plan.copies))
            src, dst = plan.copies[:, 0], plan.copies[:, 1]
            if len(np.unique(dst)) != len(dst) or np.isin(dst, src).any():
                raise ExecutorError(f"step {plan.step}: copy destinations repeat or are also sources")
            self.writer[dst], self.pos[dst] = self.writer[src], self.pos[src]
        slots = plan.slot_mapping
        writers = np.concatenate([np.repeat(plan.prefill_seq_ids, plan.prefill_tokens), plan.decode_seq_ids])
        positions = np.concatenate([plan.prefill_positions, plan.decode_context.astype(_I64) - 1])
        decode_tables, decode_context = plan.decode_tables, plan.decode_context.astype(_I64)
        graph_size = graph_size_for(plan, self.graph_sizes, self.max_blocks)
        if graph_size is not None:  # the padded inputs a replayed graph reads (gpu/graphs.py)
            self.calls.append(("graph_replay", graph_size))
            self.graph_replays[graph_size] = self.graph_replays.get(graph_size, 0) + 1
            padded = padded_inputs(plan, graph_size, self.max_blocks)
            slots, positions = padded["slots"], padded["pos"]
            writers = np.concatenate([writers, np.full(graph_size - len(writers), -1, _I64)])
            n = len(plan.decode_seq_ids)
            if padded["lens"][n:].any():
                raise ExecutorError(f"step {plan.step}: a padding row of the graph reads a context")
            decode_tables, decode_context = padded["tables"][:n], padded["lens"][:n].astype(_I64)
        keep = slots >= 0  # a negative slot is not written (graph padding), as the kernels skip it
        slots, writers, positions = slots[keep], writers[keep], positions[keep]
        if len(slots):
            if len(np.unique(slots)) != len(slots):
                raise ExecutorError(f"step {plan.step}: two new tokens map to the same slot")
            self.calls.append(("reshape_and_cache", slots))
            self.writer.reshape(-1)[slots] = writers
            self.pos.reshape(-1)[slots] = positions
        if len(plan.prefill_seq_ids):
            self.calls.append(("prefill_attention", (plan.prefill_seq_ids, plan.prefill_tokens)))
        if len(plan.decode_seq_ids):
            self.calls.append(("decode_attention", (plan.decode_tables, plan.decode_context)))
        if self.verify:
            seqs = np.concatenate([plan.prefill_seq_ids, plan.decode_seq_ids]).tolist()
            ctxs = np.concatenate([plan.prefill_context, decode_context]).tolist()
            rows = [plan.prefill_tables[i] for i in range(len(plan.prefill_seq_ids))] + \
                   [decode_tables[i] for i in range(len(plan.decode_seq_ids))]
            for s, c, row in zip(seqs, ctxs, rows):
                sl = slots_for(row, 0, c, bs)
                pos = self.pos.reshape(-1)[sl]
                if not (pos == np.arange(c)).all():
                    bad = int(np.flatnonzero(pos != np.arange(c))[0])
                    raise ExecutorError(f"step {plan.step}: sequence {s} reads position {bad} from slot "
                                        f"{int(sl[bad])}, which holds position {int(pos[bad])}")
                if self.check_writers:
                    w = np.unique(self.writer.reshape(-1)[sl])
                    anc = self._ancestors(s)
                    if not set(w.tolist()) <= anc:
                        raise ExecutorError(f"step {plan.step}: sequence {s} reads K/V written by "
                                            f"{sorted(set(w.tolist()) - anc)}, not itself or an ancestor")
        t = self.step_time(plan)
        host = float(self.host_fn(plan)) if self.host_fn is not None else 0.0
        self.last_timing = {"gpu_s": t, "host_s": host, "graph_size": graph_size}
        if self.sleep:
            time.sleep(t + host)
        return t + host
