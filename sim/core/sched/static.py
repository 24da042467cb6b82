"""Request-level (static) batching over the core's arrays (FasterTransformer): with no batch running, take up to B waiting requests FCFS (B: the static
manager's slots, ``static_batch_size`` or ``max_num_seqs`` if fewer), each in a fixed slot of
max_seq_len (the contiguous manager's accounting with the ``max`` reservation, its slots
first-fit over ``[0, B * max_seq_len)``: the lowest free slot), and prefill them together;
then decode until the longest member is done. Nobody joins mid-batch. The batch is padded: the
prefill computes B sequences of the longest prompt each (nothing cached before it) and every
decode step computes all B sequences, finished or not; members that are done keep their K/V
and wait. Results return when the whole batch ends: every member's finish time is the batch's.
The loop prices these steps as any other (``loop.step_time``, whichever cost model), from the
padded shape this module writes.
"""

from __future__ import annotations


from pagesim.sim.core.kv import extent, kv_cache
from pagesim.sim.core.sched import lifecycle
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.compile.families import TRAITS
from pagesim.sim.core.state import STATIC
from pagesim.sim.core.state import (COMPUTED_SLOTS, DEMAND_WAITING, FINISHED, FREE_EPOCH, ITL_COUNT, ITL_SUM,
                                    NUM_FINISHED, NUM_RUNNING, NUM_RUNNING_SEQS, REJECT_NEVER_FITS,
                                    REJECT_WIDTH_UNSHARED, STEP_DECODE_SEQS, STEP_PREFILL_SEQS,
                                    STEP_PREFILL_TOKENS, WAITING_LEN)
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    STATIC_BATCH_LIMIT  static batching: the requests of a batch
""")

# Core.count: this file's entries, in its room of the shared table (sim/core/state.py)
section("count", globals(), """
    STATIC_LIVE         static batching: the batch's requests still generating
    STATIC_CONTEXT_SUM  static batching: the batch's context tokens
""")


#: the traits of this scheduler's family (``families.TRAITS``)
STATIC_TRAITS = TRAITS[STATIC]


@njit(inline=True)  # one place calls it: its scheduler's entry (by_reference.py)
def start_batch(s):
    """Admit up to B waiting requests FCFS into a new batch (the running list) and prefill
    them; the longest prompt is every member's padded prefill."""
    c = s.count
    longest = 0
    while c[WAITING_LEN] and c[NUM_RUNNING] < s.config[STATIC_BATCH_LIMIT]:
        i = lifecycle.waiting_head(s)
        if s.width[i] > 1:  # one sequence per request (sim.core.outcome says why)
            lifecycle.reject_head(s, i, REJECT_WIDTH_UNSHARED)
            continue
        prompt = s.prompt_tokens[i]
        fits = extent.can_allocate(s, i, prompt)
        if fits == kv_cache.NEVER_FITS:
            lifecycle.reject_head(s, i, REJECT_NEVER_FITS)
            continue
        if fits == kv_cache.ALLOCATE_LATER:
            c[DEMAND_WAITING] = 1
            break
        lifecycle.pop_waiting(s)
        extent.allocate(s, i, prompt, 0)
        kv_cache.compute_tokens(s, i, prompt, STATIC_TRAITS)
        s.num_prompt_computed[i] = prompt
        lifecycle.start_running(s, i)
        longest = max(longest, prompt)
    c[STEP_PREFILL_SEQS] = c[NUM_RUNNING]
    c[STEP_PREFILL_TOKENS] = c[NUM_RUNNING] * longest
    context_sum = 0
    for k in range(c[NUM_RUNNING]):
        i = s.running[k]
        s.step_prefill_ids[k] = i
        s.step_prefill_tokens[k] = longest  # padded: the longest prompt, after nothing cached
        s.step_prefill_context[k] = longest
        context_sum += s.prompt_tokens[i]
    # a decode step's context: each member's prompt + min(generated, output), kept as a sum
    # that grows with every token handed out (complete_step)
    c[STATIC_CONTEXT_SUM] = context_sum


@njit(inline=True)
def schedule(s):
    """One iteration: a new batch's prefill, or a decode step of the running batch; returns
    the decode context sum (every member's, after this step's token where it gets one)."""
    c = s.count
    c[DEMAND_WAITING] = 0
    lifecycle.begin_iteration(s)
    if c[NUM_RUNNING] == 0:
        start_batch(s)
        return 0
    # the members still generating store their newest token's K/V (their L is
    # prompt + generated - 1, written back when the batch ends); every member is computed
    c[COMPUTED_SLOTS] += c[STATIC_LIVE]
    c[STEP_DECODE_SEQS] = c[NUM_RUNNING]
    return c[STATIC_CONTEXT_SUM]


@njit(inline=True)
def complete_step(s, now):
    """Hand out the tokens; when every member is done, finish the whole batch at ``now``."""
    c = s.count
    members = c[NUM_RUNNING]
    running, num_generated, output_tokens = s.running, s.num_generated, s.output_tokens
    last_token_s = s.last_token_s
    still_live = 0
    if c[STEP_PREFILL_SEQS]:
        for k in range(members):
            i = running[k]
            num_generated[i] = 1
            s.first_token_s[i] = now
            last_token_s[i] = now
            if output_tokens[i] > 1:
                still_live += 1
        c[STATIC_CONTEXT_SUM] += members
    else:  # the members still generating got their last token together: one latency
        live = c[STATIC_LIVE]
        latency = 0.0
        for k in range(members):
            i = running[k]
            if num_generated[i] < output_tokens[i]:
                latency = now - last_token_s[i]
                num_generated[i] += 1
                last_token_s[i] = now
                if num_generated[i] < output_tokens[i]:
                    still_live += 1
        s.itl_hist[lifecycle.itl_bin(s.itl_edges, latency)] += live
        s.clock[ITL_SUM] += latency * live
        c[ITL_COUNT] += live
        c[STATIC_CONTEXT_SUM] += live
    c[STATIC_LIVE] = still_live
    if still_live:
        return
    for k in range(members):
        i = running[k]
        s.num_computed_tokens[i] = s.prompt_tokens[i] + num_generated[i] - 1  # the batch's L
        extent.free(s, i)
        s.status[i] = FINISHED
        s.finish_s[i] = now
    c[FREE_EPOCH] += 1
    c[NUM_FINISHED] += members
    c[NUM_RUNNING] = 0
    c[NUM_RUNNING_SEQS] = 0  # (start_running counted them; nothing static reads it, --check does)
