"""Time: the core's two-source event loop (the next arrival, the end of the running step).

Which owns time? The core does, outright: this loop is the whole simulation of a run, compiled
with the policy it drives, so a run never leaves machine code between events (a SimPy event
costs microseconds of Python; a run has up to millions of iterations). ``sim/simpy_model.py``
tells the same loop as two SimPy processes (arrivals; engine) calling the same functions, the
readable process model, tested to leave the same records. The loop keeps SimPy's two rules:
an arrival fires at ``now + (at - now)`` (a timeout is a delay, which can land an ulp off
``at``), and events at the same time fire in creation order (each event gets the next id).
The engine sleeps when it has nothing to run and an arrival wakes it.

:func:`run` returns to Python every ``progress_every`` finished requests, as the step that
reaches them ends (the progress bar, Ctrl-C, a plan probe's early stop), when the step table's
buffers are full (Python grows them), under ``--check`` after every iteration
(``sim/core/check.py``) and, with an executor outside the core (``config[EXTERNAL_STEPS]``, the
GPU mode), after scheduling every iteration instead of pricing it (``SCHEDULED``): the executor
runs the step the arrays describe and puts its duration in ``clock[STEP_S]``; the next call
goes on from there, time still being the loop's. It resumes where it stopped, all of its state
being in the arrays.

**Compiled per family.** Each scheduler family (``config[SCHEDULER_KIND]``: vLLM v0's and Orca's
scheduler over paged memory, the same over contiguous extents, static, vLLM v1, SGLang) has a loop
of its own, :func:`loop_for` with ``family`` a constant of the closure, and what the family does,
its traits (``families.TRAITS``: its manager, its features), a constant too, on which the loop and
everything inlined into it branch: numba prunes what the family never does before it types it, so
a run compiles its own family's loop only, each cached apart. ``family`` itself only chooses the
family's own scheduler (:func:`scheduler_entry_for`) and loop (:func:`run_family`). The static, vLLM v1 and SGLang
families' scheduler is compiled apart from their loop (:func:`scheduler_entry_for`) and called
by the address of its machine code, the state by reference (:func:`call_scheduler`): an edit
of such a scheduler's file recompiles its entry alone, not the loop (``sim/core/compile/families.py``);
vLLM v0's and Orca's is inlined into their loops. A feature's larger functions that most runs
never call (the CPU offload tier's, KV cache groups', a non-default policy's, a disaggregated pool's, the
calibrated and measured prices, a drafter's) are called at an address the run's set-up writes,
compiled only for the runs that may call them (``jit.njit``'s ``lazy``), the state passed by
reference as to a scheduler (``by_reference.py``): numba compiles every function a loop names,
reached or not, and these were two fifths of vLLM v1's cold compile. What a scheduler's entry
calls apart is lazy too, whatever runs reach it, and what only it calls is inlined: a call of
numba's would pass the state field by field, which the entry would load whole at every step
(``jit.njit``'s docstring).
What a step calls once (its price, its record, its end: ``step_time``, ``record``,
``lifecycle.complete_step``) is inlined, the record and the end with their family's managers
alone (``memory.py``). For the rest: what runs per running request, per iteration or per request
is inlined; what runs on a rare or configured path and would be inlined in several places or
into the loop is a call (a rejection, a swap-in, a preemption's victim, a policy's function); a
function with one caller that is itself a call off the hot path is inlined there. Why: a call
costs its own compile and passes the state's ~60 arrays field by field at every call, inlining
copies the code into every place that calls it and numba prunes a constant's branches only
then; the measurements behind the rule are docs/performance.md's "Inlined or called".
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.compile import by_reference, jit
from pagesim.sim.core.kv import host_tier, kv_cache, radix_cache
from pagesim.sim.core.sched import lifecycle, speculative, static
# the schedulers by name: jit.interpreted (the SimPy model) then runs them by CPython too
from pagesim.sim.core.sched.scheduler_vllm import schedule as schedule_vllm
from pagesim.sim.core.sched.scheduler_sglang import schedule as schedule_sglang
from pagesim.sim.core.sched.scheduler_v1 import holding_admissible, schedule as schedule_v1
from pagesim.sim.core.sched.static import schedule as schedule_static
from pagesim.sim.core.price.cost import OVERHEAD_S, PER_SEQ_OVERHEAD_S, roofline_step_time, scaled_step_time
from pagesim.sim.core.price.cost_calibrated import calibrated_step_time
from pagesim.sim.core.price.cost_table import table_step_time
from pagesim.sim.core.compile.families import FAMILIES, SCHEDULER_GROUPS, TRAITS
from pagesim.sim.core.compile.families import (EXTENTS, HOLDS_ARRIVED_KV, HOST_COPIES, HOST_LOADS, INLINED_SCHEDULER,
                                               PREEMPTING_PASS_ADMITS_NONE, SPECULATES, WHOLE_BATCHES)
from pagesim.sim.core.compile.by_reference import pin, state_at
from pagesim.sim.core.compile.jit import interpreted, njit, on_numba_load
from pagesim.sim.core.kv.memory import memory_categories
from pagesim.sim.core.state import (ARRIVALS_DONE, BLOCK_SIZE, BLOCKS_SUM, BUSY_S, DEMAND_WAITING, END_S,
                                    ENGINE_EVENT_ID, ENGINE_PENDING, ENGINE_TIME, IDLE_S, KEEP_ROWS,
                                    LOGICAL_BLOCKS, LOGICAL_SUM, MEM_SUM, NEXT_EVENT_ID, NOW, NUM_FINISHED,
                                    NUM_FINISHED_REPORTED, NUM_REQUESTS, NUM_ROWS, NUM_RUNNING,
                                    PROGRESS_EVERY, RUNNING_WEIGHTED, SCHEDULE_ON_RESUME, STARTED,
                                    STEP_DECODE_SEQS, STEP_COPIED_BLOCKS, STEP_PREFILL_SEQS,
                                    STEP_PREFILL_TOKENS, STEP_SWAP_IN, STEP_SWAP_OUT, STEPS_WITHOUT_TOKEN,
                                    SWAPPED_LEN, WAITING_LEN)
from pagesim.sim.core.state import CALIBRATED, CHECK_STEPS, MAX_SEQ_LEN, TABLE
from pagesim.sim.core.state import (CONTINUOUS, CONTINUOUS_CONTIGUOUS, LAZY_ADDRESSES, SCHEDULER_ADDRESS, SGLANG,
                                    STATE_ADDRESS, STATIC, V1)
from pagesim.sim.core.state import EXTERNAL_STEPS, STEP_S
from pagesim.sim.core.state import (HORIZON_EVENT_ID, HORIZON_S, KV_HOLDING_WAITING, NUM_EXCHANGE, ROUTED,
                                    TRANSFER_SLOTS)
from pagesim.sim.core.state import NUM_PREEMPTIONS
from pagesim.sim.core.state import (MEMORY_CATEGORIES, ROW_BATCH, ROW_DECODE_SEQS, ROW_DT, ROW_LOGICAL_BLOCKS,
                                    ROW_MEMORY, ROW_PREFILL_TOKENS, ROW_QUEUED, ROW_RUNNING, ROW_START,
                                    ROW_USED_BLOCKS)
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    COST_MODEL          which step price the loop calls: ROOFLINE, CALIBRATED or TABLE
        (sim.core.cost, cost_calibrated, cost_table)
    COST_SCALED         1 when its GPU time is scaled (sim.cost.models.ScaledCostModel), the
        scale being the last entry of Core.cost
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    NEXT_ARRIVAL        the next request to arrive (a trace row)
    ARRIVAL_PENDING     1: an arrival event is scheduled
    ARRIVAL_EVENT_ID    its id
    IDLE                1: the engine has nothing to run and waits for an arrival
    WAKE_TRIGGERED      1: an arrival has woken the idle engine
    IN_STEP             1: an iteration is running
    AWAITING_STEP_TIME  1: the loop returned SCHEDULED and resumes with clock[STEP_S]
""")

