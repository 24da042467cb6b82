"""The GPU executor: runs the core's iterations for real, over the core's own block tables.

``run_simulation(cfg, trace, executor=GPUExecutor(model, backend))`` runs the very scheduler and
paged allocator of a simulation (the compiled core, ``sim/core/``) and swaps only what runs an
iteration: the core's loop returns after scheduling each one (``loop.SCHEDULED``, the external
executor mode), and :meth:`GPUExecutor.step` reads the step's contract from the core's arrays,
runs it on the backend and returns its measured duration, which the core's clock takes as the
step's length (time stays the loop's: the same event order as a simulation). Per iteration::

    scheduler_vllm.schedule()  (core)  admit / swap in / preempt / decode / copy-on-write, recording
                                  the step's data movement where it happens
    step(core)            (here)  1. the contract: prefilling sequences (step_prefill_ids,
                                     _tokens, _context), decoding ones (the running requests in
                                     the decode set, each sequence's block-table row seq_slot[i, j]
                                     and context num_computed_tokens[i]), copy-on-write pairs
                                     (step_copies), device blocks swapped out / in (step_swap_out,
                                     step_swap_in)
                                  2. a StepPlan: swap pairs (with the host blocks this executor
                                     keeps), copies, slot mappings, dense int32 tables
                                  3. backend.execute(plan) -> device seconds (synchronized)
    lifecycle.complete_step()  (core)  tokens, finishes, forks

Nothing is observed or inferred: every block the plan moves is one the core recorded as it
acted (``sim/core/state.py``: ``Core.step_copies``, ``step_swap_out``, ``step_swap_in``).

Slot mapping: token position ``p`` of a sequence lives at slot ``table[p // bs] * bs + p % bs``.
The scheduler has already counted this step's tokens when ``step`` runs, so a prefill chunk of
``n`` tokens ending at ``ctx`` writes positions ``[ctx - n, ctx)`` and a decode writes position
``ctx - 1`` (``decode_context`` includes the new token).

Sequences: the plan names a sequence by its request's row (a group's sequences share it), so
the fake backend's writer check is per request: a sequence may read what its request wrote.

Swaps: the core lists the device blocks of each sequence it swaps out (in table order, before
they are freed) and of each it swaps back in (the blocks just allocated); this executor maps
each swapped sequence to host blocks of its own (taken at swap-out, given back at swap-in, or
when the core recomputes a swapped request instead). Order within a step: swap-in, swap-out,
copy-on-write copies, then the model (writes, reads). Why that order is safe: a scheduling
pass that swaps in preempts nobody (vLLM 0.4.2's rule), so swap-in destinations were free,
swap-out sources were in use until the preemption, and copy destinations may be blocks just
freed by a swap-out, so they are written last; freed blocks reused in the same step are only
written after every copy that reads them. One exception: when a pass schedules nothing but
preempts (every running request), the core schedules another pass at the same instant
(``scheduler_vllm.schedule``), whose swap-ins may take the blocks an earlier pass swapped out
(or bring a request just swapped out back); the earlier passes' swap-outs
(``count[STEP_SWAP_OUT_EARLY]`` rows) then run first, as a swap-only plan of their own
(``StepPlan.first``) executed before the step's plan.

Time: ``step`` returns the backend's measured time plus (``include_prep=True`` and a backend
that measures real time) the host time spent building the plan, like a real engine's
block-table preparation. Idle gaps between arrivals are *not* slept: the core's clock jumps to
the next arrival, so a 10-minute trace at low load takes only its busy time on the GPU.

Backends (:class:`Backend` protocol)::

    setup(model, num_blocks, block_size, host_blocks)   allocate the KV pool once
    execute(plan) -> seconds                           run one step, synchronized
    measures_time: bool                                 real wall time (True) or a formula

``FakeBackend`` (``gpu/fake_backend.py``: CPU, tests and ``validate --backend fake``) and
``TorchCupyBackend`` (``gpu/model_runner.py``, the real transformer). :func:`plan_step` builds a plan from explicit
tables (hand-built steps: tests, ``benchmarks/gpu_step_profile.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

import numpy as np

from pagesim.sim.batch import StepBatch
from pagesim.sim.core import state
from pagesim.sim.errors import ConfigError, PagesimError

_I64 = np.int64
_EMPTY = np.zeros(0, _I64)
_EMPTY2 = np.zeros((0, 2), _I64)


class ExecutorError(PagesimError):
    """The step the core handed over is inconsistent (a bug; please report it)."""


@dataclass
class StepPlan:
    """Everything one iteration does on the device, in execution order (all numpy, host side)."""

    step: int
    block_size: int
    num_blocks: int
    swap_in: np.ndarray = field(default_factory=lambda: _EMPTY2)  # [n, 2] (host block, device block)
    swap_out: np.ndarray = field(default_factory=lambda: _EMPTY2)  # [n, 2] (device block, host block)
    copies: np.ndarray = field(default_factory=lambda: _EMPTY2)  # [n, 2] (src, dst) copy-on-write
    forks: list = field(default_factory=list)  # (parent, child) sequence forks (hand-built plans)
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
    batch: StepBatch | None = None  # the step as a cost model prices it (read-only)
    first: "StepPlan | None" = None  # swap-outs the executor runs before this plan (see the module docstring)

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


def slots_for(table, start: int, end: int, block_size: int) -> np.ndarray:
    """Slots of token positions [start, end) of a sequence with block table ``table``."""
    pos = np.arange(start, end, dtype=_I64)
    t = np.asarray(table, dtype=_I64)
    return t[pos // block_size] * block_size + pos % block_size


def dense_tables(rows: np.ndarray, num_blocks: np.ndarray) -> np.ndarray:
    """int32 tables from full block-table rows: as wide as the longest, -1 past each one's
    ``num_blocks`` (entries there are left over from earlier holders and never read)."""
    width = max(1, int(num_blocks.max()) if len(num_blocks) else 0)
    t = np.ascontiguousarray(rows[:, :width], dtype=np.int32)
    t[np.arange(width)[None, :] >= num_blocks[:, None]] = -1
    return t


def plan_step(step: int, block_size: int, num_blocks: int, *, prefill_seq_ids=_EMPTY, prefill_tokens=_EMPTY,
              prefill_context=_EMPTY, prefill_tables=None, decode_seq_ids=_EMPTY, decode_context=_EMPTY,
              decode_tables=None, copies=_EMPTY2, swap_in=_EMPTY2, swap_out=_EMPTY2, batch=None) -> StepPlan:
    """A :class:`StepPlan` from explicit tables (int32, one row per sequence, -1 padded): the new
    tokens' positions and slots (prefill chunks end at their context; a decode writes its
    context's last position)."""
    bs = block_size
    p_new, p_ctx = np.asarray(prefill_tokens, _I64), np.asarray(prefill_context, _I64)
    d_ctx = np.asarray(decode_context, _I64)
    plan = StepPlan(step, bs, num_blocks, swap_in=np.asarray(swap_in, _I64).reshape(-1, 2),
                    swap_out=np.asarray(swap_out, _I64).reshape(-1, 2), copies=np.asarray(copies, _I64).reshape(-1, 2),
                    batch=batch)
    if len(p_new):
        plan.prefill_seq_ids = np.asarray(prefill_seq_ids, _I64)
        plan.prefill_tokens, plan.prefill_context = p_new, p_ctx
        plan.prefill_tables = np.asarray(prefill_tables, np.int32)
        row = np.repeat(np.arange(len(p_new)), p_new)
        pos = np.arange(int(p_new.sum()), dtype=_I64) - np.repeat(np.cumsum(p_new) - p_new, p_new) \
            + np.repeat(p_ctx - p_new, p_new)
        plan.prefill_positions = pos
        plan.prefill_slots = plan.prefill_tables[row, pos // bs].astype(_I64) * bs + pos % bs
    if len(d_ctx):
        plan.decode_seq_ids = np.asarray(decode_seq_ids, _I64)
        plan.decode_context = d_ctx.astype(np.int32)
        plan.decode_tables = np.asarray(decode_tables, np.int32)
        last = d_ctx - 1
        plan.decode_slots = plan.decode_tables[np.arange(len(d_ctx)), last // bs].astype(_I64) * bs + last % bs
    return plan


def swap_groups(rows: np.ndarray):
    """(request, sequence, device blocks) per swapped sequence, from the core's [n, 3] rows
    (request, sequence, block), which list each sequence's blocks together in table order."""
    if not len(rows):
        return
    key = rows[:, 0] * (1 << 20) + rows[:, 1]
    cut = np.flatnonzero(np.diff(key)) + 1
    for part in np.split(rows, cut):
        yield int(part[0, 0]), int(part[0, 1]), part[:, 2]


class GPUExecutor:
    """Runs the core's iterations on a backend (see the module docstring): an executor outside
    the core (``sim.executor.is_external``) for ``run_simulation(..., executor=...)``.

    ``on_step(batch, plan, seconds)`` is called after every step (``self.core`` is the core's
    state then, as scheduled); ``check`` checks the contract against the core's counts."""

    def __init__(self, model, backend, *, host_blocks: int | None = None, include_prep: bool = True,
                 on_step: Callable | None = None, check: bool = True):
        if model.kv_cache_dtype != "auto":  # the kernels (gpu/kernels) read and write a 16-bit cache
            raise ConfigError(f"the GPU mode keeps the KV cache at the model's 16-bit dtype; --kv-cache-dtype "
                              f"{model.kv_cache_dtype} is simulated only (drop it, or run pagesim simulate)")
        self.model = model
        self.backend = backend
        self.host_blocks_asked = host_blocks
        self.include_prep = include_prep
        self.on_step = on_step
        self.check = check
        self.step_index = 0
        self.total_copies = 0
        self.total_swap_out_blocks = 0
        self.total_swap_in_blocks = 0
        self.core = None
        self.host: dict[tuple[int, int], np.ndarray] = {}  # (request, sequence) -> its host blocks
        self.swapped_requests: set[int] = set()

    # ------------------------------------------------------------------ the core's external executor
    def start(self, core) -> None:
        """Before the run: the pool's shape from the core's configuration; the backend's pool."""
        config = core.config
        if config[state.MANAGER_KIND] != state.PAGED:
            raise ConfigError("the GPU executor needs a paged manager (--system vllm or token)")
        self.core = core
        self.block_size = int(config[state.BLOCK_SIZE])
        self.num_blocks = int(config[state.NUM_BLOCKS])
        host_blocks = self.host_blocks_asked
        if host_blocks is None:
            host_blocks = 0
            # the swap space, in blocks, and room for rounding up (a request of several sequences is
            # swapped under recompute too: sim/core/sched/lifecycle.py's preempt)
            if config[state.SWAP_CAPACITY_TOKENS]:
                host_blocks = -(-int(config[state.SWAP_CAPACITY_TOKENS]) // self.block_size) + 64
        self.host_blocks = int(host_blocks)
        self._host_free = list(range(self.host_blocks - 1, -1, -1))
        self.backend.setup(self.model, self.num_blocks, self.block_size, self.host_blocks)

    def step(self, core) -> float:
        """Run the iteration the core just scheduled; its duration in seconds."""
        self.core = core
        t0 = time.perf_counter()
        plan = self.plan(core)
        prep = time.perf_counter() - t0
        dt = float(self.backend.execute(plan.first)) if plan.first is not None else 0.0
        dt += float(self.backend.execute(plan))
        if self.include_prep and getattr(self.backend, "measures_time", False):
            dt += prep
        self.total_copies += len(plan.copies)
        self.total_swap_out_blocks += len(plan.swap_out) + (len(plan.first.swap_out) if plan.first is not None else 0)
        self.total_swap_in_blocks += len(plan.swap_in)
        if self.on_step is not None:
            self.on_step(plan.batch, plan, dt)
        self.step_index += 1
        return dt

    def finish(self, core) -> None:
        """After the run: nothing is left swapped out."""
        self.core = core
        self._forget_recomputed(core, set())
        if self.host:
            raise ExecutorError(f"the run ended with sequences still swapped out: {sorted(self.host)[:5]}")

    # ------------------------------------------------------------------ planning
    def _forget_recomputed(self, core, swapped_in: set[int]) -> None:
        """A swapped request the core recomputes instead (nothing else ran to make room: swap
        fallback) gives its host blocks back."""
        for i in [i for i in self.swapped_requests if core.status[i] != state.SWAPPED and i not in swapped_in]:
            self.swapped_requests.discard(i)
            for key in [k for k in self.host if k[0] == i]:
                self._host_free.extend(reversed(self.host.pop(key).tolist()))

    def _swap_out(self, rows: np.ndarray) -> np.ndarray:
        """(device, host) pairs for the sequences the core swapped out (``rows``), each given host
        blocks of its own."""
        outs = []
        for i, j, dev in swap_groups(rows):
            if len(dev) > len(self._host_free):
                raise ExecutorError(f"host swap space exhausted swapping out request {i} (sequence {j}: "
                                    f"{len(dev)} blocks, {len(self._host_free)} free)")
            hb = np.array([self._host_free.pop() for _ in range(len(dev))], _I64)
            outs.append(np.stack([dev, hb], axis=1))
            self.host[(i, j)] = hb
            self.swapped_requests.add(i)
        return np.concatenate(outs) if outs else _EMPTY2

    def _swaps(self, core, plan: StepPlan) -> None:
        c = core.count
        ins = []
        swap_in_rows = core.step_swap_in[:c[state.STEP_SWAP_IN_BLOCKS]]
        swap_out_rows = core.step_swap_out[:c[state.STEP_SWAP_OUT_BLOCKS]]
        swapped_in = set(swap_in_rows[:, 0].tolist())
        self._forget_recomputed(core, swapped_in)
        # a second scheduling pass swaps in after the first one's swap-outs: those run first
        early = int(c[state.STEP_SWAP_OUT_EARLY]) if len(swap_in_rows) else 0
        if early:
            plan.first = StepPlan(self.step_index, self.block_size, self.num_blocks,
                                  swap_out=self._swap_out(swap_out_rows[:early]))
        for i, j, dev in swap_groups(swap_in_rows):
            hb = self.host.pop((i, j), None)
            if hb is None:
                raise ExecutorError(f"step {self.step_index}: request {i} (sequence {j}) is swapped in without "
                                    "having been swapped out before")
            if len(hb) != len(dev):
                raise ExecutorError(f"step {self.step_index}: request {i} (sequence {j}) comes back in {len(dev)} "
                                    f"blocks, it went out in {len(hb)}")
            ins.append(np.stack([hb, dev], axis=1))
            self._host_free.extend(reversed(hb.tolist()))
        self.swapped_requests -= swapped_in
        plan.swap_in = np.concatenate(ins) if ins else _EMPTY2
        plan.swap_out = self._swap_out(swap_out_rows[early:])
        self._forget_recomputed(core, swapped_in)  # swapped out by a first pass, recomputed by the second
        plan.swap_in_tokens, plan.swap_out_tokens = int(c[state.STEP_SWAP_IN]), int(c[state.STEP_SWAP_OUT])
        if self.check:
            bs = self.block_size
            for name, parts in (("in", [swap_in_rows]), ("out", [swap_out_rows[:early], swap_out_rows[early:]])):
                # each request moves the blocks of its tokens (swapped_tokens: per sequence), the
                # first sequence all of them, each other only the blocks past those it shares
                blocks, tokens = 0, 0
                for rows in parts:
                    first = 0
                    for i, j, dev in swap_groups(rows):
                        n = int(core.swapped_tokens[i])
                        if j == 0:
                            first = len(dev)
                            blocks += -(-n // bs)
                            tokens += n
                        else:
                            blocks += len(dev)
                            tokens += n - (first - len(dev)) * bs
                rows = swap_in_rows if name == "in" else swap_out_rows
                got = plan.swap_in_tokens if name == "in" else plan.swap_out_tokens
                if blocks != len(rows) or tokens != got:
                    raise ExecutorError(f"step {self.step_index}: swapped {name} {len(rows)} blocks of "
                                        f"{tokens} tokens, the core counts {got} tokens")

    def plan(self, core) -> StepPlan:
        """The step the core just scheduled, as a :class:`StepPlan`."""
        c, bs = core.count, self.block_size
        # prefill: each prefilling request's one sequence (a group prefills once, then forks)
        num_prefill = int(c[state.STEP_PREFILL_SEQS])
        p_ids = core.step_prefill_ids[:num_prefill].copy()
        p_new = core.step_prefill_tokens[:num_prefill].copy()
        p_ctx = core.step_prefill_context[:num_prefill].copy()
        p_tables = dense_tables(core.block_table[core.seq_slot[p_ids, 0]], core.num_blocks[p_ids])
        # decode: every sequence of every request in the decode set, when this step decodes
        d_req = _EMPTY
        if c[state.STEP_DECODE_SEQS]:
            running = core.running[:c[state.NUM_RUNNING]]
            ids = running[core.in_decode[running] != 0]
            width = core.num_seqs[ids]
            d_req = np.repeat(ids, width)
            j = np.arange(len(d_req)) - np.repeat(np.cumsum(width) - width, width)
            d_rows = core.seq_slot[d_req, j]
        else:
            d_rows = _EMPTY
        d_ctx = core.num_computed_tokens[d_req]
        d_tables = dense_tables(core.block_table[d_rows], core.num_blocks[d_req])
        copies = core.step_copies[:c[state.STEP_COPIED_BLOCKS]].copy()
        batch = StepBatch(p_ids, p_new, p_ctx, d_req, d_ctx, swap_in_tokens=int(c[state.STEP_SWAP_IN]),
                          swap_out_tokens=int(c[state.STEP_SWAP_OUT]), copy_blocks=len(copies),
                          copy_tokens=len(copies) * bs)
        if self.check:
            if len(d_req) != c[state.STEP_DECODE_SEQS]:
                raise ExecutorError(f"step {self.step_index}: {len(d_req)} decoding sequences, the core counts "
                                    f"{int(c[state.STEP_DECODE_SEQS])}")
            short = np.flatnonzero(core.num_blocks[np.concatenate([p_ids, d_req])] * bs
                                   < np.concatenate([p_ctx, d_ctx]))
            if len(short):
                raise ExecutorError(f"step {self.step_index}: a sequence of request "
                                    f"{int(np.concatenate([p_ids, d_req])[short[0]])} holds fewer blocks than its context")
        plan = plan_step(self.step_index, bs, self.num_blocks, prefill_seq_ids=p_ids, prefill_tokens=p_new,
                         prefill_context=p_ctx, prefill_tables=p_tables, decode_seq_ids=d_req, decode_context=d_ctx,
                         decode_tables=d_tables, copies=copies, batch=batch)
        self._swaps(core, plan)
        if self.check and plan.num_tokens:  # the kernels write where they are told: no slot past the pool
            slots = plan.slot_mapping
            top = int(slots.max())
            if top >= self.num_blocks * bs or int(slots.min()) < 0:
                raise ExecutorError(f"step {self.step_index}: a slot ({top}) outside the pool's "
                                    f"{self.num_blocks * bs} slots")
        return plan
