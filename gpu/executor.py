"""The GPU executor: runs the scheduler's iterations for real over the manager's live block tables.

``GPUExecutor(model, manager, backend, scheduler=sched)`` implements the engine's executor
interface ``run_step(batch, manager) -> seconds``, so the GPU mode swaps only this object:
the engine, the scheduler and the paged manager are the very objects ``run_simulation`` uses
(no copies, no re-implementation of the policy). Per iteration::

    scheduler.schedule()  (engine)  allocate / append / preempt / fork on the manager
    run_step(batch)       (here)    1. read the manager's live tables for the batch's sequences
                                    2. build a StepPlan: swap-out, swap-in, copy-on-write copies,
                                       slot mappings of the new tokens, dense int32 decode tables
                                    3. backend.execute(plan) -> device seconds (synchronized)
    scheduler.complete_step()       samples, finishes, forks (engine)

Slot mapping: token position ``p`` of sequence ``s`` lives at slot ``table[p // bs] * bs +
p % bs``. The scheduler has already appended this step's tokens when ``run_step`` runs, so a
prefill chunk of ``n`` tokens ending at ``ctx`` writes positions ``[ctx - n, ctx)`` and a
decode writes position ``ctx - 1`` (``decode_context`` includes the new token).

Copy-on-write detection (exact): the executor keeps, for every live sequence, the table it
last saw (after the previous step, or right after ``allocate``/``fork``) and the number of
tokens that table held. A block this step writes into that already held computed tokens
(``i * bs < L_before``) and whose id changed was replaced by the manager's copy-on-write, so
``(old, new)`` is one copy; a write into an unshared block never changes the table, and
blocks not written are never copied, so only those indices are compared (O(1) per decode). To know a
forked child's table at fork time, and a freed sequence's table (for swap-out), the executor
*observes* the manager: :class:`ManagerObserver` wraps the instance's ``allocate``/``fork``/
``free`` with pass-throughs that record the table after (or before) the call; the manager's
state and answers are untouched (tests prove the records are identical with and without it).
A manager may instead offer the hook ``drain_copies() -> [(src, dst), ...]`` (the copies made
since the last call); the executor then uses it and skips the diff.

Swaps (needs ``scheduler``): a sequence with host blocks whose request left
``scheduler.swapped`` (or re-entered it with a new ``swapped_tokens`` entry) since the last
step is swapped in (host -> the blocks it was allocated; a failed trial resume, allocated and
freed while the request stays queued, is no swap); a sequence freed since the last step whose
request is now in ``scheduler.swapped`` is swapped out (its freed blocks -> host blocks).
Order within a step: swap-in, swap-out, copy-on-write copies, then the model (writes, reads).
Why that order is safe: swap-in destinations were free when ``schedule`` resumed the request
(before any preemption), swap-out sources were in use until the preemption, and copy
destinations may be blocks just freed by a swap-out, so they are written last; freed blocks
reused in the same step are only written after every copy that reads them.

Time: ``run_step`` returns the backend's measured time plus (``include_prep=True`` and a
backend that measures real time) the host time spent building the plan, like a real engine's
block-table preparation. The SimPy clock advances by these measured step times; idle gaps
between arrivals are *not* slept: the clock jumps to the next arrival, so a 10-minute trace
at low load takes only its busy time on the GPU. TTFT/TPOT of the "real" run are therefore
exact for the measured step times and the simulator's arrival process.

Backends (:class:`Backend` protocol)::

    setup(model, num_blocks, block_size, host_blocks)   allocate the KV pool once
    execute(plan) -> seconds                           run one step, synchronized
    measures_time: bool                                 real wall time (True) or a formula

``FakeBackend`` (CPU, tests and ``validate --backend fake``) and ``TorchCupyBackend``
(``gpu/model_runner.py``, the real transformer).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from pagesim.sim.batch import StepBatch
from pagesim.sim.errors import ConfigError, PagesimError

_I64 = np.int64
_EMPTY = np.zeros(0, _I64)
_EMPTY2 = np.zeros((0, 2), _I64)


class ExecutorError(PagesimError):
    """The executor found the manager's tables inconsistent with the batch (a bug; please report it)."""


