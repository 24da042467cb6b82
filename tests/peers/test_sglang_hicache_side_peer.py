"""pagesim's HiCache (``--system sglang --kv-offload-gib``) against SGLang 0.5.23's own
``UnifiedRadixCache`` with its host tier, call by call (tests/peers/sglang_hicache_side.py).

Skipped unless ``python -m tests.peers.fetch`` has put SGLang 0.5.23 in the cache folder and its
unified radix cache imports here (torch and msgspec are needed). Each workload runs pagesim;
every tree call it makes (match, checkpoint with write-through, lock, eviction, load back,
acknowledgement) is made on SGLang's cache too, and every result and both trees after it must
be the same.
"""

from __future__ import annotations

import collections

import pytest

from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
side = driver_or_skip("0.5.23", "tests.peers.sglang_hicache_side")

RUNS: dict = {}  # workload name -> its run (the second test reads them)


def run_of(name):
    if name not in RUNS:
        RUNS[name] = side.run(side.WORKLOADS[name])
    return RUNS[name]


@pytest.mark.parametrize("name", list(side.WORKLOADS))
def test_every_hicache_call_is_sglangs(name):
    run = run_of(name)
    assert run.operations, f"{name}: pagesim made no tree call"
    assert run.first is None, (f"{name} ({side.WORKLOADS[name].description}): {run.identical} of "
                               f"{len(run.operations)} calls identical\n" + run.divergence())


def test_the_workloads_exercise_what_they_claim():
    """Loads back, host hits under the threshold, writes dropped for want of host room, host
    evictions, and chunks' checkpoints."""
    loads = run_of("conversations-p1")
    assert sum(op.kind == "load_back" and op.ours for op in loads.operations) > 5
    assert run_of("under-threshold").unloaded_hits > 0
    pressure = run_of("host-pressure")
    assert pressure.dropped_writes > 0 and pressure.summary["host_evicted_blocks"] > 0
    checkpoints = collections.Counter(op.request for op in run_of("chunks").operations if op.kind == "checkpoint")
    assert max(checkpoints.values()) >= 3  # a prompt's chunks, then its finish
