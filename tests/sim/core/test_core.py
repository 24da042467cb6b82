"""The core (``sim/core/``) as a whole: fixed cases over every system and setting run under
``--check`` (every incremental quantity recomputed from scratch after every iteration,
``sim/core/check.py``), the event order of its two-source loop worked by hand, progress reports
and early stops, limits beyond int64, and the core compiled by numba against the same functions
interpreted by CPython (the readable specification).
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.core.compile import jit
from pagesim.sim.core.events import replay
from pagesim.sim.config import PLACEMENTS, RESERVATIONS, SYSTEMS
from pagesim.sim.run import initial_state, prepare, result, run_simulation
from tests.sim.helpers import (OPT13B_SLOT, ConstExecutor, cfg_for, huge_cfg_for, rand_trace, subprocess_path,
                               TESTS_ROOT, trace, write_table_profile)


CASES = [
    ("vllm", {}, {}),
    ("vllm", dict(block_size=4), {}),
    ("vllm", dict(block_size=32, watermark=0.0), {}),
    ("vllm", dict(block_size=1), {}),
    ("token", {}, {}),
    ("vllm", dict(slots=1200), dict(rate=200.0)),  # heavy preemption (recompute)
    ("vllm", dict(max_num_seqs=8), {}),  # admission blocked by max_num_seqs
    ("vllm", dict(max_num_batched_tokens=256), {}),  # a token budget of max_seq_len bounds each prefill batch
    ("vllm", dict(step_overhead_ms=0.0, per_seq_overhead_ms=0.0), {}),
    ("vllm", dict(record_steps=False), {}),
    ("vllm", dict(tensor_parallel=2), {}),
    ("vllm", dict(chunked_prefill=True, chunk_budget=128), {}),
    ("vllm", dict(chunked_prefill=True, chunk_budget=512, block_size=8), {}),
    ("vllm", dict(chunked_prefill=True, chunk_budget=64, slots=1200), dict(rate=200.0)),  # preempted mid-prefill
    ("vllm", dict(chunked_prefill=True, chunk_budget=16, max_num_seqs=8), {}),  # budget below the batch
    ("vllm", dict(chunked_prefill=True, record_steps=False), {}),
    ("vllm", dict(preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, slots=1200), dict(rate=200.0)),
    ("vllm", dict(preemption="swap", swap_gib=150 * OPT13B_SLOT / 2**30, slots=1200), dict(rate=200.0)),  # fallbacks
    ("vllm", dict(preemption="swap", chunked_prefill=True, chunk_budget=64, slots=1200), dict(rate=200.0)),
    # the contiguous (Orca) manager: reservations, placements, a pool tight enough to block
    ("orca-max", {}, {}),
    ("orca-pow2", {}, {}),
    ("orca-oracle", {}, {}),
    ("orca-max", dict(slots=1200), dict(rate=200.0)),
    ("orca-pow2", dict(slots=1200), dict(rate=200.0)),
    ("orca-oracle", dict(slots=1000), dict(rate=200.0)),
    ("orca-pow2", dict(slots=1200, placement="first-fit"), dict(rate=200.0)),
    ("orca-oracle", dict(slots=1000, placement="best-fit"), dict(rate=200.0)),
    ("orca-max", dict(slots=1000, placement="first-fit"), dict(rate=200.0)),
    ("orca-oracle", dict(slots=1200, chunked_prefill=True, chunk_budget=64), dict(rate=200.0)),
    ("orca-pow2", dict(slots=1200, max_num_seqs=3), dict(rate=200.0)),
    ("orca-oracle", dict(slots=1000, record_steps=False), dict(rate=200.0)),
    ("orca-pow2", dict(slots=1200, preemption="swap"), dict(rate=200.0)),  # never preempts
    # the predicted reservation: overflows kept, grown in place or moved, preemption when they do not fit
    ("orca-max", dict(reservation="predicted"), {}),
    ("orca-max", dict(reservation="predicted", slots=1200), dict(rate=200.0)),
    ("orca-max", dict(reservation="predicted", slots=1000, placement="first-fit"), dict(rate=200.0)),
    ("orca-max", dict(reservation="predicted", slots=1000, placement="best-fit"), dict(rate=200.0)),
    ("orca-max", dict(reservation="predicted", slots=1200, predictor_error=1.0), dict(rate=200.0)),
    ("orca-max", dict(reservation="predicted", predictor_error=0.0), {}),  # exact: never overflows
    ("orca-max", dict(reservation="predicted", slots=1200, chunked_prefill=True, chunk_budget=64), dict(rate=200.0)),
    ("orca-max", dict(reservation="predicted", slots=1200, max_num_seqs=4), dict(rate=200.0)),
    ("orca-max", dict(reservation="predicted", slots=1000, record_steps=False), dict(rate=200.0)),
    # ... preempted by swap: the extent reserved again at swap-in (with fallbacks when swap space is short)
    ("orca-max", dict(reservation="predicted", slots=1200, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30),
     dict(rate=200.0)),
    ("orca-max", dict(reservation="predicted", slots=1000, preemption="swap", swap_gib=150 * OPT13B_SLOT / 2**30,
                      placement="first-fit"), dict(rate=200.0)),
    # swapped back in while earlier requests are in their prefill: join order is not admission order
    ("orca-max", dict(reservation="predicted", slots=1200, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30,
                      chunked_prefill=True, chunk_budget=32, predictor_error=1.0), dict(rate=200.0)),
    ("orca-max", dict(reservation="predicted", slots=600, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30,
                      chunked_prefill=True, chunk_budget=128, predictor_error=1.0), dict(rate=200.0)),
    # prefix caching (the trace's hashes cover 16-token blocks of three values: many hits)
    ("vllm", dict(prefix_caching=True), dict(prefix=True)),
    ("vllm", dict(prefix_caching=True, block_size=4), dict(prefix=True)),
    ("vllm", dict(prefix_caching=True, block_size=32), dict(prefix=True)),  # blocks wider than a hash block
    ("token", dict(prefix_caching=True), dict(prefix=True)),
    ("vllm", dict(prefix_caching=True, slots=1200), dict(prefix=True, rate=200.0)),  # evictions, preemption
    ("vllm", dict(prefix_caching=True, max_num_seqs=8), dict(prefix=True)),  # the admission shortcut
    ("vllm", dict(prefix_caching=True, chunked_prefill=True, chunk_budget=64, slots=1200),
     dict(prefix=True, rate=200.0)),
    ("vllm", dict(prefix_caching=True, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, slots=1200),
     dict(prefix=True, rate=200.0)),  # swap-in finds its prompt in the cache
    ("vllm", dict(prefix_caching=True, record_steps=False, slots=1200), dict(prefix=True, rate=200.0)),
    ("vllm", dict(prefix_caching=True), {}),  # no hashes: nothing to share, lookups counted
    # waiting_served_ratio: admission waits for the queue to grow
    ("vllm", dict(waiting_served_ratio=0.5), {}),
    ("vllm", dict(waiting_served_ratio=2.0, slots=1200), dict(rate=200.0)),
    ("vllm", dict(waiting_served_ratio=1.0, chunked_prefill=True, chunk_budget=128), {}),
    ("vllm", dict(waiting_served_ratio=0.3, prefix_caching=True, max_num_seqs=8), dict(prefix=True)),
    # static batching: fixed slots of max_seq_len, padded batches
    ("static", dict(slots=2048), {}),
    ("static", dict(slots=1200), dict(rate=200.0)),
    ("static", dict(slots=3000, static_batch_size=3), {}),
    ("static", dict(slots=3000, max_num_seqs=2), dict(rate=5.0)),  # idle between batches
    ("static", dict(slots=2048, record_steps=False), dict(rate=200.0)),
    # vAttention: the paged manager with pages of page_tokens (OPT-13B: 64 KiB -> 3, 2 MiB -> 102)
    ("vattention", {}, {}),
    ("vattention", dict(slots=1200), dict(rate=200.0)),
    ("vattention", dict(vattention_page_kib=2048, slots=1200), dict(rate=200.0)),
    ("vattention", dict(vattention_page_kib=2048, preemption="swap", swap_gib=150 * OPT13B_SLOT / 2**30,
                        slots=1200), dict(rate=200.0)),
    # parallel sampling: prefill once, fork, copy-on-write, groups preempted, swapped, finished together
    ("vllm", {}, dict(width={"n": [1, 2, 4]})),
    ("vllm", dict(slots=1200), dict(width={"n": [1, 2, 3]}, rate=200.0)),
    ("vllm", dict(slots=1200, block_size=4), dict(width={"n": [1, 2, 3]}, rate=200.0)),
    ("token", dict(slots=1200), dict(width={"n": [1, 3]}, rate=200.0)),
    ("vllm", dict(chunked_prefill=True, chunk_budget=64, slots=1200), dict(width={"n": [1, 3]}, rate=200.0)),
    ("vllm", dict(preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, slots=1200),
     dict(width={"n": [1, 2, 3]}, rate=200.0)),
    ("vllm", dict(prefix_caching=True, slots=1200), dict(width={"n": [1, 2, 3]}, rate=200.0, prefix=True)),
    ("vllm", dict(prefix_caching=True, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, slots=1200),
     dict(width={"n": [1, 2, 3]}, rate=200.0, prefix=True)),  # swap-in: later sequences hit the first one's blocks
    ("vllm", dict(max_num_seqs=3, record_steps=False), dict(width={"n": [1, 2, 4]})),  # width 4 rejected at arrival
    # beam search: beams die and fork from survivors at random (the scheduler's Generator)
    ("vllm", {}, dict(width={"beam_width": [1, 2, 4]})),
    ("vllm", dict(slots=1200), dict(width={"beam_width": [1, 2, 3]}, rate=200.0)),  # recompute
    ("vllm", dict(slots=1200, block_size=4), dict(width={"beam_width": [1, 3], "n": [1, 2]}, rate=200.0)),
    ("token", dict(slots=1200), dict(width={"beam_width": [1, 3]}, rate=200.0)),
    ("vllm", dict(chunked_prefill=True, chunk_budget=64, slots=1200), dict(width={"beam_width": [1, 3]}, rate=200.0)),
    ("vllm", dict(preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, slots=1200),
     dict(width={"beam_width": [1, 2, 3]}, rate=200.0)),
    ("vllm", dict(prefix_caching=True, slots=1200), dict(width={"beam_width": [1, 2, 3]}, rate=200.0, prefix=True)),
    ("vllm", dict(max_num_seqs=3, record_steps=False), dict(width={"beam_width": [1, 2, 4]})),  # 4 rejected
    # ... and rejected, with the reason, on the managers whose forks cannot share blocks
    ("orca-max", dict(slots=1200), dict(width={"n": [1, 2, 3]}, rate=200.0)),
    ("orca-pow2", dict(slots=1200, max_num_seqs=2), dict(width={"n": [1, 2, 3]}, rate=200.0)),  # 3: too wide
    ("vattention", dict(slots=1200), dict(width={"n": [1, 2]}, rate=200.0)),
    ("static", dict(slots=2048), dict(width={"n": [1, 2]})),
]


@pytest.mark.parametrize("system,kw,tkw", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_cases_keep_every_invariant(system, kw, tkw):
    """Each case under --check: no InvariantError, and every request finished or rejected."""
    kw = dict(kw)
    slots = kw.pop("slots", 3000)
    c = run_simulation(cfg_for(system, slots, seed=0, check=True, **kw), rand_trace(0, **tkw))
    assert c.summary["completed"] + c.summary["rejected"] == 160


# the cost models beside the roofline (sim/core/price/cost_calibrated.py, cost_table.py; the scale of
# sim/core/price/cost.py over each)
COST_MODELS = ["calibrated", "table", "table-without-prefill", "scaled-roofline", "scaled-calibrated",
               "scaled-table"]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    """Profiles for the table model: with attn_prefill rows, and without (the roofline prefill)."""
    d = tmp_path_factory.mktemp("profiles")
    return {True: str(write_table_profile(d / "table.csv")),
            False: str(write_table_profile(d / "no-prefill.csv", prefill=False))}


def cost_kw(name: str, profiles) -> dict:
    kw = {}
    if name.endswith("calibrated"):
        kw["cost_model"] = "calibrated"
    if "table" in name:
        kw["profile"] = profiles["without-prefill" not in name]
    if name.startswith("scaled"):
        kw["cost_scale"] = 1.37
    return kw


@pytest.mark.parametrize("system", ["vllm", "static"])
@pytest.mark.parametrize("cost", COST_MODELS)
def test_each_cost_model_prices_the_run(system, cost, profiles):
    """Every cost model (and the scale over each) prices the steps of a run, continuous or
    static batching's padded ones, under --check: the run ends, and its duration is not the
    roofline's."""
    slots = 1200 if system == "vllm" else 2048  # preemption storms; static batches of 8
    c = run_simulation(cfg_for(system, slots=slots, seed=1, check=True, **cost_kw(cost, profiles)),
                       rand_trace(1, rate=200.0))
    roofline = run_simulation(cfg_for(system, slots=slots, seed=1), rand_trace(1, rate=200.0))
    assert c.summary["completed"] + c.summary["rejected"] == 160
    assert c.summary["duration_s"] != roofline.summary["duration_s"]


