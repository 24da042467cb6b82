"""pagesim's ``--system vllm`` against vLLM 0.4.2's own scheduler, step by step (tests/peers/README.md).

Skipped unless ``python -m tests.peers.fetch`` has put vLLM 0.4.2 in the cache folder and its
scheduler imports here (torch and pydantic are needed: ``vllm/sampling_params.py`` imports them).
Each workload (workloads.py ``V0_WORKLOADS``) runs on both sides; every step's record must be
the same.
"""

from __future__ import annotations

import pytest

from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
vllm_v0 = driver_or_skip("0.4.2", "tests.peers.vllm_v0")

from tests.peers import pagesim_steps  # noqa: E402
from tests.peers.compare import assert_same_steps  # noqa: E402
from tests.peers.suite import cases, sample  # noqa: E402
from tests.peers.workloads import V0_WORKLOADS, random_beam_prefix_v0, random_beam_v0, random_mixed_v0  # noqa: E402


#: workload -> why pagesim diverges there (a strict xfail: its mending is seen)
KNOWN = {
    "prefix-whole-prompt-held": (
        "vLLM 0.4.2 allocates every full prompt block by its hash (block_manager_v1.py:288-299), "
        "so a prompt of whole blocks all cached shares its last one too, though it computes that "
        "block again (get_all_computed_blocks leaves the table's last block out, :597-607); "
        "pagesim's hits stop short of the last prompt token (prefix_cache.hit_limit) and the last "
        "block is a fresh one: one free block fewer while both run"),
}


@pytest.mark.parametrize("name", cases(list(V0_WORKLOADS), KNOWN))
def test_every_step_is_vllms(name):
    workload = V0_WORKLOADS[name]
    theirs = vllm_v0.run(workload)
    ours = pagesim_steps.run(workload, "vllm")
    assert_same_steps(name, workload, ours, theirs)


@pytest.mark.parametrize("seed", range(sample(8, 40)))
def test_mixed_preemption_keeps_vllms_running_order(seed):
    """Drawn n = 1-4 workloads under vLLM's own preemption choice (workloads.random_mixed_v0): 31
    of the first 40 differed while a recomputed request rejoined the running list behind groups
    swapped back in; every step identical since the list is sorted by arrival before decoding."""
    workload = random_mixed_v0(seed)
    assert_same_steps(workload.name, workload, pagesim_steps.run(workload, "vllm"), vllm_v0.run(workload))


@pytest.mark.parametrize("seed", range(sample(6, 40)))
def test_drawn_beam_searches_free_vllms_blocks(seed):
    """Drawn workloads of beam searches (their beams following pagesim's records, handed to vLLM's
    own output processor: vllm_v0.beam_step) beside parallel samples (workloads.random_beam_v0)."""
    workload = random_beam_v0(seed)
    assert_same_steps(workload.name, workload, pagesim_steps.run(workload, "vllm"), vllm_v0.run(workload))


@pytest.mark.parametrize("seed", range(sample(4, 40)))
def test_drawn_beam_searches_over_cached_prefixes_free_vllms_blocks(seed):
    """Drawn beam searches over shared prefixes with prefix caching (workloads.random_beam_prefix_v0):
    a group's hits, its beams' own blocks cached and evicted, groups swapped out and in."""
    workload = random_beam_prefix_v0(seed)
    assert_same_steps(workload.name, workload, pagesim_steps.run(workload, "vllm"), vllm_v0.run(workload))


def test_the_workloads_reach_what_they_test():
    """Recompute and swap preemptions, swap-ins, groups and beam groups are all exercised (a
    workload that never preempts would compare nothing of those rules)."""
    reached = {name: vllm_v0.run(V0_WORKLOADS[name]) for name in ("preemption", "swap", "parallel-tight", "beam-tight")}
    assert sum(len(step.preempted) for step in reached["preemption"]) > 10
    assert sum(len(step.swapped_in) for step in reached["swap"]) > 10
    assert sum(len(step.swapped_out) for step in reached["parallel-tight"]) > 10
    assert sum(len(step.swapped_in) for step in reached["beam-tight"]) > 10  # beam groups back, sharing
