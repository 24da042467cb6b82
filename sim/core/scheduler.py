"""vLLM's scheduler (v0 semantics, as the 2023 paper's system) over the core's arrays.

One iteration (:func:`schedule`):

1. swapped requests come back first, FCFS; while any stays out, nobody new is admitted;
2. prefill-first (the default): admit waiting requests (only when waiting / running reaches
   ``waiting_served_ratio``, where it is set, or nothing runs) FCFS while ``max_num_batched_tokens``,
   ``max_num_seqs`` and memory allow, and run only their prompts; with no prompt to run,
   decode: one token for every running request, preempting the latest-admitted request
   while the free blocks cannot take the block boundaries crossed this step;
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
until something is freed (it cannot fit before). :func:`complete_step` hands out the tokens
an iteration produced, finishes requests and frees their memory; after a decode step, beams
die and fork (beam search, ``beam.py``).
"""

from __future__ import annotations

import math

import numpy as np

from pagesim.sim.core import beam, extent, kv_cache, memory
from pagesim.sim.core.cost import kernel_read_tokens
from pagesim.sim.core.jit import njit
from pagesim.sim.core.state import (BLOCKED_EPOCH, BLOCKED_KIND, BLOCKED_ON_MAX_SEQS, BLOCKED_ON_MEMORY,
                            BLOCKED_REQUEST, CHUNK_BUDGET, CHUNKED_PREFILL, COMPUTED_SLOTS, DECODE_SET_SIZE,
                            DEMAND_WAITING, FINISHED, FORKS_SHARE_BLOCKS, FREE_BLOCK_PER_SEQ, FREE_EPOCH,
                            HAS_WAITING_SERVED_RATIO, ITL_COUNT, ITL_SUM,
                            MAX_BATCHED_TOKENS, MAX_NUM_SEQS, NOT_BLOCKED, NUM_FINISHED,
                            NUM_PREEMPTIONS, NUM_REJECTED, NUM_RUNNING, NUM_RUNNING_SEQS,
                            NUM_SWAP_FALLBACKS, PREFIX_CACHING, REJECT_NEVER_FITS, REJECT_OVER_BATCHED_TOKENS,
                            REJECT_TOO_WIDE, REJECT_WIDTH_UNSHARED, REJECTED, RUNNING, STEP_COPIED_BLOCKS,
                            STEP_DECODE_SEQS,
                            STEP_PREFILL_SEQS, STEP_PREFILL_TOKENS, STEP_SWAP_IN, STEP_SWAP_OUT,
                            SWAP_CAPACITY_TOKENS, SWAP_PREEMPTION, SWAP_USED_TOKENS,
                            SWAPPED, SWAPPED_HEAD, SWAPPED_LEN, WAITING, WAITING_HEAD, WAITING_LEN,
                            WAITING_SERVED_RATIO, STEPS_WITHOUT_TOKEN)
from pagesim.sim.core.state import BEAM_SEARCH, CONTIGUOUS, KERNEL_BLOCK, MANAGER_KIND, PAGED
from pagesim.sim.core.state import (EXTERNAL_STEPS, STEP_NUM_FINISHED, STEP_SWAP_IN_BLOCKS, STEP_SWAP_OUT_BLOCKS,
                                   STEP_SWAP_OUT_EARLY)



# Every run ends: a correct schedule produces a token (a first one or a decode) at least once
# every ceil(max_seq_len / chunk_budget) iterations (the longest chunked prefill; every other
# iteration decodes or completes a prompt), so this many iterations in a row without one are
# a live lock (a request preempted before it ever decodes, again and again) and end the run
# with an error naming it.
@njit(inline=True)
def steps_without_token_limit(max_seq_len: int) -> int:
    return max_seq_len + 1000


# -- the queues: rings over request ids ---------------------------------------------------
@njit(inline=True)
def waiting_head(s):
    return s.waiting[s.count[WAITING_HEAD]]


@njit(inline=True)
def push_waiting(s, i, front):
    n = len(s.waiting)
    if front:
        s.count[WAITING_HEAD] = (s.count[WAITING_HEAD] + n - 1) % n
        s.waiting[s.count[WAITING_HEAD]] = i
    else:
        s.waiting[(s.count[WAITING_HEAD] + s.count[WAITING_LEN]) % n] = i
    s.count[WAITING_LEN] += 1


@njit(inline=True)
def pop_waiting(s):
    s.count[WAITING_HEAD] = (s.count[WAITING_HEAD] + 1) % len(s.waiting)
    s.count[WAITING_LEN] -= 1


