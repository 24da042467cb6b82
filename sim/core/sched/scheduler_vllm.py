"""vLLM's scheduler (v0: vLLM 0.4.2's ``vllm/core/scheduler.py``, the 2023 paper's system) over
the core's arrays; each rule's source line in ``docs/guide/systems.md``.

One iteration (:func:`schedule`):

1. prefill-first (the default): while nobody is swapped out, admit waiting requests (only when
   waiting / running reaches ``waiting_served_ratio``, where it is set, or nothing runs) FCFS
   while ``max_num_batched_tokens``, ``max_num_seqs`` and memory allow, and run only their
   prompts; with no prompt to run, decode: the running list sorted by arrival (:func:`arrival_order`),
   one token for every running request, preempting
   the policy's victim (FCFS: the latest arrival, ``policy_fcfs.py``) while a request at its
   turn lacks a free block per sequence (:func:`decode`); then, if nobody was preempted,
   swapped requests come back by arrival and decode too (:func:`resume_swapped`);
2. chunked prefill: one token budget (``chunk_budget``); the running requests by arrival, each
   its decode or its prompt's next chunk while the budget lasts, preempting the latest arrival
   while one at its turn lacks room (:func:`run_in_order`); then, if nobody was preempted,
   swap-ins; then new prompts, not those this step preempted; the running list then in vLLM's
   order (:func:`arrival_order`).

With prefix caching an admission holds the prompt's cached blocks and computes past those of
them marked computed (vLLM 0.4.2 marks a block one full block behind: ``kv_cache.mark_computed``);
whether it fits counts every block of its prompt, hits too (vLLM 0.4.2's ``can_allocate``), and so
does the token budget.

Parallel sampling (``n``): a request is admitted when its ``n`` sequences fit
``max_num_seqs`` (and takes ``n`` of it from then on, its prompt phase too, as a vLLM v0
``SequenceGroup``: ``lifecycle.start_running``), prefills once, then forks; its sequences decode in
lockstep and are preempted, swapped (back sharing their prompt's blocks, as they left) and
finished together. A request with more sequences than ``max_num_seqs`` is rejected at arrival.

A preempted request is swapped to the CPU (``--preemption swap``, or it runs several
sequences; while swap space lasts; mid-prompt too) or recomputed: its blocks are freed
and it goes back to the front of the queue with its generated tokens as prompt. A waiting
head that did not fit is not retried until something is freed (it cannot fit before). What
every scheduler shares (the queues, preemption's mechanics, the end of a step) is
``lifecycle.py``'s; what the contiguous manager changes (Orca) is ``scheduler_orca.py``'s.
"""

from __future__ import annotations

from pagesim.sim.core.kv import kv_cache, memory
from pagesim.sim.core.sched import policies, scheduler_orca
from pagesim.sim.core.price.cost import kernel_read_tokens
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.sched.lifecycle import (begin_iteration, pop_waiting, preempt_continuous, prefill, reject_head,
                                               restart, start_running, waiting_head)
from pagesim.sim.core.compile.families import BLOCK_TABLE, EXTENTS, TRAITS
from pagesim.sim.core.state import CONTINUOUS, CONTINUOUS_CONTIGUOUS

