"""The blocks of KV transfers (sim/core/remote_kv.py) on a prefill replica with prefix caching,
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

from pagesim.sim.core import kv_cache, remote_kv, state
from pagesim.sim.core.jit import interpreted
from pagesim.sim.run import initial_state
from tests.sim.helpers import cfg_for

BS = 4
A, B = 0, 1
hold_for_transfer = interpreted(remote_kv.hold_for_transfer)
release_transfer = interpreted(remote_kv.release_transfer)
allocate_cached_blocks = interpreted(kv_cache.allocate_cached_blocks)
release_seq = interpreted(kv_cache.release_seq)


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
    s = s._replace(exchange=np.zeros(2, np.int64))
    s.config[state.DISAGG_ROLE] = state.PREFILL_SIDE
    assert allocate_cached_blocks(s, A, 0, 8, 2) == 0
    kv_cache.compute_tokens(s, A, 8)  # keys for a0, a1
    s.num_prompt_computed[A] = 8
    assert allocate_cached_blocks(s, B, 0, 8, 2) == 4  # a0 hit; b1 fresh
    kv_cache.compute_tokens(s, B, 4)
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