@njit(inline=True)
def add_arrival(s, i):
    if s.width[i] > s.config[MAX_NUM_SEQS]:  # its sequences run together: it could never be admitted
        s.status[i] = REJECTED
        s.reject_code[i] = REJECT_TOO_WIDE
        s.count[NUM_REJECTED] += 1
        return
    s.status[i] = WAITING
    push_waiting(s, i, False)


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
def prefill(s, i, n):
    """``n`` more prompt tokens of request ``i`` this iteration."""
    kv_cache.compute_tokens(s, i, n)
    s.num_prompt_computed[i] += n
    k = s.count[STEP_PREFILL_SEQS]
    s.step_prefill_ids[k] = i
    s.step_prefill_tokens[k] = n
    s.step_prefill_context[k] = s.num_prompt_computed[i]  # its context after the chunk (loop.step_time)
    s.count[STEP_PREFILL_SEQS] = k + 1
    s.count[STEP_PREFILL_TOKENS] += n


@njit(inline=True)
def reject_head(s, i, reason):
    pop_waiting(s)
    s.status[i] = REJECTED
    s.reject_code[i] = reason
    s.count[NUM_REJECTED] += 1


@njit(inline=True)
def start_running(s, i):
    s.status[i] = RUNNING
    s.running[s.count[NUM_RUNNING]] = i
    s.count[NUM_RUNNING] += 1
    s.count[NUM_RUNNING_SEQS] += s.num_seqs[i]


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
        # extent (preempted when a predicted reservation could not grow) is reserved again as
        # at an admission with its n tokens
        contiguous = s.config[MANAGER_KIND] == CONTIGUOUS
        if contiguous:
            fits = extent.can_allocate(s, i, n) == kv_cache.CAN_ALLOCATE
            if fits:
                extent.allocate(s, i, n, n)
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
        if contiguous:
            extent.joined(s, i)
    return True


# -- preemption and decode ------------------------------------------------------------------
@njit
def preempt_latest(s):
    """Preempt the latest-admitted running request (vLLM's policy): swap it out while swap
    space lasts and its prompt is done, else free it for recompute."""
    c = s.count
    c[NUM_RUNNING] -= 1
    i = s.running[c[NUM_RUNNING]]
    w = s.num_seqs[i]
    c[NUM_RUNNING_SEQS] -= w
    c[DECODE_SET_SIZE] -= s.in_decode[i] * w
    s.in_decode[i] = 0
    c[FREE_EPOCH] += 1
    s.num_preemptions[i] += 1
    c[NUM_PREEMPTIONS] += 1
    c[DEMAND_WAITING] = 1
    n = s.num_computed_tokens[i]  # per sequence
    if (s.config[SWAP_PREEMPTION] and s.num_prompt_computed[i] >= s.prompt_target[i]
            and c[SWAP_USED_TOKENS] + n * w <= s.config[SWAP_CAPACITY_TOKENS]):
        if s.config[EXTERNAL_STEPS] and s.config[MANAGER_KIND] == PAGED:
            # np.bool_: jit.njit's note on constants
            kv_cache.record_swap(s, i, np.bool_(True))  # the blocks its K/V leave from, before they are freed
        memory.free(s, i)  # its K/V go to the host; it comes back as it was
        s.swapped_tokens[i] = n
        c[SWAP_USED_TOKENS] += n * w
        c[STEP_SWAP_OUT] += n * w
        s.status[i] = SWAPPED
        s.swapped[(c[SWAPPED_HEAD] + c[SWAPPED_LEN]) % len(s.swapped)] = i
        c[SWAPPED_LEN] += 1
        return
    if s.config[SWAP_PREEMPTION]:
        c[NUM_SWAP_FALLBACKS] += 1  # no swap space left, or mid-prefill: recompute
    memory.free(s, i)
    restart(s, i)


