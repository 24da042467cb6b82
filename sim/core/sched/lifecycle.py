"""A request's life in the engine: the verbs every scheduler shares (vLLM v0 and v1, Orca, SGLang,
static batching), apart from any one system's policy.

* the waiting queue, a ring over request ids: its head, where a request joins it (the policy's
  :func:`sim.core.policies.waiting_position`), taking a request out of it;
* an arrival, an admission (``start_running``), a prefill chunk, a rejection;
* preemption's mechanics (:func:`preempt`): the victim leaves the running list and is swapped
  out or freed for recompute. *Which* request is the victim is each policy's choice
  (``policies.victim``), not this file's;
* the end of a step (:func:`complete_step`): the tokens it produced, inter-token latencies,
  finished requests and their memory.
"""

from __future__ import annotations

import math

import numpy as np

from pagesim.sim.core.kv import kv_cache, memory, remote_kv
from pagesim.sim.core.sched import beam, policies, speculative
from pagesim.sim.core.compile.families import DISAGGREGATES, FORKS, SPECULATES, TRAITS
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import DISAGG_ROLE, KV_HOLDING_WAITING, NOW, PREFILL_SIDE, SCHEDULER_KIND
from pagesim.sim.core.state import (CONTINUOUS, CONTINUOUS_CONTIGUOUS, DECODE_SET_SIZE, DEMAND_WAITING,
                                    FINISHED, FREE_EPOCH, ITL_COUNT, ITL_SUM, MAX_NUM_SEQS, NUM_FINISHED,
                                    NUM_PREEMPTIONS, NUM_REJECTED, NUM_RUNNING, NUM_RUNNING_SEQS,
                                    NUM_SWAP_FALLBACKS, REJECT_TOO_WIDE, REJECTED, RUNNING,
                                    STEP_COPIED_BLOCKS, STEP_DECODE_SEQS, STEP_NUM_FINISHED,
                                    STEP_PREFILL_SEQS, STEP_PREFILL_TOKENS, STEP_SWAP_IN,
                                    STEP_SWAP_IN_BLOCKS, STEP_SWAP_OUT, STEP_SWAP_OUT_BLOCKS,
                                    STEP_SWAP_OUT_EARLY, STEPS_WITHOUT_TOKEN, SWAP_CAPACITY_TOKENS,
                                    SWAP_USED_TOKENS, SWAPPED, SWAPPED_HEAD, SWAPPED_LEN, V1, WAITING,
                                    WAITING_HEAD, WAITING_LEN)
from pagesim.sim.core.state import section

# Core.config: this file's entries, in its room of the shared table (sim/core/state.py)
section("config", globals(), """
    SWAP_PREEMPTION     1: preempt by swapping out to host memory, not by recomputing
""")


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
def waiting_at(s, p):
    """The request at position ``p`` of the waiting queue (0: its head)."""
    return s.waiting[(s.count[WAITING_HEAD] + p) % len(s.waiting)]


@njit(inline=True)
def push_waiting(s, i, returning):
    """Request ``i`` joins the waiting queue where the policy puts it (``returning``: it was
    preempted), behind the requests holding KV blocks (:func:`hold_waiting`)."""
    insert_waiting(s, i, max(policies.waiting_position(s, i, returning), s.count[KV_HOLDING_WAITING]))


@njit(inline=True)
def insert_waiting(s, i, p):
    """Request ``i`` joins the waiting queue at position ``p``; those from there on move one
    place back."""
    c, n = s.count, len(s.waiting)
    if p == 0:  # the front: the head moves back instead
        c[WAITING_HEAD] = (c[WAITING_HEAD] + n - 1) % n
    else:
        for k in range(c[WAITING_LEN], p, -1):
            s.waiting[(c[WAITING_HEAD] + k) % n] = s.waiting[(c[WAITING_HEAD] + k - 1) % n]
    s.waiting[(c[WAITING_HEAD] + p) % n] = i
    c[WAITING_LEN] += 1


@njit(inline=True)
def pop_waiting(s):
    s.count[WAITING_HEAD] = (s.count[WAITING_HEAD] + 1) % len(s.waiting)
    s.count[WAITING_LEN] -= 1