# Core.clock: this file's entries, in its room of the shared table (sim/core/state.py)
section("clock", globals(), """
    ARRIVAL_TIME        the scheduled arrival event's time
    IDLE_FROM           when the engine last went idle
    SPEC_DRAFT_COST     speculative decoding: the drafter's price per step, as a fraction of a
        decode step of the drafting requests (sim/core/sched/speculative.py)
""")


# what run() returns
DONE, ROWS_FULL, PROGRESS, STEP_NOT_POSITIVE, EMPTY_POOL, STALLED, NO_TOKEN, STEPPED = 0, 1, 2, 3, 4, 5, 6, 7
NO_SCHEDULER = 10  # compiled, config[SCHEDULER_ADDRESS] is 0: no scheduler given (replay.scheduler_address)
NOT_ADMITTED = 11  # vllm-v1: a request holding arrived KV was admissible, and the pass after admitted nothing
HORIZON = 9  # config[ROUTED]: the next engine event comes after the cluster's next arrival (sim/core/events/cluster.py)
SCHEDULED = 8  # config[EXTERNAL_STEPS]: an iteration is scheduled; its executor puts its duration in clock[STEP_S]
GO_ON = -1  # (start_step: the loop goes on)
SCHEDULE, HOLDING_ADMISSIBLE = 0, 1  # what a loop asks its family's scheduler (call_scheduler)


