"""A disaggregated cluster: P prefill and D decode replicas of ``vllm-v1``, a router per pool,
and the KV transfers between them, in one discrete-event simulation.

Each replica is a whole engine (a :class:`~sim.core.state.Core`, run by ``loop.run`` with
``config[ROUTED]``, as in ``sim/core/events/cluster.py``) with a role (``config[DISAGG_ROLE]``). The
prefill pool shares one set of request columns, in which every request asks for one token (the
disaggregated proxy's ``max_tokens=1``); the decode pool shares another, the trace's own, with
``arrival_s`` the time each request was handed to it. A request's life (vLLM 0.33.0's NIXL
connector, pull mode: ``sim/core/kv/remote_kv.py`` gives the rules of its blocks):

1. it arrives, is routed to a prefill replica (the prefill pool's router) and prefilled there
   as a one-token request; when it finishes, its blocks are held for the transfer and it is
   handed over, at that instant, to a decode replica (the decode pool's router);
2. the decode replica admits it when its prompt's blocks fit, leaving free those its prefills
   in flight still lack (``host_tier.reserved_blocks``; ``remote_kv.admit_remote``);
   the transfer is then asked for and priced on that replica's link (``transfer.py``: a queue
   per decode replica, ``latency + bytes / bandwidth``, bandwidth ``min(TP)`` GPU pairs);
   until it ends, both sides' blocks are in transfer. A decode pool with no room leaves the
   request waiting and the prefill side holding its blocks: backpressure;
3. when the transfer ends, the prefill side frees its blocks and the decode side's hold the
   prompt: the request rejoins the decode queue's front (its loaded requests first) and
   recomputes the last prompt token there to sample its first token, then decodes.

**Time.** Replicas interact both ways (a handoff at a prefill step's end, a release at a
transfer's end), so a replica is advanced only up to the earliest event anywhere else: the next
arrival, another replica's next engine event, an in-flight transfer's end. A decode replica's
events touch another decode replica only through a prefill replica that a transfer's end wakes
(a decode step admits a request, its transfer's end frees a prefill replica's blocks, whose next
step hands a request over); while no prefill replica waits idle with requests (a release then
wakes none, and one busy takes what it frees at its next step, an event counted), a decode
replica runs on past the other decode replicas' events. Each turn takes the
earliest event of all (ties in creation order: every event id comes from the one counter kept
here, as the cluster's) and acts on it: an arrival is routed; a transfer's end frees and loads;
a replica's event runs that replica until the horizon (``loop.run`` returns ``HORIZON``), or
until it leaves work for this loop (``Core.exchange``: a finished prefill to hand over, an
admission whose transfer is to be priced; the loop returns right after the step it schedules
then, at the same instant), which is done before anything else moves.

Per request the loop records when each phase ended (``timeline``: the handoff, the transfer's
ask, its bytes' start and its end, its bytes), from which the records decompose the TTFT.
"""

from __future__ import annotations

from pagesim.sim.core.events import cluster, loop
from pagesim.sim.core.kv import kv_cache, remote_kv, transfer
from pagesim.sim.core.sched import lifecycle
from pagesim.sim.core.compile.by_reference import pin, unpin
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import (BLOCK_SIZE, CHECK_STEPS, ENGINE_EVENT_ID,
                                    ENGINE_PENDING, ENGINE_TIME, FREE_EPOCH, HORIZON_EVENT_ID,
                                    HORIZON_S, LOADING, MAX_SEQ_LEN,
                                    NEXT_EVENT_ID, NOW, NUM_BLOCKS, NUM_EXCHANGE, NUM_REJECTED,
                                    REJECT_NEVER_FITS, REJECTED, SCHEDULE_ON_RESUME, STARTED, V1,
                                    WAITING, WAITING_LEN)

# the loop's counters (int64) and times (float64)
(D_STARTED, D_NEXT_ARRIVAL, D_NEXT_EVENT_ID, D_ARRIVAL_PENDING, D_ARRIVAL_EVENT_ID, D_ARRIVALS_DONE,
 D_ROUTER, D_STOPPED_REPLICA, D_PREFILL, D_IN_FLIGHT, NUM_DISAGG_COUNTS) = range(11)
(E_ARRIVAL_TIME, E_BANDWIDTH, E_LATENCY, E_BYTES_PER_TOKEN, NUM_DISAGG_CLOCK) = range(5)
# timeline columns, per request
(T_HANDOFF, T_ASKED, T_FLOW, T_END, T_BYTES, NUM_TIMELINE) = range(6)
# the next event's kind
NONE, ARRIVAL, TRANSFER_END, REPLICA = 0, 1, 2, 3
FOREVER = float(cluster.NO_HORIZON)


