"""pagesim's ``--system sglang`` scheduler against SGLang 0.5.23's own ``Scheduler``, its loop,
admission, retraction and result processing run as they are, the model a fake, step by step
(tests/peers/README.md, sglang_engine.py).

Skipped unless ``python -m tests.peers.fetch`` has put SGLang 0.5.23 in the cache folder and its
scheduler imports here (torch is needed). pagesim runs through an executor outside its core
(compiled or not), SGLang's side in Python: no child process is needed. The large bursts of the
issue's shape run by ``python -m tests.peers.sglang_engine --all`` (too long for the suite).
"""

from __future__ import annotations

import pytest

from tests.peers.importing import driver_or_skip

pytestmark = pytest.mark.peers
driver = driver_or_skip("0.5.23", "tests.peers.sglang_engine")

KNOWN: dict = {}  # workload -> why it diverges (an xfail, strict, citing SGLang's lines): none today


def cases():
    for name in driver.TESTED:
        why = KNOWN.get(name)
        marks = [pytest.mark.xfail(strict=True, raises=AssertionError, reason=why)] if why else []
        yield pytest.param(name, marks=marks, id=name)


@pytest.mark.parametrize("name", list(cases()))
def test_every_step_is_sglangs(name):
    workload = driver.sglang_scheduler.WORKLOADS[name]
    run = driver.run(workload)
    assert run.theirs, f"{name}: SGLang ran no step"
    assert run.first is None, (f"{name} ({workload.description}): {len(run.ours)} pagesim steps, "
                               f"{len(run.theirs)} SGLang's, {run.identical} identical\n" + run.describe())


def admitted_before_the_first_finish(steps) -> int:
    admitted = set()
    for step in steps:
        if step.finished:
            break
        if step.kind == "prefill":
            admitted |= set(step.scheduled)
    return len(admitted)


def test_the_scheduler_retracts_finishes_and_frees():
    """SGLang's own update_running_batch retracts in the retract workload and not with
    ignore_eos; every request finishes by its result processing; the bursts' admission budget
    binds before the first finish, harder with ignore_eos."""
    workloads = driver.sglang_scheduler.WORKLOADS
    retract = driver.run_sglang(workloads["retract"])
    assert any(step.retracted for step in retract)
    assert not any(step.retracted for step in driver.run_sglang(workloads["retract-ignore-eos"]))
    finished = set().union(*(step.finished for step in retract))
    assert finished == set(range(len(workloads["retract"].trace())))
    ratio = driver.run_sglang(workloads["burst-p1"])
    whole = driver.run_sglang(workloads["burst-p1-ignore-eos"])
    assert admitted_before_the_first_finish(whole) < admitted_before_the_first_finish(ratio) < 160
    assert set().union(*(step.finished for step in ratio)) == set(range(160))