# once a step: inlined (the module's docstring, "Compiled per family")
@njit(inline=True)
def step_time(s, decode_context_sum, traits):
    """The cost model's price of the iteration just scheduled, by either scheduler (``config[COST_MODEL]``
    says which model, ``config[COST_SCALED]`` whether its GPU time is scaled), and under vLLM v1's
    speculative decoding its drafter's (``traits``: the loop's family's). Each prefilling
    sequence's ``n`` new tokens (``step_prefill_tokens``) and its context after them
    (``step_prefill_context``; ``b`` = context - n were cached before) are as the scheduler
    scheduled them: a static batch's padded prefill is n = context = the longest prompt."""
    c = s.count
    # np.int64(0), not 0: the sums are passed to the step prices (jit.njit's note on constants)
    pair_sum = np.int64(0)  # sum(n * (2b + n)), twice the causal pairs: an integer, exact in any order
    cached_sum = np.int64(0)
    cross_sum = np.int64(0)  # sum(n * b) and sum(n * n): the calibrated model's
    square_sum = np.int64(0)
    for k in range(c[STEP_PREFILL_SEQS]):
        n = s.step_prefill_tokens[k]
        before = s.step_prefill_context[k] - n
        pair_sum += n * (2 * before + n)
        cached_sum += before
        cross_sum += n * before
        square_sum += n * n
    flop_sum = pair_sum * 0.5  # sum(n * (b + n / 2)), rounded once (sim.cost.roofline.prefill_sums)
    num_seqs = c[STEP_PREFILL_SEQS] + c[STEP_DECODE_SEQS]
    # a decode's query tokens: one, and under speculative decoding its drafts
    num_tokens = c[STEP_PREFILL_TOKENS] + c[STEP_DECODE_SEQS] + speculative.step_drafts(s)
    swapped = c[STEP_SWAP_IN] + c[STEP_SWAP_OUT]
    copied = c[STEP_COPIED_BLOCKS] * s.config[BLOCK_SIZE]  # copy-on-write of shared tails
    t = price(s, num_seqs, num_tokens, c[STEP_DECODE_SEQS], decode_context_sum, c[STEP_PREFILL_SEQS], flop_sum,
              cached_sum, cross_sum, square_sum, swapped, copied)
    if traits & SPECULATES and s.clock[SPEC_DRAFT_COST] > 0:  # a drafter with a forward pass (speculative.py)
        t += draft_time(s)
    return t


@njit(inline=True)
def price(s, num_seqs, num_tokens, decode_seqs, decode_context_sum, prefill_seqs, flop_sum, cached_sum, cross_sum,
          square_sum, swapped, copied):
    """The cost model's price of a batch (``config[COST_MODEL]`` says which model,
    ``config[COST_SCALED]`` whether its GPU time is scaled)."""
    if calibrated(s.config):
        t = calibrated_price(s, num_seqs, num_tokens, decode_seqs, decode_context_sum, prefill_seqs, cross_sum,
                             square_sum, swapped, copied)
    elif measured(s.config):
        t = table_price(s, num_seqs, num_tokens, decode_seqs, decode_context_sum, prefill_seqs, flop_sum, cached_sum,
                        swapped, copied)
    else:
        t = roofline_step_time(s.cost, num_seqs, num_tokens, decode_context_sum, prefill_seqs, flop_sum,
                               cached_sum, swapped, copied)
    if s.config[COST_SCALED]:
        t = scaled_step_time(t, s.cost[len(s.cost) - 1], s.cost[OVERHEAD_S], s.cost[PER_SEQ_OVERHEAD_S], num_seqs)
    return t


@njit(inline=True)
def calibrated(config):
    """The runs priced by the calibrated model (:func:`price`): the only ones that compile it
    (``njit``'s lazy)."""
    return config[COST_MODEL] == CALIBRATED


@njit(inline=True)
def measured(config):
    """The runs priced by the measured tables (:func:`price`): the only ones that compile them
    (``njit``'s lazy)."""
    return config[COST_MODEL] == TABLE


@njit(lazy=calibrated)
def calibrated_price(s, num_seqs: int, num_tokens: int, decode_seqs: int, decode_context_sum: int,
                     prefill_seqs: int, cross_sum: int, square_sum: int, swapped: int, copied: int) -> float:
    return calibrated_step_time(s.cost, s.cost_data, num_seqs, num_tokens, decode_seqs, decode_context_sum,
                                prefill_seqs, cross_sum, square_sum, swapped, copied)


@njit(lazy=measured)
def table_price(s, num_seqs: int, num_tokens: int, decode_seqs: int, decode_context_sum: int, prefill_seqs: int,
                flop_sum: float, cached_sum: int, swapped: int, copied: int) -> float:
    return table_step_time(s.cost, s.cost_data, num_seqs, num_tokens, decode_seqs, decode_context_sum,
                           prefill_seqs, s.step_prefill_context, flop_sum, cached_sum, swapped, copied)