def test_table_runs_reach_every_part_of_the_tables(profiles):
    """The table cases interpolate inside, below and beyond each table, and sum the prefill of
    several sequences in one step."""
    c = run_simulation(cfg_for(seed=0, profile=profiles[True]), rand_trace(0))
    tokens = c.steps["num_prefill_tokens"] + c.steps["num_decode_tokens"]
    assert tokens.max() > 256 and ((tokens > 16) & (tokens < 64)).any()  # linear: beyond and inside
    decode = c.steps["num_decode_tokens"]
    assert decode.max() > 32 and ((decode > 1) & (decode < 8)).any()  # decode batches: beyond and inside
    prompts = c.requests["prompt_tokens"]
    assert prompts.min() < 16 and prompts.max() > 64  # prefill: below and beyond
    assert ((c.steps["batch_size"] - decode >= 3) & (c.steps["num_prefill_tokens"] > 0)).any()


def test_cases_reach_what_they_test():
    """Preemption, swap fallbacks and rejection do happen in the cases."""
    c = run_simulation(cfg_for(slots=1200, seed=0), rand_trace(0, rate=200.0))
    assert c.summary["num_preemptions"] > 0
    assert (c.requests["preemptions"] > 0).sum() > 1
    c = run_simulation(cfg_for(slots=1200, seed=0, preemption="swap", swap_gib=150 * OPT13B_SLOT / 2**30),
                       rand_trace(0, rate=200.0))
    assert c.summary["num_preemptions"] > c.summary["num_swap_fallbacks"] > 0  # swapped, and fell back
    long = rand_trace(1)
    long.loc[3, "output_tokens"] = 300  # final length over max_seq_len 256: NEVER
    c = run_simulation(cfg_for(), long)
    assert "exceeds max_seq_len" in c.requests["reject_reason"][3]
    assert c.summary["rejected"] == 1


