"""vLLM v1's scheduler (``--system vllm-v1``) over the core's arrays, as of vLLM 0.33.0
(``vllm/v1/core/sched/scheduler.py``, ``Scheduler.schedule``; file:line below are of that release).

One iteration is one token budget, ``max_num_batched_tokens``, with no prefill or decode
phase (scheduler.py:701-709): every request is owed the tokens between its computed ones
and its length, and the budget is handed out

1. to the running list first, in its order (scheduler.py:793-1001): each running request gets
   ``min(its remaining tokens, the budget left)`` (scheduler.py:836-848; a prefilling request
   the rest of its prompt, chunk by chunk, a decoding one its next token), and its blocks grow
   to hold them (``allocate_slots``, kv_cache_manager.py:380). When they cannot, the policy's
   victim (``policies.victim``: under FCFS the *last* request of the running list,
   ``self.running.pop()``, scheduler.py:970; under priority the largest (priority, arrival),
   scheduler.py:932-936) is preempted and recomputed (``_preempt_request``, scheduler.py:1799:
   its blocks freed, its computed tokens 0, back in the waiting queue where the policy puts
   it), and the allocation is tried again; a request that preempts itself computes nothing,
   and the pass goes on after it (under FCFS it was the last: scheduler.py:978-994). The
   budget may run out before the end of the list: the requests it did not reach compute
   nothing this step;
2. then to waiting requests, in the policy's order, only if nobody was preempted this step
   (scheduler.py:1050), while the budget lasts and fewer than ``max_num_seqs`` run
   (scheduler.py:1062-1073): the prefix cache's hits first (``get_computed_blocks``, kv_cache_manager.py:266: full blocks
   only, at most ``num_tokens - 1`` tokens, so a prompt found whole recomputes its last
   block), then as many of the rest as the budget holds (scheduler.py:1297-1346). Its whole
   sequence must fit the free blocks, hits that nobody holds counting as taken
   (``scheduler_reserve_full_isl``, True by default: kv_cache_manager.py:531-548,
   config/scheduler.py:190), less the watermark when something runs (kv_cache_manager.py:518-525;
   ``watermark`` is 0.0 by default, config/scheduler.py:196); only the chunk's blocks are
   taken now. The first request that does not fit ends the pass (scheduler.py:1454-1461).

**Async scheduling** (``--async-scheduling``, on by default as in vLLM: config/vllm.py:1685-1719
turns it on unless something is incompatible). The engine core keeps two steps in flight
(``step_with_batch_queue``, v1/engine/core.py:708-769): it schedules step N+1 as soon as step N is
submitted, then blocks on step N's result, then takes the requests that arrived meanwhile
(``_process_input_queue``) and schedules N+2. So a request arriving while step N runs is first
scheduled in step N+2: here, waiting requests are admitted only if they arrived by the previous
scheduling decision (``clock[LAST_SCHEDULE_S]``, the start of the step that just ended), unless
nothing was running (an idle engine schedules at once). The CPU time it overlaps with the GPU
is the cost model's to price (``--cost-model serving``). Not modelled: a request that stops on
its own (EOS) is scheduled for one more step before the engine learns it stopped.

**Client timeouts** (``--client-timeout S``): a client that has waited ``S`` seconds for its
whole answer gives up and closes the stream, and vLLM aborts the request wherever it is
(v1/engine/async_llm.py:804-809, the disconnect; ``finish_requests``, sched/scheduler.py:2964-3000:
waiting, it leaves the queue; running, it leaves the running list and its blocks are freed). Here each step first aborts every waiting or running request sent ``S`` or more seconds
ago; it counts as rejected, with that reason.

**Speculative decoding** (``--num-speculative-tokens K``): a decode's tokens are its last sampled
one and its K drafts, each scheduled request takes the method's draft slots of the budget too,
and blocks grow for the lookahead slots as well (``speculative.py``, with its sources).

**KV cache groups** (a model with sliding-window layers: ``sim/specs/kv_groups.py``): each
request's blocks are taken in every group, and each time it is scheduled its sliding-window
groups first free the blocks its window has left (``kv_cache.remove_skipped``, as
``allocate_slots`` does, kv_cache_manager.py:557-567); a waiting request's sequence counts in a
sliding group at most the group's admission cap; with speculation, the drafts' and lookahead
slots too, in every group, the window freed on the tokens processed before them (vLLM frees on
``total_computed_tokens - num_in_flight_tokens``, kv_cache_manager.py:555-567). With prefix
caching, each group keys its own blocks and an admission's hit is the groups' together
(``prefix_cache.group_hits``, ``kv_cache.allocate_group_hits``; docs/notes/swa-prefix-caching.md):
its whole sequence's count caps a sliding group before the hit comes off, so its first chunk's
is tested too.

Blocks and the prefix cache are the paged manager's (``kv_cache.py``, ``prefix_cache.py``),
whose rules are v1's: a block is named by its hash once full (block_pool.py:230); a request's
blocks are freed tail first (single_type_kv_cache_manager.py:598), unhashed ones to be reused
first and hashed ones to the free queue's end (block_pool.py:816-847); a hit takes its block
out of the free queue (block_pool.py:792-810); a new block comes from the queue's front,
evicting its hash (block_pool.py:706-733); free blocks include cached unreferenced ones
(block_pool.py:912, kv_cache_utils.py:258-274). Tokens are handed out by
``scheduler.complete_step``: one to each request that decoded, and one to each whose chunk
completed its prompt; a request stops at its output length (sched/utils.py:114-119).
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.kv import host_tier, kv_cache, prefix_cache, remote_kv
from pagesim.sim.core.sched import policies, speculative
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.sched.lifecycle import (begin_iteration, first_arrived, hold_waiting, preempt_v1, prefill,
                                        reject_waiting, release, start_running, take_holding, take_waiting, waiting_at)
from pagesim.sim.core.state import BLOCK_SIZE, SPEC_DRAFT_SLOTS, SPEC_LOOKAHEAD, V1
from pagesim.sim.core.state import SLIDING_GROUPS
from pagesim.sim.core.state import MAMBA_ALIGN, WINDOW_JUNCTION
from pagesim.sim.core.state import KV_HOLDING_WAITING
from pagesim.sim.core.state import (ASYNC_SCHEDULING, DECODE_SET_SIZE, DEMAND_WAITING, MAX_BATCHED_TOKENS,
                                    MAX_NUM_SEQS, MAX_SEQ_LEN, NOW, NUM_BLOCKS, NUM_REJECTED, NUM_RUNNING,
                                    PREFIX_CACHING, REJECT_CLIENT_TIMEOUT, REJECT_NEVER_FITS,
                                    REJECT_WIDTH_UNSHARED, REJECTED, RUNNING, STEP_DECODE_SEQS,
                                    STEP_PREFILL_SEQS, STEP_PREFILL_TOKENS, WAITING_LEN, WATERMARK_BLOCKS)
from pagesim.sim.core.compile.families import TRAITS
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    HAS_CLIENT_TIMEOUT  1: clients give up after clock[CLIENT_TIMEOUT_S] (vLLM v1)
""")