@njit(inline=True)  # each admission takes one: a call would pass the state's ~60 arrays
def take_waiting(s, p):
    """Request ``waiting_at(s, p)`` leaves the waiting queue; those after it move up."""
    c, n = s.count, len(s.waiting)
    if p == 0:
        pop_waiting(s)
        return
    for k in range(p, c[WAITING_LEN] - 1):
        s.waiting[(c[WAITING_HEAD] + k) % n] = s.waiting[(c[WAITING_HEAD] + k + 1) % n]
    c[WAITING_LEN] -= 1


# -- requests holding KV blocks while their KV arrives (vLLM v1's WAITING_FOR_REMOTE_KVS) ------
# One rule for every connector that loads a request's KV asynchronously (a decode replica's
# transfer from the prefill side, sim/core/events/disagg.py; the CPU offload tier's load, host_tier.py),
# as vLLM 0.33.0 has it (v1/core/sched/scheduler.py): a waiting request holding KV blocks is in a
# queue of its own, ``kv_holding_waiting`` (``_enqueue_waiting_request``, :2709-2714, by
# ``_holds_kv_blocks``, :2697-2707), which each pass goes through before the others (:1062-1067),
# in its order, skipping those whose KV has not arrived (``_handle_blocked_waiting_request``,
# :3519-3535; ``skip_request``, :1053-1060, puts them back in their order ahead of the rest,
# :1606-1610). Here that queue is the waiting queue's first ``count[KV_HOLDING_WAITING]``
# places. A request that starts a load joins it behind those already in it (``skip_request``
# at :1544 once those before it were visited; by (priority, arrival) under the priority policy,
# whose queue that one is too). A decode replica's request joins it as its transfer ends
# (the transfer runs in the cluster's loop, out of the replica's queue: disagg.py), a host load's
# as the load starts (host_tier.py): both in the order vLLM has, but for transfers that end out
# of the order they started in.
@njit
def hold_waiting(s, i):
    """Request ``i``, holding KV blocks that a connector loads, joins the waiting queue's
    holding part, behind those there before it (in the policy's order)."""
    insert_waiting(s, i, policies.holding_position(s, i))
    s.count[KV_HOLDING_WAITING] += 1


@njit(inline=True)
def kv_arrived(s, i):
    """Whether holding request ``i``'s KV is in its blocks (``load_ready_s``: when it is, or will be)."""
    return s.load_ready_s[i] <= s.clock[NOW]


@njit
def first_arrived(s):
    """The first position of the waiting queue's holding part whose KV has arrived, -1 for none:
    the next request a pass admits (the rest of the queue waits behind it)."""
    for p in range(s.count[KV_HOLDING_WAITING]):
        if kv_arrived(s, waiting_at(s, p)):
            return p
    return -1


@njit(inline=True)
def take_holding(s, p):
    """Holding request ``waiting_at(s, p)`` leaves the waiting queue (admitted)."""
    take_waiting(s, p)
    s.count[KV_HOLDING_WAITING] -= 1


@njit(inline=True)
def add_arrival(s, i):
    if s.width[i] > s.config[MAX_NUM_SEQS]:  # its sequences run together: it could never be admitted
        s.status[i] = REJECTED
        s.reject_code[i] = REJECT_TOO_WIDE
        s.count[NUM_REJECTED] += 1
        return
    s.status[i] = WAITING
    push_waiting(s, i, np.bool_(False))


@njit(inline=True)
def prefill(s, i, n, traits):
    """``n`` more prompt tokens of request ``i`` this iteration (``traits``: the caller's
    family's, ``kv_cache.compute_tokens``)."""
    kv_cache.compute_tokens(s, i, n, traits)
    s.num_prompt_computed[i] += n
    k = s.count[STEP_PREFILL_SEQS]
    s.step_prefill_ids[k] = i
    s.step_prefill_tokens[k] = n
    s.step_prefill_context[k] = s.num_prompt_computed[i]  # its context after the chunk (loop.step_time)
    s.count[STEP_PREFILL_SEQS] = k + 1
    s.count[STEP_PREFILL_TOKENS] += n


@njit(inline=True)
def reject_head(s, i, reason):
    reject_waiting(s, np.int64(0), i, np.int64(reason))  # np.int64: jit.njit's note on constants


# per rejection: a call, not inlined (sim/core/events/loop.py's docstring, "Compiled per family")
@njit
def reject_waiting(s, p, i, reason):
    """Request ``i``, at position ``p`` of the waiting queue, is refused for ``reason``."""
    take_waiting(s, p)
    s.status[i] = REJECTED
    s.reject_code[i] = reason
    s.count[NUM_REJECTED] += 1


