"""SGLang's scheduler (``--system sglang``) over the core's arrays and the radix cache (``radix_cache.py``).

As of the SGLang sources read for it (sgl-project/sglang 0.5.23: ``managers/scheduler.py``,
``managers/schedule_policy.py``, ``managers/schedule_batch.py``, ``mem_cache/prefill_budget.py``,
``environ.py``, ``server_args.py``), without overlap scheduling, mixed chunks, priorities or
speculative decoding; compared step by step with SGLang's own code by
tests/peers/sglang_scheduler.py. One iteration is
either a prefill batch or a decode step, prefill first (``Scheduler.get_next_batch_to_run``):

1. ``get_new_batch_prefill``: the chunked request's computed tokens go into the tree first
   (``cache_unfinished_req``); then, unless ``max_running_requests`` decode already or the batch
   is full (``batch_is_full``: set when a pass ran short of memory, NO_TOKEN, with a request
   admitted or running, or at ``max_running_requests``; cleared when a request leaves the batch,
   a chunk ran, nothing runs, or the last prefill ran while nothing did, its batch then replacing
   the running one; scheduler.py:4098-4101, :4279-4284, :3939-3966), the waiting
   queue is ordered by the policy (``SchedulePolicy.calc_priority``: ``fcfs``, the default
   ``schedule_policy`` of ``server_args.py``, keeps arrival order; ``lpm`` sorts by the longest
   cached prefix, stable, only while at most 128 wait, ``_determine_active_policy``, and puts
   last a request that matches at most 32 tokens but shares 32 with one ahead of it, in-batch
   prefix caching; fcfs, and lpm past 128, walk the first 128 waiting requests' tokens from the
   tree one pass in 32, the head last, which refreshes their prefixes' LRU times,
   ``_touch_waiting_prefixes``) and a ``PrefillAdder`` takes requests in that order while its
   budgets last:

   * ``rem_total_tokens``: available + evictable tokens, less every running request's future
     tokens, ``min(max_new_tokens - generated, 4096)`` (``CLIP_MAX_NEW_TOKENS``) whole when
     requests carry ``ignore_eos`` (``--ignore-eos``, the default), else times ``new_token_ratio``
     (``--no-ignore-eos``; ``_get_running_request_total_token_offset``), less each
     admitted request's extend tokens (whole pages), a page and ``min(max_new_tokens, 4096)``
     (``_update_prefill_budget``, ``PrefillBudget.reserve``); a request whose extend +
     ``min(max_new - generated, 4096)`` + a page (``per_req_token_overhead``) is not below it,
     checked with its prefix locked, ends the pass (``add_one_req``: ``NO_TOKEN``);
   * ``rem_input_tokens``: ``max_prefill_tokens`` (16384) per batch: spent, it ends the pass
     (with chunked prefill, always on here, it turns no request away before);
   * ``rem_chunk_tokens``: ``chunked_prefill_size``: a prompt longer than what is left is
     truncated to it (whole pages) and becomes the one chunked request, whose next chunk comes
     first in the next prefill (``add_chunked_req``: what ``rem_total_tokens`` and the chunk
     budget hold, the whole chunk budget when memory holds nothing); the budget then is 0 and
     the pass ends.

   A request's cached prefix is matched on its tokens but the last (``init_next_round_input``),
   whole pages, and locked while it runs. The batch's tokens are allocated after the pass
   (``prepare_for_extend``), evicting first for the batch's extend tokens (paged: and a page per
   request).
2. else decode one token for every running request (``update_running_batch``): when the
   available and evictable tokens cannot hold the step (``check_decode_mem``), requests are
   retracted (``retract_decode``) fewest generated tokens first, then longest prompt, at least
   one and until the rest's step fits; each retraction evicts towards ``20`` steps of the rest
   (``SGLANG_RETRACT_DECODE_STEPS``); a retracted request frees its tokens outside the tree,
   unlocks its prefix and goes to the end of the waiting queue to be recomputed, and
   ``new_token_ratio`` becomes ``min(1, (generated + 20 * running) / (max_new_tokens + 1))`` of
   those left. The step's slots are taken after evicting a slot (paged: a page) per request.
   Otherwise ``new_token_ratio`` decays by ``(init - min) / 600`` towards ``min``: ``init`` is
   ``0.7 * schedule_conservativeness`` (1.0), ``min`` ``0.14 * init`` (``SGLANG_INIT_NEW_TOKEN_RATIO``,
   ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``, ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``); an idle engine
   resets it to ``init``.

With a host tier (``--kv-offload-gib``, ``sim/core/kv/radix_cache.py``) each iteration first acknowledges
the copies that have ended, and an admission's match has a device part (the prefix, locked) and a
host hit below it, loaded back or recomputed (``radix_cache.load_back``; the budgets as SGLang's
``_select_prefill_admission`` counts them).

A request's ``max_new_tokens`` is its output length (the trace's), and it runs to it: by default
it carries ``ignore_eos``, as benchmark clients send it (sglang 0.5.23 ``benchmark/serving.py:317``
unless ``--disable-ignore-eos``); ``--no-ignore-eos`` models requests that might stop at EOS
earlier, whose remaining outputs SGLang estimates at ``new_token_ratio``. Finished requests are
inserted into the tree (``radix_cache.cache_finished_req``, from ``scheduler.finish`` through
``memory.free``).
"""

