"""A plan probe's early stop on the core (experiments/probe.py ``_run_watched``): the watcher
looks every ``max(5, N // 200)`` finished requests, the core reports to it exactly then, as the
step that finishes them ends and before the next is scheduled, and a certain failure ends the
run there with what was simulated so far.

Worked by hand on a queue served one request at a time (``max_num_seqs=1``): every request has
an 8-token prompt and 3 output tokens, so it takes 3 iterations alone (a prefill that gives its
first token, then 2 decodes), D seconds in all, and the k-th request in the queue finishes at
(k + 1) D."""

from __future__ import annotations

import pytest

from pagesim.experiments import probe as P
from pagesim.sim.core.events import replay
from pagesim.sim.run import run_simulation
from tests.sim.helpers import cfg_for, trace

STEPS_PER_REQUEST = 3


def queued(n: int, late: int = 0):
    """``n`` requests at t=0 and ``late`` more at t=1000 (long after the queue drains)."""
    return trace([(0.0, 8, 3)] * n + [(1000.0, 8, 3)] * late)


@pytest.fixture
def core_runs(monkeypatch):
    """Counts the core's runs (a probe runs its simulation once)."""
    calls = []
    real = replay.run

    def spy(state, *args, **kwargs):
        calls.append(state)
        return real(state, *args, **kwargs)

    monkeypatch.setattr(replay, "run", spy)
    return calls


def watched(stop, n, late=0):
    cfg = cfg_for("vllm", max_num_seqs=1, record_steps=False)
    return P._run_watched(cfg, queued(n, late), stop)


def test_stops_at_the_first_look(core_runs):
    """N = 10: the watcher looks after 5 finishes; m = 10 - floor(0.99 * 9) = 2 requests over
    the TTFT threshold make p99 certain to exceed it. With a threshold of 1e-9 s every arrived
    request is over, so the run ends as the 5th request finishes: 5 completed in 5 x 3
    iterations, the two others of t=0 still queued, the three of t=1000 not arrived; the next
    iteration (the 6th request's prefill) is not scheduled."""
    summary, requests = watched({"ttft": 1e-9}, 7, late=3)
    assert len(core_runs) == 1
    assert summary["completed"] == 5
    assert summary["num_steps"] == 5 * STEPS_PER_REQUEST
    assert summary["busy_s"] == pytest.approx(summary["duration_s"], rel=1e-12)  # no idle time, ends at the 5th finish
    assert summary["duration_s"] == requests["finish_s"].max()
    assert summary["stopped_early"].endswith("7 of 10 requests already over the TTFT threshold 1e-09 s "
                                             "(p99 certainly above)")
    assert requests["status"].tolist() == ["finished"] * 5 + ["unfinished"] * 5
    assert requests["first_token_s"].iloc[5:].isna().all()


def test_stops_at_the_second_look():
    """N = 15 (looks every 5 finishes, m = 15 - floor(0.99 * 14) = 2) with a TTFT threshold of
    5.5 D. First look, at t = 5 D: the finished requests' TTFTs are at most 4 D + prefill < 5.5 D
    and the ten waiting since t=0 have waited 5 D: nothing certain, the run goes on. Second look,
    at t = 10 D: the five still waiting have waited 10 D > 5.5 D: stop with 10 completed."""
    lone = run_simulation(cfg_for("vllm", max_num_seqs=1, record_steps=False), queued(1)).summary["busy_s"]
    summary, requests = watched({"ttft": 5.5 * lone}, 15)
    assert summary["completed"] == 10
    assert summary["num_steps"] == 10 * STEPS_PER_REQUEST
    assert summary["duration_s"] == pytest.approx(10 * lone, rel=1e-12)
    assert "of 15 requests already over the TTFT threshold" in summary["stopped_early"]
    assert requests["status"].tolist() == ["finished"] * 10 + ["unfinished"] * 5


def test_runs_to_the_end_when_nothing_is_certain(core_runs):
    """A threshold no request reaches, and the reject-only watcher with no rejection: full runs."""
    for stop in ({"ttft": 1e9}, {"reject_only": True}):
        summary, requests = watched(stop, 7, late=3)
        assert "stopped_early" not in summary
        assert summary["completed"] == 10 and summary["num_steps"] == 10 * STEPS_PER_REQUEST
        assert (requests["status"] == "finished").all()
    assert len(core_runs) == 2


def test_a_rejection_stops_the_probe():
    """A 40-token prompt over max_num_batched_tokens=32 is rejected at its first scheduling; the
    watcher's next look (after 5 finishes) ends the run whatever the thresholds."""
    cfg = cfg_for("vllm", max_num_seqs=1, max_num_batched_tokens=32, max_seq_len=32, record_steps=False)
    tr = trace([(0.0, 40, 3)] + [(0.0, 8, 3)] * 9)
    summary, requests = P._run_watched(cfg, tr, {"ttft": 1e9})
    assert summary["stopped_early"].endswith("1 request(s) rejected")
    assert summary["completed"] == 5 and summary["num_steps"] == 5 * STEPS_PER_REQUEST