@njit(inline=True)
def start_running(s, i):
    """Request ``i`` joins the running list. It takes ``width`` of ``max_num_seqs`` from now on,
    before its fork too (vLLM 0.4.2 counts a group's ``best_of`` at its prompt stage:
    ``SequenceGroup.get_max_num_running_seqs``, ``vllm/sequence.py:479-494``)."""
    s.status[i] = RUNNING
    s.running[s.count[NUM_RUNNING]] = i
    s.count[NUM_RUNNING] += 1
    s.count[NUM_RUNNING_SEQS] += s.width[i]


# -- preemption: the mechanics (the victim is the policy's choice: policies.victim) ------------
@njit(inline=True)
def preempt(s, k, traits):
    """Preempt ``running[k]``: it leaves the running list (the rest keep their order), and is
    swapped out (``--preemption swap``, or it runs several sequences) while swap space lasts,
    else freed for recompute.
    Returns its request id. ``traits``: the caller's scheduler family's (``memory.py``)."""
    c = s.count
    i = s.running[k]
    for m in range(k, c[NUM_RUNNING] - 1):  # none to move when it is the latest admitted
        s.running[m] = s.running[m + 1]
    c[NUM_RUNNING] -= 1
    w = s.num_seqs[i]
    c[NUM_RUNNING_SEQS] -= s.width[i]
    c[DECODE_SET_SIZE] -= s.in_decode[i] * w
    s.in_decode[i] = 0
    c[FREE_EPOCH] += 1
    s.num_preemptions[i] += 1
    c[NUM_PREEMPTIONS] += 1
    c[DEMAND_WAITING] = 1
    n = s.num_computed_tokens[i]  # per sequence
    # a request running several sequences is swapped whatever the setting: vLLM 0.4.2 cannot
    # recompute a group (``Scheduler._preempt``, ``vllm/core/scheduler.py:1047-1060``)
    # a request mid-prompt (chunked prefill) too: it comes back to prefill the rest
    # (``swapped_in.prefill_seq_groups``, ``vllm/core/scheduler.py:564-567``)
    swap = s.config[SWAP_PREEMPTION] or w > 1
    memory.preempted(s, i, traits)
    moved = kv_cache.swapped_size(s, i, n)
    if swap and c[SWAP_USED_TOKENS] + moved <= s.config[SWAP_CAPACITY_TOKENS]:
        if kv_cache.swaps_recorded(s.config):
            kv_cache.record_swap(s, i, True)  # the blocks its K/V leave from, before they are freed
        memory.swap_out(s, i, traits)  # its K/V go to the host; it comes back as it was
        s.swapped_tokens[i] = n
        c[SWAP_USED_TOKENS] += moved
        c[STEP_SWAP_OUT] += moved
        s.status[i] = SWAPPED
        push_swapped(s, i)
        return i
    if swap:
        c[NUM_SWAP_FALLBACKS] += 1  # no swap space left: recompute
    memory.free(s, i, traits)
    restart(s, i)
    return i


@njit(inline=True)
def push_swapped(s, i):
    """Request ``i`` joins the swapped queue at its place by arrival, after those that arrived
    with it: vLLM 0.4.2 sorts that queue by arrival before each swap-in (stable, FCFS:
    ``vllm/core/scheduler.py:518``), so the earliest arrival comes back first, not the first
    swapped out."""
    c, n = s.count, len(s.swapped)
    k = c[SWAPPED_LEN]
    while k > 0 and s.arrival_s[s.swapped[(c[SWAPPED_HEAD] + k - 1) % n]] > s.arrival_s[i]:
        s.swapped[(c[SWAPPED_HEAD] + k) % n] = s.swapped[(c[SWAPPED_HEAD] + k - 1) % n]
        k -= 1
    s.swapped[(c[SWAPPED_HEAD] + k) % n] = i
    c[SWAPPED_LEN] += 1


