"""pagesim's ``--system sglang`` scheduler against SGLang 0.5.23's own scheduling policy, step by
step (tests/peers/README.md, sglang_scheduler.py).

Skipped unless ``python -m tests.peers.fetch`` has put SGLang 0.5.23 in the cache folder and its
scheduling modules import here (torch is needed); the Mooncake workloads are skipped where the
shared traces folder does not hold the trace. pagesim runs through an executor outside its core
(compiled or not), SGLang's side in Python: no child process is needed.

Each workload runs twice: with SGLang's tree as SGLang uses it, and with it used as pagesim's radix
cache is today (``pagesim_tree``: no insert after a prefill, a finished request's leaf not split at
its prompt), which shows the scheduler's own divergences past the tree's.
"""

from __future__ import annotations

import os

import pytest

from tests.peers.importing import driver_or_skip

os.environ.setdefault("PAGESIM_JIT", "0")  # alone, no compile; in a compiled session the executor works too

pytestmark = pytest.mark.peers
driver = driver_or_skip("0.5.23", "tests.peers.sglang_scheduler")

CHECKPOINT = ("SGLang 0.5.23 inserts every unfinished request's prompt into the tree once it is prefilled "
              "(checkpoint_kv_cache, mem_cache/common.py:271-280, from managers/scheduler_components/"
              "batch_result_processor.py:393-394) and splits a finished request's leaf at its prompt "
              "(radix_cache.py:485-502); pagesim inserts a request at its finish alone, once "
              "(sim/core/radix_cache.py:318-325): later requests hit what pagesim has not cached, and a "
              "retracted or evicted request's prompt stays (compare.py --sglang-scheduler --pagesim-tree "
              "without it)")
IN_BATCH = ("SGLang's lpm puts last a waiting request whose tree match is at most 32 tokens but that shares "
            "32 or more with a request ahead of it in the queue (in-batch prefix caching: "
            "schedule_policy.py:346-397 _compute_prefix_matches, IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD and "
            "_DEPRIORITIZE_THRESHOLD :110-120, _sort_by_longest_prefix :441-451); pagesim sorts by the tree "
            "match alone (sim/core/scheduler_sglang.py sort_by_longest_prefix)")
EVICTION = ("the trees hold the same tokens but an eviction frees different leaves (free and evictable "
            "differ by a few tokens after a prefill: not followed yet; lpm matches the whole queue each pass, "
            "SGLang through match_kv_cache and init_next_round_input, schedule_policy.py:363, "
            "schedule_batch.py:1692)")

KNOWN = {  # (workload, pagesim_tree) -> why it diverges
    **{(name, False): CHECKPOINT for name in (
        "retract", "shared-prefix", "three-levels-p1-lpm", "three-levels-p1-fcfs", "three-levels-p16-lpm",
        "three-levels-p16-fcfs", "mooncake-p1-fcfs", "mooncake-p16-fcfs", "mooncake-p1-lpm", "mooncake-p16-lpm")},
    **{(name, pagesim_tree): IN_BATCH for name in ("pressure-p1", "pressure-p16") for pagesim_tree in (False, True)},
    **{(name, True): EVICTION for name in ("three-levels-p1-lpm", "three-levels-p1-fcfs", "three-levels-p16-lpm",
                                           "three-levels-p16-fcfs", "mooncake-p1-lpm", "mooncake-p16-lpm")},
}


def cases():
    for name in driver.WORKLOADS:
        for pagesim_tree in (False, True):
            why = KNOWN.get((name, pagesim_tree))
            marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=why)] if why else []
            yield pytest.param(name, pagesim_tree, marks=marks, id=f"{name}{'-pagesim-tree' if pagesim_tree else ''}")


@pytest.mark.parametrize("name, pagesim_tree", list(cases()))
def test_every_step_is_sglangs(name, pagesim_tree):
    workload = driver.WORKLOADS[name]
    if workload.needs is not None and not workload.needs.exists():
        pytest.skip(f"{workload.needs} is not here (PAGESIM_SHARED_TRACES names the shared traces folder)")
    run = driver.run(workload, pagesim_tree)
    assert run.theirs, f"{name}: SGLang ran no step"
    assert run.first is None, (f"{name} ({workload.description}): {len(run.ours)} pagesim steps, "
                               f"{len(run.theirs)} SGLang's, {run.identical} identical\n" + run.describe())


def test_the_hand_workloads_exercise_what_they_claim():
    """max-prefill spends max_prefill_tokens before the chunk budget, chunked truncates, retract
    retracts (both sides: they agree)."""
    steps = driver.run_sglang(driver.WORKLOADS["max-prefill"])
    assert sum(steps[0].scheduled.values()) > driver.WORKLOADS["max-prefill"].max_prefill_tokens
    chunked = driver.run_sglang(driver.WORKLOADS["chunked"])
    assert chunked[0].scheduled == {0: 64} and chunked[1].scheduled[0] == 64
    retracted = driver.run_sglang(driver.WORKLOADS["retract"], pagesim_tree=True)
    assert any(step.retracted for step in retracted)
