"""Properties of the paged manager's forks (sim/core/kv/kv_cache.py) over whole runs on random
requests: copy-on-write happens exactly once per sequence that writes into a block it
shares, and never into a block of its own; the token manager is the paged one with blocks of
one token."""

from __future__ import annotations

import os

import pandas as pd
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagesim.sim.run import run_simulation
from tests.sim.helpers import OPT13B_SLOT, cfg_for, rand_trace, trace

SETTINGS = settings(max_examples=int(os.environ.get("PAGESIM_HYPOTHESIS_EXAMPLES", 40)), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

request = st.tuples(st.integers(1, 24), st.integers(1, 16), st.integers(1, 5))  # prompt, output, n


@SETTINGS
@given(st.lists(request, min_size=1, max_size=5), st.sampled_from([1, 2, 4, 8]))
def test_copy_on_write_once_per_sequence_writing_into_its_shared_tail(requests, block_size):
    """A request of n samples forks after its prefill: its n sequences share every block.
    Full blocks are never written again. Its first decode token (the prompt's P + 1st, at
    index P) goes into the shared tail when P is not a whole number of blocks: each sequence
    but the last to write copies it (the last finds it its own), n - 1 copies; when P fills
    its blocks, each sequence takes a fresh block of its own and nothing is copied. After
    that every tail is private: no more copies. A request of one output token never decodes.
    The pool (4,096 slots) holds every request at once, so nobody is preempted."""
    rows = [(0.0, p, o) for p, o, _ in requests]
    tr = trace(rows, n=[n for _, _, n in requests])
    cfg = cfg_for(slots=4096, max_seq_len=64, block_size=block_size, watermark=0.0, max_num_seqs=64)
    result = run_simulation(cfg, tr)
    assert result.summary["num_preemptions"] == 0
    assert (result.requests["status"] == "finished").all()
    want = sum(n - 1 for p, o, n in requests if o >= 2 and p % block_size)
    assert result.summary.get("mgr_cow_copies", 0) == want


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**16), st.booleans(), st.sampled_from(["recompute", "swap"]))
def test_the_token_manager_is_paged_blocks_of_one_token(seed, prefix_caching, preemption):
    """``token`` is vLLM's paged manager with blocks of one token: on the same random requests
    (a pool tight enough to preempt) the two give the same records, bit for bit."""
    tr = rand_trace(seed, n=40, width={"n": [1, 1, 2]}, prefix=prefix_caching)
    kw = dict(slots=600, prefix_caching=prefix_caching, preemption=preemption, swap_gib=400 * OPT13B_SLOT / 2**30)
    token = run_simulation(cfg_for("token", **kw), tr)
    paged = run_simulation(cfg_for("vllm", block_size=1, **kw), tr)
    pd.testing.assert_frame_equal(token.requests, paged.requests, check_exact=True)
    pd.testing.assert_frame_equal(token.steps, paged.steps, check_exact=True)