@dataclass
class StepPlan:
    """Everything one iteration does on the device, in execution order (all numpy, host side)."""

    step: int
    block_size: int
    num_blocks: int
    swap_in: np.ndarray = field(default_factory=lambda: _EMPTY2)  # [n, 2] (host block, device block)
    swap_out: np.ndarray = field(default_factory=lambda: _EMPTY2)  # [n, 2] (device block, host block)
    copies: np.ndarray = field(default_factory=lambda: _EMPTY2)  # [n, 2] (src, dst) copy-on-write
    forks: list = field(default_factory=list)  # (parent, child) forks since the last step
    # prefill: one row per sequence; tokens concatenated in row order
    prefill_seq_ids: np.ndarray = field(default_factory=lambda: _EMPTY)
    prefill_tokens: np.ndarray = field(default_factory=lambda: _EMPTY)  # new tokens this step
    prefill_context: np.ndarray = field(default_factory=lambda: _EMPTY)  # length after the chunk
    prefill_slots: np.ndarray = field(default_factory=lambda: _EMPTY)  # [sum tokens]
    prefill_positions: np.ndarray = field(default_factory=lambda: _EMPTY)  # [sum tokens]
    prefill_tables: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.int32))
    # decode: one token per sequence
    decode_seq_ids: np.ndarray = field(default_factory=lambda: _EMPTY)
    decode_context: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))  # incl. new token
    decode_slots: np.ndarray = field(default_factory=lambda: _EMPTY)
    decode_tables: np.ndarray = field(default_factory=lambda: np.zeros((0, 1), np.int32))
    swap_in_tokens: int = 0
    swap_out_tokens: int = 0
    batch: StepBatch | None = None  # the scheduler's batch this plan runs (for pricing; read-only)

    @property
    def num_tokens(self) -> int:
        return int(len(self.prefill_slots) + len(self.decode_slots))

    @property
    def decode_max_context(self) -> int:
        return int(self.decode_context.max()) if len(self.decode_context) else 0

    @property
    def slot_mapping(self) -> np.ndarray:
        """All new tokens' slots, prefill tokens first (the model's token order)."""
        return np.concatenate([self.prefill_slots, self.decode_slots])


class Backend(Protocol):
    name: str
    measures_time: bool

    def setup(self, model, num_blocks: int, block_size: int, host_blocks: int) -> None: ...

    def execute(self, plan: StepPlan) -> float: ...