def test_prefix_cases_reach_what_they_test():
    """Prefix hits, evictions, preemption and swap-ins do happen in the prefix-caching cases."""
    tr = rand_trace(0, rate=200.0, prefix=True)
    c = run_simulation(cfg_for(slots=1200, seed=0, prefix_caching=True), tr)
    assert c.summary["prefix_cache_hit_rate"] > 0.3 and c.summary["mgr_evictions"] > 0
    assert c.summary["num_preemptions"] > 0 and c.summary["mgr_cached_blocks"] > 0
    c = run_simulation(cfg_for(slots=1200, seed=0, prefix_caching=True, preemption="swap",
                               swap_gib=2000 * OPT13B_SLOT / 2**30), tr)
    assert c.summary["num_preemptions"] > c.summary["num_swap_fallbacks"]


@pytest.mark.parametrize("arrival", [1.0, np.nextafter(1.0, 2.0)])
def test_an_arrival_tied_with_a_step_end_comes_first(arrival):
    """Two events at one instant fire in the order they were made (SimPy's rule, which the loop
    keeps). Every iteration takes 1 s. Request A (prompt 4, output 3) arrives at 0; B at 1.0.
    B's arrival was set up at 0, when A was handed over, before A's prefill [0, 1) was
    scheduled: at 1.0 B joins the queue first, so the iteration scheduled at 1.0 is B's prefill
    (prefill first), [1, 2): B's first token at 2.0; both decode at [2, 3) (B done) and A alone
    at [3, 4). B an ulp after 1.0 finds A's first decode [1, 2) running and prefills at [2, 3);
    both decode at [3, 4) and finish at 4.0."""
    ex = ConstExecutor(1.0)
    r = run_simulation(cfg_for(), trace([(0.0, 4, 3), (arrival, 4, 2)]), executor=ex).requests
    tied = arrival == 1.0
    assert [b[0] for b in ex.batches[:2]] == ([[0], [1]] if tied else [[0], []])
    assert r["first_token_s"].tolist() == [1.0, 2.0 if tied else 3.0]
    assert r["finish_s"].tolist() == ([4.0, 3.0] if tied else [4.0, 4.0])