#: the traits of this scheduler's family over paged memory (``families.TRAITS``)
PAGED_TRAITS = TRAITS[CONTINUOUS]
from pagesim.sim.core.state import (BLOCKED_ON_MAX_SEQS, BLOCKED_ON_MEMORY, CHUNK_BUDGET, COMPUTED_SLOTS,
                                    DECODE_SET_SIZE, DEMAND_WAITING, FREE_EPOCH, MAX_BATCHED_TOKENS,
                                    MAX_NUM_SEQS, NOT_BLOCKED, NUM_PREEMPTIONS, NUM_RUNNING,
                                    NUM_RUNNING_SEQS, NUM_SWAP_FALLBACKS, PREFIX_CACHING, NUM_REJECTED,
                                    REJECT_NEVER_FITS, REJECT_OVER_BATCHED_TOKENS, REJECT_TOO_WIDE,
                                    REJECT_WIDTH_UNSHARED, REJECTED, SCHEDULED_STEPS, STEP_DECODE_SEQS,
                                    STEP_PREFILL_SEQS, STEP_PREFILL_TOKENS, STEP_SWAP_IN,
                                    STEP_SWAP_OUT_BLOCKS, STEP_SWAP_OUT_EARLY, SWAP_USED_TOKENS,
                                    SWAPPED_HEAD, SWAPPED_LEN, WAITING_HEAD, WAITING_LEN)
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    CHUNKED_PREFILL     1: a prompt's prefill may be split over iterations
    FREE_BLOCK_PER_SEQ  1: vLLM v0's append rule, a free block for each decoding sequence
    HAS_WAITING_SERVED_RATIO  1: clock[WAITING_SERVED_RATIO] holds vLLM v0's ratio
    FORKS_SHARE_BLOCKS  1: a request's sequences share their prompt's blocks
    KERNEL_BLOCK        the tokens the decode attention kernel reads a sequence's KV in: the
        block size under vLLM v0's PagedAttention kernel (it reads whole blocks,
        sim.core.cost.kernel_read_tokens), 1 for a kernel that reads each cached token once
        (SimConfig.kernel_block_tokens)
    SWAPS               1: a request may be swapped out (swap space, and --preemption swap or a
        request of several sequences: lifecycle.preempt), so swapped in (resume_swapped)
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    BLOCKED_REQUEST     the waiting head that did not fit (-1: none)
    BLOCKED_EPOCH       FREE_EPOCH when it did not fit: not retried until something is freed
    BLOCKED_KIND        what blocked it (NOT_BLOCKED, BLOCKED_ON_MEMORY, BLOCKED_ON_MAX_SEQS)
    SWAP_IN_BUDGET      the token budget a step's swap-ins left (resume_swapped's: it returns their context)
    RUNNING_UNSORTED    1: a request joined the running list behind a later arrival (join_running)
        since the decode pass last read it (0: the list is in arrival order)
""")

# Core.clock: this file's entries, in its room of the shared table (sim/core/state.py)
section("clock", globals(), """
    WAITING_SERVED_RATIO  vLLM v0's waiting-served ratio (see HAS_WAITING_SERVED_RATIO)