from __future__ import annotations

import numpy as np

from pagesim.sim.core.kv import radix_cache
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.sched.lifecycle import begin_iteration, pop_waiting, prefill, push_waiting, reject_head, start_running
from pagesim.sim.core.compile.families import TRAITS
from pagesim.sim.core.state import SGLANG
from pagesim.sim.core.state import (BLOCK_SIZE, CHUNK_BUDGET, DECODE_SET_SIZE, DEMAND_WAITING, FREE_EPOCH,
                                    LOCKED_NODE, LPM, MAX_BATCHED_TOKENS, MAX_NUM_SEQS, MAX_SEQ_LEN,
                                    NUM_PREEMPTIONS, NUM_RUNNING, NUM_RUNNING_SEQS, PREFIX_HIT_TOKENS,
                                    PREFIX_LEN, PREFIX_LOOKUP_TOKENS, REJECT_NEVER_FITS,
                                    REJECT_WIDTH_UNSHARED, RUNNING, STEP_DECODE_SEQS, STEP_NUM_FINISHED,
                                    WAITING, WAITING_HEAD, WAITING_LEN)
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    SCHEDULE_POLICY     sglang's waiting order (FCFS, LPM)
    IGNORE_EOS          sglang: 1 when requests carry ``ignore_eos`` (they run to max_new_tokens), so
        the prefill budget charges a running request's remaining output whole, not at the
        new_token_ratio (scheduler_sglang.get_new_batch_prefill)
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    CHUNKED_REQUEST     sglang: the request whose prefill is chunked (-1: none)
    BATCH_IS_FULL       sglang: 1 while the running batch is full (no new request is tried)
    PREFILL_INTO_EMPTY  sglang: 1 when the last iteration was a prefill while nothing ran: its batch
        then becomes the running batch, not flagged full (scheduler_sglang.get_new_batch_prefill)
    WAITING_REFRESHES   sglang: the fcfs passes over a waiting queue so far (every 32nd touches
        the queue's prefixes: scheduler_sglang.touch_waiting_prefixes)
""")

# Core.clock: this file's entries, in its room of the shared table (sim/core/state.py)
section("clock", globals(), """
    NEW_TOKEN_RATIO     sglang: the share of max_new_tokens a running request is taken to
        still decode (the scheduler's new_token_ratio), now
    INIT_NEW_TOKEN_RATIO  its start
    MIN_NEW_TOKEN_RATIO  its floor
    NEW_TOKEN_RATIO_DECAY  its decay per decode step
""")

# Core.radix_request: this file's entries, in its room of the shared table (sim/core/state.py)
section("radix_request", globals(), """
    MATCH_LEN           its last match's length in the radix tree
    IN_WAITING_TREE     sglang lpm: 1 while its tokens are in the pass's waiting-queue tree (in-batch
        prefix caching: scheduler_sglang.sort_by_longest_prefix)
    EXTEND_LEN          this step's extend length
""")


#: the traits of this scheduler's family (``families.TRAITS``)
SGLANG_TRAITS = TRAITS[SGLANG]
CLIP_MAX_NEW_TOKENS = 4096  # schedule_policy.py: SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION's default
RETRACT_DECODE_STEPS = 20  # environ.py: SGLANG_RETRACT_DECODE_STEPS
LPM_QUEUE_LIMIT = 128  # schedule_policy.py _determine_active_policy: beyond it lpm falls back to fcfs
IN_BATCH_CHECK_THRESHOLD = 32  # schedule_policy.py:110-112: a tree match at most this is checked in-batch
IN_BATCH_DEPRIORITIZE_THRESHOLD = 32  # :117-119: so many shared with a request ahead puts it last
WAITING_PREFIX_REFRESH_INTERVAL = 32  # schedule_policy.py:139: an fcfs pass in so many touches the queue
FULL = 1  # BATCH_IS_FULL: no request slot left (max_running_requests)
NO_TOKEN = 2  # BATCH_IS_FULL: a request did not fit the memory budget (the waiting head's demand)


@njit(inline=True)
def schedule(s):
    """One iteration: a prefill batch if the adder takes anything, else a decode step. Returns
    the decode context sum (the cost model's)."""
    c = s.count
    begin_iteration(s)
    c[DEMAND_WAITING] = 0
    radix_cache.copies_ended(s)  # the host tier's, by now
    context_sum = 0
    if not get_new_batch_prefill(s):
        if c[DECODE_SET_SIZE]:
            context_sum = decode(s)
        else:  # idle: scheduler.py resets the estimate (self_check_during_idle)
            s.clock[NEW_TOKEN_RATIO] = s.clock[INIT_NEW_TOKEN_RATIO]
    if not c[WAITING_LEN]:
        c[DEMAND_WAITING] = 0
    return context_sum


@njit(inline=True)
def ceil_page(s, n):
    page = s.config[BLOCK_SIZE]
    return (n + page - 1) // page * page


@njit(inline=True)
def free_and_evictable(s):
    return radix_cache.available(s) + radix_cache.evictable(s)


@njit(inline=True)
def sort_by_longest_prefix(s):
    """``_compute_prefix_matches`` then ``_sort_by_longest_prefix`` (schedule_policy.py:346-397,
    :441-451): each waiting request, in queue order, is matched on all its tokens
    (``match_kv_cache`` without a limit, :353-354: the walk splits there) and keyed by the match,
    at most its tokens but the last (``num_matched_prefix_tokens``, common.py:260-261). In-batch
    prefix caching: one whose match is at most 32 tokens (IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD,
    :110-112) and that shares 32 or more (``_DEPRIORITIZE_THRESHOLD``, :117-119) with a request
    ahead of it in the waiting-queue tree goes last (key -1), else its tokens join that tree.
    That tree holds the requests that joined it, and a match in it is the longest prefix shared
    with one of them (page 1: ``create_simulated``, radix_cache.py:320-339): ``same_tokens``
    with each. Then the queue is sorted by key, longest first, stable."""
    c, n = s.count, len(s.waiting)
    head, size = c[WAITING_HEAD], c[WAITING_LEN]
    for k in range(size):
        i = s.waiting[(head + k) % n]
        target = s.prompt_target[i]
        node, matched = radix_cache.match_prefix(s, i, target)
        s.radix_request[i, MATCH_LEN] = min(matched, max(target - 1, 0))
        s.radix_request[i, IN_WAITING_TREE] = 0
        # the key counts a host hit, the in-batch check the device prefix alone
        if radix_cache.device_prefix(s, node, matched) <= IN_BATCH_CHECK_THRESHOLD:
            shares = False
            # a request shares no more tokens with another than it names by hashes (same_tokens):
            # one naming fewer than the threshold is not compared; the first sharing them ends it
            if radix_cache.named_tokens(s, i) >= IN_BATCH_DEPRIORITIZE_THRESHOLD:
                for m in range(k):
                    q = s.waiting[(head + m) % n]
                    if (s.radix_request[q, IN_WAITING_TREE] and radix_cache.same_tokens(
                            s, q, i, 0, IN_BATCH_DEPRIORITIZE_THRESHOLD) >= IN_BATCH_DEPRIORITIZE_THRESHOLD):
                        shares = True
                        break
            if shares:
                s.radix_request[i, MATCH_LEN] = -1  # after every other (their keys are 0 or more)
            else:
                s.radix_request[i, IN_WAITING_TREE] = 1
    for k in range(1, size):  # insertion sort: stable, and the queue is at most 128 long here
        i = s.waiting[(head + k) % n]
        m = k
        while m > 0 and s.radix_request[s.waiting[(head + m - 1) % n], MATCH_LEN] < s.radix_request[i, MATCH_LEN]:
            s.waiting[(head + m) % n] = s.waiting[(head + m - 1) % n]
            m -= 1
        s.waiting[(head + m) % n] = i


@njit(inline=True)
def touch_waiting_prefixes(s):
    """``_touch_waiting_prefixes`` (schedule_policy.py:281-302, called at the end of every
    ``calc_priority``): under a policy that matches no prefix (fcfs, or lpm past 128 waiting),
    one pass in 32 over a non-empty queue walks the first 128 waiting requests' tokens from the
    tree, the head last, so that LRU evicts their prefixes last and in reverse admission order
    (``SGLANG_ENABLE_WAITING_PREFIX_REFRESH``, on by default, environ.py:645). The walks split
    nodes as a match does, where a waiting prompt ends inside one."""
    c, n = s.count, len(s.waiting)
    if c[WAITING_LEN] == 0:  # :287: an empty queue is no pass
        return
    refresh = c[WAITING_REFRESHES] % WAITING_PREFIX_REFRESH_INTERVAL == 0
    c[WAITING_REFRESHES] += 1
    if not refresh:
        return
    for k in range(min(c[WAITING_LEN], LPM_QUEUE_LIMIT) - 1, -1, -1):  # reversed(waiting_queue[:128])
        # touch_prefix (radix_cache.py:419-426) is match_prefix's walk, on all the request's tokens
        # so far (origin_input_ids + output_ids, common.py:214-217), its result unused
        i = s.waiting[(c[WAITING_HEAD] + k) % n]
        radix_cache.match_prefix(s, i, s.prompt_target[i])


@njit(inline=True)  # one place calls it: its scheduler's entry (by_reference.py)
def get_new_batch_prefill(s):
    """The prefill batch (module docstring, 1); False when it is empty."""
    c, page = s.count, s.config[BLOCK_SIZE]
    chunked = c[CHUNKED_REQUEST]
    into_empty = c[PREFILL_INTO_EMPTY]
    c[PREFILL_INTO_EMPTY] = 0
    # batch_is_full holds until a request leaves the batch: one finished (scheduler.py:3939-3940,
    # :3963-3966), the last prefill ran a chunk (filtered out of that batch, :3911-3940), or
    # nothing runs (:4093-4096); or the batch is replaced: the last prefill ran while nothing
    # did, and its batch (never flagged: schedule_batch.py:2482) becomes the running one
    # (:3957-3958), where the flag was set (:4282-4284)
    if c[STEP_NUM_FINISHED] or chunked >= 0 or c[DECODE_SET_SIZE] == 0 or into_empty:
        c[BATCH_IS_FULL] = 0
    if chunked >= 0:
        radix_cache.cache_unfinished_req(s, chunked)
    running_bs = c[DECODE_SET_SIZE]
    if chunked < 0:
        if c[WAITING_LEN] and c[BATCH_IS_FULL] == NO_TOKEN:  # the waiting head waits for memory
            c[DEMAND_WAITING] = 1
        if c[BATCH_IS_FULL] or c[WAITING_LEN] == 0:  # :4098-4101
            return False
        if running_bs >= s.config[MAX_NUM_SEQS]:  # no request slot left (:4119-4126)
            c[BATCH_IS_FULL] = FULL
            return False
    if s.config[SCHEDULE_POLICY] == LPM and c[WAITING_LEN] <= LPM_QUEUE_LIMIT:
        sort_by_longest_prefix(s)
    else:
        touch_waiting_prefixes(s)
    # a running request's remaining output: whole under ignore_eos (it cannot stop before its
    # max_new_tokens), else at new_token_ratio (_get_running_request_total_token_offset,
    # schedule_policy.py:785-794)
    ratio = 1.0 if s.config[IGNORE_EOS] else s.clock[NEW_TOKEN_RATIO]
    total_offset = 0.0  # PrefillAdder: rem_total_token_offset, cur_rem_token_offset and the budgets
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if s.in_decode[i]:
            total_offset += min(s.output_tokens[i] - s.num_generated[i], CLIP_MAX_NEW_TOKENS) * ratio
    cur_offset = 0
    rem_input = s.config[MAX_BATCHED_TOKENS]
    rem_chunk = s.config[CHUNK_BUDGET]
    num_can_run = 0
    new_chunked = -1
    if chunked >= 0:  # add_chunked_req: its next chunk first
        todo = s.prompt_target[chunked] - s.num_prompt_computed[chunked]
        room = min(rem_chunk, int(free_and_evictable(s) - total_offset))
        if room <= 0:  # available_chunk_tokens: a continuing chunk makes progress (prefill_budget.py:142-145)
            room = rem_chunk
        extend = min(todo, room)
        s.radix_request[chunked, EXTEND_LEN] = extend
        num_can_run += 1
        tokens = ceil_page(s, extend)
        # _update_prefill_budget -> PrefillBudget.reserve (schedule_policy.py:895-933,
        # prefill_budget.py:156-169): the paged extend and a page, its output if this is the last chunk
        total_offset += tokens + page + (0 if todo > room else min(s.output_tokens[chunked], CLIP_MAX_NEW_TOKENS))
        cur_offset += tokens + page
        rem_input -= tokens
        rem_chunk -= tokens
        if todo > room:
            new_chunked = chunked
    first_new = c[NUM_RUNNING]
    while c[WAITING_LEN]:
        if rem_input <= 0 or rem_chunk <= 0:  # budget_state: OTHER, before each candidate (scheduler.py:4202-4203)
            break
        if running_bs + num_can_run >= s.config[MAX_NUM_SEQS]:  # :4215-4226
            c[BATCH_IS_FULL] = FULL
            break
        i = s.waiting[c[WAITING_HEAD]]
        target = s.prompt_target[i]
        left = min(max(s.output_tokens[i] - s.num_generated[i], 0), CLIP_MAX_NEW_TOKENS)
        if s.width[i] > 1:  # one sequence per request (SGLang fans n out into requests)
            reject_head(s, i, REJECT_WIDTH_UNSHARED)
            continue
        if s.final_len[i] > s.config[MAX_SEQ_LEN] or target + left + page >= radix_cache.capacity(s):
            reject_head(s, i, REJECT_NEVER_FITS)  # no empty pool's budget (add_one_req's, below) takes it
            continue
        # the match (with a host tier, best is its deepest node, on the device or the host)
        node, best, prefix = radix_cache.match_for_admission(s, i, target)
        device_prefix = prefix
        extend = target - prefix
        # add_one_req: the extend, the output left and a page for the paged allocator's rounding
        # (per_req_token_overhead, schedule_policy.py:1403-1412), checked with the prefix locked
        # (_lock_node, :1431; check_prefill, prefill_budget.py:114-131)
        radix_cache.inc_lock_ref(s, node)
        if extend + left + page >= free_and_evictable(s) - total_offset:  # NO_TOKEN
            radix_cache.dec_lock_ref(s, node)
            c[DEMAND_WAITING] = 1
            if num_can_run or running_bs:  # scheduler.py:4279-4284
                c[BATCH_IS_FULL] = NO_TOKEN
            break
        # a host hit: loaded back, its tokens then cached, or recomputed (radix_cache.load_back)
        node, loaded = radix_cache.load_host_hit(s, node, best)
        prefix += loaded
        extend -= loaded
        # the extend and chunk budgets count a loaded host hit as cached (_select_prefill_admission,
        # schedule_policy.py:1596-1603, which SGLang checks before the load: the same verdicts), one
        # not loaded as recomputed (the admission selected again without it, :1557-1566)
        tokens = ceil_page(s, extend)
        # max_prefill_tokens (rem_input_tokens) turns a request away only without chunked prefill
        # (schedule_policy.py:1627-1633); chunked, it spends the budget and ends the pass (budget_state)
        if tokens > rem_chunk:  # chunked prefill: what the chunk budget holds, whole pages (:1650-1675)
            extend = rem_chunk // page * page
            if extend <= 0:
                radix_cache.dec_lock_ref(s, node)
                break
            new_chunked = i
            total_offset += extend + page  # reserve: the chunk and a page, no output (prefill_budget.py:166-169)
            cur_offset += extend + page
            tokens = extend
        else:
            total_offset += tokens + page + min(s.output_tokens[i], CLIP_MAX_NEW_TOKENS)
            cur_offset += tokens + page
        rem_input -= tokens
        rem_chunk -= tokens
        pop_waiting(s)
        s.radix_request[i, LOCKED_NODE] = node
        s.radix_request[i, PREFIX_LEN] = prefix
        s.radix_request[i, EXTEND_LEN] = extend
        s.num_computed_tokens[i] = prefix
        s.num_prompt_computed[i] = prefix
        c[PREFIX_HIT_TOKENS] += device_prefix  # the device's hit (with a host tier, HOST_HIT_TOKENS the host's)
        c[PREFIX_LOOKUP_TOKENS] += target
        start_running(s, i)
        num_can_run += 1
        free = free_and_evictable(s)
        if free - total_offset <= 0 or free - cur_offset <= 0:  # budget_state: NO_TOKEN (scheduler.py:4279-4284)
            c[BATCH_IS_FULL] = NO_TOKEN
            break
    c[CHUNKED_REQUEST] = new_chunked
    if num_can_run == 0:
        return False
    c[PREFILL_INTO_EMPTY] = running_bs == 0
    # prepare_for_extend: the batch's tokens, after every lock was taken; the allocator evicts for
    # the batch's extend tokens first (alloc_token_slots, allocation.py:157), paged with a page more
    # per request (alloc_paged_token_slots_extend, :190-201)
    extend_tokens = 0
    for k in range(first_new, c[NUM_RUNNING]):
        extend_tokens += s.radix_request[s.running[k], EXTEND_LEN]
    if chunked >= 0:
        extend_tokens += s.radix_request[chunked, EXTEND_LEN]
    radix_cache.make_room(s, extend_tokens + (num_can_run * page if page > 1 else 0))
    if chunked >= 0:
        extend_request(s, chunked)
    for k in range(first_new, c[NUM_RUNNING]):
        extend_request(s, s.running[k])
    return True


@njit  # called from two places
def extend_request(s, i):
    n = s.radix_request[i, EXTEND_LEN]
    radix_cache.hold(s, i, s.num_computed_tokens[i] + n)
    prefill(s, i, n, SGLANG_TRAITS)


@njit(inline=True)
def decode_tokens(s):
    """``new_tokens_required_next_decode``: a page for each decoding request whose last page is
    full (schedule_batch.py:3403-3419)."""
    c, page = s.count, s.config[BLOCK_SIZE]
    need = 0
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if s.in_decode[i] and (s.num_computed_tokens[i] - s.radix_request[i, PREFIX_LEN]) % page == 0:
            need += page
    return need


@njit(inline=True)
def decode_fits(s):
    """``check_decode_mem`` -> ``check_decode_capacity``: evict what the step is short of, then
    whether it fits (schedule_batch.py:3432-3449, mem_cache/allocator/base.py:171-185)."""
    need = decode_tokens(s)
    radix_cache.make_room(s, need)
    return radix_cache.available(s) >= need


@njit(inline=True)
def decode(s):
    """The decode step (module docstring, 2); returns its context sum."""
    c, page = s.count, s.config[BLOCK_SIZE]
    clock = s.clock
    if not decode_fits(s):
        retract_decode(s)
        c[BATCH_IS_FULL] = 0  # the batch shrank (scheduler.py:4544-4545)
    else:
        clock[NEW_TOKEN_RATIO] = max(clock[NEW_TOKEN_RATIO] - clock[NEW_TOKEN_RATIO_DECAY], clock[MIN_NEW_TOKEN_RATIO])
    # alloc_for_decode evicts a slot (paged: a page) per request first (allocation.py:157, :582-585)
    radix_cache.make_room(s, c[DECODE_SET_SIZE] * page)
    context_sum = 0
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if s.in_decode[i]:
            radix_cache.hold(s, i, s.num_computed_tokens[i] + 1)
            s.num_computed_tokens[i] += 1
            context_sum += s.num_computed_tokens[i]
    c[STEP_DECODE_SEQS] = c[DECODE_SET_SIZE]
    return context_sum


@njit(inline=True)
def retract_decode(s):
    """``retract_decode``: retract the request sorted last by (generated tokens, -prompt)
    descending, Python's stable sort (the fewest generated, then the longest prompt, then the
    latest in the batch), at least one, until the rest's decode step fits (``check_decode_mem``,
    schedule_batch.py:3458-3461; each retraction evicts towards ``RETRACT_DECODE_STEPS`` steps of
    the rest: ``release_req``, :2389-2392); then ``new_token_ratio`` from the rest."""
    c = s.count
    remaining = c[DECODE_SET_SIZE]
    first = True
    while first or not decode_fits(s):
        if remaining <= 1:
            break
        first = False
        victim = np.int64(-1)  # not -1: jit.njit's note on constants
        for k in range(c[NUM_RUNNING]):
            i = s.running[k]
            if s.in_decode[i] and (victim < 0 or s.num_generated[i] < s.num_generated[victim] or (
                    s.num_generated[i] == s.num_generated[victim] and s.prompt_tokens[i] >= s.prompt_tokens[victim])):
                victim = i
        retract(s, victim)
        remaining -= 1
        radix_cache.make_room(s, RETRACT_DECODE_STEPS * remaining)
    kept = 0  # the running list without them, in order
    decoded = 0
    max_new = 0
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        if s.status[i] == RUNNING:
            s.running[kept] = i
            kept += 1
            if s.in_decode[i]:
                decoded += s.num_generated[i]
                max_new += s.output_tokens[i]
    c[NUM_RUNNING] = kept
    # estimate_new_token_ratio_after_retract (new_token_ratio_tracker.py:41-49): + 1 against a zero
    s.clock[NEW_TOKEN_RATIO] = min(1.0, (decoded + RETRACT_DECODE_STEPS * remaining) / (max_new + 1))


@njit(inline=True)
def retract(s, i):
    """Request ``i`` leaves the batch: its tokens outside the tree freed, its prefix unlocked,
    and it waits at the end of the queue to be recomputed with its generated tokens."""
    c = s.count
    s.in_decode[i] = 0
    c[DECODE_SET_SIZE] -= 1
    c[NUM_RUNNING_SEQS] -= 1
    radix_cache.release(s, i)
    s.num_preemptions[i] += 1
    c[NUM_PREEMPTIONS] += 1
    c[FREE_EPOCH] += 1
    s.prompt_target[i] = s.prompt_tokens[i] + s.num_generated[i]
    s.num_prompt_computed[i] = 0
    s.status[i] = WAITING
    push_waiting(s, i, np.bool_(False))  # at the end: SGLang retracts to the queue's back