# Core.clock: this file's entries, in its room of the shared table (sim/core/state.py)
section("clock", globals(), """
    LAST_SCHEDULE_S     vLLM v1 under ASYNC_SCHEDULING: when the scheduler last scheduled a step
        (a request arriving after it waits one more step)
    CLIENT_TIMEOUT_S    vLLM v1: how long a client waits for its whole answer (inf: forever)
""")


#: the traits of this scheduler's family (``families.TRAITS``)
V1_TRAITS = TRAITS[V1]


@njit(inline=True)
def schedule(s):
    """One iteration: the running list, then (nobody preempted) the waiting queue, within one
    token budget. Returns the decode context sum (the cost model's)."""
    c = s.count
    begin_iteration(s)
    c[DEMAND_WAITING] = 0
    speculative.step_starts(s)
    prefix_cache.step_starts(s)
    if timing_out(s.config):
        abort_timed_out(s)
    budget, preempted, context_sum, reached = schedule_running(s)
    ran = c[NUM_RUNNING]  # the running list after its pass: those admitted join it past here
    if not preempted:
        admit_waiting(s, budget)
    host_tier.pass_ended(s, reached, ran)
    if not c[WAITING_LEN]:
        c[DEMAND_WAITING] = 0
    s.clock[LAST_SCHEDULE_S] = s.clock[NOW]
    return context_sum