def test_orca_cases_reach_what_they_test():
    """The tight Orca cases block on memory with holes free (external fragmentation), and
    the buddy's rounding shows as allocator slack."""
    for placement in ("buddy", "first-fit", "best-fit"):
        c = run_simulation(cfg_for("orca-oracle", slots=1000, placement=placement), rand_trace(0, rate=200.0))
        assert c.summary["completed"] == 160
        assert (c.steps["mem_external_frag"] > 0).any()
        assert (c.steps["mem_allocator_slack"] > 0).any() == (placement == "buddy")
        # predicted: reservations outgrown, kept, grown in place and moved, and preemptions
        p = run_simulation(cfg_for("orca-max", slots=1000, placement=placement, reservation="predicted"),
                           rand_trace(0, rate=200.0)).summary
        assert p["completed"] == 160 and p["num_preemptions"] > 0
        kept = p["mgr_overflows"] - p["mgr_grows_in_place"] - p["mgr_moves"]  # a buddy block's slack held R'
        assert (kept > 0) == (placement == "buddy") and p["mgr_grows_in_place"] > 0 and p["mgr_moves"] > 0


def test_limits_beyond_int64_are_clamped():
    """A swap space or max_num_seqs no run can reach (beyond int64, or at the 2**62 settings
    cap) behaves as one merely larger than the run needs."""
    tr = rand_trace(0, rate=200.0)
    beyond = run_simulation(cfg_for(slots=1200, preemption="swap", swap_gib=1e16, max_num_seqs=2**62), tr)
    ample = run_simulation(cfg_for(slots=1200, preemption="swap", swap_gib=1e3, max_num_seqs=10**6), tr)
    assert beyond.summary["num_preemptions"] > 0 and beyond.summary["num_swap_fallbacks"] == 0
    pd.testing.assert_frame_equal(beyond.requests, ample.requests, check_exact=True)
    pd.testing.assert_frame_equal(beyond.steps, ample.steps, check_exact=True)


