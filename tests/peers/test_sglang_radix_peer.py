"""pagesim's radix cache (``--system sglang``) against SGLang 0.5.23's own ``RadixCache``, call by
call (tests/peers/README.md, sglang_radix.py).

Skipped unless ``python -m tests.peers.fetch`` has put SGLang 0.5.23 in the cache folder and its
radix cache imports here (torch is needed); the Mooncake workloads are skipped where the shared
traces folder does not hold the trace. Each workload runs pagesim, every radix call it makes is
made on SGLang's cache too, and every call's result and the trees after it must be the same.
"""

from __future__ import annotations

import pytest

from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
sglang_radix = driver_or_skip("0.5.23", "tests.peers.sglang_radix")


RUNS: dict = {}  # workload name -> its run: the second test reads two runs the first made


def runs_needing(workload):
    if workload.needs is not None and not workload.needs.exists():
        pytest.skip(f"{workload.needs} is not here (PAGESIM_SHARED_TRACES names the shared traces folder)")
    if workload.name not in RUNS:
        RUNS[workload.name] = sglang_radix.run(workload)
    return RUNS[workload.name]


@pytest.mark.parametrize("name", list(sglang_radix.WORKLOADS))
def test_every_radix_call_is_sglangs(name):
    workload = sglang_radix.WORKLOADS[name]
    run = runs_needing(workload)
    assert run.operations, f"{name}: pagesim made no radix call"
    assert run.first is None, (f"{name} ({workload.description}): {run.identical} of {len(run.operations)} "
                               f"calls identical\n" + run.divergence())


def test_the_workloads_exercise_what_they_claim():
    """The pressure workloads evict cached tokens and retract requests; the shared-prefix ones hit
    (matches shorter than a node: splits) and lock nodes several requests share."""
    pressure = runs_needing(sglang_radix.WORKLOADS["pressure-p16"])
    assert sum(op.ours[0] for op in pressure.operations if op.kind == "evict") > 0
    assert pressure.summary["num_preemptions"] > 0
    shared = runs_needing(sglang_radix.WORKLOADS["three-levels-p16-lpm"])
    hits = [op for op in shared.operations if op.kind == "match" and op.ours > 0]
    assert len(hits) > len(shared.operations) // 20
    assert any(op.kind == "inc_lock_ref" and op.ours == 0 for op in shared.operations)  # a node locked already


@pytest.mark.parametrize("name", ["three-levels-p16-lpm", "pressure-p16"])
def test_every_checkpoint_is_sglangs_checkpoint(name):
    """pagesim's checkpoints (a finished request's tokens, a chunk's) made on SGLang's side as its
    RadixCache.checkpoint makes them, inserts and the split at the prompt's end (sglang_radix.py,
    Checkpoints; compare.py --sglang --checkpoint)."""
    workload = sglang_radix.WORKLOADS[name]
    run = sglang_radix.run(workload, checkpoint=True)
    assert any(op.kind == "insert" and op.argument > 0 for op in run.operations)
    assert run.first is None, (f"{name}: {run.identical} of {len(run.operations)} calls identical, "
                               f"{run.same_results} with the same results\n" + run.divergence())
