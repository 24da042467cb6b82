"""pagesim's ``--system sglang`` scheduler against SGLang 0.5.23's own ``Scheduler``, its loop,
admission, retraction and result processing run as they are, the model a fake, step by step
(tests/peers/README.md, sglang_engine.py).

Skipped unless ``python -m tests.peers.fetch`` has put SGLang 0.5.23 in the cache folder and its
scheduler imports here (torch is needed). pagesim runs through an executor outside its core
(compiled or not), SGLang's side in Python: no child process is needed. A fixed sample by
default (``sglang_engine.SAMPLE``); every workload (the other large bursts, Mooncake's, where the
shared traces folder holds it) under ``PAGESIM_PEERS_FULL=1`` or by
``python -m tests.peers.sglang_engine --all``.
"""

from __future__ import annotations

import pytest

from tests.peers import suite
from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
driver = driver_or_skip("0.5.23", "tests.peers.sglang_engine")

KNOWN: dict = {}  # workload -> why it diverges (an xfail, strict, citing SGLang's lines): none today


RUNS: dict = {}  # workload -> both sides' run, once per session (the later tests read SGLang's)


def compared(name: str):
    if name not in RUNS:
        RUNS[name] = driver.run(driver.WORKLOADS[name])
    return RUNS[name]


@pytest.mark.parametrize("name", suite.cases(driver.TESTED, KNOWN))
def test_every_step_is_sglangs(name):
    workload = driver.WORKLOADS[name]
    if workload.needs is not None and not workload.needs.exists():
        pytest.skip(f"{workload.needs} is not here (PAGESIM_SHARED_TRACES names the shared traces folder)")
    run = compared(name)
    assert run.theirs, f"{name}: SGLang ran no step"
    assert run.first is None, (f"{name} ({workload.description}): {len(run.ours)} pagesim steps, "
                               f"{len(run.theirs)} SGLang's, {run.identical} identical\n" + run.describe())


def test_the_scheduler_retracts_finishes_and_frees():
    """SGLang's own update_running_batch retracts in the retract workload and not with
    ignore_eos; every request finishes by its result processing (and frees: the driver's run
    raises where the pools leak once all is done, sglang_engine.leaked); the bursts' admission
    budget binds before the first finish, harder with ignore_eos."""
    retract = compared("retract").theirs
    assert any(step.retracted for step in retract)
    assert not any(step.retracted for step in compared("retract-ignore-eos").theirs)
    finished = set().union(*(step.finished for step in retract))
    assert finished == set(range(len(driver.WORKLOADS["retract"].trace())))
    ratio = compared("burst-p1").theirs
    whole = compared("burst-p1-ignore-eos").theirs
    admitted = driver.sglang_scheduler.admitted_before_the_first_finish
    assert admitted(whole) < admitted(ratio) < 160
    assert set().union(*(step.finished for step in ratio)) == set(range(160))


def test_the_large_bursts_fill_the_pool():
    """1,000 requests at once into a pool of half their tokens: about half are admitted before
    the first finishes (the admission budget binds), and the free pool runs dry (the rest of it
    held by the tree, evictable)."""
    for name in ("burst-1000-p1-ignore-eos", "burst-1000-p16"):
        workload = driver.WORKLOADS[name]
        steps = compared(name).theirs
        assert 400 < driver.sglang_scheduler.admitted_before_the_first_finish(steps) < 700, name
        assert min(step.free_tokens for step in steps) < workload.pool_tokens // 1000, name