@njit(inline=True)
def timing_out(config):
    """The runs whose clients give up (``--client-timeout``): the only ones that compile
    :func:`abort_timed_out` (``njit``'s lazy)."""
    return config[HAS_CLIENT_TIMEOUT] > 0


@njit(lazy=timing_out)
def abort_timed_out(s) -> None:
    """Abort the requests whose client has given up (module docstring): waiting ones leave the
    queue (in arrival order under FCFS, a preempted request returning to its front before
    everyone who arrived after it was admitted, so they are its first), running ones are freed
    where they stand."""
    c, clock = s.count, s.clock
    deadline = clock[NOW] - clock[CLIENT_TIMEOUT_S]  # sent at or before it: given up
    p = 0
    while p < c[WAITING_LEN]:
        i = waiting_at(s, p)
        if s.arrival_s[i] <= deadline:
            # np.int64: jit.njit's note on constants (p starts as the constant 0)
            reject_waiting(s, np.int64(p), i, np.int64(REJECT_CLIENT_TIMEOUT))
        elif policies.arrival_ordered(s):
            break  # everyone after it was sent later
        else:
            p += 1
    kept = 0
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if s.arrival_s[i] > deadline:
            s.running[kept] = i
            kept += 1
            continue
        release(s, i, V1_TRAITS)
        s.status[i] = REJECTED
        s.reject_code[i] = REJECT_CLIENT_TIMEOUT
        c[NUM_REJECTED] += 1
    c[NUM_RUNNING] = kept


@njit(inline=True)
def schedule_running(s):
    """The running list, in order, while the budget lasts: each request's next tokens (the rest
    of its prompt within the budget, or one decode token), its blocks grown for them, the
    policy's victim preempted while they cannot be (scheduler.py:926-980). Returns (the budget
    left, whether anyone was preempted, the decode context sum). ``in_decode`` marks the
    requests that decode in this step (``lifecycle.complete_step`` hands each a token), so it
    is cleared for those the budget does not reach.

    A victim scheduled earlier in this step gives its tokens back to the budget
    (scheduler.py:944-966; only the priority policy's victim can be one); a request that
    preempted itself computes nothing and the list goes on after it (scheduler.py:982-994:
    under FCFS it was the last, so the pass ends)."""
    c = s.count
    budget = s.config[MAX_BATCHED_TOKENS]
    draft_slots = s.config[SPEC_DRAFT_SLOTS]  # taken from the budget per request (speculative.py)
    preempted = False
    context_sum = 0
    k = 0
    while k < c[NUM_RUNNING] and budget > draft_slots:
        i = s.running[k]
        todo = s.prompt_target[i] - s.num_prompt_computed[i]
        if todo > 0:  # the rest of its prompt within the budget, a Mamba state's chunk cut at blocks
            n = aligned_chunk(s, i, s.num_computed_tokens[i], min(todo, budget - draft_slots))
            if n == 0:  # no block-aligned chunk fits: skipped this step (scheduler.py:891-909)
                kv_cache.in_flight(s, i, 0)
                k += 1
                continue
        else:  # its last sampled token, and its drafts (speculative.py)
            n = speculative.query_tokens(s, i, budget)
        kv_cache.free_processed(s, i, n)  # what left a sliding window first (kv_cache_manager.py:557-568)
        # the tokens its blocks hold after this step's (and the lookahead slots: speculative.py)
        high = speculative.tokens_to_hold(s, i, s.num_computed_tokens[i], n)
        while not kv_cache.can_grow(s, i, high):
            preempted = True
            v = policies.victim(s)
            if v < k:  # scheduled already in this step
                given_back, context = unschedule(s, s.running[v])
                budget += given_back + draft_slots
                context_sum -= context
                k -= 1
            # recompute (swap preemption is refused for vllm-v1)
            if preempt_v1(s, v) == i:
                break
        if s.status[i] != RUNNING:  # it preempted itself: running[k] is now the one after it
            continue
        kv_cache.grow(s, i, high)
        speculative.leave(s, i)
        if todo > 0:  # (in_decode is 0: a request decodes once its prompt is done)
            prefill(s, i, n, V1_TRAITS)
        else:
            if not s.in_decode[i]:
                s.in_decode[i] = 1
                c[DECODE_SET_SIZE] += 1
            kv_cache.compute_tokens(s, i, 1, V1_TRAITS)
            # (its drafts, the query tokens beyond its first, read their context too: 0 without)
            context_sum += speculative.verify_context(s.num_computed_tokens[i], n - 1)
        speculative.scheduled(s, i, high, 0 if todo > 0 else n - 1)
        budget -= n + draft_slots
        k += 1
    for m in range(k, c[NUM_RUNNING]):  # the budget ran out before them: no token this step
        i = s.running[m]
        kv_cache.in_flight(s, i, 0)
        if s.in_decode[i]:
            s.in_decode[i] = 0
            c[DECODE_SET_SIZE] -= 1
    c[STEP_DECODE_SEQS] = c[DECODE_SET_SIZE]
    return budget, preempted, context_sum, k