""")


# -- admission ------------------------------------------------------------------------------
@njit(inline=True)
def head_still_blocked(s):
    """Whether the waiting head is the one that last failed to fit, with nothing freed since:
    it cannot fit before (what it needs is fixed, prefix caching's hits included, and the free
    blocks only shrink until something is freed: ``check.check_blocked_head`` checks)."""
    c = s.count
    if (c[BLOCKED_KIND] == NOT_BLOCKED or c[WAITING_LEN] == 0 or c[BLOCKED_REQUEST] != waiting_head(s)
            or c[BLOCKED_EPOCH] != c[FREE_EPOCH]):
        c[BLOCKED_KIND] = NOT_BLOCKED
        return False
    if c[BLOCKED_KIND] == BLOCKED_ON_MEMORY:
        c[DEMAND_WAITING] = 1
    return True


@njit(inline=True)
def may_admit(s):
    """``waiting_served_ratio`` (optional): new requests are admitted only when waiting /
    running reaches it, or nothing runs (text-generation-inference's ``waiting_served_ratio``)."""
    c = s.count
    if not s.config[HAS_WAITING_SERVED_RATIO] or c[NUM_RUNNING] == 0:
        return True
    return c[WAITING_LEN] / c[NUM_RUNNING] >= s.clock[WAITING_SERVED_RATIO]


# called from two places (inlined it would be compiled twice): a call, one per family (:func:`per_family`)
def admit_waiting_for(traits):
    def admit_waiting(s, budget):
        """FCFS while the token budget, max_num_seqs and memory allow. Prefill-first: whole
        prompts within max_num_batched_tokens; chunked: as much of a prompt as the budget holds."""
        c, chunked = s.count, s.config[CHUNKED_PREFILL]
        while c[WAITING_LEN] and (budget > 0 or not chunked):
            i = waiting_head(s)
            target = s.prompt_target[i]
            if s.width[i] > 1 and not s.config[FORKS_SHARE_BLOCKS]:  # its forks would copy whole reservations
                reject_head(s, i, REJECT_WIDTH_UNSHARED)
                continue
            if c[NUM_RUNNING_SEQS] + s.width[i] > s.config[MAX_NUM_SEQS]:
                blocked = BLOCKED_ON_MAX_SEQS
            elif not chunked and target > s.config[MAX_BATCHED_TOKENS]:
                reject_head(s, i, REJECT_OVER_BATCHED_TOKENS)
                continue
            elif not chunked and target > budget:
                break  # this iteration's budget is spent; nothing to remember
            else:
                fits = memory.can_allocate(s, i, target, traits)
                if fits == kv_cache.NEVER_FITS:
                    reject_head(s, i, REJECT_NEVER_FITS)
                    continue
                if fits == kv_cache.CAN_ALLOCATE:
                    pop_waiting(s)
                    cached = memory.allocate(s, i, target, 0, traits)  # prefix-cache hits hold their K/V
                    s.num_prompt_computed[i] = cached
                    join_running(s, i)
                    todo = target - cached
                    n = budget if chunked and budget < todo else todo
                    prefill(s, i, n, traits)
                    budget -= n
                    if traits & BLOCK_TABLE and s.config[PREFIX_CACHING] and not chunked:
                        # vLLM 0.4.2 computes again the hits not marked computed (its model runner
                        # skips computed_block_nums only: worker/model_runner.py:271-275), and its
                        # budget counts the whole prompt (scheduler.py:701)
                        again = cached - kv_cache.computed_prefix_tokens(s, i)
                        s.step_prefill_tokens[c[STEP_PREFILL_SEQS] - 1] += again
                        c[STEP_PREFILL_TOKENS] += again
                        budget -= cached
                    continue
                c[DEMAND_WAITING] = 1
                blocked = BLOCKED_ON_MEMORY
            c[BLOCKED_KIND] = blocked  # not retried until something is freed
            c[BLOCKED_REQUEST] = i
            c[BLOCKED_EPOCH] = c[FREE_EPOCH]
            break
        return budget

    return admit_waiting


# called from two places, and only while a request is swapped out: a call, one per family
def swapping(config):
    """The runs that may swap a request out (``config[SWAPS]``): the only ones that swap one in,
    and that compile the swap-ins (``njit``'s lazy: ``pagesim reproduce fig2``'s runs recompute)."""
    return config[SWAPS] > 0


def resume_swapped_for(traits):
    def resume_swapped(s, budget: int) -> int:
        """Swap requests back in, by arrival (the swapped queue's order, ``lifecycle.preempt``),
        while each fits, in memory, in ``max_num_seqs`` and in the token budget left (a token per
        sequence, or the rest of its prompt, unchunked: ``_schedule_swapped``,
        ``scheduler.py:547-558``); each runs in this step as it left, its next token or (swapped
        out mid-prompt under chunked prefill) the rest of its prompt (``:564-571``). Called after the
        running requests' turn, in a step that preempted nobody (``:757-766``, ``:838-846``).
        Returns their decode context, the budget left in ``count[SWAP_IN_BUDGET]`` (a lazy
        function returns one number)."""
        c = s.count
        context_sum = 0
        while c[SWAPPED_LEN]:
            i = s.swapped[c[SWAPPED_HEAD]]
            w = s.num_seqs[i]
            todo = s.prompt_target[i] - s.num_prompt_computed[i]
            # a rest of prompt longer than the whole budget comes back a chunk at a time: vLLM 0.4.2
            # would never swap it back in, nor anyone swapped after it (pagesim's rule)
            need = w if todo <= 0 else todo if todo <= s.config[CHUNK_BUDGET] else 1
            whole = s.config[CHUNK_BUDGET] if s.config[CHUNKED_PREFILL] else s.config[MAX_BATCHED_TOKENS]
            if todo <= 0 and w > whole:
                # its sequences decode together, a token each, in more than an iteration's whole token
                # budget: vLLM 0.4.2 never swaps it back in (budget.can_schedule, scheduler.py:553-563;
                # it refuses a budget below max_num_seqs at start, config.py:649-653), so it fails as a
                # group that can never fit does (AllocStatus.NEVER, scheduler.py:529-538)
                c[SWAPPED_HEAD] = (c[SWAPPED_HEAD] + 1) % len(s.swapped)
                c[SWAPPED_LEN] -= 1
                c[SWAP_USED_TOKENS] -= kv_cache.swapped_size(s, i, s.swapped_tokens[i])
                s.status[i] = REJECTED
                s.reject_code[i] = REJECT_TOO_WIDE
                c[NUM_REJECTED] += 1
                continue
            if c[NUM_RUNNING_SEQS] + s.width[i] > s.config[MAX_NUM_SEQS] or need > budget:
                break
            n = s.swapped_tokens[i]
            # its blocks come back if they fit (vLLM's can_swap_in: kv_cache.swap_in; a contiguous
            # extent is Orca's, scheduler_orca.swap_in)
            fits = scheduler_orca.swap_in(s, i, n) if traits & EXTENTS else kv_cache.swap_in(s, i, n)
            if not fits and c[NUM_RUNNING]:
                c[DEMAND_WAITING] = 1
                break
            c[SWAPPED_HEAD] = (c[SWAPPED_HEAD] + 1) % len(s.swapped)
            c[SWAPPED_LEN] -= 1
            moved = kv_cache.swapped_size(s, i, n)
            c[SWAP_USED_TOKENS] -= moved
            if not fits:  # nothing else holds memory: it can never come back
                c[NUM_SWAP_FALLBACKS] += 1
                restart(s, i)
                continue
            c[STEP_SWAP_IN] += moved
            if kv_cache.swaps_recorded(s.config):
                kv_cache.record_swap(s, i, False)  # the blocks its K/V come back into
            # at the running list's end, as vLLM 0.4.2 extends it (scheduler.py:779); both modes
            # sort it by arrival before the next decode pass (arrival_order)
            join_running(s, i)
            if todo > 0:
                s.num_prompt_computed[i] = s.num_computed_tokens[i]  # prefix caching may hold more
                todo = min(s.prompt_target[i] - s.num_prompt_computed[i], budget)
                prefill_cold(s, i, todo, traits)
                budget -= todo
                continue
            s.in_decode[i] = 1
            c[DECODE_SET_SIZE] += w
            memory.joined_decode(s, i, traits)
            context_sum += decode_token_cold(s, i, s.config[KERNEL_BLOCK], traits)
            c[COMPUTED_SLOTS] += w
            c[STEP_DECODE_SEQS] += w
            budget -= w
        c[SWAP_IN_BUDGET] = budget
        return context_sum

    # a name of each family's own: a lazy function's entry is found by its module and name
    resume_swapped.__qualname__ += "_contiguous" if traits & EXTENTS else "_paged"
    return resume_swapped


@njit(inline=True)
def decode_token(s, i, kernel_block, traits):
    """Request ``i``'s sequences take their next token's slot; returns the context they read."""
    memory.take_decode_slot(s, i, traits)
    s.num_computed_tokens[i] += 1
    return kernel_read_tokens(s.num_computed_tokens[i], kernel_block) * s.num_seqs[i]


# the chunked pass's and the swap-ins' (colder than decode's loop): over paged memory calls, not
# more inlined copies of a token's and a chunk's memory paths for numba to compile; over
# contiguous extents, which take no memory there, inlined
@njit
def decode_token_call(s, i, kernel_block):
    return decode_token(s, i, kernel_block, PAGED_TRAITS)


@njit
def prefill_call(s, i, n):
    prefill(s, i, n, PAGED_TRAITS)


@njit(inline=True)
def decode_token_cold(s, i, kernel_block, traits):
    if traits & EXTENTS:
        return decode_token(s, i, kernel_block, traits)
    return decode_token_call(s, i, kernel_block)


@njit(inline=True)
def prefill_cold(s, i, n, traits):
    if traits & EXTENTS:
        prefill(s, i, n, traits)
    else:
        prefill_call(s, i, n)


# called from two places (inlined it would be compiled twice): a call, one per family
def decode_for(traits):
    def decode(s):
        """One token for every request in the decode set, in running order; returns their
        context sum. As vLLM 0.4.2's running pass does (``Scheduler._schedule_running``,
        ``scheduler.py:410-448``), each request at its turn needs room (:func:`room_at_turn`, the
        chunked pass's rule too), else the policy's victim (FCFS: the latest arrival, after it in
        the list) is preempted until it has room or was the victim itself, and it takes its
        token's slot before the next request is asked. With as many free blocks as decoding
        sequences nobody is asked: a sequence takes at most one block (a fresh one at a block
        boundary, or a copy of a tail it shares). A contiguous extent makes room by Orca's rule
        (``scheduler_orca.make_decode_room``)."""
        c = s.count
        if traits & EXTENTS:
            scheduler_orca.make_decode_room(s)
        asked = traits & BLOCK_TABLE and c[DECODE_SET_SIZE] > kv_cache.num_free_blocks(s)
        context_sum = 0
        running, in_decode = s.running, s.in_decode
        kernel_block = s.config[KERNEL_BLOCK]  # read once, not per member
        k = 0
        while k < c[NUM_RUNNING]:
            i = running[k]
            if in_decode[i]:
                if asked and not room_at_turn(s, k):
                    break  # it was the last, and preempted itself
                context_sum += decode_token(s, i, kernel_block, traits)
            k += 1
        c[COMPUTED_SLOTS] += c[DECODE_SET_SIZE]  # once, not per member: a store per member costs
        c[STEP_DECODE_SEQS] = c[DECODE_SET_SIZE]
        return context_sum

    return decode


@njit(inline=True)
def schedule(s, traits):
    """One iteration's memory operations; returns the decode context sum."""
    c = s.count
    begin_iteration(s)
    context_sum = 0
    changes = -1
    for attempt in range(3):  # one call of the pass (inlined: one copy of its code)
        if attempt and (c[STEP_PREFILL_SEQS] or c[STEP_DECODE_SEQS]
                        or c[NUM_PREEMPTIONS] + c[NUM_SWAP_FALLBACKS] == changes
                        or not (c[WAITING_LEN] or c[SWAPPED_LEN] or c[NUM_RUNNING])):
            break
        if attempt:
            # the pass before scheduled nothing but preempted every running request, or sent a
            # swapped request that can never come back to be recomputed: vLLM's empty
            # iteration and its next one, at the same instant, are this one iteration
            c[STEP_SWAP_OUT_EARLY] = c[STEP_SWAP_OUT_BLOCKS]  # swapped out before the next pass swaps in
        changes = c[NUM_PREEMPTIONS] + c[NUM_SWAP_FALLBACKS]
        context_sum = schedule_pass(s, traits)
    if traits & BLOCK_TABLE and s.config[PREFIX_CACHING]:  # (the paged manager's)
        mark_scheduled_computed(s)
    return context_sum


@njit  # prefix caching's, once a step: a call
def mark_scheduled_computed(s):
    """Every request this step runs accesses its blocks and marks them computed (vLLM 0.4.2,
    once a step is scheduled: ``access_all_blocks_in_seq``, ``scheduler.py:942``, and
    ``scheduler.py:986-991``; kv_cache.mark_computed). The access is the request's: its blocks
    take its step as they are let go (kv_cache.release_seq), not each one every step."""
    c = s.count
    c[SCHEDULED_STEPS] += 1
    for k in range(c[STEP_PREFILL_SEQS]):
        s.last_scheduled_step[s.step_prefill_ids[k]] = c[SCHEDULED_STEPS]
        kv_cache.mark_computed(s, s.step_prefill_ids[k])
    if c[STEP_DECODE_SEQS]:
        for k in range(c[NUM_RUNNING]):
            if s.in_decode[s.running[k]]:
                s.last_scheduled_step[s.running[k]] = c[SCHEDULED_STEPS]
                kv_cache.mark_computed(s, s.running[k])


@njit(inline=True)
def schedule_pass(s, traits):
    c = s.count
    c[DEMAND_WAITING] = 0
    preemptions = c[NUM_PREEMPTIONS]
    if not s.config[CHUNKED_PREFILL]:
        # prefill-first: new prompts only, else decode. While a request stays swapped out nobody
        # new is admitted (vLLM 0.4.2 scheduler.py:743-746; the blocked head is not looked at:
        # its shortcut's bookkeeping is left as it is)
        if not c[SWAPPED_LEN] and may_admit(s) and not head_still_blocked(s):
            admit_waiting(s, s.config[MAX_BATCHED_TOKENS], traits)
        if c[STEP_PREFILL_SEQS]:
            return 0
        # the running list sorted by arrival (stable) before its pass, as vLLM 0.4.2 sorts it
        # (scheduler.py:409): a recomputed request admitted after a later arrival came back from
        # swap is behind it until then, and the victim is the latest arrival (:430); read first
        # where a request joined behind a later arrival, as it is nearly always in order already
        if c[RUNNING_UNSORTED]:
            c[RUNNING_UNSORTED] = 0
            if not in_arrival_order(s):
                arrival_order(s, c[NUM_RUNNING], c[NUM_RUNNING], c[NUM_RUNNING])
        context_sum = decode(s, traits)
        if c[SWAPPED_LEN] and c[NUM_PREEMPTIONS] == preemptions:
            context_sum += resume_swapped(s, s.config[MAX_BATCHED_TOKENS] - c[STEP_DECODE_SEQS], traits)[0]
        return context_sum
    # chunked: one pass over the running requests, swap-ins (if nobody was preempted), then new
    # prompts, within one token budget (vLLM 0.4.2 ``_schedule_chunked_prefill``, scheduler.py:807-851)
    waiting_before = c[WAITING_LEN]
    budget, context_sum, reached = run_in_order(s, s.config[CHUNK_BUDGET], traits)
    swapped_in = c[NUM_RUNNING]
    if c[SWAPPED_LEN] and c[NUM_PREEMPTIONS] == preemptions:
        swapped_context, budget = resume_swapped(s, budget, traits)
        context_sum += swapped_context
    admitted = c[NUM_RUNNING]
    # this pass's recomputed requests rejoin the waiting queue's front after its admissions
    # (``self.waiting.extendleft(running_scheduled.preempted)``, scheduler.py:857-858): not
    # admitted in the step that preempted them
    returned, hidden_at = c[WAITING_LEN] - waiting_before, c[WAITING_HEAD]
    hide_waiting_front(s, returned)
    if may_admit(s) and not head_still_blocked(s):
        admit_waiting(s, budget, traits)
    unhide_waiting_front(s, returned, hidden_at)
    arrival_order(s, reached, swapped_in, admitted)
    return context_sum


# a chunked iteration's: a call, one per family
def run_in_order_for(traits):
    def run_in_order(s, budget):
        """vLLM 0.4.2's running pass under chunked prefill (``_schedule_running`` with
        ``enable_chunking``, ``scheduler.py:366-479``): the running requests by arrival, each its
        decode (a token per sequence) or its prompt's next chunk, the least of what is left and the
        budget left; the first that finds nothing left of the budget ends the pass, and the requests
        after it do not run this step (``in_decode`` is this step's decode set: theirs waits). A
        group of several sequences decodes all of them whatever is left (``_get_num_new_tokens``,
        ``:1139-1163``: only one sequence is chunked). At its turn a request needs room
        (:func:`room_at_turn`), else the latest arrival is preempted, itself when it is the last.
        Returns the budget left, the decode context sum and how many requests ran (the first of the
        running list)."""
        c = s.count
        for k in range(c[NUM_RUNNING]):  # a decode that waited last step is looked at anew
            i = s.running[k]
            if not s.in_decode[i] and s.num_prompt_computed[i] >= s.prompt_target[i]:
                s.in_decode[i] = 1
                c[DECODE_SET_SIZE] += s.num_seqs[i]
        if traits & EXTENTS:
            scheduler_orca.make_decode_room(s)
        kernel_block = s.config[KERNEL_BLOCK]
        context_sum = 0
        k = 0
        while k < c[NUM_RUNNING]:
            i = s.running[k]
            w = s.num_seqs[i]
            n = w if s.in_decode[i] else s.prompt_target[i] - s.num_prompt_computed[i]
            if w == 1:
                n = min(n, budget)
            if n <= 0 or (traits & BLOCK_TABLE and not room_at_turn(s, k)):
                break
            if s.in_decode[i]:
                context_sum += decode_token_cold(s, i, kernel_block, traits)
                c[COMPUTED_SLOTS] += w
                c[STEP_DECODE_SEQS] += w
            else:
                prefill_cold(s, i, n, traits)
            budget -= n
            k += 1
        for m in range(k, c[NUM_RUNNING]):  # not reached: no decode this step
            i = s.running[m]
            c[DECODE_SET_SIZE] -= s.in_decode[i] * s.num_seqs[i]
            s.in_decode[i] = 0
        return budget, context_sum, k

    return run_in_order


@njit(inline=True)
def room_at_turn(s, k):
    """Whether ``running[k]`` may run its step, after preempting the latest arrivals while it
    lacks room (itself, when it is the last: then it may not). Room (``append_rule``):
    ``free-block-per-seq``, vLLM's ``can_append_slots``, a free block per running sequence,
    asked of a prompt's chunk too (its blocks were all taken at admission;
    ``block_manager_v1.py:308-318``, asked at ``scheduler.py:420``); ``exact``, the blocks the
    step takes. A prompt's chunk alone in the list goes on without the free block (pagesim's
    rule: vLLM 0.4.2 preempts it, admits it again and so on for ever when its prompt's blocks
    leave none free, which a pool with a watermark of 0 blocks allows)."""
    i = s.running[k]
    while True:
        if s.config[FREE_BLOCK_PER_SEQ]:
            needed = s.num_seqs[i]
        else:
            needed = kv_cache.decode_blocks_needed(s, i) if s.in_decode[i] else 0
        if needed <= kv_cache.num_free_blocks(s) or (s.count[NUM_RUNNING] == 1 and not s.in_decode[i]):
            return True
        victim = policies.victim(s)
        preempt_continuous(s, victim)
        if victim == k:
            return False


@njit(inline=True)
def hide_waiting_front(s, n):
    """The waiting queue's first ``n`` leave it for a while (:func:`unhide_waiting_front`)."""
    c = s.count
    c[WAITING_HEAD] = (c[WAITING_HEAD] + n) % len(s.waiting)
    c[WAITING_LEN] -= n


@njit(inline=True)
def unhide_waiting_front(s, n, hidden_at):
    """The ``n`` hidden from ring position ``hidden_at`` go back to the front, in their order
    (the queue's head has moved on past them by what was admitted since)."""
    c, size = s.count, len(s.waiting)
    for j in range(n - 1, -1, -1):
        c[WAITING_HEAD] = (c[WAITING_HEAD] + size - 1) % size
        s.waiting[c[WAITING_HEAD]] = s.waiting[(hidden_at + j) % size]
    c[WAITING_LEN] += n


@njit(inline=True)
def join_running(s, i):
    """Request ``i`` joins the running list (``lifecycle.start_running``), the list marked where
    it joins behind a later arrival: a recomputed request admitted after a later one came back
    from swap. Leaving the list keeps the others' order, so an unmarked list is in arrival order."""
    c = s.count
    if c[NUM_RUNNING] and s.arrival_s[i] < s.arrival_s[s.running[c[NUM_RUNNING] - 1]]:
        c[RUNNING_UNSORTED] = 1
    start_running(s, i)


@njit(inline=True)
def in_arrival_order(s):
    """Whether the running list is in arrival order (equal arrivals in any order)."""
    running, arrival = s.running, s.arrival_s
    for k in range(1, s.count[NUM_RUNNING]):
        if arrival[running[k]] < arrival[running[k - 1]]:
            return False
    return True


@njit  # a chunked iteration's: a call
def arrival_order(s, reached, swapped_in, admitted):
    """The running list as vLLM 0.4.2 leaves it (``scheduler.py:860-869``) and sorts it at the
    next step (stable, by arrival: ``:409``): the requests the pass did not reach, the admitted,
    the decodes, the prompts' chunks, the swapped in decoding, then prefilling; then by arrival,
    those groups' order standing among equal arrivals (it decides the victim among them). The
    list's positions on entry: ``[0, reached)`` ran, up to ``swapped_in`` did not, up to
    ``admitted`` came back from swap, the rest were admitted."""
    c = s.count
    n = c[NUM_RUNNING]
    group = s.running_group
    for k in range(n):
        if k < reached:
            group[k] = 2 if s.in_decode[s.running[k]] else 3
        elif k < swapped_in:
            group[k] = 0
        elif k < admitted:
            group[k] = 4 if s.in_decode[s.running[k]] else 5
        else:
            group[k] = 1
    for k in range(1, n):  # insertion sort: stable, and the list is nearly in order
        i, g = s.running[k], group[k]
        m = k
        while m > 0 and (s.arrival_s[s.running[m - 1]] > s.arrival_s[i]
                         or (s.arrival_s[s.running[m - 1]] == s.arrival_s[i] and group[m - 1] > g)):
            s.running[m] = s.running[m - 1]
            group[m] = group[m - 1]
            m -= 1
        s.running[m] = i
        group[m] = g


def per_family(make):
    """``make(traits)`` compiled once for each family this scheduler runs in: over paged memory
    (``CONTINUOUS``) and over contiguous extents (``CONTINUOUS_CONTIGUOUS``), the family's traits a
    constant of each closure, so that numba compiles each family's manager into its own alone (as
    ``lifecycle.preempt_for``)."""
    return njit(make(TRAITS[CONTINUOUS])), njit(make(TRAITS[CONTINUOUS_CONTIGUOUS]))


admit_waiting_paged, admit_waiting_contiguous = per_family(admit_waiting_for)
resume_swapped_paged = njit(resume_swapped_for(TRAITS[CONTINUOUS]), lazy=swapping)
resume_swapped_contiguous = njit(resume_swapped_for(TRAITS[CONTINUOUS_CONTIGUOUS]), lazy=swapping)
decode_paged, decode_contiguous = per_family(decode_for)
run_in_order_paged, run_in_order_contiguous = per_family(run_in_order_for)


# the family's own, chosen where its ``traits`` are a constant (inlined into the family's scheduler)
@njit(inline=True)
def admit_waiting(s, budget, traits):
    return admit_waiting_contiguous(s, budget) if traits & EXTENTS else admit_waiting_paged(s, budget)


@njit(inline=True)
def resume_swapped(s, budget, traits):
    """The family's swap-ins (a lazy function): their decode context and the budget left."""
    if traits & EXTENTS:
        return resume_swapped_contiguous(s, budget), s.count[SWAP_IN_BUDGET]
    return resume_swapped_paged(s, budget), s.count[SWAP_IN_BUDGET]


@njit(inline=True)
def decode(s, traits):
    return decode_contiguous(s) if traits & EXTENTS else decode_paged(s)


@njit(inline=True)
def run_in_order(s, budget, traits):
    return run_in_order_contiguous(s, budget) if traits & EXTENTS else run_in_order_paged(s, budget)