# per step of a speculative run whose drafter has a forward pass: a call (off the other runs' path)
@njit(lazy=speculative.speculating)
def draft_time(s) -> float:
    """The drafter's price for the step just scheduled (``sim/core/sched/speculative.py``): a decode
    step of the step's decoding requests, one token each over their contexts, times
    ``clock[SPEC_DRAFT_COST]`` (its passes per step times its share of the target's work)."""
    c = s.count
    seqs = c[STEP_DECODE_SEQS]
    if seqs == 0:
        return 0.0
    zero = np.int64(0)  # np.int64: jit.njit's note on constants
    return s.clock[SPEC_DRAFT_COST] * price(s, seqs, seqs, seqs, speculative.draft_context(s), zero, 0.0, zero,
                                             zero, zero, zero, zero)


# once a step: inlined (the module's docstring, "Compiled per family")
@njit(inline=True)
def record(s, start, dt, traits):
    """The time-weighted sums the summary reads (in sim.metrics' order), and with rows the
    step-table row. The summary reads the sums either way: one statement of each average, the
    same float with or without a step table. ``traits``: the loop's family's (``memory.py``)."""
    c = s.count
    memory = s.step_memory
    used = memory_categories(s, c[DEMAND_WAITING], memory, traits)
    logical = c[LOGICAL_BLOCKS]  # the tables' lengths: more than used when prefix hits share blocks
    clock = s.clock
    clock[BLOCKS_SUM] += used * dt
    clock[LOGICAL_SUM] += logical * dt
    clock[BUSY_S] += dt
    for k in range(MEMORY_CATEGORIES):
        clock[MEM_SUM + k] = clock[MEM_SUM + k] + memory[k] * dt
    clock[RUNNING_WEIGHTED] += c[NUM_RUNNING] * dt
    kv_cache.groups_elapsed(s, dt)
    if s.config[KEEP_ROWS]:
        r = c[NUM_ROWS]
        s.row_floats[r, ROW_START] = start
        s.row_floats[r, ROW_DT] = dt
        row = s.row_ints
        row[r, ROW_BATCH] = c[STEP_PREFILL_SEQS] + c[STEP_DECODE_SEQS]
        row[r, ROW_PREFILL_TOKENS] = c[STEP_PREFILL_TOKENS]
        row[r, ROW_DECODE_SEQS] = c[STEP_DECODE_SEQS] + speculative.step_drafts(s)  # and the drafts verified
        row[r, ROW_QUEUED] = c[WAITING_LEN] + c[SWAPPED_LEN]
        row[r, ROW_RUNNING] = c[NUM_RUNNING]
        for k in range(MEMORY_CATEGORIES):
            row[r, ROW_MEMORY + k] = memory[k]
        row[r, ROW_USED_BLOCKS] = used
        row[r, ROW_LOGICAL_BLOCKS] = logical
    c[NUM_ROWS] += 1


@njit(inline=True)
def new_event(s):
    eid = s.count[NEXT_EVENT_ID]
    s.count[NEXT_EVENT_ID] = eid + 1
    return eid


@njit(inline=True)
def wake_engine(s):
    """An arrival (or the end of arrivals) wakes a sleeping engine at once."""
    c = s.count
    if c[IDLE] and not c[WAKE_TRIGGERED]:
        c[WAKE_TRIGGERED] = 1
        c[ENGINE_PENDING] = 1
        s.clock[ENGINE_TIME] = s.clock[NOW]
        c[ENGINE_EVENT_ID] = new_event(s)


@njit(inline=True)
def hand_over_arrivals(s):
    """The arrivals process: hand over every request due now, then wait for the next."""
    c, now = s.count, s.clock[NOW]
    while True:
        i = c[NEXT_ARRIVAL]
        if i >= s.config[NUM_REQUESTS]:
            c[ARRIVALS_DONE] = 1
            wake_engine(s)
            return
        at = s.arrival_s[i]
        if at > now:
            c[ARRIVAL_PENDING] = 1
            s.clock[ARRIVAL_TIME] = now + (at - now)  # SimPy's timeout(at - now)
            c[ARRIVAL_EVENT_ID] = new_event(s)
            return
        lifecycle.add_arrival(s, i)
        c[NEXT_ARRIVAL] = i + 1
        wake_engine(s)


@njit(inline=True)
def start_step(s, dt, traits):
    """The iteration just scheduled runs for ``dt``: its row, and the event of its end."""
    c, clock = s.count, s.clock
    if not dt > 0:
        return STEP_NOT_POSITIVE
    record(s, clock[NOW], dt, traits)
    c[ENGINE_PENDING] = 1
    clock[ENGINE_TIME] = clock[NOW] + dt
    c[ENGINE_EVENT_ID] = new_event(s)
    c[IN_STEP] = 1
    if s.config[CHECK_STEPS] or c[NUM_EXCHANGE]:  # or a disaggregated cluster's loop has work (disagg.py)
        return STEPPED
    return GO_ON