HUGE = 1 << 26  # a budget or max_seq_len beyond any run's prompts (the core refused these once)


@pytest.mark.parametrize("system,kw", [
    ("vllm", dict(max_num_batched_tokens=2 * HUGE)),
    ("vllm", dict(chunked_prefill=True, chunk_budget=2 * HUGE, slots=1200)),
    ("vllm", dict(max_seq_len=HUGE, slots=HUGE + 1200, max_num_seqs=8)),  # a queue behind max_num_seqs
    ("orca-max", dict(max_seq_len=HUGE, slots=3 * HUGE)),  # max reservations of 2**26: three at a time
    ("static", dict(max_seq_len=HUGE, slots=3 * HUGE)),
    ("static", dict(max_seq_len=HUGE, slots=3 * HUGE, cost_model="calibrated")),
])
def test_huge_budgets_and_max_seq_len_run_on_the_core(system, kw):
    """Token budgets and max_seq_len of 2**26 and more run (the core refused these once): the
    core's block tables are as wide as the trace's longest request needs, not max_seq_len."""
    kw = dict(kw)
    cfg = huge_cfg_for(system, slots=kw.pop("slots", 3000), seed=0, **kw)
    c = run_simulation(cfg, rand_trace(0, n=60, rate=200.0))
    assert c.summary["completed"] == 60


