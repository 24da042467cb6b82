"""Running the core for an :class:`~sim.engine.Engine`: which configurations it covers, the
arrays it starts from, and the records it leaves (the request table's columns are written
in place; the scheduler's counts, the manager's counters and the step recorder are handed
what the core measured, so the summary reads them as after a Python run).

``run_simulation(..., engine=...)`` and ``pagesim simulate --engine``: ``auto`` (the default)
takes the core when it covers the configuration, ``core`` insists (and says why not),
``python`` never takes it. ``summary['engine']`` says which ran: ``core`` (compiled by numba)
or ``core-cpython`` (numba missing: the same functions, interpreted), or ``python``.
"""

from __future__ import annotations

import time

import numpy as np

from pagesim.sim.core import loop, placement, state
from pagesim.sim.core.jit import COMPILED
from pagesim.sim.errors import ConfigError, InvariantError

ENGINES = ("auto", "core", "python")
PROGRESS_EVERY = 4096  # finished requests between progress-bar updates
ROWS_PER_REQUEST = 8  # the step table's first size: runs take about 5 steps per request


class StopRun(Exception):
    """Raised by a run's progress hook to end the run where it stands (a plan's probe whose
    verdict is already certain: ``experiments/probe.py``). The core then hands over what it
    measured so far, as the Python engine leaves its records when the hook raises there (after
    the step that finished the reported requests, before the next is scheduled), and lets the
    exception through to the caller."""


def progress_every(progress) -> int:
    """Finished requests before the next report to ``progress``: its own ``due`` where it has
    one (a probe's watcher looks every so many; reporting exactly then keeps its stops where the
    Python engine's are), else :data:`PROGRESS_EVERY` (a progress bar)."""
    due = getattr(progress, "due", None)
    return PROGRESS_EVERY if due is None else max(1, int(due))


def engine_name() -> str:
    return "core" if COMPILED else "core-cpython"


def unsupported(engine) -> str | None:
    """Why ``engine`` (an :class:`~sim.engine.Engine`, not run yet) cannot run on the core;
    None when it can."""
    from pagesim.sim.executor import SimulatedExecutor, is_external
    from pagesim.sim.memory.contiguous import ContiguousManager
    from pagesim.sim.memory.paged import PagedManager, TokenManager
    from pagesim.sim.memory.static import StaticManager
    from pagesim.sim.memory.vattention import VAttentionManager
    from pagesim.sim.sched.continuous import ContinuousScheduler
    from pagesim.sim.sched.static import StaticScheduler

    sched, mgr, ex = engine.sched, engine.mgr, engine.executor
    if type(sched) not in (ContinuousScheduler, StaticScheduler):
        return "only the continuous (vllm/orca) and static schedulers run on the core"
    # vAttention's pages are the paged manager's blocks (page_tokens per block, no sharing)
    if type(mgr) not in (PagedManager, TokenManager, VAttentionManager, ContiguousManager, StaticManager):
        return ("only the paged manager (vllm, token, vattention), the contiguous one (orca) and the "
                "static one run on the core")
    if type(mgr) is ContiguousManager and mgr.reservation not in RESERVATIONS:
        return f"the {mgr.reservation} reservation runs in Python"
    if is_external(ex):  # the core schedules, the executor runs each step (loop.SCHEDULED)
        if type(sched) is not ContinuousScheduler or type(mgr) not in (PagedManager, TokenManager):
            return "an executor outside the core runs the continuous scheduler over the paged manager only"
    elif type(ex) is not SimulatedExecutor or cost_model_code(ex.cost_model) is None:
        return "only the simulated executor with the roofline, calibrated or table cost model runs on the core"
    t = sched.t
    if t.size and (t.status != 0).any():
        return "the request table has been run already"
    return None


def cost_model_code(cost_model) -> int | None:
    """Which step price (``state.ROOFLINE``, ``CALIBRATED``, ``TABLE``) prices ``cost_model``,
    scaled or not; None for a model the core does not have."""
    from pagesim.sim.calibration import ScaledCostModel
    from pagesim.sim.cost import RooflineCostModel, TableCostModel
    from pagesim.sim.cost_calibrated import CalibratedCostModel

    inner = cost_model.inner if type(cost_model) is ScaledCostModel else cost_model
    return {RooflineCostModel: state.ROOFLINE, CalibratedCostModel: state.CALIBRATED,
            TableCostModel: state.TABLE}.get(type(inner))


