"""A cluster: K replicas behind a global router, in one discrete-event simulation.

Design. Each replica is a whole engine, a :class:`~sim.core.state.Core` of its own (its KV pool,
prefix cache, queues, scheduler limits, cost model, step records, counters and clocks), run by the
one loop a single engine runs (``loop.run``) with ``config[ROUTED]`` set: its own arrival process
is off, and the loop returns ``HORIZON`` instead of taking an engine event that comes after the
cluster's next arrival. This file is the cluster's arrival process and its router, compiled, over
the replicas held in a list (numba's reflected list: one type for every K, no recompile per K):

1. an arrival fires (at ``now + (at - now)``, SimPy's timeout, as ``loop.hand_over_arrivals``);
   every request due now is routed in trace order, one at a time, on the replicas' state at
   that instant, and handed to its replica (``lifecycle.add_arrival``, ``loop.wake_engine``);
   the next arrival's event is made;
2. every replica whose next engine event comes before that arrival is advanced to it
   (``loop.run`` until ``HORIZON``): replicas share nothing but the router's view, so they
   advance one after another; a replica with nothing due is not touched;
3. after the last arrival every replica is told so (and woken), and runs to its end.

Time is SimPy's, as for one engine: the event ids come from one counter the cluster keeps
(copied into a replica's ``count[NEXT_EVENT_ID]`` before it acts and back after), so an arrival
and an engine event at the same time fire in creation order. With one replica the events, their
order and every record are those of a single run (tests/sim/core/test_cluster.py).

Routers (``ROUND_ROBIN`` .. ``PREFIX_AFFINITY``; ties go to the lowest replica index):

* round-robin: request ``j`` of the trace goes to replica ``j mod K``;
* least-outstanding-requests: the fewest requests routed to it and not yet finished or rejected;
* least-kv-usage: the lowest fraction of its KV pool in use (paged: blocks held by a request,
  cached unreferenced blocks counting free as in the memory categories; contiguous: the slots
  its extents hold; SGLang's radix pool: slots, the tree's locked tokens and the running
  requests' pages, its evictable tokens counting free), compared exactly (cross-multiplied);
  ties by fewer outstanding;
* prefix-affinity: the replica whose prefix cache holds the most leading blocks of the
  request's prompt (``prefix_cache.count_hits``, the hits its admission would find now; SGLang:
  the tokens its tree holds, ``radix_cache.cached_prefix``, which leaves the tree as it is), ties by
  fewer outstanding; unless no replica holds any, or that replica's outstanding requests exceed
  ``(1 + slack) x`` the mean over the replicas: then least-outstanding.

Memory: the request columns (the trace's and every per-request column of the core) are shared
by the replicas (each request is owned by the replica it was routed to, which alone writes its
row); each replica has its own pool, queues and step arrays, its queues' rings sized to its
outstanding requests (grown by Python when a routing would overflow them: ``RINGS_FULL``) and
its running list to its ``max_num_seqs`` (``sim/cluster.py`` builds them). The replicas' config,
count and clock arrays are rows of three 2-D arrays, so the router and the horizon test read
every replica's counters without fetching its state from the list.

The loop (one per scheduler family, :func:`cluster_loop_for`) returns to Python when a replica
needs it (its step table is full, ``--check``, an error: ``STOPPED_REPLICA`` names it) or a ring
must grow, and resumes where it stopped.
"""

from __future__ import annotations

from pagesim.sim.core.events import loop
from pagesim.sim.core.kv import extent, prefix_cache, radix_cache
from pagesim.sim.core.sched import lifecycle
from pagesim.sim.core.compile.by_reference import pin, unpin
from pagesim.sim.core.compile.jit import njit
from pagesim.sim.core.state import CONTINUOUS, CONTINUOUS_CONTIGUOUS, SGLANG, STATIC, V1
from pagesim.sim.core.state import (ARRIVALS_DONE, BLOCK_SIZE, CAPACITY, CONTIGUOUS, ENGINE_EVENT_ID, ENGINE_PENDING,
                                    ENGINE_TIME, HORIZON_EVENT_ID, HORIZON_S, MANAGER_KIND, NEXT_EVENT_ID, NOW,
                                    NUM_BLOCKS, NUM_FINISHED, NUM_FREE_BLOCK_IDS, NUM_LRU, NUM_REJECTED,
                                    PREFIX_CACHING, RADIX,
                                    SCHEDULE_ON_RESUME, STARTED)