def test_the_block_table_is_as_wide_as_the_longest_request():
    """max_seq_len 2**26 in blocks of 16: a row of 4,194,304 blocks per running slot; the trace's
    longest request (40 + 9 tokens) needs ceil(49 / 16) = 4."""
    s = initial_state(huge_cfg_for(max_seq_len=HUGE, slots=HUGE + 64), trace([(0, 10, 5), (0, 40, 9), (0, 3, 30)]))
    assert s.block_table.shape == (3, 4)


def test_progress_counts_every_finish():
    class Bar:
        total = 0

        def update(self, k):
            self.total += k

    bar = Bar()
    run = prepare(cfg_for(), rand_trace(0))
    replay.run(run.state, progress=bar)
    assert bar.total == int((run.table.status == 4).sum()) > 0


def test_progress_reports_as_a_step_ends_and_a_hook_may_stop_the_run():
    """Served one at a time (``max_num_seqs=1``), 6 queued requests of 3 iterations each: a hook
    that asks for every finish (``due`` = 1) hears of each as its last iteration ends, before
    the next request is admitted, so it never sees one running; raising StopRun at the 4th
    ends the run there, the state keeping its 4 x 3 iterations, and the exception let through."""
    from pagesim.sim.core.events.replay import StopRun

    class Hook:
        due = 1

        def __init__(self, table):
            self.table, self.heard, self.running = table, 0, []

        def update(self, k):
            self.heard += k
            self.running.append(int((self.table.status == 2).sum()))
            if self.heard == 4:
                raise StopRun

    cfg = cfg_for(max_num_seqs=1, record_steps=False)
    run = prepare(cfg, trace([(0.0, 8, 3)] * 6))
    table = run.table
    hook = Hook(table)
    with pytest.raises(StopRun) as stop:
        replay.run(run.state, progress=hook)
    assert hook.running == [0, 0, 0, 0]
    assert (table.status == 4).sum() == 4 and (table.status == 1).sum() == 2
    stopped = result(cfg, run, stop.value.wall_time_s, duration_s=12.0)
    assert stopped.summary["num_steps"] == 12 and stopped.summary["completed"] == 4