def cost_arrays(cost_model) -> tuple[np.ndarray, np.ndarray]:
    """The cost model as the core reads it: its constants followed by the scale of its GPU time
    (1 when unscaled), and its other array (the calibrated model's GEMM shapes, the table
    model's tables; empty for the roofline)."""
    from pagesim.sim.calibration import ScaledCostModel

    scaled = type(cost_model) is ScaledCostModel
    inner = cost_model.inner if scaled else cost_model
    code = cost_model_code(cost_model)
    data = (inner.gemm_shapes() if code == state.CALIBRATED else inner.tables() if code == state.TABLE
            else np.zeros(0))
    return (np.array([*inner.constants(), cost_model.scale if scaled else 1.0], dtype=np.float64),
            np.ascontiguousarray(data, dtype=np.float64))


def choose(engine, which: str, step_by_step: bool = False) -> bool:
    """Whether ``engine`` runs on the core, for ``which`` in :data:`ENGINES`
    (``step_by_step``: the Python reference path was asked for)."""
    if which not in ENGINES:
        raise ConfigError(f"unknown engine '{which}'; valid: {', '.join(ENGINES)}")
    if which == "core" and step_by_step:
        raise ConfigError("the core has no step-by-step mode (macro_steps=False is the Python reference)")
    from pagesim.sim.executor import is_external

    if is_external(engine.executor):  # it has no Python path: the core drives it or nothing does
        if which == "python" or step_by_step:
            raise ConfigError("an executor outside the core (the GPU mode) runs on the core only")
        why = unsupported(engine)
        if why is not None:
            raise ConfigError(why)
        return True
    if which == "python" or step_by_step:
        return False
    why = unsupported(engine)
    if which == "core" and why is not None:
        raise ConfigError(f"--engine core: {why}; use --engine auto or python")
    return why is None


# the contiguous manager's policies as the core's flags
RESERVATIONS = {"max": state.RESERVE_MAX, "pow2": state.RESERVE_POW2, "oracle": state.RESERVE_ORACLE,
                "predicted": state.RESERVE_PREDICTED}
PLACEMENTS = {"buddy": state.BUDDY, "first-fit": state.FIRST_FIT, "best-fit": state.BEST_FIT}


def is_contiguous(mgr) -> bool:
    """One extent per request: the contiguous (Orca) manager, or the static one's fixed slots."""
    return getattr(mgr, "kind", "") in ("contiguous", "static")


class NoBlocks:
    """The paged pool's settings for a manager without blocks (contiguous): none."""
    block_size, num_blocks, leftover, watermark_blocks, append_rule, prefix_caching = 1, 0, 0, 0, "", False

    def __init__(self, max_seq_len: int):
        self.max_seq_len = max_seq_len