def preempt_for(family):
    """:func:`preempt` for one scheduler family's callers, its traits a constant of the closure.
    A preemption is a call, not inlined (sim/core/events/loop.py's docstring, "Compiled per family"),
    and numba prunes branches by a constant it sees, not by a literal argument's value: with
    the traits an argument of the call, each family compiled every manager's release into it
    (vLLM's SGLang's radix tree, vLLM v1's the contiguous manager too: its family alone took
    37 s of CPU to compile, 33 s since, paired by hand; ``tests/sim/core/test_family_managers.py``
    checks)."""

    traits = TRAITS[family]

    def preempt_family(s, k: int) -> int:
        return preempt(s, k, traits)

    return preempt_family


preempt_continuous = njit(preempt_for(CONTINUOUS))  # vLLM v0's and Orca's over paged memory (scheduler_vllm.py)
preempt_contiguous = njit(preempt_for(CONTINUOUS_CONTIGUOUS))  # ... over contiguous extents (scheduler_orca.py)
# vLLM v1's (scheduler_v1.py), called from its scheduler's entry: compiled apart, the state by reference
preempt_v1 = njit(preempt_for(V1), lazy=lambda config: config[SCHEDULER_KIND] == V1)


@njit
def restart(s, i):
    """Request ``i`` (holding no memory) waits to be recomputed, where the policy puts a
    returning request (FCFS: the queue's front)."""
    s.num_seqs[i] = 1  # a group restarts as one sequence and forks again after its prefill
    if s.num_generated[i] > 0:  # the generated tokens become prompt
        s.prompt_target[i] = s.prompt_tokens[i] + s.num_generated[i]
    s.num_prompt_computed[i] = 0
    s.status[i] = WAITING
    push_waiting(s, i, np.bool_(True))  # np.bool_: jit.njit's note on constants


@njit(inline=True)
def begin_iteration(s):
    """An iteration's counts from zero: what it prefills, decodes, swaps and copies (both
    schedulers, this one and sim/core/sched/static.py)."""
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


# once a step: inlined (sim/core/events/loop.py's docstring, "Compiled per family")
@njit(inline=True)
def complete_step(s, now, traits):
    """Hand out the tokens the iteration produced; finish and free whoever is done. ``traits``:
    what the loop's scheduler family does, a constant there (``memory.py``)."""
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
        speculating = False
        if traits & SPECULATES:
            speculating = speculative.speculating(s.config)
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
            if speculating:  # its accepted drafts too (speculative.py)
                num_generated[i] += speculative.accept(s, i, traits)
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
        if traits & SPECULATES and speculative.speculating(s.config):  # a padded admission's placeholders (speculative.pads)
            speculative.placeholders_rejected(s, i)
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
            # parallel sampling: prefilled once, then forked (vLLM v0's over blocks alone: the
            # others reject n > 1 or fan it out into requests)
            if traits & FORKS and s.width[i] > 1 and s.num_seqs[i] == 1:
                kv_cache.fork(s, i)
            s.in_decode[i] = 1
            c[DECODE_SET_SIZE] += s.num_seqs[i]
            memory.joined_decode(s, i, traits)
    c[STEP_NUM_FINISHED] = num_done  # step_finished[:num_done]: an executor outside the core may ask
    if num_done:
        finish(s, now, num_done, traits)
    if c[STEP_DECODE_SEQS] and beam.searching(s.config):  # after the finishes: the rest's beams follow their records
        beam.advance(s)


@njit(inline=True)
def release(s, i, traits):
    """Running request ``i`` is done with (finished, or aborted: scheduler_v1.abort_timed_out):
    its memory goes, its sequences leave the counts. The caller sets its status and drops it
    from the running list."""
    c = s.count
    c[FREE_EPOCH] += 1
    memory.free(s, i, traits)
    c[DECODE_SET_SIZE] -= s.in_decode[i] * s.num_seqs[i]
    c[NUM_RUNNING_SEQS] -= s.width[i]
    s.in_decode[i] = 0


@njit(inline=True)
def finish(s, now, num_done, traits):
    """The step's ``num_done`` finished requests (``step_finished``) let their memory go."""
    c = s.count
    for k in range(num_done):
        i = s.step_finished[k]
        if traits & DISAGGREGATES and s.config[DISAGG_ROLE] == PREFILL_SIDE:  # its KV waits for the decode side
            c[NUM_RUNNING_SEQS] -= s.width[i]
            remote_kv.hold_for_transfer(s, i)
        else:  # (its host tier blocks are touched by the next scheduling pass: host_tier.touch_finished)
            release(s, i, traits)
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