@pytest.mark.parametrize("system", list(SYSTEMS))
def test_every_command_line_system_runs_on_the_core(system):
    """Every setting reachable from ``pagesim simulate`` runs on the core, compiled: every
    system, with sampling width and beams, swap, chunked prefill and --check, and for Orca every
    reservation and placement, runs on the core."""
    variants = [dict(), dict(preemption="swap", swap_gib=1.0), dict(chunked_prefill=True, chunk_budget=64),
                dict(check=True)]
    if system == "vllm-v1":  # v1 preempts by recompute only (its config refuses swap) and always chunks
        variants = [dict(), dict(max_num_batched_tokens=64, max_num_seqs=64), dict(check=True)]
    if system == "sglang":  # recompute only, chunks by its own chunk_budget (chunked_prefill_size)
        variants = [dict(), dict(chunk_budget=64, block_size=4, schedule_policy="lpm"), dict(check=True)]
    if system == "static":  # never preempts (its config refuses swap)
        variants = [dict(), dict(check=True)]
    if system.startswith("orca"):
        variants += [dict(reservation=r, placement=p) for r in RESERVATIONS for p in PLACEMENTS]
    width = {"n": [1, 2], "beam_width": [1, 3]} if system in ("vllm", "token") else None
    for kw in variants:
        cfg = cfg_for(system, slots=3000 if system != "static" else 2048, **kw)
        r = run_simulation(cfg, rand_trace(0, n=40, width=width))
        assert r.summary["engine"] == "core", (system, kw)


def test_numba_is_there_to_compile_the_core():
    """numba is a dependency: without it every run would silently take the interpreted core
    (the same results, many times slower)."""
    assert jit.COMPILED, "numba is not importable: pip install numba (or PAGESIM_JIT=0 is set)"


INTERPRETED = """
import sys
import pandas as pd
from pagesim.sim.core.compile import jit
assert not jit.COMPILED
from pagesim.sim.run import run_simulation
from tests.sim.helpers import cfg_for, rand_trace
kw = eval(sys.argv[1])
if kw.get("profile"):
    from tests.sim.helpers import write_table_profile
    kw["profile"] = str(write_table_profile(sys.argv[2] + "/profile.csv"))
kw.setdefault("system", "vllm")
width = kw.pop("width", None)
r = run_simulation(cfg_for(kw.pop("system"), seed=0, **kw), rand_trace(0, rate=200.0, prefix=True, width=width))
assert r.summary["engine"] == "core-cpython"
r.requests.to_pickle(sys.argv[2] + "/requests.pkl")
r.steps.to_pickle(sys.argv[2] + "/steps.pkl")
"""


@pytest.mark.parametrize("kw", [
    dict(slots=1200),  # recompute
    dict(slots=1200, prefix_caching=True),  # prefix hits, evictions (the trace has hashes)
    dict(slots=1200, prefix_caching=True, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30),
    dict(slots=1200, waiting_served_ratio=1.0),
    dict(slots=1200, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, width={"n": [1, 2, 3]}),  # n: fork, COW, swap
    dict(slots=1200, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30, width={"beam_width": [1, 2, 3]}),  # beams
    dict(slots=1200, preemption="swap", swap_gib=150 * OPT13B_SLOT / 2**30),  # swap, with fallbacks
    dict(slots=1200, chunked_prefill=True, chunk_budget=64, block_size=8),
    dict(slots=1200, cost_model="calibrated", cost_scale=1.37),
    dict(slots=1200, chunked_prefill=True, chunk_budget=64, profile=True, cost_scale=0.5),  # the table model
    dict(system="orca-pow2", slots=1200),  # the buddy
    dict(system="orca-oracle", slots=1000, placement="best-fit"),
    dict(system="orca-max", slots=1000, placement="first-fit"),
    dict(system="orca-max", slots=1000, reservation="predicted"),  # overflows, moves, preemption (buddy)
    dict(system="orca-max", slots=1000, reservation="predicted", placement="best-fit"),
    dict(system="orca-max", slots=1200, reservation="predicted", preemption="swap", chunked_prefill=True,
         chunk_budget=32, swap_gib=2000 * OPT13B_SLOT / 2**30),
    dict(system="static", slots=1200),
    dict(system="static", slots=1200, profile=True, cost_scale=1.37),  # padded prefill by the table
    # one rank of an expert-parallel group of 2 (the busiest GPU's experts, the ranks' all-gather)
    dict(system="vllm-v1", model="qwen3-30b-a3b", slots=1200, expert_parallel=True, data_parallel=2),
])
def test_interpreted_core_equals_compiled(kw, tmp_path):
    """The same functions run by CPython (PAGESIM_JIT=0, the readable specification) and
    compiled by numba give the same records."""
    env = dict(os.environ, PAGESIM_JIT="0", PYTHONPATH=subprocess_path())
    subprocess.run([sys.executable, "-c", INTERPRETED, repr(kw), str(tmp_path)], check=True, env=env, cwd=TESTS_ROOT)
    kw = dict(kw)
    if kw.get("profile"):
        kw["profile"] = str(tmp_path / "profile.csv")
    width = kw.pop("width", None)
    r = run_simulation(cfg_for(kw.pop("system", "vllm"), seed=0, **kw),
                       rand_trace(0, rate=200.0, prefix=True, width=width))
    pd.testing.assert_frame_equal(pd.read_pickle(tmp_path / "requests.pkl"), r.requests, check_exact=True)
    pd.testing.assert_frame_equal(pd.read_pickle(tmp_path / "steps.pkl"), r.steps, check_exact=True)


