"""pagesim's ``--system sglang`` scheduler against SGLang 0.5.23's own scheduling policy, step by
step (tests/peers/README.md, sglang_scheduler.py).

Skipped unless ``python -m tests.peers.fetch`` has put SGLang 0.5.23 in the cache folder and its
scheduling modules import here (torch is needed); the Mooncake workloads are skipped where the
shared traces folder does not hold the trace. pagesim runs through an executor outside its core
(compiled or not), SGLang's side in Python: no child process is needed.
"""

from __future__ import annotations

import pytest

from tests.peers import suite
from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
driver = driver_or_skip("0.5.23", "tests.peers.sglang_scheduler")

KNOWN: dict = {}  # workload -> why it diverges (an xfail, strict, citing SGLang's lines): none today


@pytest.mark.parametrize("name", suite.cases(driver.WORKLOADS, KNOWN))
def test_every_step_is_sglangs(name):
    workload = driver.WORKLOADS[name]
    if workload.needs is not None and not workload.needs.exists():
        pytest.skip(f"{workload.needs} is not here (PAGESIM_SHARED_TRACES names the shared traces folder)")
    run = driver.run(workload)
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
    retracted = driver.run_sglang(driver.WORKLOADS["retract"])
    assert any(step.retracted for step in retracted)
    assert not any(step.retracted for step in driver.run_sglang(driver.WORKLOADS["retract-ignore-eos"]))


def test_the_burst_workloads_fill_the_admission_budget():
    """Of 160 requests arriving at once, the budget (rem_total_tokens) admits only some before the
    first finishes; fewer with ignore_eos, whose running requests' outputs are charged whole."""
    ratio = driver.admitted_before_the_first_finish(driver.run_sglang(driver.WORKLOADS["burst-p1"]))
    whole = driver.admitted_before_the_first_finish(driver.run_sglang(driver.WORKLOADS["burst-p1-ignore-eos"]))
    assert whole < ratio < 160
