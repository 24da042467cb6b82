"""The blocks of KV transfers (sim/core/kv/remote_kv.py) on a prefill replica with prefix caching,
worked by hand on a pool of 8 blocks of 4 tokens (the core's functions called directly).

    A: 8 prompt tokens, hashes (1, 2): blocks a0 a1, both full and keyed; one output token
    B: 8 prompt tokens, hashes (1, 2): a hit stops a token short, so B takes a0 and computes
       its second block itself (b1)

After A's prefill, A's transfer holds a0 a1: a1 it holds alone (in transfer), a0 is B's too
(in use). When B lets go, a0 is held by the transfer alone; when the transfer ends, both go
to the cache's LRU, and every slot is free.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pagesim.sim.core import state
from pagesim.sim.core.kv import host_tier, kv_cache, remote_kv
from pagesim.sim.core.sched import lifecycle, scheduler_v1
from pagesim.sim.core.build import offload_rows
from pagesim.sim.core.compile.jit import interpreted
from pagesim.sim.disagg import disaggregated_columns
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for

BS = 4
A, B = 0, 1
hold_for_transfer = interpreted(remote_kv.hold_for_transfer)
release_transfer = interpreted(remote_kv.release_transfer)
allocate_cached_blocks = interpreted(kv_cache.allocate_cached_blocks)
release_seq = interpreted(kv_cache.release_seq)
admit_waiting = interpreted(scheduler_v1.admit_waiting)


def categories(s):
    """(token states, reservation, internal fragmentation, in transfer, free), in slots."""
    out = np.zeros(state.MEMORY_CATEGORIES, np.int64)
    kv_cache.memory_categories(s, 0, out)
    return int(out[0]), int(out[1]), int(out[2]), int(out[state.IN_TRANSFER]), int(out[5])


def test_blocks_held_by_a_transfer_with_prefix_caching():
    trace = pd.DataFrame({"request_id": ["A", "B"], "arrival_s": [0.0, 0.0], "prompt_tokens": [8, 8],
                          "output_tokens": [1, 1], "prefix_hashes": [(1, 2), (1, 2)]})
    trace.attrs["hash_block_tokens"] = BS
    s = initial_state(cfg_for("vllm-v1", slots=32, block_size=BS, max_seq_len=32, prefix_caching=True), trace)
    assert s.config[state.NUM_BLOCKS] == 8
    s = s._replace(exchange=np.zeros(2, np.int64), **disaggregated_columns(2))
    s.config[state.DISAGG_ROLE] = state.PREFILL_SIDE
    assert allocate_cached_blocks(s, A, 0, 8, 2) == 0
    kv_cache.compute_tokens(s, A, 8, s.config[state.FAMILY_TRAITS])  # keys for a0, a1
    s.num_prompt_computed[A] = 8
    assert allocate_cached_blocks(s, B, 0, 8, 2) == 4  # a0 hit; b1 fresh
    kv_cache.compute_tokens(s, B, 4, s.config[state.FAMILY_TRAITS])
    # A: 8 tokens, demand 8 (final 9 > 2 blocks); B: 8 tokens; 3 blocks used, 5 free (20 slots)
    assert categories(s) == (12, 0, 0, 0, 20)
    hold_for_transfer(s, A)  # a1 (4 tokens) is in transfer; a0 is B's too
    assert categories(s) == (8, 0, 0, 4, 20)
    assert s.block_info[s.block_table[s.seq_slot[A, 0], 0], state.TRANSFERS] == 1
    assert list(s.exchange[:s.count[state.NUM_EXCHANGE]]) == [A]
    release_seq(s, B, 0)  # B lets go: a0 held by the transfer alone, b1 cached
    s.num_blocks[B] = s.num_computed_tokens[B] = 0
    assert categories(s) == (0, 0, 0, 8, 24)
    release_transfer(s, A)  # both cached, every slot free
    assert categories(s) == (0, 0, 0, 0, 32)
    assert s.count[state.NUM_LRU] == 3 and s.count[state.TRANSFER_SLOTS] == 0
    assert not s.block_info[:8, state.TRANSFERS].any()


@pytest.mark.parametrize("prompt, loads", [(16, False), (12, True)])
def test_a_transfer_leaves_the_prefills_in_flight_their_blocks(prompt, loads):
    """Decode side: an admission whose KV comes from the prefill side loads asynchronously, so it
    must leave free the blocks the prefills in flight still lack (``reserved_blocks``, v1
    scheduler.py:1420-1430; ``_inflight_prefill_reserved_blocks``, :3432-3436), as a host load
    does. A pool of 8 blocks of 4, a budget of 8 tokens a pass. Z was preempted here after 8
    output tokens: it recomputes 12 + 8 = 20 tokens, and its first pass schedules 8 of them (2
    blocks), so it is a prefill in flight lacking 5 - 2 = 3 blocks. W, fresh (its prompt's KV
    on the prefill side), arrives: 6 blocks are free, 3 once Z's are set aside. A prompt of 16
    (4 blocks) waits; one of 12 (3 blocks) is admitted and waits for its transfer."""
    t = pd.DataFrame({"request_id": ["Z", "W"], "arrival_s": [0.0, 0.0], "prompt_tokens": [12, prompt],
                      "output_tokens": [9, 1]})
    s = initial_state(cfg_for("vllm-v1", slots=32, block_size=BS, max_seq_len=32, max_num_batched_tokens=8, max_num_seqs=4,
                              async_scheduling=False), t)
    Z, W = 0, 1
    s = s._replace(exchange=np.zeros(2, np.int64), offload=offload_rows(2), **disaggregated_columns(2))
    s.config[state.DISAGG_ROLE] = state.DECODE_SIDE
    assert (s.config[state.NUM_BLOCKS], s.config[state.WATERMARK_BLOCKS]) == (8, 0)
    s.num_preemptions[Z], s.num_generated[Z] = 1, 8
    interpreted(lifecycle.restart)(s, Z)
    admit_waiting(s, 8)
    assert (s.status[Z], s.num_blocks[Z], s.prompt_target[Z]) == (state.RUNNING, 2, 20)
    interpreted(host_tier.prefilled)(s)  # the pass ends: Z is still prefilling
    assert interpreted(host_tier.reserved_blocks)(s) == 3
    interpreted(lifecycle.add_arrival)(s, W)
    admit_waiting(s, 8)
    assert s.status[W] == (state.LOADING if loads else state.WAITING)
    assert s.num_blocks[W] == (prompt // BS if loads else 0)
    assert s.count[state.DEMAND_WAITING] == (0 if loads else 1)