def loop_for(family):
    """The loop of one scheduler family (``config[SCHEDULER_KIND]``: ``sim/core/compile/families.py``),
    ``family`` a constant of the closure: numba prunes the other families' branches before it
    types them, so a run compiles its own family's loop only, each cached apart (numba keys a
    closure's cache by its constants). It branches on what the family does, its ``traits``
    (``families.TRAITS``), a constant too; ``family`` itself names the scheduler it calls."""
    traits = TRAITS[family]

    def run(s):
        """Run until the end, or until Python is needed (see the module docstring)."""
        c, clock = s.count, s.clock
        ref = pin(s)  # the state where the functions called by address read it (by_reference.py)
        if c[AWAITING_STEP_TIME]:  # back from the executor outside the core with the step's duration
            c[AWAITING_STEP_TIME] = 0
            code = start_step(s, clock[STEP_S], traits)
            if code != GO_ON:
                return code
        if not c[STARTED] and not s.config[ROUTED]:  # a replica's router hands over its arrivals
            c[NEXT_EVENT_ID] = 2  # SimPy's two Initialize events
            hand_over_arrivals(s)
        holding_retried = False  # a pass was run again for a request holding arrived KV (below)
        while True:
            # each pass takes one event and records at most one row: room is checked first
            if s.config[KEEP_ROWS] and c[NUM_ROWS] >= len(s.row_floats):
                return ROWS_FULL
            if c[STARTED] and not c[SCHEDULE_ON_RESUME]:
                take_arrival = c[ARRIVAL_PENDING] and (
                    not c[ENGINE_PENDING] or clock[ARRIVAL_TIME] < clock[ENGINE_TIME]
                    or (clock[ARRIVAL_TIME] == clock[ENGINE_TIME] and c[ARRIVAL_EVENT_ID] < c[ENGINE_EVENT_ID]))
                if take_arrival:
                    c[ARRIVAL_PENDING] = 0
                    clock[NOW] = clock[ARRIVAL_TIME]
                    lifecycle.add_arrival(s, c[NEXT_ARRIVAL])
                    c[NEXT_ARRIVAL] += 1
                    wake_engine(s)
                    hand_over_arrivals(s)
                    continue
                if s.config[ROUTED] and c[ENGINE_PENDING] and not (
                        clock[ENGINE_TIME] < clock[HORIZON_S]
                        or (clock[ENGINE_TIME] == clock[HORIZON_S] and c[ENGINE_EVENT_ID] < c[HORIZON_EVENT_ID])):
                    return HORIZON  # the cluster's next arrival fires first (sim/core/events/cluster.py)
                if not c[ENGINE_PENDING]:
                    clock[END_S] = clock[NOW]  # a replica waits for its router; else not reached: the engine ends the run
                    return DONE
                c[ENGINE_PENDING] = 0
                clock[NOW] = clock[ENGINE_TIME]
                if c[IN_STEP]:
                    c[IN_STEP] = 0
                    if traits & WHOLE_BATCHES:  # request-level (static) batching: sim/core/sched/static.py
                        static.complete_step(s, clock[NOW])
                    else:
                        lifecycle.complete_step(s, clock[NOW], traits)
                        if c[STEPS_WITHOUT_TOKEN] > lifecycle.steps_without_token_limit(s.config[MAX_SEQ_LEN]):
                            return NO_TOKEN
                else:  # woken from sleep
                    c[IDLE] = 0
                    clock[IDLE_S] += clock[NOW] - clock[IDLE_FROM]
                if c[NUM_FINISHED] - c[NUM_FINISHED_REPORTED] >= s.config[PROGRESS_EVERY]:
                    # report as the step ends, before the next one is scheduled: where the Python
                    # engine reports, so a progress hook that ends the run here (a plan's probe,
                    # sim/core/events/replay.py StopRun) leaves the same records
                    c[SCHEDULE_ON_RESUME] = 1
                    return PROGRESS
            c[STARTED] = 1
            c[SCHEDULE_ON_RESUME] = 0
            preemptions = c[NUM_PREEMPTIONS]  # (a vllm-v1 pass that preempts its last request: below)
            # the engine: schedule an iteration, price it, let it run
            # the family's scheduler (scheduler_entry_for): inlined, or compiled apart and called by
            # address (families.SCHEDULER_BY_ADDRESS)
            if traits & INLINED_SCHEDULER:  # vLLM v0's and Orca's, over extents or blocks
                if traits & EXTENTS:
                    decode_context_sum = scheduler_entry_contiguous(s, s, SCHEDULE)
                else:
                    decode_context_sum = scheduler_entry_continuous(s, s, SCHEDULE)
            else:
                decode_context_sum = call_scheduler(s, ref, family, SCHEDULE)
                if decode_context_sum < 0:
                    return NO_SCHEDULER
            if not (c[STEP_PREFILL_SEQS] or c[STEP_DECODE_SEQS] or c[STEP_SWAP_IN] or c[STEP_SWAP_OUT]):
                if c[ARRIVALS_DONE] and not (c[WAITING_LEN] or c[NUM_RUNNING] or c[SWAPPED_LEN]):
                    clock[END_S] = clock[NOW]
                    return DONE
                if not c[NUM_RUNNING] and c[SWAPPED_LEN] and c[ARRIVALS_DONE] and not c[WAITING_LEN]:
                    return STALLED
                if (traits & HOLDS_ARRIVED_KV and not c[NUM_RUNNING] and c[KV_HOLDING_WAITING]
                        and call_scheduler(s, ref, family, HOLDING_ADMISSIBLE) > 0):
                    # the pass preempted every running request (none admitted: scheduler.py:1050)
                    # while a request holding blocks has its KV: vLLM's next step admits it
                    # (lifecycle.hold_waiting); if that pass admits nothing, none ever would:
                    # an error, not a loop that spins with the clock stopped
                    if holding_retried:
                        return NOT_ADMITTED
                    holding_retried = True
                    c[SCHEDULE_ON_RESUME] = 1
                    continue
                # a host tier's load: the end of the next wakes it, or an arrival before (host_tier.py)
                wake = host_tier.next_load_end(s) if traits & HOST_LOADS and host_tier.loading(s) else np.inf
                if traits & HOST_COPIES and radix_cache.copies_pending(s):  # sglang's host tier: the next copy's end unlocks
                    wake = radix_cache.next_end(s)  # its node (an idle scheduler polls: radix_cache.acknowledge)
                if (not c[NUM_RUNNING] and c[WAITING_LEN] and c[DEMAND_WAITING] and not c[TRANSFER_SLOTS]
                        and wake == np.inf):
                    if traits & PREEMPTING_PASS_ADMITS_NONE and c[NUM_PREEMPTIONS] > preemptions:
                        # the pass preempted its last running request and so admitted nobody
                        # (scheduler.py:1050): vLLM's next step, at once, admits into the emptied
                        # pool; a pass with nobody running preempts nobody, so this runs once
                        c[SCHEDULE_ON_RESUME] = 1
                        continue
                    return EMPTY_POOL  # (in-flight transfers and host loads free or load blocks)
                c[IDLE] = 1
                c[WAKE_TRIGGERED] = 0
                clock[IDLE_FROM] = clock[NOW]
                if wake < np.inf:
                    c[ENGINE_PENDING] = 1
                    clock[ENGINE_TIME] = wake
                    c[ENGINE_EVENT_ID] = new_event(s)
                continue
            holding_retried = False
            if s.config[EXTERNAL_STEPS]:  # its executor runs it (the row's room was checked above)
                c[AWAITING_STEP_TIME] = 1
                return SCHEDULED
            # np.int64: SGLang's loop types its sum as the constant 0 here, which compiled step_time
            # and the cost models a second time (jit.njit's note on constants)
            dt = step_time(s, np.int64(decode_context_sum), traits)
            # sglang's host tier loads KV back in the step (radix_cache.step_price)
            if traits & HOST_COPIES and radix_cache.loads_back(s):
                dt = radix_cache.step_price(s, dt)
            code = start_step(s, dt, traits)
            if code != GO_ON:
                return code

    return run