@njit(inline=True)
def route_pool(configs, counts, routed, router, i):
    """The replica of one pool request ``i`` goes to (``cluster.py``'s rules; prefix affinity is
    not offered here)."""
    if router == cluster.LEAST_OUTSTANDING:
        return cluster.least_outstanding(counts, routed)
    if router == cluster.LEAST_KV_USAGE:
        return cluster.least_kv_usage(configs, counts, routed)
    return i % len(routed)


@njit(inline=True)
def earlier(t, eid, best_t, best_id):
    return t < best_t or (t == best_t and eid < best_id)


@njit(inline=True)
def new_event(dc):
    eid = dc[D_NEXT_EVENT_ID]
    dc[D_NEXT_EVENT_ID] = eid + 1
    return eid


@njit(inline=True, refcounted=True)
def hand_over_arrivals(replicas, configs, counts, routed, replica_of, dc, dk, arrival_s, now):
    """Every request due at ``now`` is routed to a prefill replica; then the next arrival's
    event, or every prefill replica is told that arrivals are done."""
    P = dc[D_PREFILL]
    while True:
        i = dc[D_NEXT_ARRIVAL]
        if i >= len(arrival_s):
            dc[D_ARRIVALS_DONE] = 1  # the prefill pool's replicas come first in the list
            dc[D_NEXT_EVENT_ID] = cluster.arrivals_done(replicas, P, now, dc[D_NEXT_EVENT_ID])
            return
        at = arrival_s[i]
        if at > now:
            dc[D_ARRIVAL_PENDING] = 1
            dk[E_ARRIVAL_TIME] = now + (at - now)  # SimPy's timeout(at - now)
            dc[D_ARRIVAL_EVENT_ID] = new_event(dc)
            return
        r = route_pool(configs[:P], counts[:P], routed[:P], dc[D_ROUTER], i)
        dc[D_NEXT_EVENT_ID] = cluster.hand_to(replicas[r], i, now, dc[D_NEXT_EVENT_ID], 0)
        routed[r] += 1
        replica_of[i] = r
        dc[D_NEXT_ARRIVAL] = i + 1


@njit
def wake(s, dc, now):
    s.clock[NOW] = now
    s.count[NEXT_EVENT_ID] = dc[D_NEXT_EVENT_ID]
    loop.wake_engine(s)
    dc[D_NEXT_EVENT_ID] = s.count[NEXT_EVENT_ID]


@njit(inline=True, refcounted=True)
def take_exchange(replicas, configs, counts, routed, replica_of, decode_of, timeline, in_flight,
                  free_at, tp, dc, dk, r):
    """The work replica ``r``'s run left (``Core.exchange``), at its clock: a prefill replica's
    finished prefills are handed to decode replicas; a decode replica's admissions are priced
    on its link (their ends become events), its refusals free the prefill side's blocks."""
    P = dc[D_PREFILL]
    s = replicas[r]
    for k in range(s.count[NUM_EXCHANGE]):
        i = s.exchange[k]
        if r < P:  # a finished prefill: to the decode pool
            d = route_pool(configs[P:], counts[P:], routed[P:], dc[D_ROUTER], i)
            routed[P + d] += 1
            decode_of[i] = d
            hand_off(s, replicas[P + d], dc, timeline, i)
        elif s.status[i] == LOADING:  # the decode side asks for the prompt's KV
            ask_transfer(s, r - P, tp[replica_of[i]], tp[r], free_at, dc, dk, timeline, in_flight, i)
    s.count[NUM_EXCHANGE] = 0


@njit
def hand_off(s, sd, dc, timeline, i):
    """Prefill replica ``s``'s finished prefill ``i`` is handed to decode replica ``sd``, at
    ``s``'s clock: it joins ``sd``'s queue, or ``sd``'s serving layer refuses it and ``s`` frees
    its blocks."""
    now = s.clock[NOW]
    sd.arrival_s[i] = now  # the decode pool's own arrival column: when it was handed over
    timeline[i, T_HANDOFF] = now
    if never_fits(sd, i):  # refused by its serving layer; the prefill side frees its blocks
        sd.status[i] = REJECTED
        sd.reject_code[i] = REJECT_NEVER_FITS
        sd.count[NUM_REJECTED] += 1
        release_prefill(s, dc, i, now)
    else:
        dc[D_NEXT_EVENT_ID] = cluster.hand_to(sd, i, now, dc[D_NEXT_EVENT_ID], 0)


