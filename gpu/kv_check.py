"""K/V contents checked after copy-on-write and swaps: ``KVContentCheck(backend)``.

A wrapper around an executor backend (same ``setup`` / ``execute`` / ``measures_time``) that
needs one more method of it::

    read_blocks(where: "device" | "host", block_ids) -> np.ndarray   # [len(ids), ...] for all layers

Copies and swaps move bytes, so the CPU reference of what a block must hold after the step is a
snapshot of its source taken before the step: before ``execute`` it reads the sources (copy
sources and swap-out sources on the device, swap-in sources on the host); after it, the
destinations, and requires them equal byte for byte, except the slots the step's new tokens were
written to (a copy-on-write destination receives its sequence's new token right after the copy).
The reads happen outside ``execute``, so they are not in the measured step time. A mismatch
raises :class:`gpu.executor.ExecutorError` naming the step, the operation and the block.

The reference follows the executor's order within a step (gpu/executor.py): swap-in, swap-out,
copies, then the model. A request resumed and preempted again in one step is swapped in and
straight back out of the same blocks, so a swap-out source may hold what the swap-in just
brought, and a copy destination may be a block the swap-out just freed: the expected contents
are chained through the step in that order.
"""

from __future__ import annotations

import numpy as np

from pagesim.gpu.executor import ExecutorError, StepPlan


class KVContentCheck:
    def __init__(self, backend):
        if not hasattr(backend, "read_blocks"):
            raise TypeError(f"{type(backend).__name__} cannot read blocks back (no read_blocks)")
        self.inner = backend
        self.checked_blocks = 0  # destinations compared so far
        self.checked_steps = 0

    def __getattr__(self, name):  # name, measures_time, dtype_name, L_run, device_name, ...
        return getattr(self.inner, name)

    def setup(self, model, num_blocks: int, block_size: int, host_blocks: int) -> None:
        self.block_size = int(block_size)
        self.inner.setup(model, num_blocks, block_size, host_blocks)

    def _written(self, plan: StepPlan) -> dict[int, np.ndarray]:
        """block -> offsets written by this step's new tokens."""
        slots = plan.slot_mapping
        out: dict[int, list[int]] = {}
        for s in slots.tolist():
            out.setdefault(s // self.block_size, []).append(s % self.block_size)
        return {b: np.asarray(o) for b, o in out.items()}

    def execute(self, plan: StepPlan) -> float:
        read = self.inner.read_blocks
        sin, sout, cow = (np.array(p, copy=True) for p in (plan.swap_in, plan.swap_out, plan.copies))
        if not (len(sin) or len(sout) or len(cow)):
            return self.inner.execute(plan)
        # the sources as they are before the step (pairs captured as planned, before the backend runs)
        host_before = dict(zip(sin[:, 0].tolist(), read("host", sin[:, 0]))) if len(sin) else {}
        dev_ids = np.unique(np.concatenate([sout[:, 0], cow[:, 0]]))
        dev_before = dict(zip(dev_ids.tolist(), read("device", dev_ids))) if len(dev_ids) else {}
        t = self.inner.execute(plan)
        # the CPU reference, in the executor's order: swap-in, swap-out, copies (a request resumed
        # and preempted again in one step is swapped in and straight back out of the same blocks)
        dev: dict[int, tuple[str, int, np.ndarray]] = {}
        host: dict[int, tuple[str, int, np.ndarray]] = {}
        for h, d in sin.tolist():
            dev[d] = ("swap-in", h, host_before[h])
        for d, h in sout.tolist():
            host[h] = ("swap-out", d, dev[d][2] if d in dev else dev_before[d])
        for a, d in cow.tolist():
            dev[d] = ("copy-on-write", a, dev[a][2] if a in dev else dev_before[a])
        written = self._written(plan)
        for where, expect in (("device", dev), ("host", host)):
            if not expect:  # e.g. copies only: nothing lands on the host (which may not exist)
                continue
            ids = np.asarray(sorted(expect), np.int64)
            for d, got in zip(ids.tolist(), read(where, ids)):
                op, src, want = expect[d]
                if where == "device" and d in written:  # the step's new tokens land after the copy
                    keep = np.ones(self.block_size, bool)
                    keep[written[d]] = False
                    want, got = (np.compress(keep, x, axis=_token_axis(x)) for x in (want, got))
                if not np.array_equal(np.asarray(want).view(np.uint8), np.asarray(got).view(np.uint8)):
                    raise ExecutorError(f"step {plan.step}: after {op} {src} -> {d}, {where} block {d} does not "
                                        f"hold what block {src} held before the step")
            self.checked_blocks += len(ids)
        self.checked_steps += 1
        return t


def _token_axis(block: np.ndarray) -> int:
    """read_blocks returns [..., block_size, kv_heads, head_dim] per block (layers and K/V first)."""
    return block.ndim - 3
