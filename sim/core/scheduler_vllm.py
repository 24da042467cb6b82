"""vLLM's scheduler (v0 semantics, as the 2023 paper's system) over the core's arrays.

One iteration (:func:`schedule`):

1. swapped requests come back first, FCFS; while any stays out, nobody new is admitted;
2. prefill-first (the default): admit waiting requests (only when waiting / running reaches
   ``waiting_served_ratio``, where it is set, or nothing runs) FCFS while ``max_num_batched_tokens``,
   ``max_num_seqs`` and memory allow, and run only their prompts; with no prompt to run,
   decode: one token for every running request, preempting the policy's victim (FCFS: the
   latest admitted, ``policy_fcfs.py``) while the free blocks cannot take the block boundaries
   crossed this step;
3. chunked prefill: decode first, then ongoing prefills, then new prompts, all within the
   token budget ``chunk_budget``.

With prefix caching an admission starts past the prompt's cached blocks, and a waiting head
that did not fit after others were admitted in the same prefill-first pass is not marked
blocked (their prompts' blocks may become its hits).

Parallel sampling (``n``): a request is admitted when its ``n`` sequences fit
``max_num_seqs`` (it counts as one running sequence until its fork, as a
vLLM v0 ``SequenceGroup`` in its prompt phase), prefills once, then forks; its sequences decode in
lockstep and are preempted, swapped (each in blocks of its own on the way back) and finished
together. A request with more sequences than ``max_num_seqs`` is rejected at arrival.

A preempted request is swapped to the CPU (``--preemption swap``, while swap space lasts and
its prompt is done) or recomputed: its blocks are freed and it goes back to the front of the
queue with its generated tokens as prompt. A waiting head that did not fit is not retried
until something is freed (it cannot fit before). What every scheduler shares (the queues,
preemption's mechanics, the end of a step) is ``lifecycle.py``'s; what the contiguous manager
changes (Orca) is ``scheduler_orca.py``'s.
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core import kv_cache, memory, policies, scheduler_orca
from pagesim.sim.core.cost import kernel_read_tokens
from pagesim.sim.core.jit import njit
from pagesim.sim.core.lifecycle import (begin_iteration, pop_waiting, preempt_continuous, prefill, reject_head, restart,
                                        start_running, waiting_head)
from pagesim.sim.core.state import CONTINUOUS
from pagesim.sim.core.state import (BLOCKED_EPOCH, BLOCKED_KIND, BLOCKED_ON_MAX_SEQS, BLOCKED_ON_MEMORY,
                                    BLOCKED_REQUEST, CHUNK_BUDGET, CHUNKED_PREFILL, COMPUTED_SLOTS, CONTIGUOUS,
                                    DECODE_SET_SIZE, DEMAND_WAITING, EXTERNAL_STEPS, FORKS_SHARE_BLOCKS,
                                    FREE_BLOCK_PER_SEQ, FREE_EPOCH, HAS_WAITING_SERVED_RATIO, KERNEL_BLOCK,
                                    MANAGER_KIND, MAX_BATCHED_TOKENS, MAX_NUM_SEQS, NOT_BLOCKED, NUM_PREEMPTIONS,
                                    NUM_RUNNING, NUM_RUNNING_SEQS, NUM_SWAP_FALLBACKS, PAGED, PREFIX_CACHING,
                                    REJECT_NEVER_FITS, REJECT_OVER_BATCHED_TOKENS, REJECT_WIDTH_UNSHARED,
                                    STEP_DECODE_SEQS, STEP_PREFILL_SEQS, STEP_SWAP_IN,
                                    STEP_SWAP_OUT_BLOCKS, STEP_SWAP_OUT_EARLY, SWAP_USED_TOKENS, SWAPPED_HEAD,
                                    SWAPPED_LEN, WAITING_LEN, WAITING_SERVED_RATIO)


# -- admission ------------------------------------------------------------------------------
@njit(inline=True)
def head_still_blocked(s):
    """Whether the waiting head is the one that last failed to fit, with nothing freed since."""
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


@njit  # called from two places: inlined it would be compiled twice
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
        if c[NUM_RUNNING_SEQS] + s.width[i] > s.config[MAX_NUM_SEQS]:  # its sequences after the fork too
            blocked = BLOCKED_ON_MAX_SEQS
        elif not chunked and target > s.config[MAX_BATCHED_TOKENS]:
            reject_head(s, i, REJECT_OVER_BATCHED_TOKENS)
            continue
        elif not chunked and target > budget:
            break  # this iteration's budget is spent; nothing to remember
        else:
            fits = memory.can_allocate(s, i, target)
            if fits == kv_cache.NEVER_FITS:
                reject_head(s, i, REJECT_NEVER_FITS)
                continue
            if fits == kv_cache.CAN_ALLOCATE:
                pop_waiting(s)
                cached = memory.allocate(s, i, target, 0)  # prefix-cache hits are computed
                s.num_prompt_computed[i] = cached
                start_running(s, i)
                todo = target - cached
                n = budget if chunked and budget < todo else todo
                prefill(s, i, n)
                budget -= n
                continue
            c[DEMAND_WAITING] = 1
            blocked = BLOCKED_ON_MEMORY
        if s.config[PREFIX_CACHING] and not chunked and c[STEP_PREFILL_SEQS]:
            break  # the prompts admitted in this pass may hold its hits: it is retried
        c[BLOCKED_KIND] = blocked  # not retried until something is freed
        c[BLOCKED_REQUEST] = i
        c[BLOCKED_EPOCH] = c[FREE_EPOCH]
        break
    return budget


@njit(inline=True)
def resume_swapped(s):
    """Swap requests back in, FCFS; True when none is left out."""
    c = s.count
    while c[SWAPPED_LEN]:
        i = s.swapped[c[SWAPPED_HEAD]]
        w = s.num_seqs[i]
        if c[NUM_RUNNING_SEQS] + w > s.config[MAX_NUM_SEQS]:
            return False
        n = s.swapped_tokens[i]
        # one free block per sequence left after it, or as the latest request it would be the
        # first preempted again (vLLM's can_swap_in;
        # prefix-cache hits its sequences share are counted for each: conservative); then every
        # sequence of a group must fit: one by one, each in blocks of its own (prefix caching:
        # the later ones find the first one's prompt blocks), undone on a miss. A contiguous
        # extent is Orca's (scheduler_orca.swap_in)
        contiguous = s.config[MANAGER_KIND] == CONTIGUOUS
        if contiguous:
            fits = scheduler_orca.swap_in(s, i, n)
        else:
            fits = (kv_cache.can_allocate(s, i, n) == kv_cache.CAN_ALLOCATE
                    and kv_cache.num_free_blocks(s) - w * kv_cache.blocks_to_allocate(s, i, n) >= w)
        j = w if contiguous else 0
        while fits and j < w:
            if kv_cache.can_allocate(s, i, n) != kv_cache.CAN_ALLOCATE:
                for k in range(j):
                    kv_cache.release_seq(s, i, k)
                s.num_computed_tokens[i] = 0
                s.num_blocks[i] = 0
                fits = False
                break
            cached = kv_cache.allocate_seq(s, i, j, n, n)
            if cached < n:  # prefix caching: only the tokens the cache does not hold come in
                kv_cache.compute_tokens_seq(s, i, j, n - cached)
            j += 1
        if not fits:
            if c[NUM_RUNNING] == 0:  # nothing else holds memory: it can never come back
                c[SWAPPED_HEAD] = (c[SWAPPED_HEAD] + 1) % len(s.swapped)
                c[SWAPPED_LEN] -= 1
                c[SWAP_USED_TOKENS] -= n * w
                c[NUM_SWAP_FALLBACKS] += 1
                restart(s, i)
                continue
            c[DEMAND_WAITING] = 1
            return False
        c[SWAPPED_HEAD] = (c[SWAPPED_HEAD] + 1) % len(s.swapped)
        c[SWAPPED_LEN] -= 1
        c[SWAP_USED_TOKENS] -= n * w
        c[STEP_SWAP_IN] += n * w
        if s.config[EXTERNAL_STEPS] and not contiguous:
            kv_cache.record_swap(s, i, np.bool_(False))  # the blocks its K/V come back into
        start_running(s, i)
        s.in_decode[i] = 1  # it left mid-decode and comes back as it was
        c[DECODE_SET_SIZE] += w
        memory.joined_decode(s, i, CONTINUOUS)
    return True


@njit  # called from two places: inlined it would be compiled twice
def decode(s):
    """Make room, then one token for every request in the decode set; returns their context
    sum. Each member crosses at most one block boundary, so with as many free blocks as
    members nothing needs counting; otherwise the latest-admitted request is preempted
    until the step fits. What fits (``append_rule``): ``exact``, the blocks the crossings
    take; ``free-block-per-seq``, vLLM v0's rule (``can_append_slots`` in
    ``block_manager_v1.py``, applied member by member in ``Scheduler._schedule_running``):
    each member, at its turn, needs one free block whether or not it crosses, so the last
    member needs one more block than the crossings before it. A request's sequences are
    members (its group's last sequence is the last member); a sequence writing into a tail
    it shares takes a copy. A contiguous extent makes room by Orca's rule
    (``scheduler_orca.make_decode_room``)."""
    c = s.count
    paged = s.config[MANAGER_KIND] == PAGED
    while paged and c[DECODE_SET_SIZE] and c[DECODE_SET_SIZE] > kv_cache.num_free_blocks(s):
        crossing = 0  # the blocks the step takes (fresh ones and copies)
        last_takes = 0
        for k in range(c[NUM_RUNNING]):
            i = s.running[k]
            if s.in_decode[i]:
                takes, last_takes = kv_cache.decode_blocks_needed(s, i)
                crossing += takes
        needed = crossing - last_takes + 1 if s.config[FREE_BLOCK_PER_SEQ] else crossing
        if needed <= kv_cache.num_free_blocks(s):
            break
        preempt_continuous(s, policies.victim(s))
    if not paged:
        scheduler_orca.make_decode_room(s)
    context_sum = 0
    running, in_decode, num_computed_tokens = s.running, s.in_decode, s.num_computed_tokens
    kernel_block = s.config[KERNEL_BLOCK]  # read once, not per member
    for k in range(c[NUM_RUNNING]):
        i = running[k]
        if in_decode[i]:
            memory.take_decode_slot(s, i)
            num_computed_tokens[i] += 1
            context_sum += kernel_read_tokens(num_computed_tokens[i], kernel_block) * s.num_seqs[i]
    c[COMPUTED_SLOTS] += c[DECODE_SET_SIZE]  # once, not per member: a store per member costs
    c[STEP_DECODE_SEQS] = c[DECODE_SET_SIZE]
    return context_sum


@njit(inline=True)
def schedule(s):
    """One iteration's memory operations; returns the decode context sum."""
    c = s.count
    begin_iteration(s)
    preemptions = c[NUM_PREEMPTIONS]
    context_sum = 0
    for attempt in range(2):  # one call of the pass (inlined: one copy of its code)
        if attempt and (c[STEP_PREFILL_SEQS] or c[STEP_DECODE_SEQS] or c[NUM_PREEMPTIONS] == preemptions
                        or not (c[WAITING_LEN] or c[SWAPPED_LEN] or c[NUM_RUNNING])):
            break
        if attempt:
            # the decode step preempted every running request: vLLM's empty iteration and its
            # next one, at the same instant, are this one iteration
            c[STEP_SWAP_OUT_EARLY] = c[STEP_SWAP_OUT_BLOCKS]  # swapped out before the next pass swaps in
        context_sum = schedule_pass(s)
    if not (c[WAITING_LEN] or c[SWAPPED_LEN]):  # the preempted may be back already: nobody waits
        c[DEMAND_WAITING] = 0
    return context_sum


@njit(inline=True)
def schedule_pass(s):
    c = s.count
    c[DEMAND_WAITING] = 0
    # while a swapped request stays out nobody new is admitted (and the blocked head is not
    # looked at: its shortcut's bookkeeping is left as it is)
    all_resumed = resume_swapped(s)
    if not s.config[CHUNKED_PREFILL]:  # prefill-first: new prompts only, else decode
        if all_resumed and may_admit(s) and not head_still_blocked(s):
            admit_waiting(s, s.config[MAX_BATCHED_TOKENS])
        return 0 if c[STEP_PREFILL_SEQS] else decode(s)
    context_sum = decode(s)
    budget = s.config[CHUNK_BUDGET] - c[STEP_DECODE_SEQS]
    for k in range(c[NUM_RUNNING]):  # ongoing prefills, in admission order
        if budget <= 0:
            break
        i = s.running[k]
        todo = s.prompt_target[i] - s.num_prompt_computed[i]
        if todo > 0:
            n = min(todo, budget)
            prefill(s, i, n)
            budget -= n
    if all_resumed and may_admit(s) and not head_still_blocked(s):
        admit_waiting(s, budget)
    return context_sum