@njit
def ask_transfer(s, link, prefill_tp, decode_tp, free_at, dc, dk, timeline, in_flight, i):
    """Decode replica ``s`` (on ``link``) admitted ``i`` and asks, at its clock, for the
    prompt's KV less its local prefix hits (``remote_kv.allocate_for_transfer``): the transfer
    is priced on the link, and its end becomes an event."""
    now = s.clock[NOW]
    num_bytes = transfer.transfer_bytes(s.prompt_tokens[i] - s.num_computed_tokens[i],
                                        s.config[BLOCK_SIZE], dk[E_BYTES_PER_TOKEN])
    bandwidth = transfer.pair_bandwidth(dk[E_BANDWIDTH], prefill_tp, decode_tp)
    flow, end = transfer.start_transfer(free_at, link, now, num_bytes, bandwidth, dk[E_LATENCY])
    timeline[i, T_ASKED] = now
    timeline[i, T_FLOW] = flow
    timeline[i, T_END] = end
    timeline[i, T_BYTES] = num_bytes
    in_flight[dc[D_IN_FLIGHT], 0] = i
    in_flight[dc[D_IN_FLIGHT], 1] = new_event(dc)
    dc[D_IN_FLIGHT] += 1


@njit(inline=True)
def never_fits(s, i):
    """Decode replica ``s`` can never hold request ``i`` (``scheduler_v1.admit_waiting``'s test
    of a request too long): the decode side's serving layer refuses it as it arrives, and the
    connector frees the prefill side's blocks (``request_finished`` of a request never
    scheduled: nixl/pull_scheduler.py:216-230)."""
    return (s.final_len[i] > s.config[MAX_SEQ_LEN]
            or kv_cache.blocks_for(s, s.final_len[i]) > s.config[NUM_BLOCKS])


@njit
def release_prefill(sp, dc, i, now):
    pin(sp)  # (a replica's functions called between its runs: by_reference.py)
    remote_kv.release_transfer(sp, i)
    unpin(sp)
    sp.count[FREE_EPOCH] += 1
    wake(sp, dc, now)


@njit(inline=True, refcounted=True)
def end_transfer(replicas, replica_of, decode_of, dc, k, in_flight, timeline):
    """In-flight transfer ``k`` ends: the prefill side frees its blocks, the decode side's hold
    the prompt and the request, its KV arrived, joins its queue's holding part."""
    P = dc[D_PREFILL]
    i = in_flight[k, 0]
    now = timeline[i, T_END]
    last = dc[D_IN_FLIGHT] - 1
    in_flight[k, 0] = in_flight[last, 0]
    in_flight[k, 1] = in_flight[last, 1]
    dc[D_IN_FLIGHT] = last
    release_prefill(replicas[replica_of[i]], dc, i, now)
    arrive(replicas[P + decode_of[i]], dc, i, now)


@njit
def arrive(sd, dc, i, now):
    """Request ``i``'s KV arrived at decode replica ``sd`` at ``now``: its blocks hold the
    prompt, and the request joins its queue's holding part (``lifecycle.hold_waiting``)."""
    pin(sd)  # (a replica's functions called between its runs: by_reference.py)
    remote_kv.transfer_loaded(sd, i, sd.prompt_target[i])
    sd.status[i] = WAITING
    sd.load_ready_s[i] = now
    lifecycle.hold_waiting(sd, i)
    unpin(sd)
    wake(sd, dc, now)


@njit(inline=True)
def replica_event(counts, clocks, r):
    """Replica ``r``'s next event as (pending, time, id): one not started, or owing a schedule,
    is due at once (before any event)."""
    if not counts[r, STARTED] or counts[r, SCHEDULE_ON_RESUME]:
        return True, -1.0, -1
    if counts[r, ENGINE_PENDING]:
        return True, clocks[r, ENGINE_TIME], counts[r, ENGINE_EVENT_ID]
    return False, 0.0, 0