@njit
def restart(s, i):
    """Request ``i`` (holding no memory) waits at the queue's front to be recomputed."""
    s.num_seqs[i] = 1  # a group restarts as one sequence and forks again after its prefill
    if s.num_generated[i] > 0:  # the generated tokens become prompt
        s.prompt_target[i] = s.prompt_tokens[i] + s.num_generated[i]
    s.num_prompt_computed[i] = 0
    s.status[i] = WAITING
    push_waiting(s, i, True)


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
    it shares takes a copy. A contiguous extent was reserved whole at admission, unless a
    predicted reservation is outgrown: then the latest-admitted request is preempted while
    the re-reservations do not fit (``extent.decode_fits``)."""
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
        preempt_latest(s)
    while not paged and c[DECODE_SET_SIZE] and not extent.decode_fits(s):
        preempt_latest(s)
    if not paged:
        extent.rereserve_overflowing(s)
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
def begin_iteration(s):
    """An iteration's counts from zero: what it prefills, decodes, swaps and copies (both
    schedulers, this one and sim/core/static.py)."""
    c = s.count
    c[STEP_PREFILL_SEQS] = 0
    c[STEP_PREFILL_TOKENS] = 0
    c[STEP_DECODE_SEQS] = 0
    c[STEP_SWAP_IN] = 0
    c[STEP_SWAP_OUT] = 0
    c[STEP_COPIED_BLOCKS] = 0
    c[STEP_SWAP_OUT_BLOCKS] = 0
    c[STEP_SWAP_IN_BLOCKS] = 0
    c[STEP_SWAP_OUT_EARLY] = 0


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


# -- after the iteration --------------------------------------------------------------------
@njit(inline=True)
def itl_bin(edges, v):
    """np.searchsorted(edges, v) (side left): the number of edges below v; NaN past the end."""
    lo, hi = 0, len(edges)
    while lo < hi:
        mid = (lo + hi) // 2
        if not edges[mid] >= v:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(inline=True)
def add_itl(s, v, bin_index):
    s.itl_hist[bin_index] += 1
    s.clock[ITL_SUM] += v
    s.count[ITL_COUNT] += 1


@njit(inline=True)
def complete_step(s, now):
    """Hand out the tokens the iteration produced; finish and free whoever is done."""
    c = s.count
    num_done = 0
    c[STEPS_WITHOUT_TOKEN] += 1  # back to 0 below with the first token handed out
    if c[STEP_DECODE_SEQS]:
        c[STEPS_WITHOUT_TOKEN] = 0
        # most members got their last token at the same time (the last decode step): one
        # latency and one bin lookup for each run of them
        # (sums kept in locals and stored once: a store per member costs)
        previous = math.nan
        latency = 0.0
        bin_index = 0
        itl_sum = s.clock[ITL_SUM]
        running, in_decode, last_token_s, num_generated = s.running, s.in_decode, s.last_token_s, s.num_generated
        for k in range(c[NUM_RUNNING]):
            i = running[k]
            if not in_decode[i]:
                continue
            if last_token_s[i] != previous:
                previous = last_token_s[i]
                latency = now - previous
                bin_index = itl_bin(s.itl_edges, latency)
            w = s.num_seqs[i]  # one inter-token latency per sequence
            s.itl_hist[bin_index] += w
            itl_sum += latency * w
            last_token_s[i] = now
            num_generated[i] += 1
            if num_generated[i] >= s.output_tokens[i]:
                s.step_finished[num_done] = i
                num_done += 1
        s.clock[ITL_SUM] = itl_sum
        c[ITL_COUNT] += c[STEP_DECODE_SEQS]
    for k in range(c[STEP_PREFILL_SEQS]):
        i = s.step_prefill_ids[k]
        if s.num_prompt_computed[i] < s.prompt_target[i]:
            continue  # a chunk, not the prompt's last
        c[STEPS_WITHOUT_TOKEN] = 0
        s.num_generated[i] += 1
        if math.isnan(s.first_token_s[i]):
            s.first_token_s[i] = now
        else:  # a recompute: the gap since its last token
            add_itl(s, now - s.last_token_s[i], itl_bin(s.itl_edges, now - s.last_token_s[i]))
        s.last_token_s[i] = now
        if s.num_generated[i] >= s.output_tokens[i]:
            s.step_finished[num_done] = i
            num_done += 1
        else:
            if s.width[i] > 1 and s.num_seqs[i] == 1:  # parallel sampling: prefilled once, then forked
                kv_cache.fork(s, i)
            s.in_decode[i] = 1
            c[DECODE_SET_SIZE] += s.num_seqs[i]
            if s.config[MANAGER_KIND] == CONTIGUOUS:
                extent.joined(s, i)
    c[STEP_NUM_FINISHED] = num_done  # step_finished[:num_done]: an executor outside the core may ask
    if num_done:
        finish(s, now, num_done)
    if c[STEP_DECODE_SEQS] and s.config[BEAM_SEARCH]:  # after the finishes: the beams of the rest churn
        beam.churn(s)


@njit(inline=True)
def release(s, i):
    """Running request ``i`` is done with (finished, or aborted: scheduler_v1.abort_timed_out):
    its memory goes, its sequences leave the counts. The caller sets its status and drops it
    from the running list."""
    c = s.count
    c[FREE_EPOCH] += 1
    memory.free(s, i)
    c[DECODE_SET_SIZE] -= s.in_decode[i] * s.num_seqs[i]
    c[NUM_RUNNING_SEQS] -= s.num_seqs[i]
    s.in_decode[i] = 0


@njit(inline=True)
def finish(s, now, num_done):
    """The step's ``num_done`` finished requests (``step_finished``) let their memory go."""
    c = s.count
    for k in range(num_done):
        i = s.step_finished[k]
        release(s, i)
        s.status[i] = FINISHED
        s.finish_s[i] = now
    kept = 0  # drop them from the running list, keeping admission order
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if s.status[i] != FINISHED:
            s.running[kept] = i
            kept += 1
    c[NUM_RUNNING] = kept
    c[NUM_FINISHED] += num_done