def build(engine) -> state.Core:
    from pagesim.sim.calibration import ScaledCostModel

    sched, mgr, rec = engine.sched, engine.mgr, engine.rec
    t = sched.t
    n = t.size
    contiguous = is_contiguous(mgr)
    if contiguous:
        mgr = NoBlocks(mgr.max_seq_len)
    unlimited = 1 << 62  # limits beyond any count a run reaches (swap_gib=1e16) behave alike clamped
    max_num_seqs = min(sched.max_num_seqs, unlimited)
    config = np.zeros(state.NUM_CONFIG, np.int64)
    config[state.NUM_REQUESTS] = n
    config[state.BLOCK_SIZE] = mgr.block_size
    config[state.NUM_BLOCKS] = mgr.num_blocks
    config[state.LEFTOVER_SLOTS] = mgr.leftover
    config[state.WATERMARK_BLOCKS] = mgr.watermark_blocks
    config[state.MAX_SEQ_LEN] = mgr.max_seq_len
    config[state.MAX_NUM_SEQS] = max_num_seqs
    config[state.MAX_BATCHED_TOKENS] = sched.max_batched
    config[state.KEEP_ROWS] = int(rec.keep_rows)
    config[state.PROGRESS_EVERY] = progress_every(engine.progress) if engine.progress is not None else unlimited
    config[state.CHUNKED_PREFILL] = int(sched.chunked)
    config[state.CHUNK_BUDGET] = sched.budget
    config[state.SWAP_PREEMPTION] = int(sched.swap)
    config[state.SWAP_CAPACITY_TOKENS] = min(sched.swap_capacity, unlimited)
    config[state.FREE_BLOCK_PER_SEQ] = int(mgr.append_rule == "free-block-per-seq")
    config[state.CHECK_STEPS] = int(engine.check)
    from pagesim.sim.executor import is_external

    external = is_external(engine.executor)
    config[state.EXTERNAL_STEPS] = int(external)
    if external:  # its executor times the steps: no price
        cost, cost_data = np.zeros(1), np.zeros(0)
    else:
        cost_model = engine.executor.cost_model
        config[state.COST_MODEL] = cost_model_code(cost_model)
        config[state.COST_SCALED] = int(type(cost_model) is ScaledCostModel)
        cost, cost_data = cost_arrays(cost_model)
    count = np.zeros(state.NUM_COUNTS, np.int64)
    count[state.NUM_FREE_BLOCK_IDS] = mgr.num_blocks
    # every running request holds a block, so no more than num_blocks run at once, each with at
    # most max_width sequences; admission counts a request's sequences against max_num_seqs
    # but only its first one as running until the fork (ContinuousScheduler._try_admit), so
    # the requests admitted by then can run up to max_width times max_num_seqs sequences
    max_width = int(t.width.max()) if n else 1
    num_slots = max(1, min(max_num_seqs * max_width, int(t.width.sum()), mgr.num_blocks * max_width))
    count[state.NUM_FREE_SLOTS] = num_slots
    # a sequence holds at most its request's final length, and no request longer than
    # max_seq_len is admitted: the table is as wide as the trace's longest request needs
    longest = int((t.prompt + t.output).max()) if n else 1
    blocks_per_seq = -(-min(mgr.max_seq_len, longest) // mgr.block_size)
    i64 = np.int64
    caching = prefix_caching_arrays(mgr, t, shared=mgr.prefix_caching or max_width > 1)
    seq_slot = np.full((max(n, 1), max_width), -1, i64)
    config[state.PREFIX_CACHING] = int(mgr.prefix_caching)
    config[state.SHARED_BLOCKS] = int(mgr.prefix_caching or max_width > 1)  # reference counts kept
    config[state.FORKS_SHARE_BLOCKS] = int(sched.fork_ok)  # else n / beam_width > 1 is rejected
    config[state.HASH_BLOCK_TOKENS] = t.hash_block_tokens
    config[state.TABLE_MASK] = len(caching["key_entries"]) - 1
    count[state.LRU_HEAD] = count[state.LRU_TAIL] = -1
    clock = np.zeros(state.NUM_CLOCK)
    ratio = sched.cfg.waiting_served_ratio
    config[state.HAS_WAITING_SERVED_RATIO] = int(ratio is not None)
    clock[state.WAITING_SERVED_RATIO] = 0.0 if ratio is None else float(ratio)
    rows = max(1024, ROWS_PER_REQUEST * n) if rec.keep_rows else 0
    s = state.Core(
        config=config, count=count, clock=clock,
        cost=cost,
        arrival_s=np.ascontiguousarray(t.arrival_s), prompt_tokens=t.prompt, output_tokens=t.output,
        status=t.status, reject_code=np.zeros(n, np.int8), num_generated=t.generated,
        num_prompt_computed=t.prefilled, prompt_target=t.target, num_preemptions=t.preemptions,
        first_token_s=t.first_token_s, finish_s=t.finish_s, last_token_s=t.last_token_s,
        num_computed_tokens=np.zeros(n, i64), num_blocks=np.zeros(n, i64), final_len=t.prompt + t.output,
        slot=seq_slot[:n, 0], in_decode=np.zeros(n, np.int8), swapped_tokens=np.zeros(n, i64),
        waiting=np.zeros(max(n, 1), i64), swapped=np.zeros(max(n, 1), i64), running=np.zeros(max(n, 1), i64),
        free_block_ids=np.arange(mgr.num_blocks, dtype=np.int32), free_slots=np.arange(num_slots, dtype=i64),
        block_table=np.zeros((num_slots, blocks_per_seq), np.int32),
        step_prefill_ids=np.zeros(max(n, 1), i64), step_prefill_tokens=np.zeros(max(n, 1), i64),
        step_finished=np.zeros(max(n, 1), i64), step_memory=np.zeros(6, i64),
        itl_edges=sched.itl_edges, itl_hist=sched.itl_hist,
        row_floats=np.zeros((rows, state.ROW_FLOATS)), row_ints=np.zeros((rows, state.ROW_INTS), i64),
        cost_data=cost_data, step_prefill_context=np.zeros(max(n, 1), i64),
        width=t.width, num_seqs=np.ones(max(n, 1), i64), seq_slot=seq_slot, **no_extents(), **caching,
        beam=t.beam, rng=sched.rng,  # the scheduler's Generator: the core draws what Python would
        predictor_draw=np.zeros(0), placement_saved=np.zeros(0, i64), **step_output_arrays(
            external, mgr.num_blocks, num_slots * blocks_per_seq))
    config[state.BEAM_SEARCH] = int(n > 0 and int(t.beam.max()) > 1 and sched.beam_churn > 0)
    clock[state.BEAM_CHURN] = sched.beam_churn
    return with_extents(engine, s) if contiguous else s


def step_output_arrays(external: bool, num_blocks: int, table_cells: int) -> dict:
    """The step's data movement (state.Core.step_copies, step_swap_out, step_swap_in), sized for
    the most a step can record (one row each when nobody reads them): a copy takes a free block;
    a scheduling pass swaps out (and in) at most every cell of the block tables, and an iteration
    is at most two passes (scheduler.schedule)."""
    if not external:
        num_blocks = table_cells = 0
    i64 = np.int64
    return dict(step_copies=np.zeros((num_blocks + 1, 2), i64), step_swap_out=np.zeros((2 * table_cells + 1, 3), i64),
                step_swap_in=np.zeros((2 * table_cells + 1, 3), i64))


def no_extents() -> dict:
    """The contiguous manager's arrays, empty (a paged run never reads them)."""
    i64 = np.int64
    return dict(extent=np.zeros((0, state.EXTENT_COLUMNS), i64), buddy_bits=np.zeros(0, i64), buddy_orders=np.zeros((0, 3), i64),
                holes=np.zeros((0, 2), i64))


def with_extents(engine, s: state.Core) -> state.Core:
    """``s`` (a pool of no blocks) with the contiguous (Orca) manager's flags, its extents'
    arrays and an empty pool: one free block per buddy chunk, or one hole. The static manager
    is the same accounting with the ``max`` reservation in its B fixed slots (first-fit over
    ``[0, B * max_seq_len)``), under the static scheduler."""
    sched, mgr = engine.sched, engine.mgr
    config = s.config
    capacity = mgr.capacity
    config[state.MANAGER_KIND] = state.CONTIGUOUS
    config[state.CAPACITY] = capacity
    config[state.ADDRESS_SPACE] = capacity
    if mgr.kind == "static":
        config[state.SCHEDULER_KIND] = state.STATIC
        config[state.STATIC_BATCH_LIMIT] = sched.batch_limit
        config[state.RESERVATION_KIND] = state.RESERVE_MAX
        config[state.PLACEMENT_KIND] = state.FIRST_FIT
        config[state.ADDRESS_SPACE] = mgr.num_slots * mgr.max_seq_len  # the tail stays free
        config[state.LARGEST_EXTENT] = mgr.max_seq_len
    else:
        config[state.RESERVATION_KIND] = RESERVATIONS[mgr.reservation]
        config[state.PLACEMENT_KIND] = PLACEMENTS[mgr.placement.name]
        config[state.LARGEST_EXTENT] = mgr.placement.largest_possible()
        s.clock[state.PREDICTOR_ERROR] = mgr.predictor_error
    n = sched.t.size
    i64 = np.int64
    space = int(config[state.ADDRESS_SPACE])
    orders = max(space.bit_length(), 1) if config[state.PLACEMENT_KIND] == state.BUDDY else 0
    words = [max(1, -(-(space >> k) // placement.WORD_BITS)) for k in range(orders)]
    buddy_orders = np.zeros((orders, 3), i64)
    buddy_orders[:, state.ORDER_ROW] = np.cumsum([0] + words[:-1])[:orders]
    # holes never outnumber the extents + 1, and extents the running requests
    holes = min(int(config[state.MAX_NUM_SEQS]), n, capacity) + 2
    extent = np.zeros((n, state.EXTENT_COLUMNS), i64)
    extent[:, state.EXTENT_START] = -1
    s = s._replace(extent=extent, buddy_bits=np.zeros(sum(words), i64), buddy_orders=buddy_orders,
                   holes=np.zeros((holes, 2), i64))
    if config[state.RESERVATION_KIND] == state.RESERVE_PREDICTED and mgr.kind == "contiguous":
        s = s._replace(predictor_draw=predictor_draws(mgr, sched.t),
                       placement_saved=np.zeros(placement.saved_size(sum(words), orders, holes), i64))
    placement.init(s)
    return s


def predictor_draws(mgr, t) -> np.ndarray:
    """Each request's standard normal draw z for the predicted reservation, drawn as
    ``ContiguousManager.request_size`` draws it: seeded by (seed, seq_id, F), where a request's
    sequence is its row (no sampling width on an extent) and F its final length (what it holds
    at an admission, even after a recompute or a swap, is below F: every admission draws this z)."""
    final = (t.prompt + t.output).tolist()
    return np.array([np.random.default_rng((mgr.seed, i, f)).standard_normal() for i, f in enumerate(final)],
                    dtype=np.float64)


def prefix_caching_arrays(mgr, t, shared: bool) -> dict:
    """The prefix cache's arrays (sim/core/prefix_cache.py): the pool's (also where blocks are
    shared by forks: ``shared``), the key map's (a power of two at least twice the pool), and
    every request's prefix chain hashes, computed as the Python manager computes them
    (``sim.memory.paged.prefix_chain``). One-element arrays where not needed."""
    from pagesim.sim.memory.paged import prefix_chain

    n, i64 = t.size, np.int64
    nb = mgr.num_blocks if shared else 1
    cap = 1 << max(1, (2 * nb - 1).bit_length()) if mgr.prefix_caching else 1
    chain_start = np.zeros(n + 1, i64)
    chains: list[int] = []
    if mgr.prefix_caching and t.hashes is not None:
        H = t.hash_block_tokens
        for i in range(n):
            h = t.prefix_hashes(i)
            if h:
                chains.extend(prefix_chain(h, H))
            chain_start[i + 1] = len(chains)
    block_info = np.zeros((nb, state.BLOCK_INFO_COLUMNS), i64)
    block_info[:, state.PREV] = block_info[:, state.NEXT] = -1
    key_entries = np.zeros((cap, state.ENTRY_COLUMNS), i64)
    key_entries[:, state.ENTRY_BLOCK] = -1
    return dict(block_info=block_info, key_entries=key_entries, chain_start=chain_start,
                chains=np.array(chains if chains else [0], dtype=i64), num_keys=np.zeros(max(n, 1), i64))


def run(engine) -> None:
    """Run ``engine``'s whole simulation on the core, leaving the request table, scheduler,
    manager counters and step recorder as the Python engine leaves them."""

    from pagesim.sim.executor import is_external

    s = build(engine)
    c = s.count
    executor = engine.executor if is_external(engine.executor) else None
    if executor is not None:
        executor.start(s)
    t0 = time.perf_counter()
    last_now = 0.0
    run_loop = compiled_entry(loop.run, s)
    while True:
        code = run_loop(s)
        if code == loop.SCHEDULED:  # an executor outside the core runs the iteration and times it
            s.clock[state.STEP_S] = executor.step(s)
        elif code == loop.STEPPED:  # --check
            last_now = checked(s, last_now)
        elif code == loop.ROWS_FULL:  # grow the step table and go on
            s = s._replace(row_floats=np.concatenate([s.row_floats, np.zeros_like(s.row_floats)]),
                           row_ints=np.concatenate([s.row_ints, np.zeros_like(s.row_ints)]))
        elif code == loop.PROGRESS:
            report(engine, s, t0)
        else:
            break
    engine.wall_time_s = time.perf_counter() - t0
    if code == loop.EMPTY_POOL:
        head = int(s.waiting[c[state.WAITING_HEAD]])
        raise InvariantError(f"request {head} waits for memory in an empty pool "
                             "(the manager should have answered NEVER)")
    if code == loop.STALLED:
        raise InvariantError("scheduler stalled with swapped requests and nothing running")
    if code == loop.NO_TOKEN:
        raise InvariantError(live_lock_message(float(s.clock[state.NOW]), int(c[state.STEPS_WITHOUT_TOKEN]),
                                               int(c[state.WAITING_LEN]), int(c[state.SWAPPED_LEN]),
                                               int(c[state.NUM_RUNNING]), int(c[state.NUM_PREEMPTIONS])))
    if code == loop.STEP_NOT_POSITIVE:
        raise InvariantError("executor returned a non-positive step time")
    if engine.progress is not None and c[state.NUM_FINISHED] > c[state.NUM_FINISHED_REPORTED]:
        report(engine, s, t0)
    if executor is not None:
        executor.finish(s)
    hand_over(engine, s)


def report(engine, s: state.Core, t0: float) -> None:
    """Tell the progress hook how many requests finished since it last heard; a hook that
    raises :class:`StopRun` ends the run here, with what was measured so far handed over."""
    c = s.count
    try:
        engine.progress.update(int(c[state.NUM_FINISHED] - c[state.NUM_FINISHED_REPORTED]))
    except StopRun:
        engine.wall_time_s = time.perf_counter() - t0
        hand_over(engine, s, stopped=True)
        raise
    c[state.NUM_FINISHED_REPORTED] = c[state.NUM_FINISHED]
    s.config[state.PROGRESS_EVERY] = progress_every(engine.progress)


def compiled_entry(fn, s: state.Core):
    """``fn``'s machine code for the types of ``s``, to call directly: numba's dispatcher works
    out the types of the state's ~60 arrays at every call (about a millisecond), and the loop
    returns at every progress report (a plan probe's watcher hears up to a few hundred times a
    run). The step table grown on ROWS_FULL keeps its types. ``fn`` itself without numba."""
    if not COMPILED:
        return fn
    return fn.compile((fn.typeof_pyval(s),))  # loaded from numba's cache (or compiled) once


def checked(s: state.Core, last_now: float) -> float:
    """``--check`` after an iteration: every invariant (sim/core/check.py) and time's order;
    returns the time checked."""
    from pagesim.sim.core import check

    now = float(s.clock[state.NOW])
    if now < last_now:
        raise InvariantError(f"simulated time went backwards: {now} < {last_now}")
    try:
        check.check(s)
    except AssertionError as e:
        raise InvariantError(f"t={now:.6f}: core state inconsistent: {e}") from None
    return now


def live_lock_message(now: float, steps: int, waiting: int, swapped: int, running: int, preemptions: int) -> str:
    """Both engines' words for a run that stopped producing tokens
    (``scheduler.steps_without_token_limit``)."""
    return (f"t={now:.6g} s: no request produced a token in {steps} iterations in a row ({waiting} waiting, "
            f"{swapped} swapped, {running} running, {preemptions} preemptions so far): the scheduler is "
            "live-locked; please report it with the command line")


def hand_over(engine, s: state.Core, stopped: bool = False) -> None:
    """Give the scheduler, manager and recorder what the core measured (``stopped``: so far,
    in a run a progress hook ended: requests still hold memory, and the prefix cache's pool
    stays with the core)."""
    sched, mgr, rec, t = engine.sched, engine.mgr, engine.rec, engine.sched.t
    c, clock = s.count, s.clock
    engine.end_s = float(clock[state.END_S])
    sched.num_preemptions = int(c[state.NUM_PREEMPTIONS])
    sched.num_swap_fallbacks = int(c[state.NUM_SWAP_FALLBACKS])
    sched.num_rejected = int(c[state.NUM_REJECTED])
    for i in np.flatnonzero(s.reject_code == state.REJECT_OVER_BATCHED_TOKENS).tolist():
        t.reject_reason[i] = sched.batched_reason(i)
    for i in np.flatnonzero(s.reject_code == state.REJECT_NEVER_FITS).tolist():
        t.reject_reason[i] = sched.never_reason(i)
    for i in np.flatnonzero(s.reject_code == state.REJECT_TOO_WIDE).tolist():
        t.reject_reason[i] = sched.too_wide_reason(i)
    for i in np.flatnonzero(s.reject_code == state.REJECT_WIDTH_UNSHARED).tolist():
        t.reject_reason[i] = sched.width_reason(i)
    sched.itl_sum += float(clock[state.ITL_SUM])
    sched.itl_count += int(c[state.ITL_COUNT])
    if is_contiguous(mgr):
        assert stopped or (c[state.PLACED_SLOTS] == 0 and c[state.NUM_RUNNING] == 0), "the core ended with memory in use"
        mgr.add_counts(allocations=int(c[state.NUM_ALLOCATIONS]), frees=int(c[state.NUM_FREES]))
        if mgr.kind == "contiguous":
            mgr.add_counts(overflows=int(c[state.NUM_OVERFLOWS]), grows_in_place=int(c[state.NUM_GROWS_IN_PLACE]),
                           moves=int(c[state.NUM_MOVES]))
    else:
        assert stopped or (c[state.NUM_FREE_BLOCK_IDS] + c[state.NUM_LRU] == mgr.num_blocks
                           and c[state.NUM_RUNNING] == 0), \
            "the core ended with memory in use"
        mgr.add_counts(allocations=int(c[state.NUM_ALLOCATIONS]), frees=int(c[state.NUM_FREES]),
                       forks=int(c[state.NUM_FORKS]), cow_copies=int(c[state.NUM_COW_COPIES]))
    if getattr(mgr, "prefix_caching", False) and not stopped:
        hand_over_cache(mgr, t, s)
    n = int(c[state.NUM_ROWS])
    rec.idle_s += float(clock[state.IDLE_S])
    if rec.keep_rows:
        rec.take_rows(s.row_floats[:n], s.row_ints[:n, :11], s.row_ints[:n, 11:])
    else:
        mem = clock[state.MEM_SUM:state.MEM_SUM + 6]
        rec.take_sums(n, float(clock[state.BUSY_S]), tuple(mem.tolist()),
                      (float(clock[state.BLOCKS_SUM]), float(clock[state.LOGICAL_SUM])),
                      float(clock[state.RUNNING_WEIGHTED]), int(c[state.SUM_PREFILL_TOKENS]),
                      int(c[state.SUM_DECODE_TOKENS]))


def hand_over_cache(mgr, t, s: state.Core) -> None:
    """The prefix cache's counters and the pool it left (cached blocks, LRU order) to the manager."""
    c = s.count
    mgr.add_counts(evictions=int(c[state.NUM_EVICTIONS]), prefix_hit_tokens=int(c[state.PREFIX_HIT_TOKENS]),
                   prefix_lookup_tokens=int(c[state.PREFIX_LOOKUP_TOKENS]))
    lru = []
    b = int(c[state.LRU_HEAD])
    while b >= 0:
        lru.append(b)
        b = int(s.block_info[b, state.NEXT])
    H = t.hash_block_tokens
    info, entries = s.block_info, s.key_entries
    keyed = np.flatnonzero(info[:, state.KEY_END]).tolist()
    keys = {b: (H, int(info[b, state.KEY_END]), int(entries[info[b, state.KEY_SLOT], state.ENTRY_CHAIN]))
            for b in keyed}
    mgr.take_pool(s.free_block_ids[:c[state.NUM_FREE_BLOCK_IDS]].tolist(), lru, keys)
