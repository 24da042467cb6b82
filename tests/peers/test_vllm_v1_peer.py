"""pagesim's vllm-v1 against vLLM 0.33.0's own scheduler, step by step (tests/peers/README.md).

Skipped unless ``python -m tests.peers.fetch`` has put vLLM 0.33.0 in the cache folder and its
scheduler imports here (torch is needed: ``vllm/v1/request.py`` imports it). Each workload
(workloads.py) runs on both sides; every step's record must be the same.
"""

from __future__ import annotations

import os

import pytest

from tests.peers.importing import driver_or_skip

os.environ.setdefault("PAGESIM_JIT", "0")  # before pagesim is imported: interpreted, no compile

pytestmark = pytest.mark.peers
vllm_v1 = driver_or_skip("0.33.0", "tests.peers.vllm_v1")

from tests.peers import pagesim_steps  # noqa: E402
from tests.peers.compare import assert_same_steps  # noqa: E402
from tests.peers.workloads import WORKLOADS  # noqa: E402


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_every_step_is_vllms(name):
    workload = WORKLOADS[name]
    theirs = vllm_v1.run(workload)
    ours = pagesim_steps.run(workload)
    assert_same_steps(name, workload, ours, theirs)