@njit
def next_events(counts, clocks, dc, dk, in_flight, timeline):
    """The earliest event of all, (kind, index, time, id), and its replica's horizon (time, id):
    the earliest event after it, or, for a decode replica while no prefill replica waits idle
    for memory, the earliest but the decode replicas' (module docstring, "Time")."""
    P = dc[D_PREFILL]
    kind, index = NONE, -1
    best_t, best_id = FOREVER, cluster.NO_HORIZON
    next_t, next_id = FOREVER, cluster.NO_HORIZON  # the earliest after the best
    other_t, other_id = FOREVER, cluster.NO_HORIZON  # the earliest but the decode replicas'
    if dc[D_ARRIVAL_PENDING]:
        kind, best_t, best_id = ARRIVAL, dk[E_ARRIVAL_TIME], dc[D_ARRIVAL_EVENT_ID]
        other_t, other_id = best_t, best_id
    for k in range(dc[D_IN_FLIGHT]):
        t, eid = timeline[in_flight[k, 0], T_END], in_flight[k, 1]
        if earlier(t, eid, other_t, other_id):
            other_t, other_id = t, eid
        if earlier(t, eid, best_t, best_id):
            next_t, next_id = best_t, best_id
            kind, index, best_t, best_id = TRANSFER_END, k, t, eid
        elif earlier(t, eid, next_t, next_id):
            next_t, next_id = t, eid
    blocked = False  # a prefill replica idle with requests waiting: a release would wake it
    for r in range(len(counts)):
        pending, t, eid = replica_event(counts, clocks, r)
        if not pending:
            blocked = blocked or (r < P and counts[r, WAITING_LEN] > 0)
            continue
        if r < P and earlier(t, eid, other_t, other_id):
            other_t, other_id = t, eid
        if earlier(t, eid, best_t, best_id):
            next_t, next_id = best_t, best_id
            kind, index, best_t, best_id = REPLICA, r, t, eid
        elif earlier(t, eid, next_t, next_id):
            next_t, next_id = t, eid
    if kind == REPLICA and index >= P and not blocked:
        return kind, index, best_t, best_id, other_t, other_id
    return kind, index, best_t, best_id, next_t, next_id


def disagg_loop_for(family):
    """The disaggregated cluster's loop over replicas of one scheduler family (``vllm-v1``'s
    only, for now), ``family`` a constant of the closure as in ``cluster.cluster_loop_for``."""

    def run(replicas, configs, counts, clocks, routed, replica_of, decode_of, timeline, in_flight,
            free_at, tp, dc, dk, arrival_s, engine=0):
        """Run to the end (``loop.DONE``) or until Python is needed (a replica's code,
        ``D_STOPPED_REPLICA`` naming it: its step table is full, ``--check``, an error).
        ``engine``: the replicas' loop, compiled (``loop.call_engine``)."""
        if not dc[D_STARTED]:
            dc[D_STARTED] = 1
            dc[D_NEXT_EVENT_ID] = 2  # SimPy's two Initialize events
            hand_over_arrivals(replicas, configs, counts, routed, replica_of, dc, dk, arrival_s,
                               0.0)
        while True:
            kind, index, t, eid, horizon_s, horizon_id = next_events(counts, clocks, dc, dk,
                                                                     in_flight, timeline)
            if kind == NONE:
                return loop.DONE
            if kind == ARRIVAL:
                dc[D_ARRIVAL_PENDING] = 0
                hand_over_arrivals(replicas, configs, counts, routed, replica_of, dc, dk,
                                   arrival_s, t)
                continue
            if kind == TRANSFER_END:
                end_transfer(replicas, replica_of, decode_of, dc, index, in_flight, timeline)
                continue
            r = index  # its horizon: the earliest event anywhere else (module docstring)
            s = replicas[r]
            s.clock[HORIZON_S] = horizon_s
            s.count[HORIZON_EVENT_ID] = horizon_id
            s.count[NEXT_EVENT_ID] = dc[D_NEXT_EVENT_ID]
            code = loop.call_engine(engine, s, family)
            dc[D_NEXT_EVENT_ID] = s.count[NEXT_EVENT_ID]
            if s.count[NUM_EXCHANGE]:
                take_exchange(replicas, configs, counts, routed, replica_of, decode_of, timeline,
                              in_flight, free_at, tp, dc, dk, r)
            if code == loop.HORIZON or code == loop.DONE or (code == loop.STEPPED and not s.config[
                    CHECK_STEPS]):
                continue
            dc[D_STOPPED_REPLICA] = r
            return code

    run.engine_family = family  # its last argument (replay.compiled_entry)
    return run


run_v1 = njit(disagg_loop_for(V1), refcounted=True, cache_group=loop.FAMILIES[V1])