# routers
ROUND_ROBIN, LEAST_OUTSTANDING, LEAST_KV_USAGE, PREFIX_AFFINITY = 0, 1, 2, 3
ROUTERS = {"round-robin": ROUND_ROBIN, "least-outstanding-requests": LEAST_OUTSTANDING,
           "least-kv-usage": LEAST_KV_USAGE, "prefix-affinity": PREFIX_AFFINITY}

# the cluster's counters (int64) and times (float64)
(C_STARTED, C_NEXT_ARRIVAL, C_NEXT_EVENT_ID, C_ARRIVAL_PENDING, C_ARRIVAL_EVENT_ID, C_ARRIVALS_DONE,
 C_HANDING_OVER, C_ROUTER, C_STOPPED_REPLICA, C_RING_CAPACITY_NEEDED, NUM_CLUSTER_COUNTS) = range(11)
(K_NOW, K_ARRIVAL_TIME, K_SLACK, NUM_CLUSTER_CLOCK) = range(4)

# what run() returns beyond loop's codes: a replica's rings must grow before a request is handed to it
RINGS_FULL = 100
NO_HORIZON = 1 << 62


@njit(inline=True)
def outstanding(counts, routed, r):
    """Requests routed to replica ``r`` and not yet finished or rejected."""
    return routed[r] - counts[r, NUM_FINISHED] - counts[r, NUM_REJECTED]


@njit(inline=True)
def kv_used(configs, counts, r):
    """Replica ``r``'s KV pool in use, as (used, total) in its own unit (blocks or slots)."""
    if configs[r, MANAGER_KIND] == CONTIGUOUS:
        return extent.slots_in_use(counts, r), configs[r, CAPACITY]
    if configs[r, MANAGER_KIND] == RADIX:  # slots: the tree's locked tokens and the running's pages
        total = configs[r, NUM_BLOCKS] * configs[r, BLOCK_SIZE]
        return radix_cache.slots_in_use(counts, r, configs[r, BLOCK_SIZE]), total
    total = configs[r, NUM_BLOCKS]
    return total - counts[r, NUM_FREE_BLOCK_IDS] - counts[r, NUM_LRU], total


@njit
def least_outstanding(counts, routed):
    best = 0
    for r in range(1, len(routed)):
        if outstanding(counts, routed, r) < outstanding(counts, routed, best):
            best = r
    return best


@njit
def least_kv_usage(configs, counts, routed):
    best = 0
    used_best, total_best = kv_used(configs, counts, 0)
    for r in range(1, len(routed)):
        used, total = kv_used(configs, counts, r)
        lower = used * total_best < used_best * total  # used / total < used_best / total_best
        same = used * total_best == used_best * total
        if lower or (same and outstanding(counts, routed, r) < outstanding(counts, routed, best)):
            best, used_best, total_best = r, used, total
    return best


@njit
def prefix_hits(s, i):
    """What replica ``s``'s prefix cache holds of request ``i``'s prompt: its leading blocks that
    an admission would find now (SGLang: the tokens its tree holds, leaving the tree as it is)."""
    hits = 0
    pin(s)  # (a replica's functions called between its runs: by_reference.py)
    if s.config[MANAGER_KIND] == RADIX:  # tokens, not blocks: both compare within one cluster
        hits = radix_cache.cached_prefix(s, i, s.prompt_target[i] - 1)
    elif s.config[PREFIX_CACHING]:
        hits = prefix_cache.count_hits(s, i, s.prompt_target[i])[0]
    unpin(s)
    return hits


