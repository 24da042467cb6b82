"""The cluster loop (sim/core/events/cluster.py): one replica is a single run, event for event; each
router's choice worked by hand on a tiny trace."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pagesim.sim import cluster as sim_cluster
from pagesim.sim.cluster import run_cluster
from pagesim.sim.errors import ConfigError
from pagesim.sim.run import run_simulation
from tests.checked_core import unchecked_only
from tests.sim.helpers import cfg_for, rand_trace, trace_of


def same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@pytest.mark.parametrize("system, settings, trace", [
    ("vllm", {}, dict(seed=1)),
    ("vllm", {"prefix_caching": True}, dict(seed=2, prefix=True)),
    ("vllm", {"preemption": "swap"}, dict(seed=3, rate=300.0)),
    ("vllm", {"chunked_prefill": True}, dict(seed=4, rate=300.0)),
    ("vllm", {}, dict(seed=5, width={"n": [1, 2, 3]})),
    ("orca-pow2", {}, dict(seed=6)),
    ("static", {}, dict(seed=7, n=60)),
    ("sglang", {}, dict(seed=8, prefix=True)),
    ("vllm-v1", {"num_speculative_tokens": 3, "speculative_method": "eagle"}, dict(seed=9, rate=300.0)),
])
def test_one_replica_is_a_single_run(system, settings, trace):
    """With one replica every router hands every request to it at its arrival, and the event
    order is SimPy's as in a single run: summary, request and step tables are the same, bit for
    bit (the request table gains the replica column, the steps table too)."""
    cfg = cfg_for(system, slots=1500, **settings)
    t = rand_trace(n=trace.pop("n", 120), **trace)
    single = run_simulation(cfg, t)
    for router in ("round-robin", "least-outstanding-requests", "least-kv-usage") + (
            ("prefix-affinity",) if settings.get("prefix_caching") or system == "sglang" else ()):
        one = run_cluster(cfg, t, 1, router)
        replica = one.replica_summaries[0]
        assert [k for k in single.summary if k != "wall_time_s" and not same(single.summary[k], replica[k])] == []
        assert (one.requests["replica"] == 0).all()
        pd.testing.assert_frame_equal(single.requests, one.requests.drop(columns="replica"))
        pd.testing.assert_frame_equal(single.steps, one.steps.drop(columns="replica"))
        for key in ("completed", "mean_ttft_ms", "p99_e2el_ms", "mean_itl_ms", "num_preemptions"):
            assert same(one.summary[key], single.summary[key])


def tie_trace(step: int) -> pd.DataFrame:
    """r0 at 0 s, r1 at x (during r0's prefill), and r2 exactly when step ``step`` (1: r0's
    prefill; 2: r1's prefill, scheduled at the end of step 1) ends: its arrival event was made at
    x, after the engine event of step 1's end (made at 0 s) and before step 2's (made at step 1's
    end). The end times are the loop's own, read from a run without r2 (r2 changes nothing before
    it arrives)."""
    rows = [(0.0, 60, 40), (None, 30, 40), (None, 20, 5)]
    probe = trace_of([rows[0]])
    first_end = float(run_simulation(cfg_for(), probe).steps["dt_s"][0])
    x = first_end / 2
    two = run_simulation(cfg_for(), trace_of([rows[0], (x, 30, 40)])).steps
    end = float(two["start_s"][step - 1] + two["dt_s"][step - 1])
    assert x + (end - x) == end  # the arrival fires at x + (end - x): exactly then
    return trace_of([rows[0], (x, 30, 40), (end, 20, 5)])


@pytest.mark.parametrize("step, r2_in_the_next_step", [(1, False), (2, True)])
def test_an_arrival_and_a_step_end_at_one_instant_fire_in_creation_order(step, r2_in_the_next_step):
    """SimPy's rule across the cluster's and the replica's events: at one instant the older event
    fires first. Step 1's end (made at 0 s) is older than r2's arrival (made at x): the replica
    schedules step 2 without r2 (only r1's 30-token prompt). Step 2's end (made at step 1's end)
    is younger: r2 is waiting when step 3 is scheduled, which prefills it (prefill-first)."""
    t = tie_trace(step)
    single = run_simulation(cfg_for(), t).steps
    one = run_cluster(cfg_for(), t, 1, "least-outstanding-requests").steps.drop(columns="replica")
    pd.testing.assert_frame_equal(single, one)
    assert one["num_prefill_tokens"][step] == (20 if r2_in_the_next_step else 30)


def test_round_robin_takes_turns():
    """Request j goes to replica j mod K, whatever the replicas hold."""
    t = trace_of([(0.0, 50, 200), (0.0, 10, 1), (0.0, 10, 1), (0.5, 10, 1), (0.6, 10, 1), (0.7, 10, 1), (0.8, 10, 1)])
    assert run_cluster(cfg_for(), t, 2, "round-robin").requests["replica"].tolist() == [0, 1, 0, 1, 0, 1, 0]
    assert run_cluster(cfg_for(), t, 3, "round-robin").requests["replica"].tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_least_outstanding_counts_routed_and_unfinished():
    """r0 (long) -> 0 (a tie: the lowest index); r1 -> 1 (0 holds r0); r2 -> 0 (1 each: the
    tie); r1 finishes after its one token, so at 1.0 s r3 -> 1 (2 against 0) and r4 -> 1 (2
    against 1)."""
    t = trace_of([(0.0, 50, 200), (0.0, 10, 1), (0.0, 50, 200), (1.0, 10, 200), (1.0, 10, 200)])
    out = run_cluster(cfg_for(), t, 2, "least-outstanding-requests")
    r = out.requests
    assert r["finish_s"][1] < 1.0 < min(r["finish_s"][0], r["finish_s"][2])  # the premises
    assert r["replica"].tolist() == [0, 1, 0, 1, 1]
    assert out.summary["routed_per_replica"] == [2, 3]
    assert run_cluster(cfg_for(), t, 2, "round-robin").requests["replica"].tolist() == [0, 1, 0, 1, 0]


def test_least_kv_usage_compares_the_pools_in_use():
    """At 0 s no request holds memory yet: r0 -> 0 (a tie), r1 -> 1 (a tie in memory, then fewer
    outstanding). At 1 s replica 0 holds r0's 100-token prompt and replica 1 r1's 20-token one:
    r2 -> 1, where least-outstanding would pick 0 (1 each)."""
    t = trace_of([(0.0, 100, 150), (0.0, 20, 200), (1.0, 10, 10)])
    out = run_cluster(cfg_for(), t, 2, "least-kv-usage")
    r = out.requests
    assert 1.0 < min(r["finish_s"][0], r["finish_s"][1])  # both still hold their blocks at 1 s
    assert r["replica"].tolist() == [0, 1, 1]
    assert run_cluster(cfg_for(), t, 2, "least-outstanding-requests").requests["replica"].tolist() == [0, 1, 0]


A, B = (1, 2, 3, 4), (5, 6, 7, 8)  # two prompts' prefix hashes: four blocks of 16 tokens each


def test_least_kv_usage_counts_cached_blocks_nobody_holds_as_free():
    """r0 -> 0 and r1 -> 1 (ties at 0 s). r0 finishes after its one token: its six prompt
    blocks stay cached, held by nobody, so replica 0 uses nothing at 1 s while replica 1 holds
    r1's blocks: r2 -> 0 (counting the cached blocks as used would send it to 1)."""
    t = trace_of([(0.0, 100, 1, tuple(range(10, 16))), (0.0, 20, 200, ()), (1.0, 10, 10, ())], prefix=True)
    out = run_cluster(cfg_for(prefix_caching=True, block_size=16), t, 2, "least-kv-usage")
    r = out.requests
    assert r["finish_s"][0] < 1.0 < r["finish_s"][1]  # the premises
    assert out.replica_summaries[0]["mgr_prefix_hit_tokens"] == 0
    assert r["replica"].tolist() == [0, 1, 0]


def test_prefix_affinity_follows_the_cached_prefix_within_the_load_bound():
    """r0 (prefix A) and r1 (prefix B) find nothing cached: least-outstanding, 0 and 1. At 1 s
    their prompts' blocks are cached: r2 (B) -> 1, where B's blocks are (1 outstanding, not over
    the mean 1); r3 (B) finds B on 1 too, but 1's 2 outstanding exceed (1 + slack) x the mean 1.5
    with slack 0 -> least-outstanding, 0; with slack 0.5 (bound 2.25) it stays on 1; r4 (A)
    -> 0, where A is."""
    t = trace_of([(0.0, 64, 150, A), (0.0, 64, 150, B), (1.0, 64, 100, B), (1.0, 64, 100, B), (1.0, 64, 100, A)],
                 prefix=True)
    cfg = cfg_for(prefix_caching=True, block_size=16)
    tight = run_cluster(cfg, t, 2, "prefix-affinity", slack=0.0).requests
    assert 1.0 < min(tight["finish_s"][0], tight["finish_s"][1])
    assert tight["replica"].tolist() == [0, 1, 1, 0, 0]
    loose = run_cluster(cfg, t, 2, "prefix-affinity", slack=0.5).requests
    assert loose["replica"].tolist() == [0, 1, 1, 1, 0]
    # least-outstanding alone spreads them: 0, 1, then ties to 0, 1, 0
    assert run_cluster(cfg, t, 2, "least-outstanding-requests").requests["replica"].tolist() == [0, 1, 0, 1, 0]


def test_prefix_affinity_breaks_a_tie_in_hits_by_fewer_outstanding():
    """r0 and r1 (prefix A, one token each) -> 0 and 1 (nothing cached yet: least-outstanding),
    and both finish, leaving A cached on both replicas; r2 (B) finds B nowhere: least-outstanding,
    0. At 1 s r3 (A) finds A's three blocks on both replicas: the one with fewer outstanding, 1
    (a slack of 10 keeps the bound out of it)."""
    t = trace_of([(0.0, 64, 1, A), (0.0, 64, 1, A), (0.5, 64, 150, B), (1.0, 64, 10, A)], prefix=True)
    r = run_cluster(cfg_for(prefix_caching=True, block_size=16), t, 2, "prefix-affinity", slack=10.0).requests
    assert max(r["finish_s"][0], r["finish_s"][1]) < 0.5 and r["finish_s"][2] > 1.0  # the premises
    assert r["replica"].tolist() == [0, 1, 0, 1]


def test_prefix_affinity_hits_are_cache_hits():
    """Routed by prefix, the requests that share one find it cached: a higher hit rate than
    round-robin's on a trace of three prefixes taking turns over four replicas (round-robin
    sends each prefix to every replica)."""
    prefixes = (A, B, (9, 10, 11, 12))
    rows = [(0.1 * j, 64, 20, prefixes[j % 3]) for j in range(40)]
    cfg = cfg_for(prefix_caching=True, block_size=16)
    t = trace_of(rows, prefix=True)
    affinity = run_cluster(cfg, t, 4, "prefix-affinity").summary["prefix_cache_hit_rate"]
    spread = run_cluster(cfg, t, 4, "round-robin").summary["prefix_cache_hit_rate"]
    assert affinity > spread


def test_sglang_replicas_are_routed_by_their_radix_trees():
    """SGLang's pool is its radix tree's token slots. least-kv-usage: r0 (100 tokens) -> 0 and
    r1 (20) -> 1 (ties at 0 s); at 1 s replica 0 holds r0's tokens and replica 1 r1's: r2 -> 1.
    With r0 done after one token, its tokens stay in the tree, evictable, held by nobody:
    replica 0 uses nothing, r2 -> 0. prefix-affinity: r0 (prefix A) -> 0 and r1 (B) -> 1, both
    done after one token, their prompts in their replicas' trees; at 1 s r2 (B) finds B's 63
    tokens (its match limit: all but its last) on replica 1 and goes there, where
    least-outstanding (a tie: 0 each) picks 0."""
    cfg = cfg_for("sglang", slots=1500)
    held = trace_of([(0.0, 100, 150), (0.0, 20, 200), (1.0, 10, 10)])
    assert run_cluster(cfg, held, 2, "least-kv-usage").requests["replica"].tolist() == [0, 1, 1]
    done = trace_of([(0.0, 100, 1, ()), (0.0, 20, 200, ()), (1.0, 10, 10, ())], prefix=True)
    r = run_cluster(cfg, done, 2, "least-kv-usage").requests
    assert r["finish_s"][0] < 1.0 < r["finish_s"][1] and r["replica"].tolist() == [0, 1, 0]
    prefixes = trace_of([(0.0, 64, 1, A), (0.0, 64, 1, B), (1.0, 64, 10, B)], prefix=True)
    r = run_cluster(cfg, prefixes, 2, "prefix-affinity").requests
    assert max(r["finish_s"][0], r["finish_s"][1]) < 1.0 and r["replica"].tolist() == [0, 1, 1]
    assert run_cluster(cfg, prefixes, 2, "least-outstanding-requests").requests["replica"].tolist() == [0, 1, 0]


def test_queues_grow_as_a_replica_needs_them(monkeypatch):
    """A replica's queues start small and grow when a routing would overflow them; the run is
    the same as with queues that never grow."""
    cfg = cfg_for(slots=600)
    t = rand_trace(11, n=120, rate=400.0)
    big = run_cluster(cfg, t, 2, "least-outstanding-requests")
    monkeypatch.setattr(sim_cluster, "FIRST_RING", 1)
    small = run_cluster(cfg, t, 2, "least-outstanding-requests")
    pd.testing.assert_frame_equal(big.requests, small.requests)
    pd.testing.assert_frame_equal(big.steps, small.steps)


def test_every_request_ends_on_its_replica():
    """Three replicas: each request is routed once, to one replica, and finished there; the
    replicas' summaries add up to the cluster's."""
    cfg = cfg_for(slots=1500)
    t = rand_trace(12, n=150, rate=100.0)
    out = run_cluster(cfg, t, 3, "least-outstanding-requests")
    assert (out.requests["status"] == "finished").all()
    counts = np.bincount(out.requests["replica"], minlength=3).tolist()
    assert counts == out.summary["routed_per_replica"]
    assert [s["completed"] for s in out.replica_summaries] == counts
    assert sum(s["total_output_tokens"] for s in out.replica_summaries) == out.summary["total_output_tokens"]
    assert out.summary["duration_s"] == max(s["duration_s"] for s in out.replica_summaries)


@pytest.mark.parametrize("kw, words", [
    (dict(replicas=0, router="round-robin"), "--replicas"),
    (dict(replicas=2, router="random"), "--router"),
    (dict(replicas=2, router="round-robin", slack=-1.0), "--router-slack"),
    (dict(replicas=2, router="prefix-affinity"), "--prefix-caching"),
])
def test_bad_settings_are_refused(kw, words):
    with pytest.raises(ConfigError, match=words):
        run_cluster(cfg_for(), rand_trace(1, n=5), **kw)


def test_a_clusters_loop_calls_its_replicas_loop_by_address_not_linked_in():
    """``loop.call_engine`` calls a compiled loop through its address: the loop runs (its work
    and its code come back), and its code is not linked into the caller's, where a call of its
    dispatcher links it (numba links a callee's library into each caller's, to optimize and
    compile it again there)."""
    from pagesim.sim.core.compile import jit
    from pagesim.sim.core.events import loop
    if not jit.COMPILED:
        pytest.skip("numba is not installed")
    jit.use_numba()
    numba = jit.numba

    @numba.njit
    def replica_loop(a):
        a[0] += 5
        return a[0] * 2

    @numba.njit
    def by_address(address, a):
        return loop.call_engine(address, a, 0)

    @numba.njit
    def by_dispatcher(a):
        return replica_loop(a)

    types = (numba.types.int64[::1],)
    replica_loop.compile(types)
    engine = replica_loop.overloads[types]
    address = engine.library.get_pointer_to_function(engine.fndesc.llvm_func_name)
    a = np.zeros(1, np.int64)
    assert by_address(address, a) == 10 and a[0] == 5
    assert by_dispatcher(a) == 20 and a[0] == 10

    def linked(caller):  # numba's record of the libraries linked into a caller's
        return next(iter(caller.overloads.values())).library._linking_libraries
    assert engine.library in linked(by_dispatcher)
    assert engine.library not in linked(by_address)


@unchecked_only
def test_the_cluster_loops_hold_no_copy_of_their_replicas_loop():
    """vLLM v1's cluster and disaggregated loops, as a run compiles (or loads) them: their code
    defines no function of the replicas' loop (each calls it by address)."""
    from pagesim.sim.core.compile import jit
    from pagesim.sim.core.events import cluster, disagg, loop
    from pagesim.sim.disagg import run_disaggregated
    if not jit.COMPILED:
        pytest.skip("numba is not installed")
    cfg, trace = cfg_for("vllm-v1", slots=1500), rand_trace(seed=1, n=8)
    run_cluster(cfg, trace, 2, "round-robin")
    run_disaggregated(cfg, cfg, trace, 1, 1)
    engine = next(iter(loop.run_v1.overloads.values())).fndesc.llvm_func_name
    for caller in (cluster.run_v1, disagg.run_v1):
        library = next(iter(caller.overloads.values())).library
        # its code: as compiled, or (loaded from numba's cache) the module numba keeps to link it
        module = library._shared_module or library._final_module
        defined = {fn.name for fn in module.functions if not fn.is_declaration}
        assert caller.py_func.__qualname__.split(".")[0] in " ".join(defined)
        assert engine not in defined