def _dense(rows: list[list[int]], pad: int = -1) -> np.ndarray:
    width = max(1, max((len(r) for r in rows), default=0))
    out = np.full((len(rows), width), pad, dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def slots_for(table, start: int, end: int, block_size: int) -> np.ndarray:
    """Slots of token positions [start, end) of a sequence with block table ``table``."""
    pos = np.arange(start, end, dtype=_I64)
    t = np.asarray(table, dtype=_I64)
    return t[pos // block_size] * block_size + pos % block_size


class ManagerObserver:
    """Records the manager's allocate/fork/free as they happen (pass-through wrappers on the instance).

    ``refs[s] = (table, L)``: the table and computed length the executor last knows for ``s``;
    ``freed[s] = (table, L)``: tables of sequences freed since the last step (for swap-out);
    ``forks``: (parent, child) pairs since the last step.
    """

    def __init__(self, manager, table_of: Callable[[int], list[int]]):
        self.mgr = manager
        self.table_of = table_of
        self.refs: dict[int, tuple[list[int], int]] = {}
        self.freed: dict[int, tuple[list[int], int]] = {}
        self.forks: list[tuple[int, int]] = []
        self._orig: dict[str, Callable] = {}
        self._attach()

    def _attach(self) -> None:
        m = self.mgr
        for name in ("allocate", "fork", "free"):
            if name in vars(m):
                raise ConfigError(f"the manager's {name} is already wrapped (two executors on one manager?)")
        alloc, fork, free = m.allocate, m.fork, m.free
        self._orig = {"allocate": alloc, "fork": fork, "free": free}

        def allocate(spec):
            r = alloc(spec)
            s = spec.seq_id
            self.refs[s] = (self.table_of(s), int(m.num_tokens(s)))
            return r

        def fork_(parent_id, child_id, child_final_len=None):
            fork(parent_id, child_id, child_final_len)
            self.refs[child_id] = (self.table_of(child_id), int(m.num_tokens(child_id)))
            self.forks.append((int(parent_id), int(child_id)))

        def free_(seq_id):
            self.freed[seq_id] = (self.table_of(seq_id), int(m.num_tokens(seq_id)))
            free(seq_id)
            self.refs.pop(seq_id, None)

        m.allocate, m.fork, m.free = allocate, fork_, free_

    def detach(self) -> None:
        for name in self._orig:
            self.mgr.__dict__.pop(name, None)
        self._orig = {}


class GPUExecutor:
    """Runs iterations on a backend over the manager's live block tables (see module docstring)."""

    def __init__(self, model, manager, backend, *, scheduler=None, host_blocks: int | None = None,
                 include_prep: bool = True, on_step: Callable | None = None, check: bool = True):
        if not hasattr(manager, "block_size") or getattr(manager, "kind", "") not in ("paged", "token"):
            raise ConfigError(f"the GPU executor needs a paged manager (--system vllm or token), "
                              f"got '{getattr(manager, 'kind', type(manager).__name__)}'")
        self.model = model
        self.mgr = manager
        self.backend = backend
        self.sched = scheduler
        self.block_size = int(manager.block_size)
        self.num_blocks = int(manager.num_blocks)
        if host_blocks is None:
            host_blocks = 0
            if scheduler is not None and getattr(scheduler, "swap", False):
                host_blocks = -(-int(scheduler.swap_capacity) // self.block_size) + 64
        self.host_blocks = int(host_blocks)
        self._host_free = list(range(self.host_blocks - 1, -1, -1))
        # seq -> (host blocks, tokens, request, the scheduler's swapped_tokens entry at swap-out)
        self.host: dict[int, tuple[list[int], int, int, list]] = {}
        self.include_prep = include_prep
        self.on_step = on_step
        self.check = check
        self.step = 0
        self.total_copies = 0
        self.total_swap_out_blocks = 0
        self.total_swap_in_blocks = 0
        self._table_of = (manager.block_table if hasattr(manager, "block_table")
                          else lambda s: list(manager.export().tables[s]))
        self._drain = getattr(manager, "drain_copies", None)
        self.obs = ManagerObserver(manager, self._table_of)
        # sequences already live when the executor is attached
        snap = manager.export()
        for s, t in snap.tables.items():
            self.obs.refs[s] = (list(t), int(snap.context_lens[s]))
        try:
            backend.setup(model, self.num_blocks, self.block_size, self.host_blocks)
        except BaseException:
            self.obs.detach()
            raise

    def close(self) -> None:
        self.obs.detach()

    # ------------------------------------------------------------------ planning
    def _swaps(self, plan: StepPlan) -> set[int]:
        """Fill plan.swap_in / swap_out; return the sequences swapped in this step.

        Swap-in runs first: its destinations were free when the scheduler resumed the request at
        the start of ``schedule`` (so no other copy reads them), and a request resumed and
        preempted again in the same ``schedule`` is swapped in and straight back out (its freed
        blocks are the swap-out's sources), as the scheduler counts it.
        """
        obs, bs = self.obs, self.block_size
        sched = self.sched
        out_pairs, in_pairs, swapped_in = [], [], set()
        if sched is not None and getattr(sched, "swap", False):
            for s, (hb, L, i, lens) in list(self.host.items()):
                if sched.swapped_tokens.get(i) is lens:
                    continue  # still swapped (a failed trial resume allocates and frees it again)
                live = self.mgr.has_seq(s)
                if not live and s not in obs.freed:
                    raise ExecutorError(f"step {self.step}: swapped sequence {s} left the swap queue "
                                        "without being allocated")
                del self.host[s]
                table = self._table_of(s) if live else obs.freed[s][0]
                in_pairs.extend(zip(hb, table[:len(hb)]))
                self._host_free.extend(reversed(hb))
                if live:
                    self.obs.refs[s] = (table, L)
                    swapped_in.add(s)
                plan.swap_in_tokens += L
            for i in sched.swapped:
                lens = sched.swapped_tokens[i]
                for s in sched.t.seq_ids(i):
                    if s in self.host or s not in obs.freed:
                        continue
                    table, L = obs.freed[s]
                    nb = -(-L // bs)
                    if nb > len(self._host_free):
                        raise ExecutorError(f"host swap space exhausted swapping out sequence {s} "
                                            f"({nb} blocks, {len(self._host_free)} free)")
                    hb = [self._host_free.pop() for _ in range(nb)]
                    out_pairs.extend(zip(table[:nb], hb))
                    self.host[s] = (hb, L, i, lens)
                    plan.swap_out_tokens += L
        plan.swap_out = np.asarray(out_pairs, _I64).reshape(-1, 2)
        plan.swap_in = np.asarray(in_pairs, _I64).reshape(-1, 2)
        return swapped_in

    def _copies(self, seq_ids, ctx, new, tables, swapped_in: set[int]) -> list[tuple[int, int]]:
        """(old, new) for every written block (holding earlier tokens) whose id changed."""
        bs, refs = self.block_size, self.obs.refs
        pairs = []
        for s, c, n, cur in zip(seq_ids, ctx, new, tables):
            if s in swapped_in:
                continue
            ref = refs.get(s)
            if ref is None:
                raise ExecutorError(f"sequence {s} runs but was never allocated or forked while observed")
            old = ref[0]
            before = c - n  # tokens computed before this step
            # only blocks this step writes into can be copied (the manager copies before writing)
            hi = min(len(old), -(-before // bs), (c - 1) // bs + 1)
            for i in range(before // bs, hi):
                if old[i] != cur[i]:
                    pairs.append((old[i], cur[i]))
        return pairs

    def plan(self, batch: StepBatch) -> StepPlan:
        bs, mgr = self.block_size, self.mgr
        plan = StepPlan(self.step, bs, self.num_blocks, forks=list(self.obs.forks), batch=batch)
        swapped_in = self._swaps(plan)
        if self.check and self.sched is not None and getattr(self.sched, "swap", False) and (
                plan.swap_in_tokens != batch.swap_in_tokens or plan.swap_out_tokens != batch.swap_out_tokens):
            raise ExecutorError(f"step {self.step}: swapped {plan.swap_out_tokens} out / {plan.swap_in_tokens} in, "
                                f"the batch says {batch.swap_out_tokens} / {batch.swap_in_tokens} tokens")

        p_ids = batch.prefill_seq_ids.tolist()
        p_new = batch.prefill_tokens.tolist()
        p_ctx = batch.prefill_context.tolist()
        d_ids = batch.decode_seq_ids.tolist()
        d_ctx = batch.decode_context.tolist() if len(d_ids) else []
        p_tables = [self._table_of(s) for s in p_ids]
        d_tables = [self._table_of(s) for s in d_ids]
        if self.check:
            for s, c, t in zip(p_ids + d_ids, p_ctx + d_ctx, p_tables + d_tables):
                L = mgr.num_tokens(s)
                if L != c or -(-c // bs) > len(t):
                    raise ExecutorError(f"step {self.step}: sequence {s} has {L} tokens and {len(t)} blocks "
                                        f"in the manager, the batch says context {c}")
        if self._drain is not None:
            copies = list(self._drain())
        else:
            copies = self._copies(p_ids + d_ids, p_ctx + d_ctx, p_new + [1] * len(d_ids),
                                  p_tables + d_tables, swapped_in)
        plan.copies = np.asarray(copies, _I64).reshape(-1, 2)

        if p_ids:
            plan.prefill_seq_ids = np.asarray(p_ids, _I64)
            plan.prefill_tokens = np.asarray(p_new, _I64)
            plan.prefill_context = np.asarray(p_ctx, _I64)
            plan.prefill_slots = np.concatenate([slots_for(t, c - n, c, bs)
                                                 for t, c, n in zip(p_tables, p_ctx, p_new)])
            plan.prefill_positions = np.concatenate([np.arange(c - n, c, dtype=_I64)
                                                     for c, n in zip(p_ctx, p_new)])
            plan.prefill_tables = _dense(p_tables)
        if d_ids:
            plan.decode_seq_ids = np.asarray(d_ids, _I64)
            ctx = np.asarray(d_ctx, _I64)
            plan.decode_context = ctx.astype(np.int32)
            plan.decode_tables = _dense(d_tables)
            last = ctx - 1
            plan.decode_slots = (plan.decode_tables[np.arange(len(d_ids)), last // bs].astype(_I64) * bs
                                 + last % bs)
        if self.check and plan.num_tokens:  # the kernels write where they are told: no slot past the pool
            top = int(plan.slot_mapping.max())
            if top >= self.num_blocks * bs or int(plan.slot_mapping.min()) < 0:
                raise ExecutorError(f"step {self.step}: a slot ({top}) outside the pool's "
                                    f"{self.num_blocks * bs} slots")
        # what the executor knows after this step
        refs = self.obs.refs
        for s, c, t in zip(p_ids + d_ids, p_ctx + d_ctx, p_tables + d_tables):
            refs[s] = (t, c)
        self.obs.freed.clear()
        self.obs.forks.clear()
        return plan

    # ------------------------------------------------------------------ the executor interface
    def run_step(self, batch: StepBatch, manager) -> float:
        if manager is not self.mgr:
            raise ExecutorError("run_step got a different manager than the executor was built with")
        t0 = time.perf_counter()
        plan = self.plan(batch)
        prep = time.perf_counter() - t0
        dt = float(self.backend.execute(plan))
        if self.include_prep and getattr(self.backend, "measures_time", False):
            dt += prep
        self.total_copies += len(plan.copies)
        self.total_swap_out_blocks += len(plan.swap_out)
        self.total_swap_in_blocks += len(plan.swap_in)
        if self.on_step is not None:
            self.on_step(batch, plan, dt)
        self.step += 1
        return dt


# ---------------------------------------------------------------------- the fake backend
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
                 host_fn: Callable[[StepPlan], float] | None = None):
        self.time_fn = time_fn
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
        if len(slots):
            writers = np.concatenate([np.repeat(plan.prefill_seq_ids, plan.prefill_tokens), plan.decode_seq_ids])
            positions = np.concatenate([plan.prefill_positions, plan.decode_context.astype(_I64) - 1])
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
            ctxs = np.concatenate([plan.prefill_context, plan.decode_context.astype(_I64)]).tolist()
            rows = [plan.prefill_tables[i] for i in range(len(plan.prefill_seq_ids))] + \
                   [plan.decode_tables[i] for i in range(len(plan.decode_seq_ids))]
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
        self.last_timing = {"gpu_s": t, "host_s": host}
        if self.sleep:
            time.sleep(t + host)
        return t + host