#: each family's loop, by the name its functions' module binds it under (jit.use_numba makes each
#: a dispatcher in its place), cached with its family (sim/core/compile/families.py)
run_continuous = njit(loop_for(CONTINUOUS), cache_group=FAMILIES[CONTINUOUS])
run_contiguous = njit(loop_for(CONTINUOUS_CONTIGUOUS), cache_group=FAMILIES[CONTINUOUS_CONTIGUOUS])
run_static = njit(loop_for(STATIC), cache_group=FAMILIES[STATIC])
run_v1 = njit(loop_for(V1), cache_group=FAMILIES[V1])
run_sglang = njit(loop_for(SGLANG), cache_group=FAMILIES[SGLANG])


def run_for(kind):
    """The loop of scheduler family ``kind``, as bound now (numba's dispatcher once loaded)."""
    return globals()["run_" + FAMILIES[int(kind)]]


def scheduler_entry_for(family):
    """The entry to family ``family``'s scheduler (``family`` a constant of the closure, as in
    :func:`loop_for`): asked ``verb`` (:data:`SCHEDULE`: schedule an iteration, returning its
    decode context sum; :data:`HOLDING_ADMISSIBLE`: vLLM v1's question whether a request holding
    blocks would be admitted) about the state at ``ref`` (``like``: its type). Compiled apart
    from the family's loop, which calls it by address (:func:`call_scheduler`), each cached with
    its own sources (``sim/core/compile/families.py``): an edit of a family's scheduler file recompiles
    this entry, not the loop. The state is passed by reference, the address of the loop's one
    copy of it (``by_reference.pin``): numba's own call passes each of its ~70 arrays field by
    field, ~550 machine words, more than the static family's scheduler's own work; by reference
    the static, vLLM v1 and SGLang engines run as fast as inlined. vLLM v0's and Orca's entry is
    inlined into their loop (``families.SCHEDULER_BY_ADDRESS``), by address their engines being
    slower (docs/performance.md, "The compiler's machinery")."""

    traits = TRAITS[family]

    def scheduler(ref, like, verb):
        s = state_at(ref, like)
        # the family's scheduler, chosen here, where ``family`` is a constant: numba prunes the
        # others before it inlines (in a function inlined with ``family`` an argument, it
        # would build all four into each family's scheduler first)
        if family == STATIC:
            return schedule_static(s)
        if family == V1:
            if verb == HOLDING_ADMISSIBLE:
                return np.int64(1) if holding_admissible(s) else np.int64(0)
            return schedule_v1(s)
        if family == SGLANG:
            return schedule_sglang(s)
        return schedule_vllm(s, traits)

    return scheduler