LIVE_LOCK = """
import pytest
from pagesim.sim.core.compile import jit
from pagesim.sim.core.sched import lifecycle
assert not jit.COMPILED
from pagesim.sim.errors import InvariantError
from pagesim.sim.run import run_simulation
from tests.sim.helpers import cfg_for, trace
# the bound lowered to 3 iterations: a prompt in 1-token chunks then goes 4 without a token
lifecycle.steps_without_token_limit = lambda max_seq_len: 3
cfg = cfg_for(chunked_prefill=True, chunk_budget=1)
with pytest.raises(InvariantError, match=r"no request produced a token in 4 iterations in a row "
                                         r"\\(0 waiting, 0 swapped, 1 running, 0 preemptions"):
    run_simulation(cfg, trace([(0.0, 10, 2)]))
"""


def test_core_ends_a_run_that_stops_producing_tokens():
    """The core's loop stops a run once ``steps_without_token_limit`` iterations in a row
    produced no token, with an error naming it (tests/sim/core/test_preempt_everyone.py
    pins the bound and the live lock it catches); interpreted, so the bound can be lowered."""
    env = dict(os.environ, PAGESIM_JIT="0", PYTHONPATH=subprocess_path())
    subprocess.run([sys.executable, "-c", LIVE_LOCK], check=True, env=env, cwd=TESTS_ROOT)


def test_beam_cases_reach_what_they_test():
    """In the beam cases beams die and fork beyond the forks after each prefill, requests are
    preempted, swapped out and back, and prefix hits happen."""
    width = {"beam_width": [1, 2, 3]}
    tr = rand_trace(0, rate=200.0, width=width)
    first_forks = int((tr["beam_width"] - 1).sum())  # each request's fork after its prefill, once
    c = run_simulation(cfg_for(slots=1200, seed=0), tr)
    assert c.summary["mgr_forks"] > 2 * first_forks and c.summary["num_preemptions"] > 0
    c = run_simulation(cfg_for(slots=1200, seed=0, preemption="swap", swap_gib=2000 * OPT13B_SLOT / 2**30), tr)
    assert c.summary["num_preemptions"] > c.summary["num_swap_fallbacks"]
    c = run_simulation(cfg_for(slots=1200, seed=0, prefix_caching=True),
                       rand_trace(0, rate=200.0, width=width, prefix=True))
    assert c.summary["prefix_cache_hit_rate"] > 0.3 and c.summary["mgr_forks"] > 2 * first_forks
