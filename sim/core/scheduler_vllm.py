"""vLLM's scheduler (v0: vLLM 0.4.2's ``vllm/core/scheduler.py``, the 2023 paper's system) over
the core's arrays; each rule's source line in ``docs/guide/systems.md``.

One iteration (:func:`schedule`):

1. prefill-first (the default): while nobody is swapped out, admit waiting requests (only when
   waiting / running reaches ``waiting_served_ratio``, where it is set, or nothing runs) FCFS
   while ``max_num_batched_tokens``, ``max_num_seqs`` and memory allow, and run only their
   prompts; with no prompt to run, decode: one token for every running request, preempting
   the policy's victim (FCFS: the latest arrival, ``policy_fcfs.py``) while a request at its
   turn lacks a free block per sequence (:func:`decode`); then, if nobody was preempted,
   swapped requests come back by arrival and decode too (:func:`resume_swapped`);
2. chunked prefill: decode first, then ongoing prefills, then swap-ins (if nobody was
   preempted), then new prompts, all within the token budget ``chunk_budget`` (vLLM runs its
   running queue in one pass instead: ``docs/guide/systems.md`` says where they differ).

With prefix caching an admission starts past the prompt's cached blocks; whether it fits
counts every block of its prompt, hits too (vLLM 0.4.2's ``can_allocate``).

Parallel sampling (``n``): a request is admitted when its ``n`` sequences fit
``max_num_seqs`` (and takes ``n`` of it from then on, its prompt phase too, as a vLLM v0
``SequenceGroup``: ``lifecycle.start_running``), prefills once, then forks; its sequences decode in
lockstep and are preempted, swapped (back sharing their prompt's blocks, as they left) and
finished together. A request with more sequences than ``max_num_seqs`` is rejected at arrival.

A preempted request is swapped to the CPU (``--preemption swap``, or it runs several
sequences; while swap space lasts and its prompt is done) or recomputed: its blocks are freed
and it goes back to the front of the queue with its generated tokens as prompt. A waiting
head that did not fit is not retried until something is freed (it cannot fit before). What
every scheduler shares (the queues, preemption's mechanics, the end of a step) is
``lifecycle.py``'s; what the contiguous manager changes (Orca) is ``scheduler_orca.py``'s.
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
                                    NUM_RUNNING, NUM_RUNNING_SEQS, NUM_SWAP_FALLBACKS, PAGED,
                                    REJECT_NEVER_FITS, REJECT_OVER_BATCHED_TOKENS, REJECT_WIDTH_UNSHARED,
                                    STEP_DECODE_SEQS, STEP_PREFILL_SEQS, STEP_SWAP_IN,
                                    STEP_SWAP_OUT_BLOCKS, STEP_SWAP_OUT_EARLY, SWAP_USED_TOKENS, SWAPPED_HEAD,
                                    SWAPPED_LEN, WAITING_LEN, WAITING_SERVED_RATIO)


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
        if c[NUM_RUNNING_SEQS] + s.width[i] > s.config[MAX_NUM_SEQS]:
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
        c[BLOCKED_KIND] = blocked  # not retried until something is freed
        c[BLOCKED_REQUEST] = i
        c[BLOCKED_EPOCH] = c[FREE_EPOCH]
        break
    return budget


@njit  # called from two places, and only while a request is swapped out: a call
def resume_swapped(s):
    """Swap requests back in, by arrival (the swapped queue's order, ``lifecycle.preempt``),
    while each fits; each decodes its next token in this step, as it left mid-decode. Called
    after the step's decodes, in a step that preempted nobody (vLLM 0.4.2: ``scheduler.py:757-766``,
    ``:838-846``; its swap-ins are decodes, ``:565-571``). Returns their decode context."""
    c = s.count
    contiguous = s.config[MANAGER_KIND] == CONTIGUOUS
    context_sum = 0
    while c[SWAPPED_LEN]:
        i = s.swapped[c[SWAPPED_HEAD]]
        w = s.num_seqs[i]
        if c[NUM_RUNNING_SEQS] + s.width[i] > s.config[MAX_NUM_SEQS]:
            break
        n = s.swapped_tokens[i]
        # its blocks come back if they fit (vLLM's can_swap_in: kv_cache.swap_in; a contiguous
        # extent is Orca's, scheduler_orca.swap_in)
        fits = scheduler_orca.swap_in(s, i, n) if contiguous else kv_cache.swap_in(s, i, n)
        if not fits and c[NUM_RUNNING]:
            c[DEMAND_WAITING] = 1
            break
        c[SWAPPED_HEAD] = (c[SWAPPED_HEAD] + 1) % len(s.swapped)
        c[SWAPPED_LEN] -= 1
        c[SWAP_USED_TOKENS] -= n * w
        if not fits:  # nothing else holds memory: it can never come back
            c[NUM_SWAP_FALLBACKS] += 1
            restart(s, i)
            continue
        c[STEP_SWAP_IN] += n * w
        if s.config[EXTERNAL_STEPS] and not contiguous:
            kv_cache.record_swap(s, i, np.bool_(False))  # the blocks its K/V come back into
        # at the running list's end, which keeps it in arrival order as vLLM sorts it every
        # step (scheduler.py:409): the victims go latest arrival first and nobody is admitted
        # while a request is out, so nobody who arrived after it runs (prefill-first; chunked
        # prefill's order is not vLLM's: docs/guide/systems.md)
        start_running(s, i)
        s.in_decode[i] = 1
        c[DECODE_SET_SIZE] += w
        memory.joined_decode(s, i, CONTINUOUS)
        context_sum += decode_token(s, i, s.config[KERNEL_BLOCK])
        c[COMPUTED_SLOTS] += w
        c[STEP_DECODE_SEQS] += w
    return context_sum


@njit(inline=True)
def decode_token(s, i, kernel_block):
    """Request ``i``'s sequences take their next token's slot; returns the context they read."""
    memory.take_decode_slot(s, i)
    s.num_computed_tokens[i] += 1
    return kernel_read_tokens(s.num_computed_tokens[i], kernel_block) * s.num_seqs[i]


@njit  # called from two places: inlined it would be compiled twice
def decode(s):
    """Make room, then one token for every request in the decode set; returns their context
    sum. Each sequence crosses at most one block boundary, so with as many free blocks as
    sequences nothing needs counting; otherwise the policy's victim (FCFS: the latest
    arrival) is preempted until the step fits. What fits (``append_rule``): ``exact``, the
    blocks the step takes; ``free-block-per-seq``, vLLM v0's rule: each request at its turn,
    in running order, needs as many free blocks as it runs sequences, after the blocks the
    requests before it took (``can_append_slots``, ``block_manager_v1.py:308-318``, asked of
    each group in ``Scheduler._schedule_running``, ``scheduler.py:410-448``). A sequence
    writing into a tail it shares takes a copy. A contiguous extent makes room by Orca's rule
    (``scheduler_orca.make_decode_room``)."""
    c = s.count
    paged = s.config[MANAGER_KIND] == PAGED
    while paged and c[DECODE_SET_SIZE] and c[DECODE_SET_SIZE] > kv_cache.num_free_blocks(s):
        available = kv_cache.num_free_blocks(s)
        fits = True
        for k in range(c[NUM_RUNNING]):
            i = s.running[k]
            if s.in_decode[i]:
                if s.config[FREE_BLOCK_PER_SEQ] and s.num_seqs[i] > available:
                    fits = False
                    break
                available -= kv_cache.decode_blocks_needed(s, i)
        if fits and available >= 0:
            break
        preempt_continuous(s, policies.victim(s))
    if not paged:
        scheduler_orca.make_decode_room(s)
    context_sum = 0
    running, in_decode = s.running, s.in_decode
    kernel_block = s.config[KERNEL_BLOCK]  # read once, not per member
    for k in range(c[NUM_RUNNING]):
        i = running[k]
        if in_decode[i]:
            context_sum += decode_token(s, i, kernel_block)
    c[COMPUTED_SLOTS] += c[DECODE_SET_SIZE]  # once, not per member: a store per member costs
    c[STEP_DECODE_SEQS] = c[DECODE_SET_SIZE]
    return context_sum


@njit(inline=True)
def schedule(s):
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
        context_sum = schedule_pass(s)
    if not (c[WAITING_LEN] or c[SWAPPED_LEN]):  # the preempted may be back already: nobody waits
        c[DEMAND_WAITING] = 0
    return context_sum


@njit(inline=True)
def schedule_pass(s):
    c = s.count
    c[DEMAND_WAITING] = 0
    preemptions = c[NUM_PREEMPTIONS]
    if not s.config[CHUNKED_PREFILL]:
        # prefill-first: new prompts only, else decode. While a request stays swapped out nobody
        # new is admitted (vLLM 0.4.2 scheduler.py:743-746; the blocked head is not looked at:
        # its shortcut's bookkeeping is left as it is)
        if not c[SWAPPED_LEN] and may_admit(s) and not head_still_blocked(s):
            admit_waiting(s, s.config[MAX_BATCHED_TOKENS])
        if c[STEP_PREFILL_SEQS]:
            return 0
        context_sum = decode(s)
        if c[SWAPPED_LEN] and c[NUM_PREEMPTIONS] == preemptions:
            context_sum += resume_swapped(s)
        return context_sum
    # chunked: decodes, ongoing prefills, swap-ins, then new prompts (scheduler.py:832-851)
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
    if c[SWAPPED_LEN] and c[NUM_PREEMPTIONS] == preemptions:
        decoding = c[STEP_DECODE_SEQS]
        context_sum += resume_swapped(s)
        budget -= c[STEP_DECODE_SEQS] - decoding
    if may_admit(s) and not head_still_blocked(s):
        admit_waiting(s, budget)
    return context_sum