#: each family's scheduler entry, by the name :func:`scheduler_of` finds it under; vLLM v0's and
#: Orca's inlined into their loops (families.SCHEDULER_BY_ADDRESS)
scheduler_entry_continuous = njit(scheduler_entry_for(CONTINUOUS), inline=True)
scheduler_entry_contiguous = njit(scheduler_entry_for(CONTINUOUS_CONTIGUOUS), inline=True)
scheduler_entry_static = njit(scheduler_entry_for(STATIC), cache_group=SCHEDULER_GROUPS[STATIC],
                              by_address=True)
scheduler_entry_v1 = njit(scheduler_entry_for(V1), cache_group=SCHEDULER_GROUPS[V1], by_address=True)
scheduler_entry_sglang = njit(scheduler_entry_for(SGLANG), cache_group=SCHEDULER_GROUPS[SGLANG],
                              by_address=True)


def scheduler_of(kind):
    """The scheduler entry of family ``kind``, as bound now (numba's dispatcher once loaded)."""
    return globals()["scheduler_entry_" + FAMILIES[int(kind)]]


def call_scheduler(s, ref, family, verb):
    """The family's scheduler (:func:`scheduler_entry_for`) asked ``verb`` about the state.
    Compiled, called at the address ``config[SCHEDULER_ADDRESS]`` holds
    (``replay.scheduler_address``, or in an extension module :func:`linked_scheduler`), with
    ``ref``; -1 where none was set. Interpreted, the scheduler's own source, run by CPython."""
    return interpreted(scheduler_of(family))(s, None, verb)


def scheduler_signature(state):
    """The types a family's scheduler is compiled for, over states of numba's type ``state``: the
    state's address, its type, the question (numba loaded)."""
    from numba import types

    return types.voidptr, types.TypeRef(state), types.int64


def linked_scheduler(s, family):
    """The address :func:`call_scheduler` calls, in an extension module (``aot.exported``): the
    family's scheduler linked into the module with its loop (``s``: a state, or a cluster's list
    of them, for its type). Interpreted, none is needed."""
    return 0


def link_lazies(config, s, linked):
    """In an extension module (``aot.exported``), the lazy functions (``jit.njit``'s ``lazy``)
    whose slots are the bits of ``linked`` (a constant; ``jit.lazy_mask``: never an interface)
    linked into the module with its loop, each one's address written into ``config`` (a
    replica's row), so that a run needing no other compiles nothing (the others, and a policy
    other than the default: ``jit.set_lazy_addresses``; ``s``: a state, or a cluster's list
    of them, for its type). Interpreted, none is needed."""


@njit(inline=True)
def run_family(s, family):
    """:func:`run` from compiled code, ``family`` a constant there (the cluster's loop)."""
    if family == STATIC:
        return run_static(s)
    if family == V1:
        return run_v1(s)
    if family == SGLANG:
        return run_sglang(s)
    if family == CONTINUOUS_CONTIGUOUS:
        return run_contiguous(s)
    return run_continuous(s)


def call_engine(engine, s, family):
    """Run replica ``s`` by its family's loop from a cluster's loop (``cluster.py``,
    ``disagg.py``). Compiled, ``engine`` is the address of that loop's machine code for the
    replica's types (``replay.engine_address``; in an extension module, :func:`linked_engine`),
    called through it: a call of the loop's dispatcher would have numba link the loop's whole
    code into the cluster's loop and optimize and compile it again there (numba links a callee's
    module into each caller's), which doubled the cluster loops' cold compile (docs/performance.md,
    "The compiler's machinery"). Interpreted, ``engine`` is not read."""
    return run_family(s, family)


def linked_engine(replicas, family):
    """The address :func:`call_engine` takes, in an extension module (``aot.exported``): the
    family's loop linked into the module with the cluster's. Interpreted, none is needed."""
    return 0