@njit
def unschedule(s, i):
    """Running request ``i``, scheduled earlier in this step, is about to be preempted: its
    prefill chunk leaves the step (the chunks after it keep their order), or its decode token's
    context leaves the sum. Returns (its tokens this step, its decode context)."""
    c = s.count
    for k in range(c[STEP_PREFILL_SEQS]):
        if s.step_prefill_ids[k] != i:
            continue
        n = s.step_prefill_tokens[k]
        for m in range(k, c[STEP_PREFILL_SEQS] - 1):
            s.step_prefill_ids[m] = s.step_prefill_ids[m + 1]
            s.step_prefill_tokens[m] = s.step_prefill_tokens[m + 1]
            s.step_prefill_context[m] = s.step_prefill_context[m + 1]
        c[STEP_PREFILL_SEQS] -= 1
        c[STEP_PREFILL_TOKENS] -= n
        return n, 0
    drafts = speculative.unscheduled(s, i) if speculative.speculating(s.config) else 0
    # a decode: its tokens and context sum term (schedule_running)
    return 1 + drafts, speculative.verify_context(s.num_computed_tokens[i], drafts)


@njit(lazy=prefix_cache.several_groups)
def mamba_aligned_split(s, i: int, start: int, n: int, junction: int) -> int:
    """MAMBA_ALIGN: request ``i``'s prompt chunk of ``n`` tokens from ``start`` (its computed tokens
    and hit), cut where a Mamba state must be cached (``_mamba_block_aligned_split``,
    sched/scheduler.py:546-663): a chunk ending before ``prefill_end = max(P, num_tokens - 1)`` (a
    resumed request replays its outputs) ends on a block boundary, floored (nothing when under a
    block: :612-619); and it stops at the first of these strictly inside it: the next boundary from a
    mid-block start (:648-652), the last boundary below its tokens, ``floor((num_tokens - 1) / block)
    * block`` (``get_mamba_prefill_checkpoint_position``, kv_cache_interface.py:1169-1186), and its
    ``junction`` (tokens; 0: none) floored to a block from ``start`` (:632-647). Returns the tokens
    (0: a running request is skipped, a waiting one ends the waiting loop: :891-909, :1357-1358)."""
    bs = s.config[BLOCK_SIZE]
    num_tokens = s.prompt_target[i]  # vLLM's request.num_tokens while it prefills: prompt and outputs
    prefill_end = max(s.prompt_tokens[i], num_tokens - 1)
    if start >= prefill_end:
        return n
    end = start + n
    if end < prefill_end:
        aligned = end // bs * bs
        if aligned > start or bs <= s.config[MAX_BATCHED_TOKENS]:
            end = aligned
    stop = end
    if start % bs and start < (start // bs + 1) * bs < stop:
        stop = (start // bs + 1) * bs
    last_cache = (num_tokens - 1) // bs * bs
    if start < last_cache < stop:
        stop = last_cache
    if start < junction < end:
        floored = start + (junction - start) // bs * bs
        if start < floored < stop:
            stop = floored
    return max(stop - start, 0)


@njit(inline=True)
def aligned_chunk(s, i, start, n):
    """Request ``i``'s prompt chunk of ``n`` tokens from ``start``: in Mamba "align" mode cut where a
    state must be cached (:func:`mamba_aligned_split`, at its shared-prefix junction), else ``n``."""
    if not s.config[MAMBA_ALIGN]:
        return n
    return mamba_aligned_split(s, i, start, n, s.window[i, WINDOW_JUNCTION])


@njit(inline=True)
def first_chunk_fits(s, i, target, room):
    """Whether waiting request ``i``'s (``target`` tokens) first chunk, within ``room`` tokens,
    schedules any: in Mamba "align" mode, cut at blocks from its prefix-cache hit before its blocks
    are counted (scheduler.py:1350-1358: none ends the pass); always otherwise."""
    if not s.config[MAMBA_ALIGN]:
        return True
    hit, junction = prefix_cache.group_hits(s, i, target)
    start = hit * s.config[BLOCK_SIZE]
    return mamba_aligned_split(s, i, start, min(target - start, room), junction * s.config[BLOCK_SIZE]) > 0


@njit(inline=True)
def blocks_to_admit(s, i, num_tokens):
    """The available blocks admitting request ``i`` with ``num_tokens`` tokens (its whole
    sequence) consumes: its blocks, less the hits, plus the hits nobody holds (taken out of
    the free queue); vLLM v1's ``get_num_blocks_to_allocate``
    (single_type_kv_cache_manager.py:214-266)."""
    if s.config[PREFIX_CACHING]:
        return kv_cache.blocks_to_allocate(s, i, num_tokens)
    return kv_cache.blocks_for_sequence(s, num_tokens)


@njit(inline=True)
def first_visible(s, in_flight, skipped):
    """The first position past the waiting queue's holding part (``lifecycle.hold_waiting``) and
    the ``skipped`` positions after it this pass may admit from, -1 for none. Under async
    scheduling with a step in flight, a request that arrived after the previous scheduling
    decision is not in vLLM's queue yet (module docstring): FCFS's queue is in arrival order, so
    if its first is not visible nobody is; under priority later arrivals may stand anywhere."""
    c = s.count
    start = c[KV_HOLDING_WAITING] + skipped
    if not (s.config[ASYNC_SCHEDULING] and in_flight):
        return start if start < c[WAITING_LEN] else -1
    for p in range(start, c[WAITING_LEN]):
        if s.arrival_s[waiting_at(s, p)] <= s.clock[LAST_SCHEDULE_S]:
            return p
        if policies.arrival_ordered(s):
            break
    return -1


@njit
def lookahead_end(s, i, target, budget, drafts):
    """Speculative decoding with lookahead slots or a padded token: the tokens admitting request
    ``i`` grows its blocks to hold (kv_cache_manager.py:548-551, after the whole-sequence test
    :530-546): its prefix-cache hits, its first chunk within ``budget`` (its one token and
    ``drafts`` placeholders when padded: speculative.pads), and the lookahead slots."""
    cached = prefix_cache.hit_tokens(s, i, target)
    return min(cached + min(target - cached, budget) + drafts + s.config[SPEC_LOOKAHEAD], s.config[MAX_SEQ_LEN])


@njit(inline=True)
def admission_blocks(s, i, target, room, drafts, loads):
    """The available blocks admitting waiting request ``i`` (``target`` tokens) needs (``allocate_slots``'
    count, kv_cache_manager.py:518-588): its whole sequence's (:func:`blocks_to_admit`); with
    lookahead slots or placeholder ``drafts`` (speculative.py), its first chunk's within ``room``
    tokens and those too, unless it ``loads`` its KV first (which schedules no token now:
    scheduler.py:1285-1288, 1395-1400); and over sliding-window groups with prefix caching, its
    first chunk's with a sliding group's uncapped: with a hit, more than the whole sequence's
    capped count (kv_cache_manager.py:570-588)."""
    need = blocks_to_admit(s, i, target)
    if (s.config[SPEC_LOOKAHEAD] and not loads) or drafts:
        need = max(need, blocks_to_admit(s, i, lookahead_end(s, i, target, room, drafts)))
    if s.config[SLIDING_GROUPS] and s.config[PREFIX_CACHING]:
        need = max(need, kv_cache.group_blocks_to_allocate(s, i, lookahead_end(s, i, target, room, drafts), False))
    return need


@njit(inline=True)
def holding_step(s, i, budget, running_prefill, scheduled_running):
    """Request ``i``, holding blocks whose KV has arrived, as a pass with ``budget`` tokens left
    would schedule it: the placeholder drafts padding its one token left (-1: padded past the
    budget: speculative.padded_drafts) and the tokens its blocks must then hold (its chunk and
    the lookahead slots: speculative.slots_needed)."""
    cached, target = s.num_computed_tokens[i], s.prompt_target[i]
    drafts = speculative.padded_drafts(s, cached, target, budget, running_prefill, scheduled_running)
    if drafts < 0:
        return -1, 0
    n = min(target - cached, budget - s.config[SPEC_DRAFT_SLOTS])
    return drafts, speculative.slots_needed(s, i, n + drafts)


@njit(inline=True)
def holding_fits(s, i, end):
    """Whether request ``i``, holding blocks whose KV has arrived, may be admitted: its whole
    sequence and the ``end`` tokens its first step grows it to (:func:`holding_step`) fit the
    free blocks with those it holds, less the watermark while something runs (a promoted request
    is WAITING to ``allocate_slots``: kv_cache_manager.py:518-551)."""
    watermark = s.config[WATERMARK_BLOCKS] if s.count[NUM_RUNNING] else 0
    need = kv_cache.blocks_for(s, max(s.prompt_target[i], end)) - s.num_blocks[i]
    return need + watermark <= kv_cache.num_free_blocks(s)


@njit
def holding_admissible(s):
    """Whether the next pass would admit a request holding blocks, its KV arrived (the loop's
    question when a pass scheduled nothing and nothing runs: ``sim/core/events/loop.py``)."""
    p = first_arrived(s)
    if p < 0:
        return False
    i = waiting_at(s, p)
    drafts, end = holding_step(s, i, s.config[MAX_BATCHED_TOKENS], False, False)
    return drafts >= 0 and holding_fits(s, i, end)


@njit(inline=True)
def admit_waiting(s, budget):
    """Waiting requests, while the budget lasts and fewer than ``max_num_seqs`` run: those
    holding KV blocks whose KV has arrived first (``lifecycle.hold_waiting``), then the rest in
    the policy's order: the prefix cache's hits and the first chunk of the rest, if the whole
    sequence fits; the first that does not ends the pass (scheduler.py:1050-1600). Under async
    scheduling with a step in flight (someone running: nobody was preempted, or this pass would
    not run), only those that arrived by the previous scheduling decision (:func:`first_visible`).
    The features meet it where vLLM's loop meets them, each through its own file's hooks: the
    CPU offload tier (``host_tier``) and a disaggregated replica's connector (``remote_kv``),
    speculative decoding (``speculative``), KV cache groups (``kv_cache``, :func:`admission_blocks`)
    and Mamba's block-aligned chunks (:func:`first_chunk_fits`, :func:`aligned_chunk`)."""
    c = s.count
    in_flight = c[NUM_RUNNING] > 0
    draft_slots = s.config[SPEC_DRAFT_SLOTS]  # taken from the budget per request (speculative.py)
    skipped = 0  # the positions past the holding part this pass passes over (skip_request: they keep them)
    # what speculative.pads reads of the running list's pass: a request scheduled mid-prompt, any scheduled
    running_prefill, scheduled_running = c[STEP_PREFILL_SEQS] > 0, budget < s.config[MAX_BATCHED_TOKENS]
    while budget > draft_slots and c[WAITING_LEN]:
        p = first_arrived(s) if c[KV_HOLDING_WAITING] else -1  # those holding KV blocks first
        # the seats taken: the running list's and the host loads' (a transfer's waiting request
        # holds none, as in vLLM); one whose load has ended takes its own
        seats = c[NUM_RUNNING] + host_tier.seats_loading(s, waiting_at(s, p) if p >= 0 else -1)
        if seats >= s.config[MAX_NUM_SEQS]:
            break
        if p < 0:
            p = first_visible(s, in_flight, skipped)
        if p < 0:
            break
        i = waiting_at(s, p)
        target = s.prompt_target[i]  # the prompt, and the tokens generated before a preemption
        drafts = 0  # placeholder drafts padding its one token (speculative.pads)
        loaded = p < c[KV_HOLDING_WAITING]
        if loaded:  # its KV has arrived: admitted as any request, its blocks held
            drafts, end = holding_step(s, i, budget, running_prefill, scheduled_running)
            if drafts < 0:
                break
            if not holding_fits(s, i, end):
                c[DEMAND_WAITING] = 1
                break
            take_holding(s, p)
            cached = host_tier.arrived(s, i)
        else:
            if not remote_kv.table_row_free(s):
                break
            if s.width[i] > 1:  # n / beam_width > 1: v1 fans n out into separate requests
                reject_waiting(s, p, i, np.int64(REJECT_WIDTH_UNSHARED))  # np.int64: jit.njit's note on constants
                continue
            if (s.final_len[i] > s.config[MAX_SEQ_LEN]
                    or kv_cache.blocks_for_sequence(s, s.final_len[i]) > s.config[NUM_BLOCKS]):
                reject_waiting(s, p, i, np.int64(REJECT_NEVER_FITS))  # np.int64: jit.njit's note on constants
                continue
            gpu_hits, revived, host_hits = host_tier.lookup(s, i, target)  # before any block is counted
            if host_hits and host_tier.being_loaded(s, i, gpu_hits, host_hits):
                skipped = p - c[KV_HOLDING_WAITING] + 1  # it waits; those behind it may go
                continue
            if not first_chunk_fits(s, i, target, budget - draft_slots):
                break
            drafts = speculative.admission_drafts(s, i, target, budget, running_prefill, scheduled_running,
                                                  host_hits)
            if drafts < 0:  # one token left, padded to 1 + K past the budget: nobody is admitted
                break
            watermark = s.config[WATERMARK_BLOCKS] if c[NUM_RUNNING] else 0
            need = admission_blocks(s, i, target, budget - draft_slots, drafts, host_hits)
            remote = remote_kv.prompt_is_remote(s, i)
            # a load (a host load below, a transfer) leaves the prefills in flight their blocks
            # (allocate_slots' reserved_blocks, kv_cache_manager.py:579-588; scheduler.py:1420-1430)
            if need + watermark > kv_cache.num_free_blocks(s) - host_tier.reserved_for(s, remote):
                c[DEMAND_WAITING] = 1
                break
            if host_hits:  # it takes its hits' blocks and waits in the queue's holding part for the load
                if not host_tier.load_on_admission(s, i, target, gpu_hits, revived, host_hits, watermark):
                    c[DEMAND_WAITING] = 1
                    break
                take_waiting(s, p)
                hold_waiting(s, i)
                continue
            take_waiting(s, p)
            remote_kv.note_admitted(s, i)
            if remote:  # its blocks taken, it waits for the prefill side's KV
                remote_kv.admit_remote(s, i, target)
                continue
            cached = kv_cache.allocate_admitted(s, i, target)
        n = aligned_chunk(s, i, cached, min(target - cached, budget - draft_slots))
        high = speculative.tokens_to_hold(s, i, cached, n + drafts)  # (and its lookahead slots)
        kv_cache.grow(s, i, high)
        s.num_prompt_computed[i] = cached
        kv_cache.in_flight(s, i, n)
        start_running(s, i)
        prefill(s, i, n, V1_TRAITS)
        host_tier.admitted_prefill(s, i, loaded)
        speculative.scheduled(s, i, high, drafts)
        budget -= n + drafts + draft_slots
    return budget