@njit(inline=True, refcounted=True)
def prefix_affinity(replicas, counts, routed, i, slack):
    best, best_hits = 0, -1
    total = 0
    for r in range(len(routed)):
        load = outstanding(counts, routed, r)
        total += load
        hits = prefix_hits(replicas[r], i)
        if hits > best_hits or (hits == best_hits and load < outstanding(counts, routed, best)):
            best, best_hits = r, hits
    if best_hits <= 0 or outstanding(counts, routed, best) > (1.0 + slack) * total / len(routed):
        return least_outstanding(counts, routed)
    return best


@njit(inline=True, refcounted=True)
def route(replicas, configs, counts, routed, cc, ck, i):
    """The replica request ``i`` goes to (the module docstring's rules)."""
    router = cc[C_ROUTER]
    if router == LEAST_OUTSTANDING:
        return least_outstanding(counts, routed)
    if router == LEAST_KV_USAGE:
        return least_kv_usage(configs, counts, routed)
    if router == PREFIX_AFFINITY:
        return prefix_affinity(replicas, counts, routed, i, ck[K_SLACK])
    return i % len(routed)


@njit
def end_arrivals(s, now, next_event_id):
    """Replica ``s`` is told, at ``now``, that no request will arrive any more, and woken (its
    wake takes the next event ids from ``next_event_id``); returns the next id."""
    s.clock[NOW] = now
    s.count[ARRIVALS_DONE] = 1
    s.count[NEXT_EVENT_ID] = next_event_id
    loop.wake_engine(s)
    return s.count[NEXT_EVENT_ID]


@njit
def hand_to(s, i, now, next_event_id, need):
    """Request ``i`` is handed, at ``now``, to replica ``s``, which is woken (its wake takes the
    next event ids from ``next_event_id``); returns the next id, or -1 (nothing done) when its
    queues' rings hold fewer than ``need`` requests (0: rings sized for every request)."""
    if need > len(s.waiting) or need > len(s.swapped):
        return -1
    s.clock[NOW] = now
    s.count[NEXT_EVENT_ID] = next_event_id
    pin(s)  # (a replica's functions called between its runs: by_reference.py)
    lifecycle.add_arrival(s, i)
    unpin(s)
    loop.wake_engine(s)
    return s.count[NEXT_EVENT_ID]


@njit(inline=True, refcounted=True)
def arrivals_done(replicas, count, now, next_event_id):
    """The first ``count`` replicas are told, at ``now``, that no request will arrive any more,
    and woken; returns the next event id."""
    for r in range(count):
        next_event_id = end_arrivals(replicas[r], now, next_event_id)
    return next_event_id


@njit(inline=True, refcounted=True)
def hand_over(replicas, configs, counts, routed, replica_of, cc, ck, arrival_s):
    """The arrivals process: route and hand over every request due now, then make the next
    arrival's event (or tell every replica that arrivals are done). Returns RINGS_FULL (with
    ``C_STOPPED_REPLICA`` and ``C_RING_CAPACITY_NEEDED`` set) when a replica's queues must grow
    first; called again, it goes on where it stopped."""
    now = ck[K_NOW]
    cc[C_HANDING_OVER] = 1
    while True:
        i = cc[C_NEXT_ARRIVAL]
        if i >= len(arrival_s):
            cc[C_ARRIVALS_DONE] = 1
            cc[C_NEXT_EVENT_ID] = arrivals_done(replicas, len(routed), now, cc[C_NEXT_EVENT_ID])
            break
        at = arrival_s[i]
        if at > now:
            cc[C_ARRIVAL_PENDING] = 1
            ck[K_ARRIVAL_TIME] = now + (at - now)  # SimPy's timeout(at - now)
            cc[C_ARRIVAL_EVENT_ID] = cc[C_NEXT_EVENT_ID]
            cc[C_NEXT_EVENT_ID] += 1
            break
        r = route(replicas, configs, counts, routed, cc, ck, i)
        need = outstanding(counts, routed, r) + 1  # its queues hold at most its outstanding requests
        next_event_id = hand_to(replicas[r], i, now, cc[C_NEXT_EVENT_ID], need)
        if next_event_id < 0:
            cc[C_STOPPED_REPLICA] = r
            cc[C_RING_CAPACITY_NEEDED] = need
            return RINGS_FULL
        cc[C_NEXT_EVENT_ID] = next_event_id
        routed[r] += 1
        replica_of[i] = r
        cc[C_NEXT_ARRIVAL] = i + 1
    cc[C_HANDING_OVER] = 0
    return loop.DONE