@on_numba_load
def _compiled_engine_calls():
    from numba import types
    from numba.core.errors import TypingError
    from numba.core import cgutils
    from numba.extending import intrinsic, lower_builtin, overload, type_callable

    def call_by_address(context, builder, address, argtys, args):
        """A call of the compiled function (returning an int64) at ``address``."""
        return jit.call_by_address(context, builder, address, types.int64, argtys, args)

    def linked_address_of(dispatcher, sig, typed):
        """An intrinsic's typing and code: the address of ``dispatcher``'s machine code for
        ``sig``, linked into the caller's module (an extension module's), typed int64(*typed)."""
        dispatcher.compile(sig)
        compiled = dispatcher.overloads[sig]

        def codegen(context, builder, signature, args):
            context.add_linking_libs([compiled.library])
            fn = context.declare_function(builder.module, compiled.fndesc)
            return builder.ptrtoint(fn, context.get_value_type(types.int64))
        return types.int64(*typed), codegen

    # called as numba's builtins (type_callable, lower_builtin), with no code of their own to
    # compile: an overload's implementation, even one inlined, is compiled apart first (jit._lazy_call)
    @type_callable(call_engine)
    def _call_engine(context):
        def typer(engine, s, family):
            if not isinstance(engine, types.Integer):
                raise TypingError(f"call_engine takes the address of a family's loop, not {engine}")
            return types.int64
        return typer

    @lower_builtin(call_engine, types.Integer, types.Any, types.Any)
    def engine_called(context, builder, signature, args):
        s = signature.args[1]
        code = call_by_address(context, builder, args[0], (s,), (args[1],))
        if "config" in getattr(s, "fields", ()):  # (else not a state: a test's loop)
            at = by_reference.config_slot(context, builder, s, args[1], STATE_ADDRESS)
            builder.store(context.get_constant(types.int64, 0), at)  # its copy of the state is gone
        return code

    @intrinsic
    def linked_address(typingctx, replicas, family):
        if not isinstance(family, types.IntegerLiteral):
            raise TypingError(f"linked_engine takes the family as a constant, not {family}")
        return linked_address_of(run_for(family.literal_value), (replicas.dtype,), (replicas, family))

    @overload(linked_engine, inline="always")
    def _linked_engine(replicas, family):
        return lambda replicas, family: linked_address(replicas, family)

    # the schedulers called by address, the state by reference (scheduler_entry_for)
    @type_callable(call_scheduler)
    def _call_scheduler(context):
        return lambda s, ref, family, verb: types.int64

    @lower_builtin(call_scheduler, types.BaseTuple, types.Any, types.Any, types.Any)
    def scheduler_called(context, builder, signature, args):
        s, ref, verb = signature.args[0], args[1], args[3]
        argtys = scheduler_signature(s)
        address = builder.load(by_reference.config_slot(context, builder, s, args[0], SCHEDULER_ADDRESS))
        code = cgutils.alloca_once_value(builder, context.get_constant(types.int64, -1))  # none set
        with builder.if_then(builder.icmp_signed("!=", address, address.type(0)), likely=True):
            asked = context.cast(builder, verb, signature.args[3], types.int64)
            like = context.get_constant_null(argtys[1])
            builder.store(call_by_address(context, builder, address, argtys, (ref, like, asked)), code)
        return builder.load(code)

    @intrinsic
    def linked_scheduler_address(typingctx, s, family):
        if not isinstance(family, types.IntegerLiteral):
            raise TypingError(f"linked_scheduler takes the family as a constant, not {family}")
        sig = scheduler_signature(s.dtype if isinstance(s, types.List) else s)
        return linked_address_of(scheduler_of(family.literal_value), sig, (s, family))

    @overload(linked_scheduler, inline="always")
    def _linked_scheduler(s, family):
        return lambda s, family: linked_scheduler_address(s, family)

    @intrinsic
    def linked_lazy_addresses(typingctx, config, s, mask):
        if not isinstance(mask, types.IntegerLiteral):
            raise TypingError(f"link_lazies takes the slots it links as a constant, not {mask}")
        state = s.dtype if isinstance(s, types.List) else s
        # (an interface's slot holds the implementation a run chose, set by jit.set_lazy_addresses)
        linked = [(slot, jit.lazy_compiled(fn, state)) for fn, (slot, _) in jit._LAZY.items()
                  if mask.literal_value >> slot & 1 and not jit.is_interface(fn)]

        def codegen(context, builder, signature, args):
            data = context.make_array(config)(context, builder, value=args[0]).data
            for slot, compiled_function in linked:
                context.add_linking_libs([compiled_function.library])
                fn = context.declare_function(builder.module, compiled_function.fndesc)
                at = builder.gep(data, [context.get_constant(types.intp, LAZY_ADDRESSES + slot)])
                builder.store(builder.ptrtoint(fn, context.get_value_type(types.int64)), at)
            return context.get_dummy_value()
        return types.none(config, s, mask), codegen

    @overload(link_lazies, inline="always")
    def _link_lazies(config, s, linked):
        return lambda config, s, linked: linked_lazy_addresses(config, s, linked)
