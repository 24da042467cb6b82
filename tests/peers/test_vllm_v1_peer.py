"""pagesim's vllm-v1 against vLLM 0.33.0's own scheduler, step by step (tests/peers/README.md).

Skipped unless ``python -m tests.peers.fetch`` has put vLLM 0.33.0 in the cache folder and its
scheduler imports here (torch is needed: ``vllm/v1/request.py`` imports it). Each workload
(workloads.py) runs on both sides; every step's record must be the same. With speculative
decoding (``SPECULATIVE_WORKLOADS``) vLLM is given the drafts pagesim's run accepted at each
step (``compare.peer_steps``, ``vllm_v1.drive``).
"""

from __future__ import annotations

import os

import pytest

from tests.peers.importing import driver_or_skip

os.environ.setdefault("PAGESIM_JIT", "0")  # before pagesim is imported: interpreted, no compile

pytestmark = pytest.mark.peers
vllm_v1 = driver_or_skip("0.33.0", "tests.peers.vllm_v1")

from tests.peers import pagesim_steps  # noqa: E402
from tests.peers.compare import assert_same_steps, peer_steps  # noqa: E402
from tests.peers.workloads import SPECULATIVE_WORKLOADS, WORKLOADS  # noqa: E402


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_step_is_vllms(name):
    workload = WORKLOADS[name]
    theirs = vllm_v1.run(workload)
    ours = pagesim_steps.run(workload)
    assert_same_steps(name, workload, ours, theirs)


# the known divergences: rules of vLLM's that pagesim does not model (sim/core/speculative.py)
KNOWN = {
    # A preempted request whose prefix-cache hits leave one token to compute is padded to 1 + K
    # query tokens, K of them placeholder drafts, when nothing is prefilling in the step
    # (scheduler.py:1308-1330, :1578-1582; for CUDA graphs of uniform decodes); pagesim schedules
    # its one token. Here request 8 at step 25: vLLM 4 tokens (3 drafts), pagesim 1
    "spec-prefix-resume": "vLLM pads a resumed request's one token to 1 + K (scheduler.py:1308-1330); "
                          "pagesim does not",
}


@pytest.mark.parametrize("name", [pytest.param(name, marks=[pytest.mark.xfail(reason=KNOWN[name], strict=True)]
                                               if name in KNOWN else []) for name in SPECULATIVE_WORKLOADS])
def test_every_speculative_step_is_vllms(name):
    workload = SPECULATIVE_WORKLOADS[name]
    ours = pagesim_steps.run(workload)
    assert_same_steps(name, workload, ours, peer_steps(vllm_v1.run, workload, ours))


def test_the_known_divergence_is_the_padding_alone():
    """spec-prefix-resume is identical on every step once vLLM's padding of a resumed request
    is turned off (``vllm_v1.run(pad_resumed=False)``): nothing else of it differs."""
    workload = SPECULATIVE_WORKLOADS["spec-prefix-resume"]
    ours = pagesim_steps.run(workload)
    assert_same_steps("spec-prefix-resume", workload, ours, vllm_v1.run(workload, replay=ours, pad_resumed=False))


def test_the_speculative_workloads_reach_what_they_test():
    """On vLLM's side: drafts cut by max_model_len and by the budget, a draft model's slot
    binding the budget, EAGLE's lookahead slots holding blocks n-gram's drafts do not, and
    preemptions; on pagesim's, verifications that accept none, some and all of their drafts (a
    workload that never reaches a rule compares nothing of it)."""
    runs = {name: vllm_v1.run(SPECULATIVE_WORKLOADS[name]) for name in (
        "spec-max-len", "spec-budget", "spec-draft-model", "spec-eagle", "spec-k3", "spec-pressure")}
    k = {name: SPECULATIVE_WORKLOADS[name].num_speculative_tokens for name in runs}
    assert any(n < k["spec-max-len"] for step in runs["spec-max-len"] for n in step.drafts.values())
    budget = SPECULATIVE_WORKLOADS["spec-budget"].max_num_batched_tokens
    assert any(sum(step.scheduled.values()) == budget and min(step.drafts.values(), default=k["spec-budget"])
               < k["spec-budget"] for step in runs["spec-budget"])
    # a draft model: each scheduled request takes a slot more, so a full step schedules fewer
    # tokens than the budget by its requests
    budget = SPECULATIVE_WORKLOADS["spec-draft-model"].max_num_batched_tokens
    assert any(sum(step.scheduled.values()) + len(step.scheduled) == budget for step in runs["spec-draft-model"])
    # the same requests and K, every draft rejected (nothing replayed): the same tokens each
    # step, more blocks under EAGLE
    eagle, ngram = runs["spec-eagle"], runs["spec-k3"]
    assert [step.scheduled for step in eagle] == [step.scheduled for step in ngram]
    assert any(sum(a.blocks.values()) > sum(b.blocks.values()) for a, b in zip(eagle, ngram))
    assert sum(len(step.preempted) for step in runs["spec-pressure"]) > 5
    kept = {n for step in pagesim_steps.run(SPECULATIVE_WORKLOADS["spec-k3"]) for n in step.kept.values()}
    assert kept == {0, 1, 2, 3}