@njit(inline=True)
def due(counts, clocks, r, horizon_s, horizon_id):
    """Replica ``r`` has something to do before the horizon: it has not started (its engine's
    first pass is at time 0), it owes a schedule (a progress report stopped it), or its next
    engine event comes first."""
    if not counts[r, STARTED] or counts[r, SCHEDULE_ON_RESUME]:
        return True
    if not counts[r, ENGINE_PENDING]:
        return False
    at = clocks[r, ENGINE_TIME]
    return at < horizon_s or (at == horizon_s and counts[r, ENGINE_EVENT_ID] < horizon_id)


def cluster_loop_for(family):
    """The cluster's loop over replicas of one scheduler family (``loop.loop_for``: each family
    compiled apart, ``family`` a constant of the closure)."""

    def run(replicas, configs, counts, clocks, routed, replica_of, cc, ck, arrival_s, engine=0):
        """Run the cluster until its end (``loop.DONE``) or until Python is needed (a replica's
        code, ``C_STOPPED_REPLICA`` naming it, or ``RINGS_FULL``). ``engine``: the replicas'
        loop, compiled (``loop.call_engine``)."""
        if not cc[C_STARTED]:
            cc[C_STARTED] = 1
            cc[C_NEXT_EVENT_ID] = 2  # SimPy's two Initialize events
            cc[C_HANDING_OVER] = 1
        while True:
            if cc[C_HANDING_OVER]:
                code = hand_over(replicas, configs, counts, routed, replica_of, cc, ck, arrival_s)
                if code != loop.DONE:
                    return code
            horizon_s, horizon_id = ck[K_ARRIVAL_TIME], cc[C_ARRIVAL_EVENT_ID]
            if not cc[C_ARRIVAL_PENDING]:
                horizon_s, horizon_id = float(NO_HORIZON), NO_HORIZON
            for r in range(len(routed)):
                while due(counts, clocks, r, horizon_s, horizon_id):
                    s = replicas[r]
                    s.clock[HORIZON_S] = horizon_s
                    s.count[HORIZON_EVENT_ID] = horizon_id
                    s.count[NEXT_EVENT_ID] = cc[C_NEXT_EVENT_ID]
                    code = loop.call_engine(engine, s, family)
                    cc[C_NEXT_EVENT_ID] = s.count[NEXT_EVENT_ID]
                    if code == loop.HORIZON or code == loop.DONE:
                        break
                    cc[C_STOPPED_REPLICA] = r
                    return code
            if not cc[C_ARRIVAL_PENDING]:
                return loop.DONE  # every replica ran to its end
            cc[C_ARRIVAL_PENDING] = 0  # the arrival fires
            ck[K_NOW] = ck[K_ARRIVAL_TIME]
            cc[C_HANDING_OVER] = 1

    run.engine_family = family  # its last argument (replay.compiled_entry)
    return run


# each family's cluster loop (jit.use_numba makes each a dispatcher in its place)
# cached with their family's loops (sim/core/compile/families.py): they compile the family's scheduler too
run_continuous = njit(cluster_loop_for(CONTINUOUS), refcounted=True, cache_group=loop.FAMILIES[CONTINUOUS])
run_contiguous = njit(cluster_loop_for(CONTINUOUS_CONTIGUOUS), refcounted=True,
                      cache_group=loop.FAMILIES[CONTINUOUS_CONTIGUOUS])
run_static = njit(cluster_loop_for(STATIC), refcounted=True, cache_group=loop.FAMILIES[STATIC])
run_v1 = njit(cluster_loop_for(V1), refcounted=True, cache_group=loop.FAMILIES[V1])
run_sglang = njit(cluster_loop_for(SGLANG), refcounted=True, cache_group=loop.FAMILIES[SGLANG])


def run_for(kind):
    """The cluster's loop for replicas of scheduler family ``kind``, as bound now."""
    return globals()["run_" + loop.FAMILIES[int(kind)]]